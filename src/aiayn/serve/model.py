"""The checkpoint a server serves: its kind, its text in and out, and its batched translation and embedding work.

A language model's text goes through the checkpoint's codec exactly as ``aiayn generate`` reads and writes it
(:func:`aiayn.tokenize.text_codec.codec_from_meta`; an empty prompt starts from the codec's start ids), ends at the
tokenizer's EOS, and fits the model's context (``block_size``, else ``max_len``). Translations and embeddings that
wait together run as one call on the model thread (:class:`Coalescer`), through the functions ``aiayn translate`` and
``aiayn embed`` use.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from aiayn.errors import AiaynError
from aiayn.generate.continuous import ContinuousBatch
from aiayn.generate.inputs import is_blank
from aiayn.generate.translate import DECODE_DEFAULTS
from aiayn.pretrained import Pretrained
from aiayn.serve.chat import compile_template
from aiayn.serve.engine import Engine
from aiayn.serve.errors import RequestError
from aiayn.tasks import embedding as embedding_task
from aiayn.tasks.translation import translate_texts
from aiayn.tokenize.text_codec import codec_from_meta


class Coalescer:
    """Work items that wait together run as one call per key on the engine's thread: ``run(key, items)`` returns
    one result per item."""

    def __init__(self, run: Callable[[Hashable, list[Any]], list[Any]]) -> None:
        self.run = run
        self._pending: list[tuple[Hashable, Any, concurrent.futures.Future]] = []
        self._lock = threading.Lock()

    def submit(self, engine: Engine, key: Hashable, item: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._pending.append((key, item, future))
        engine.call(self._flush)
        return future

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        groups: dict[Hashable, list[tuple[Any, concurrent.futures.Future]]] = {}
        for key, item, future in pending:
            groups.setdefault(key, []).append((item, future))
        for key, members in groups.items():
            try:
                results = self.run(key, [item for item, _ in members])
            except BaseException as e:  # noqa: BLE001 - handed to every waiting request
                for _, future in members:
                    future.set_exception(e)
                continue
            for (_, future), result in zip(members, results):
                future.set_result(result)


class ServedModel:
    """A loaded checkpoint as the server uses it.

    Args:
        pre: the checkpoint, loaded for inference (:func:`aiayn.pretrained.load_pretrained`).
        name: the model's name in the API.
    """

    def __init__(self, pre: Pretrained, name: str) -> None:
        self.pre, self.name, self.created = pre, name, int(time.time())
        if pre.task == "lm":
            self.kind = "lm"
        elif pre.task == "translation":
            self.kind = "translation"
        elif pre.task in embedding_task.TASKS:
            self.kind = "embedding"
        else:
            raise AiaynError(f"a {pre.task!r} checkpoint: aiayn serve serves language models, translation models and "
                             f"the checkpoints aiayn embed reads ({', '.join(embedding_task.TASKS)})")
        self.chat_template = None
        if self.kind == "lm":
            self.codec = codec_from_meta(pre.tokenizers["text"], pre.meta)
            tok = self.codec.tokenizer
            self.tokenizer, self.pad_id = tok, tok.pad_id
            self.stop_ids = frozenset({tok.eos_id})
            self.banned_ids = () if tok.pad_id in self.stop_ids else (tok.pad_id,)
            self.context = min(pre.meta.get("block_size") or pre.config.max_len, pre.config.max_len)
            source = pre.meta.get("chat_template")
            self.chat_template = compile_template(source) if isinstance(source, str) else None
            self.bos_token = self._token(getattr(tok, "bos_id", None))
            self.eos_token = self._token(tok.eos_id)
        self.decode_settings = {**DECODE_DEFAULTS, **(pre.meta.get("decode") or {})}  # the checkpoint's beam settings
        self._translations = Coalescer(self._translate_group)
        self._embeddings = Coalescer(self._embed_group)

    # ------------------------------------------------------------------------------------------- text
    def _token(self, idx: int | None) -> str | None:
        if idx is None:
            return None
        to_token = getattr(self.tokenizer, "id_to_token", None)
        return to_token(idx) if to_token is not None else self.codec.decode([idx])

    def encode(self, text: str) -> list[int]:
        """A prompt's ids, as ``aiayn generate`` reads it."""
        return self.codec.encode(text) if text else self.codec.start_ids()

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids)

    def token_text(self, idx: int) -> str:
        """One token's text."""
        return self.codec.decode([idx])

    def card(self) -> dict[str, Any]:
        """The model in ``GET /v1/models``."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "aiayn",
                "task": self.pre.task, **({"context_length": self.context} if self.kind == "lm" else {})}

    def require(self, kind: str, endpoint: str) -> None:
        if self.kind != kind:
            raise RequestError(f"{endpoint} needs a {kind} model; {self.name} is a {self.pre.task!r} checkpoint",
                               status=400)

    def new_batch(self, max_batch: int, prefill_chunk: int) -> ContinuousBatch:
        """The continuous batch a language model decodes in."""
        return ContinuousBatch(self.pre.model, self.pad_id, self.banned_ids, max_batch, prefill_chunk)

    # ----------------------------------------------------------------------------- translations, embeddings
    def translate(self, engine: Engine, texts: list[str], beam: int | None, alpha: float | None,
                  n_best: int) -> concurrent.futures.Future:
        """Each text's translation (a list of ``n_best`` when above 1), with the checkpoint's ``decode`` settings
        where ``beam`` or ``alpha`` is None; batched with the other requests waiting."""
        dec = self.decode_settings
        beam = dec["beam"] if beam is None else beam
        if n_best > beam:
            raise RequestError(f"'n_best' {n_best} is more than the beam ({beam}) keeps", "n_best")
        if beam > self.pre.tokenizers["tgt"].vocab_size:
            raise RequestError(f"'beam_size' {beam}: more than the target vocabulary", "beam_size")
        key = (beam, dec["alpha"] if alpha is None else alpha, n_best)
        return self._translations.submit(engine, key, texts)

    def _translate_group(self, key: Hashable, requests: list[list[str]]) -> list[list[Any]]:
        beam, alpha, n_best = key
        pre, dec = self.pre, self.decode_settings
        lines = [t.lower() if pre.meta.get("lowercase") else t for texts in requests for t in texts]
        src = pre.tokenizers["src"]
        keep = [i for i, line in enumerate(lines) if not is_blank(line, src.encode(line))]
        outs = translate_texts(pre.model, src, pre.tokenizers["tgt"], [lines[i] for i in keep], beam=beam,
                               alpha=alpha, max_len_a=dec["max_len_a"], max_len_b=dec["max_len_b"], n_best=n_best,
                               forced_bos_id=dec.get("forced_bos_id")) if keep else []
        result: list[Any] = [[""] * n_best if n_best > 1 else "" for _ in lines]
        for i, out in zip(keep, outs):
            result[i] = out
        split, at = [], 0
        for texts in requests:
            split.append(result[at:at + len(texts)])
            at += len(texts)
        return split

    def embed(self, engine: Engine, texts: list[str]) -> concurrent.futures.Future:
        """(vectors (N, D), tokens read) of the texts, as ``aiayn embed`` makes them; batched with the others."""
        return self._embeddings.submit(engine, None, texts)

    def _embed_group(self, key: Hashable, requests: list[list[str]]) -> list[Any]:
        texts = [t for group in requests for t in group]
        s = embedding_task.settings(self.pre)
        _, lengths = embedding_task.encode_texts(self.pre, texts, s)
        vectors = embedding_task.embed(self.pre, texts, on_long="error")
        out, at = [], 0
        for group in requests:
            out.append((vectors[at:at + len(group)], sum(lengths[at:at + len(group)])))
            at += len(group)
        return out
