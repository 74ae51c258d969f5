"""A checkpoint's chat template: chat messages rendered into the prompt text the model was tuned on.

The template is the Jinja2 text of a converted tokenizer's ``chat_template`` (``aiayn convert --from-hf`` keeps it in
the checkpoint's ``config.json``). It renders as transformers renders it: in Jinja2's immutable sandbox (a template
cannot reach Python objects' internals or change its inputs), ``trim_blocks`` and ``lstrip_blocks`` on, with
``messages``, ``add_generation_prompt``, the tokenizer's ``bos_token`` and ``eos_token``, a ``raise_exception``
function and a ``tojson`` filter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiayn.errors import AiaynError


class ChatTemplateError(AiaynError):
    """The messages cannot be rendered: the checkpoint has no template, or the template refused them."""


def compile_template(source: str) -> Any:
    """The template ``source`` compiled in the sandbox (a syntax error is a :class:`ChatTemplateError`)."""
    from jinja2 import TemplateError  # optional: jinja2 (aiayn[serve])
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise ChatTemplateError(f"the checkpoint's chat template does not compile: {e}") from None


def render(template: Any, messages: Sequence[dict[str, Any]], bos_token: str | None, eos_token: str | None) -> str:
    """The prompt text of ``messages`` ([{"role": ..., "content": ...}, ...]), ending with the assistant's turn
    opened (``add_generation_prompt``)."""
    from jinja2 import TemplateError  # optional: jinja2

    try:
        return template.render(messages=list(messages), add_generation_prompt=True, bos_token=bos_token or "",
                               eos_token=eos_token or "")
    except ChatTemplateError:
        raise
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None
