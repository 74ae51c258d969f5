"""The compiled decoding step equals the eager one and the reference, for generated configs and converted families.

Three runs of the same decoding (a padded prefill, one-token steps, beams expanded and reordered): the reference
(the cache addressed by position), the same step eagerly over the static cache addressed by slot, and that step
compiled by ``torch.compile`` (:func:`aiayn.accel.compile_decoding`; fullgraph, so a graph break fails the test). The
configurations are the pairwise cover of the config's choice lists that the accelerator's equivalence test uses
(decoder-only and encoder-decoder cases), so a new choice enters here by itself. The "aot_eager" backend traces and
runs the captured graph without generating code, which keeps this test fast; one case per architecture also runs
inductor's generated code.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tests.consistency.test_accel_equivalence import CASES, _config
from torch import Tensor, nn

from aiayn.accel import compile_decoding
from aiayn.accel.compiled import uncompiled, unsupported
from aiayn.generate.lm import left_pad
from aiayn.generate.steppers import LMStepper, Seq2SeqStepper, eval_mode
from aiayn.models.build import build_model
from aiayn.models.seq2seq import EncoderDecoderModel

ATOL = 2e-5
DECODING = [c for c in CASES if c["arch"] != "encoder"]


class _Eager:
    """A step compiler that compiles nothing: the step runs eagerly over the static cache."""

    def __call__(self, step):  # noqa: ANN001, ANN204
        return step


def _decode(model: nn.Module) -> list[Tensor]:
    """Logits of every step of a fixed decoding: first(), then steps with beams expanded (x2) and reordered."""
    g = torch.Generator().manual_seed(1)
    vocab = model.config.target_vocab_size if isinstance(model, EncoderDecoderModel) else model.config.vocab_size
    with eval_mode(model):
        if isinstance(model, EncoderDecoderModel):
            src = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0], [13, 14, 0, 0, 0]])
            stepper = Seq2SeqStepper(model, src, capacity=8)
        else:
            ids, is_token = left_pad([[1, 5, 6, 7, 8], [1, 9], [1, 10, 11]])
            stepper = LMStepper(model, ids, is_token, capacity=ids.shape[1] + 7)
        out = [stepper.first()]
        stepper.reorder(torch.tensor([0, 0, 1, 1, 2, 2]), group=2)  # beams: 2 per input
        for i in range(6):
            out.append(stepper.step(torch.randint(3, vocab, (6,), generator=g)))
            if i % 2:
                stepper.reorder(torch.tensor([1, 0, 2, 2, 5, 4]), same_sources=True)
    return out


def _compare(model: nn.Module, backend: str) -> None:
    reference = _decode(model)
    model.step_compiler = _Eager()
    static = _decode(model)
    torch._dynamo.reset()  # each case's model compiles afresh, within dynamo's limit of compilations per function
    compile_decoding(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compiled step that fell back to eager fails here
        compiled = _decode(model)
    uncompiled(model)
    for i, (r, s, c) in enumerate(zip(reference, static, compiled)):
        torch.testing.assert_close(s, r, atol=ATOL, rtol=0, msg=lambda m, i=i: f"static eager, step {i}: {m}")
        torch.testing.assert_close(c, r, atol=ATOL, rtol=0, msg=lambda m, i=i: f"compiled, step {i}: {m}")


@pytest.mark.parametrize("case", DECODING, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_compiled_equals_eager_equals_reference(case: dict) -> None:
    torch.manual_seed(0)
    model = build_model(_config(case)).eval()
    assert unsupported(model) is None
    _compare(model, "aot_eager")


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_inductor_code_equals_the_reference(arch: str) -> None:
    torch.manual_seed(0)
    model = build_model(_config(DECODING[0] | {"arch": arch})).eval()
    _compare(model, "inductor")


def test_the_compiled_step_is_named_and_declines_what_it_cannot_compile() -> None:
    from aiayn import accel

    model = build_model(_config(DECODING[0])).eval()
    compile_decoding(model, backend="aot_eager")
    assert "decoding_step=torch.compile(backend='aot_eager', mode=None)" in repr(model)
    assert accel.describe(model) == {"decoding step=torch.compile(backend='aot_eager', mode=None)": 1}
    linear = build_model(_config(DECODING[0]).replace(attention="linear")).eval()
    with pytest.raises(ValueError, match="linear attention keeps a running state"):
        compile_decoding(linear)


def test_left_padded_prompts_decode_as_each_alone_through_the_compiled_step() -> None:
    from aiayn.generate.lm import generate

    torch.manual_seed(0)
    model = build_model(_config(DECODING[0] | {"position": "rope"})).eval()
    prompts = [[1, 5, 6, 7, 8, 9], [1, 12], [1, 20, 21, 22]]
    alone = [generate(model, [p], max_new_tokens=6, greedy=True, stop_ids=())[0] for p in prompts]
    compile_decoding(model, backend="aot_eager")
    assert generate(model, prompts, max_new_tokens=6, greedy=True, stop_ids=()) == alone
