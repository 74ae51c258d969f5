"""``aiayn check``: the consistency guarantees, verified on the user's own machine and model.

Each check runs one model two ways that must agree and reports the largest difference:

- cached == uncached: logits of decoding step by step with the KV cache, against one pass over the whole sequence;
- batched == single: each sequence of a padded batch, against the same sequence alone;
- accelerated == reference: the accelerator's modules (:func:`aiayn.accel.accelerate`, train and decode, with and
  without its native kernels), against the reference core with the same weights;
- accumulated == one batch: gradients summed over two half batches, against one batch;
- resume == uninterrupted: a tiny training run stopped, saved and resumed, against the same run straight through.

Differences are relative to the largest magnitude compared (1e-4 allows float rounding of a different summation
order, nothing more). :func:`run_checks` returns the rows; the CLI prints them and exits non-zero on a failure.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn import accel
from aiayn.checkpoint import load_training_state, read_state_dict
from aiayn.config import ModelConfig
from aiayn.demos.copy_task import CopyTask
from aiayn.errors import AiaynError
from aiayn.generate.choosers import greedy_chooser
from aiayn.generate.steppers import LMStepper, Seq2SeqStepper, eval_mode
from aiayn.models.build import build_model
from aiayn.models.decoder import DecoderModel
from aiayn.models.encoder import EncoderModel
from aiayn.models.seq2seq import EncoderDecoderModel
from aiayn.tokenize import NUM_SPECIAL
from aiayn.train.trainer import TrainConfig, train

TOLERANCE = 1e-4


@dataclass
class CheckResult:
    """One row of the report: what was compared, the largest relative difference, and whether it is within
    ``tolerance`` (``skipped`` says why a check did not apply)."""

    name: str
    compared: str
    max_diff: float = 0.0
    tolerance: float = TOLERANCE
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        """Within tolerance (a skipped check passes)."""
        return self.skipped is not None or self.max_diff <= self.tolerance


def relative_difference(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max(1, max |b|) over tensors of one shape; inf where the shapes differ or a value is not finite."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp(min=1.0))


def _inputs(config: ModelConfig, batch: int, length: int, seed: int,
            device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """(B, T) ids of real tokens (no special ids) and their (B, T) is_token flags: row i is padded on the right to
    length - i (at least half the length), so a batch holds rows of several lengths."""
    g = torch.Generator().manual_seed(seed)
    low = min(NUM_SPECIAL, config.vocab_size - 1)
    ids = torch.randint(low, config.vocab_size, (batch, length), generator=g)
    lengths = torch.tensor([max(length - i, (length + 1) // 2) for i in range(batch)])
    is_token = torch.arange(length)[None] < lengths[:, None]
    return ids.masked_fill(~is_token, config.pad_id).to(device), is_token.to(device)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _forward_logits(model: nn.Module, ids: Tensor, is_token: Tensor, tgt: Tensor | None = None) -> Tensor:
    """Teacher-forced logits of any family: (B, T, V) (seq2seq: of ``tgt``); an encoder's MLM logits."""
    if isinstance(model, EncoderDecoderModel):
        return model(ids, tgt, src_is_token=is_token).logits
    if isinstance(model, DecoderModel):
        return model(ids, is_token=is_token).logits
    return model(ids, is_token, task="mlm").logits


def check_cached(model: nn.Module, *, length: int = 9, seed: int = 0) -> CheckResult:
    """Decoding with the cache, one token at a time, against one uncached pass over the whole sequence."""
    row = CheckResult("cached == uncached", "per-step logits vs one full pass")
    if isinstance(model, EncoderModel):
        row.skipped = "an encoder has no cache"
        return row
    config = model.config
    ids, _ = _inputs(config, 2, length, seed, _device(model))
    with eval_mode(model):
        if isinstance(model, EncoderDecoderModel):
            src, src_is_token = ids, ids != config.pad_id
            tgt = torch.cat([torch.full_like(ids[:, :1], 1), ids.roll(1, dims=1)[:, : length - 1]], dim=1)  # BOS + ids
            full = model(src, tgt, src_is_token=src_is_token).logits  # (B, T, V)
            memory, src_is_token, _ = model.encode(src, src_is_token)
            cache = model.new_cache(length)
            steps = [model.decode(tgt[:, t: t + 1], memory if t == 0 else None, src_is_token, cache=cache).logits
                     for t in range(length)]
        else:
            full = model(ids).logits
            cache = model.new_cache(length)
            steps = [model(ids[:, t: t + 1], cache=cache).logits for t in range(length)]
    row.max_diff = relative_difference(torch.cat(steps, dim=1), full)
    return row


def check_batched(model: nn.Module, *, length: int = 9, seed: int = 1) -> CheckResult:
    """Each row of a padded batch against the same row alone (real positions only)."""
    row = CheckResult("batched == single", "logits of a padded batch vs each row alone")
    config = model.config
    ids, is_token = _inputs(config, 3, length, seed, _device(model))
    tgt = ids[:, :5].clone() if isinstance(model, EncoderDecoderModel) else None
    if tgt is not None:
        tgt[:, 0] = 1
    diffs = []
    with eval_mode(model):
        batched = _forward_logits(model, ids, is_token, tgt)
        for i in range(ids.shape[0]):
            n = int(is_token[i].sum())
            alone = _forward_logits(model, ids[i: i + 1, :n], is_token[i: i + 1, :n],
                                    None if tgt is None else tgt[i: i + 1])
            mine = batched[i: i + 1] if tgt is not None else batched[i: i + 1, :n]  # real positions of row i
            diffs.append(relative_difference(mine, alone))
    row.max_diff = max(diffs)
    return row


def _step_logits(model: nn.Module, ids: Tensor, is_token: Tensor, steps: int, seed: int) -> Tensor:
    """Logits of a fixed decode through the model's stepper: the first token, then ``steps`` forced tokens, with a
    beam-style reorder after the first (each row doubled, as two beams of one sentence). (steps + 1, 2B, V)."""
    g = torch.Generator().manual_seed(seed)
    config = model.config
    with eval_mode(model):
        if isinstance(model, EncoderDecoderModel):
            stepper = Seq2SeqStepper(model, ids, capacity=steps + 2, src_is_token=is_token)
        else:
            left = torch.stack([torch.cat([r[~m], r[m]]) for r, m in zip(ids, is_token)])  # left padding
            left_is_token = torch.stack([torch.cat([m[~m], m[m]]) for m in is_token])
            stepper = LMStepper(model, left, left_is_token, capacity=ids.shape[1] + steps + 2)
        out = [stepper.first()]
        b = out[0].shape[0]
        stepper.reorder(torch.arange(b, device=ids.device).repeat_interleave(2), group=2)
        out[0] = out[0].repeat_interleave(2, dim=0)
        for _ in range(steps):
            tokens = torch.randint(NUM_SPECIAL, config.target_vocab_size, (2 * b,), generator=g).to(ids.device)
            out.append(stepper.step(tokens))
    return torch.stack(out).float()


def _loss_and_grads(model: nn.Module, ids: Tensor, is_token: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """A training step's summed loss (dropout off) and every parameter's gradient."""
    model.eval()  # the same dropout-free computation as training
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        labels = ids.masked_fill(~is_token, -100)
        if isinstance(model, EncoderDecoderModel):
            tgt_in = torch.cat([torch.full_like(ids[:, :1], 1), ids[:, :-1]], dim=1)
            hidden = model(ids, tgt_in, src_is_token=is_token, compute_logits=False).hidden
            loss = model.lm_head.loss(hidden, labels, 0.1)[0]
        elif isinstance(model, DecoderModel):
            hidden = model(ids, is_token=is_token, compute_logits=False).hidden
            loss = model.lm_head.loss(hidden[:, :-1], labels[:, 1:], 0.1)[0]
        else:
            logits = model(ids, is_token, task="mlm").logits
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def check_accelerated(model: nn.Module, *, native: bool | None = None, seed: int = 2,
                      accel_setting: str | None = "auto") -> list[CheckResult]:
    """The accelerator against the reference core with the same weights: teacher-forced logits and a training step's
    loss and gradients (accelerated for training), the logits of a cached, beam-reordered decode and the greedy
    choice (accelerated for decoding). ``native`` False runs the accelerator without its compiled kernels (None: as
    configured). On a device without an accelerator the two sides are the same modules."""
    rows = []
    config = model.config
    device = _device(model)
    ids, is_token = _inputs(config, 3, 8, seed, device)
    reference = _reference_copy(model)
    label = "" if native is None else (" (native kernels)" if native else " (no native kernels)")
    with _native_kernels(native):
        trained = accel.accelerate(_reference_copy(model), "train", accel_setting)
        ref_loss, ref_grads = _loss_and_grads(reference, ids, is_token)
        loss, grads = _loss_and_grads(trained, ids, is_token)
        train_row = CheckResult("accelerated == reference" + label, "training loss and every gradient")
        train_row.max_diff = max([relative_difference(loss, ref_loss)] +
                                 [relative_difference(grads.get(n, torch.zeros(0)), g) for n, g in ref_grads.items()])
        rows.append(train_row)

        decoding = accel.accelerate(_reference_copy(model).eval(), "decode", accel_setting)
        tgt = None
        if isinstance(model, EncoderDecoderModel):
            tgt = torch.cat([torch.full((ids.shape[0], 1), 1, device=device), ids[:, :4]], dim=1)
        with torch.inference_mode():
            a, b = _forward_logits(decoding.eval(), ids, is_token, tgt), _forward_logits(reference.eval(), ids,
                                                                                          is_token, tgt)
        logits_row = CheckResult("accelerated == reference" + label, "inference logits of a padded batch")
        logits_row.max_diff = relative_difference(a, b)
        rows.append(logits_row)
        if not isinstance(model, EncoderModel):
            step_row = CheckResult("accelerated == reference" + label, "cached decoding steps, beams reordered")
            step_row.max_diff = relative_difference(_step_logits(decoding, ids, is_token, 4, seed),
                                                    _step_logits(reference, ids, is_token, 4, seed))
            rows.append(step_row)
            greedy_row = CheckResult("accelerated == reference" + label, "greedy choice from hidden states")
            h = torch.randn(5, config.d_model, generator=torch.Generator().manual_seed(seed)).to(device)
            with eval_mode(decoding), eval_mode(reference):
                chosen = greedy_chooser(decoding.lm_head, [config.pad_id])(h)
                expected = greedy_chooser(reference.lm_head, [config.pad_id])(h)
            greedy_row.max_diff = 0.0 if torch.equal(chosen, expected) else float("inf")
            greedy_row.tolerance = 0.0
            rows.append(greedy_row)
    return rows


def check_accumulated(model: nn.Module, *, seed: int = 3) -> CheckResult:
    """Gradients of a summed loss over two half batches, accumulated, against one batch."""
    row = CheckResult("accumulated == one batch", "gradients of 2 x 2 rows vs 4 rows")
    ids, is_token = _inputs(model.config, 4, 8, seed, _device(model))
    work = _reference_copy(model)
    _, whole = _loss_and_grads(work, ids, is_token)
    _, first = _loss_and_grads(work, ids[:2], is_token[:2])
    _, second = _loss_and_grads(work, ids[2:], is_token[2:])
    summed = {n: first.get(n, 0) + second.get(n, 0) for n in whole}
    row.max_diff = max(relative_difference(summed[n], g) for n, g in whole.items())
    return row


class _Interrupted(Exception):
    """Stands in for a kill in :func:`check_resume`."""


def check_resume(*, steps: int = 12) -> CheckResult:
    """A tiny copy-task training run of ``steps`` steps on the CPU, against the same run interrupted after its
    checkpoint at ``steps // 2`` and resumed from it. On the CPU every kernel is deterministic, so the two must be
    bit-identical (CUDA's atomic adds would blur that; saving and resuming do not depend on the device)."""
    class StoppingTask(CopyTask):
        """The copy task whose data stops (as a killed process would) once ``stop_after`` batches were drawn."""

        stop_after: int | None = None

        def batches(self, position):  # noqa: ANN001, ANN202 - as CopyTask.batches
            for i, item in enumerate(super().batches(position)):
                if self.stop_after is not None and i >= self.stop_after:
                    raise _Interrupted
                yield item

    row = CheckResult("resume == uninterrupted", f"weights after {steps} steps (tiny copy task, CPU)", tolerance=0.0)
    threads = torch.get_num_threads()  # pinned: a thread count changed mid-run changes the rounding
    with tempfile.TemporaryDirectory() as tmp:
        def run(out: str, resume: bool, stop_after: int | None = None) -> None:
            task = StoppingTask(seed=1, batch_size=16)
            task.stop_after = stop_after
            cfg = TrainConfig(out_dir=out, max_steps=steps, lr=3e-3, schedule="warmup_cosine", warmup=4,
                              label_smoothing=0.1, eval_every=10**6, log_every=10**6, save_every=steps // 2,
                              seed=1, progress=False, device="cpu", threads=threads)
            with contextlib.redirect_stdout(io.StringIO()):  # the runs' own progress lines
                try:
                    train(task, cfg, resume=resume)
                except _Interrupted:
                    pass

        run(f"{tmp}/straight", False)
        run(f"{tmp}/resumed", False, stop_after=steps // 2 + 2)  # two steps past the checkpoint, then killed
        state = load_training_state(f"{tmp}/resumed/last")
        if state is None or state["step"] != steps // 2:
            row.max_diff = float("inf")
            row.compared += ": no checkpoint to resume from"
            return row
        run(f"{tmp}/resumed", True)
        a, b = read_state_dict(f"{tmp}/resumed/last"), read_state_dict(f"{tmp}/straight/last")
        row.max_diff = max(relative_difference(a[k], b[k]) for k in b)
    return row


def run_checks(model: nn.Module, *, resume: bool = True, accel_setting: str | None = None) -> list[CheckResult]:
    """Every check on ``model`` (and, with ``resume``, the tiny resume check), in report order.

    Raises:
        AiaynError: a model that reads images (the checks feed token ids).
    """
    if model.config.input == "patches":
        raise AiaynError("aiayn check feeds token ids, and this model reads images (input='patches'); its batched == "
                         "single and accelerated == reference are held by the test suite (tests/unit/test_patches.py)")
    rows = [check_cached(model), check_batched(model)]
    if accel.resolve(accel_setting) == "none":
        rows.append(CheckResult("accelerated == reference", "", skipped="acceleration is off (--accel none)"))
    elif next(model.parameters()).device.type == "cpu" and accel.native_kernels_available():
        rows += check_accelerated(model, native=True, accel_setting=accel_setting)
        rows += check_accelerated(model, native=False, accel_setting=accel_setting)
    else:
        rows += check_accelerated(model, accel_setting=accel_setting)
    rows.append(check_accumulated(model))
    if resume:
        rows.append(check_resume())
    return rows


def format_report(rows: list[CheckResult]) -> str:
    """The rows as an aligned text table with a last line counting failures."""
    header = ("check", "compared", "max rel. diff", "tolerance", "result")
    lines = [(r.name, r.compared, "-" if r.skipped else f"{r.max_diff:.2e}", f"{r.tolerance:.0e}",
              f"skipped: {r.skipped}" if r.skipped else ("ok" if r.passed else "FAILED")) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*line) for line in lines]
    failed = sum(not r.passed for r in rows)
    out.append(f"{len(rows) - failed} passed, {failed} failed")
    return "\n".join(out)


def kernels_in_use(model: nn.Module, accel_setting: str | None = None) -> dict[str, str]:
    """What runs when ``model`` trains and when it decodes here: for each purpose, the accelerator's kernels in the
    core's seams and its modules (:func:`aiayn.accel.describe`, e.g. ``"MultiHeadAttention.attention_kernel=
    cpu_attention_kernel x4"``), or "the reference core" where it adds nothing."""
    out = {}
    for purpose in accel.PURPOSES:
        copy = _reference_copy(model)
        used = accel.describe(accel.accelerate(copy if purpose == "train" else copy.eval(), purpose, accel_setting))
        out[purpose] = ", ".join(f"{name} x{n}" for name, n in used.items()) or "the reference core"
    return out


def _reference_copy(model: nn.Module) -> nn.Module:
    """A reference-core copy of ``model`` with the same weights: the accelerator's kernels, packed layers and layouts
    undone (built anew from the config, then the state dict loaded)."""
    ref = build_model(model.config, init=False).to(next(model.parameters()).device)
    ref.load_state_dict({k: v.contiguous() for k, v in model.state_dict().items()})
    return ref


@contextlib.contextmanager
def _native_kernels(native: bool | None) -> Iterator[None]:
    """The accelerator's compiled kernels on (True) or off (False) for the block; None leaves them as they are."""
    if native is None:
        yield
        return
    with accel.native_kernels(native):
        yield
