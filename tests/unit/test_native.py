"""The native decoding kernels (aiayn.accel.cpu.native) against their PyTorch references, the deferred cache reorders
they allow against eager ones, and beam search with and without them."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest
import torch

from aiayn import ModelConfig, build_model
from aiayn.accel import accelerate
from aiayn.accel.cpu import native
from aiayn.accel.cpu.settings import SETTINGS
from aiayn.generate import translate

needs_native = pytest.mark.skipif(native.library() is None, reason=f"native kernels not built: {native.build_error}")


def test_builds_where_a_compiler_is_present() -> None:
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler")
    assert native.library() is not None, native.build_error


def test_disabled_by_the_setting_and_failed_build_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(SETTINGS, "native", False)
    assert native.library() is None
    monkeypatch.setattr(SETTINGS, "native", True)
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_lib", None)
    assert native.library() is None
    assert native.build_error


@needs_native
@pytest.mark.parametrize("n_rows,v,n", [(4, 8000, 8), (33, 5000, 8), (3, 10, 8), (2, 5, 5), (1, 300, 1)])
def test_row_top_equals_reference(n_rows: int, v: int, n: int) -> None:
    g = torch.Generator().manual_seed(v + n)
    x = torch.randn(n_rows, v, generator=g) * 4
    x[0, :3] = x[0].max() + 1.0  # the best entries banned: they must be skipped, yet count in the normalizer
    banned = torch.zeros(v, dtype=torch.bool)
    banned[:3] = True
    want = native.row_top_reference(x, n, banned)
    got = native.row_top(x, n, banned)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-5)
    assert torch.equal(got[1][got[0].isfinite()], want[1][want[0].isfinite()])
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-6)


@needs_native
def test_row_top_normalizer_at_the_exponential_edges() -> None:
    """Masked (-inf) entries and entries more than 87.3 below the row's best add nothing, in the vector lanes and
    in the last few columns alike; a NaN logit makes its row's normalizer NaN."""
    x = torch.randn(3, 37) * 3
    x[0, ::3] = float("-inf")
    x[1, :20] = x[1].max() - 90.0
    x[1, 36] = x[1].max() - 87.3
    x[2, 5] = float("nan")
    _, _, lse = native.row_top(x, 2)
    torch.testing.assert_close(lse[:2], torch.logsumexp(x[:2].double(), -1).float(), rtol=1e-6, atol=1e-6)
    assert lse[2].isnan()


@needs_native
def test_row_top_ties_and_too_few_allowed() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    vals, ids, _ = native.row_top(x, 3)
    assert ids[0].tolist() == [1, 2, 4]  # equal values: smaller id first
    banned = torch.tensor([True, True, True, False, False])
    vals, ids, lse = native.row_top(x, 3, banned)
    assert ids[1, :2].tolist() == [3, 4] and vals[1, 2] == float("-inf") and ids[1, 2] == 0
    torch.testing.assert_close(lse, torch.logsumexp(x, -1))


@needs_native
@pytest.mark.parametrize("n_rows,v", [(4, 8000), (33, 5003), (3, 7), (1, 1), (2, 256)])
def test_softmax_lse_equals_reference(n_rows: int, v: int) -> None:
    x = torch.randn(n_rows, v) * 4
    want_softmax, want_lse = native.softmax_lse_reference(x.double())
    got = x.clone()
    lse = native.softmax_lse_(got)
    torch.testing.assert_close(lse, want_lse.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, want_softmax.float(), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.sum(-1), torch.ones(n_rows), rtol=1e-5, atol=1e-5)


@needs_native
def test_softmax_lse_strided_rows_and_the_exponential_edges() -> None:
    """Rows of a wider buffer (a chunk's view) are done in place and nothing else is touched; masked (-inf) entries
    get 0, entries far below the row's best underflow to 0 in the vector lanes and the last few columns alike; a NaN
    makes its row's normalizer and softmax NaN, as torch's."""
    buffer = torch.randn(4, 45) * 3
    x = buffer[:, :37]
    x[0, ::3] = float("-inf")
    x[1, :20] = x[1].max() - 90.0
    x[1, 36] = x[1].max() - 87.3
    x[3, 5] = float("nan")
    before, tail = x.clone(), buffer[:, 37:].clone()
    lse = native.softmax_lse_(x)
    want_softmax, want_lse = native.softmax_lse_reference(before[:3].double())
    torch.testing.assert_close(lse[:3], want_lse.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x[:3], want_softmax.float(), rtol=1e-5, atol=1e-9)
    assert (x[0, ::3] == 0).all() and (x[1, :20] == 0).all()
    assert lse[3].isnan() and x[3].isnan().all()
    assert torch.equal(buffer[:, 37:], tail)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        native.softmax_lse_(torch.randn(5, 3).T)


@needs_native
@pytest.mark.parametrize("b,h,hkv,t,s,d", [(4, 4, 4, 1, 7, 64), (9, 8, 2, 1, 21, 32), (5, 4, 4, 4, 20, 64),
                                          (3, 6, 3, 2, 300, 16), (2, 3, 1, 3, 600, 20)])
def test_few_query_attention_equals_reference(b: int, h: int, hkv: int, t: int, s: int, d: int) -> None:
    g = torch.Generator().manual_seed(s)
    q = torch.randn(b, h, t, d, generator=g)
    k, v = torch.randn(2, b, hkv, s, d, generator=g)
    mask = torch.rand(b, s, generator=g) > 0.3
    mask[0] = False  # a row with no allowed key: zeros
    for m in (None, mask):
        want = native.few_query_attention_reference(q, k, v, m, 0.3)
        torch.testing.assert_close(native.few_query_attention(q, k, v, m, 0.3), want, rtol=1e-5, atol=1e-5)
    assert native.few_query_attention(q, k, v, mask, 0.3)[0].abs().sum() == 0
    # folded queries and output as strided views, as the fast step's cross-attention passes them
    qf = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, T, Dh) over a (B, T, H, Dh) buffer
    out = torch.full((b, t, h, d), float("nan"))
    native.few_query_attention(qf, k, v, mask, 0.3, out=out.transpose(1, 2))
    torch.testing.assert_close(out.transpose(1, 2), native.few_query_attention_reference(q, k, v, mask, 0.3),
                               rtol=1e-5, atol=1e-5)
    # on time-major strided views, as the KV store gives them
    store = torch.randn(s + 3, b + 2, 2, hkv, d, generator=g)  # (capacity, buffer rows, k/v, Hkv, Dh)
    ks, vs = store[:s, :b, 0].permute(1, 2, 0, 3), store[:s, :b, 1].permute(1, 2, 0, 3)  # (B, Hkv, S, Dh)
    want = native.few_query_attention_reference(q, ks, vs, mask, 0.3)
    torch.testing.assert_close(native.few_query_attention(q, ks, vs, mask, 0.3), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@needs_native
def test_beam_search_same_with_and_without_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """An accelerated model's beam search is the same with the native kernels on and off, and the same as the
    reference model's."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=50, max_len=64, dropout=0.0)
    reference = build_model(cfg).eval()
    model = accelerate(build_model(cfg).eval(), "decode", accel="auto")
    model.load_state_dict(reference.state_dict())
    src = torch.randint(4, 50, (5, 9))
    src[1, 6:] = 0  # padding
    out, queries = {}, []  # the native attention's query counts per block: 1 self-attention, 4 (beams) cross
    kernel = native.few_query_attention

    def counted(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        queries.append(q.shape[2])
        return kernel(q, *args, **kwargs)

    monkeypatch.setattr(native, "few_query_attention", counted)
    for flag in ("0", "1"):
        monkeypatch.setattr(SETTINGS, "native", flag == "1")
        out[flag] = translate(model, src, beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=5, bos_id=1, eos_id=2,
                              pad_id=0, n_best=2)
        if flag == "0":
            assert queries == []
    assert 1 in queries and 4 in queries  # both attentions of the fast step went through the kernel
    queries.clear()
    out["reference"] = translate(reference, src, beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=5, bos_id=1,
                                 eos_id=2, pad_id=0, n_best=2)
    assert queries == []
    for a, b, r in zip(out["0"], out["1"], out["reference"], strict=True):
        assert [h.tokens for h in b] == [h.tokens for h in r]
        for x, y in zip(b, r):
            assert x.score == pytest.approx(y.score, abs=1e-4)
        assert [h.tokens for h in a] == [h.tokens for h in b]
        for x, y in zip(a, b):
            assert x.score == pytest.approx(y.score, abs=1e-4)


@needs_native
@pytest.mark.parametrize("m,k,n", [(1, 512, 2048), (4, 37, 1031), (3, 5, 3), (2, 2048, 300), (7, 64, 130)])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_rows_linear_equals_reference(m: int, k: int, n: int, activation: str | None) -> None:
    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k + 3, generator=g)[:, 3:]  # rows with a stride of their own
    wt = torch.randn(n, k, generator=g).t().contiguous() / k ** 0.5  # a column-major weight's transpose
    bias = torch.randn(n, generator=g)
    for b in (bias, None):
        want = native.rows_linear_reference(x.double(), wt.double(), None if b is None else b.double(), activation)
        got = native.rows_linear(x, wt, b, activation)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-5)
    assert native.rows_linear(x[None], wt, bias).shape == (1, m, n)  # leading dimensions kept
    with pytest.raises(ValueError, match="contiguous rows"):
        native.rows_linear(x, wt.t().contiguous().t(), bias)  # a (K, N) view with strided rows
    with pytest.raises(ValueError, match=r"x \(\.\.\., "):
        native.rows_linear(x[:, 1:], wt, bias)  # the wrong width


@needs_native
@pytest.mark.parametrize("m,d,v", [(1, 384, 5003), (4, 37, 1031), (3, 8, 3), (2, 512, 64), (1, 5, 1), (9, 64, 130)])
def test_int8_screen_equals_reference(m: int, d: int, v: int) -> None:
    g = torch.Generator().manual_seed(m * d + v)
    x = torch.randn(m, d + 3, generator=g)[:, 3:]  # rows with a stride of their own
    q = torch.randint(-127, 128, (v, d), generator=g, dtype=torch.int8)
    q[0] = 127  # a same-sign row: the largest sum
    scales = torch.rand(v, generator=g) / 100
    want = native.int8_screen_reference(x.double(), q, scales.double())
    torch.testing.assert_close(native.int8_screen(x, q, scales).double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        native.int8_screen(x, torch.zeros(4, d + 1, dtype=torch.int8)[:, :d], scales[:1].expand(4))  # strided
    with pytest.raises(ValueError, match="do not fit"):
        native.int8_screen(torch.randn(2, d + 1), q, scales)  # another width
    with pytest.raises(ValueError, match="do not fit"):
        native.int8_screen(x, q, scales.double())


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch (and so the native kernels) at ``n`` threads inside."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@needs_native
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 256, 768), (4, 37, 5), (3, 512, 2049), (2, 8, 1), (6, 64, 33), (4, 1000, 7)])
def test_int8_rows_linear_equals_reference(m: int, k: int, n: int, activation: str | None) -> None:
    """Any row count (blocks of 4), widths that are not whole vectors, an odd last output, both thread counts."""
    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k + 3, generator=g)[:, 3:]  # rows with a stride of their own
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    q[0] = 127  # a same-sign row: the largest sum
    scales, bias = torch.rand(n, generator=g) / k, torch.randn(n, generator=g)
    for b in (bias, None):
        want = native.int8_rows_linear_reference(x.double(), q, scales.double(), None if b is None else b.double(),
                                                 activation)
        for threads in (1, 2):
            with _threads(threads):
                got = native.int8_rows_linear(x, q, scales, b, activation)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    plan = native.int8_rows_linear_plan(q, scales, bias, activation)
    assert plan(x[None]).shape == (1, m, n)  # leading dimensions kept
    if n > 1:
        with pytest.raises(ValueError, match="contiguous rows"):
            native.int8_rows_linear(x, q.t().contiguous().t(), scales, bias)  # column-major
    with pytest.raises(ValueError, match="int8"):
        native.int8_rows_linear(x, q.float(), scales, bias)
    with pytest.raises(ValueError, match=r"x \(\.\.\., "):
        native.int8_rows_linear(x[:, 1:], q, scales, bias)  # the wrong width


@needs_native
def test_gelu_matches_torch_over_its_range() -> None:
    x = torch.linspace(-12, 12, 20001)
    got = native.rows_linear(x[:, None], torch.ones(1, 1), None, "gelu")[:, 0]
    want = torch.nn.functional.gelu(x.double())
    assert (got.double() - want).abs().max() < 1e-6  # torch's own fp32 GELU is about 1.2e-6 off here


@needs_native
def test_packed_linear_takes_rows_linear_for_a_few_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A column-major PackedLinear serves up to MAX_LINEAR_ROWS rows by the native kernel, more rows and
    the native setting off by its other products; plans kept across frozen blocks follow the switch."""
    from aiayn.accel.cpu.layout import column_major_linears
    from aiayn.accel.cpu.packed import PackedLinear, frozen_weights

    torch.manual_seed(0)
    layer = column_major_linears(torch.nn.Linear(64, 200))
    fast = PackedLinear.from_linear(layer)
    calls = []
    make_plan = native.rows_linear_plan

    def counted_plan(*args: object) -> object:
        plan = make_plan(*args)
        return lambda x: calls.append(x.shape) or plan(x)

    monkeypatch.setattr(native, "rows_linear_plan", counted_plan)
    x = torch.randn(native.MAX_LINEAR_ROWS + 1, 64)
    few = x[:native.MAX_LINEAR_ROWS]
    with torch.inference_mode():
        for rows in (x[:1], few, x):
            torch.testing.assert_close(fast(rows, activation="gelu"), torch.nn.functional.gelu(layer(rows)),
                                       rtol=1e-5, atol=1e-5)
        assert calls == [x[:1].shape, few.shape]
        for flag, used in (("0", False), ("1", True)):
            monkeypatch.setattr(SETTINGS, "native", flag == "1")
            calls.clear()
            with frozen_weights():
                fast(few)
            assert bool(calls) == used


@needs_native
@pytest.mark.parametrize("m", [1, 5, 6, 7, 128, 131])
@pytest.mark.parametrize("k,n", [(256, 768), (70, 33), (1030, 16), (3, 5)])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_panel_linear_equals_reference(m: int, k: int, n: int, activation: str | None) -> None:
    """Every edge of the blocking: rows past a 6-row block, outputs past a panel, inputs past a 512-input slice."""
    g = torch.Generator().manual_seed(m * k + n)
    x = torch.randn(m, k + 3, generator=g)[:, 3:]  # rows with a stride of their own
    w = torch.randn(n, k, generator=g).t().contiguous().t() / k ** 0.5  # column-major, as the layout leaves it
    bias = torch.randn(n, generator=g)
    for b in (bias, None):
        want = native.panel_linear_reference(x.double(), w.double(), None if b is None else b.double(), activation)
        torch.testing.assert_close(native.panel_linear(x, w, b, activation).double(), want, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(native.panel_linear(x, w.contiguous(), b, activation).double(), want,
                                   rtol=1e-5, atol=2e-5)  # a row-major weight packs the same


@needs_native
def test_panel_linear_one_thread_and_leading_dimensions() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 70, 300), torch.randn(520, 300), torch.randn(520)
    want = native.panel_linear_reference(x, w, b)
    with _threads(1):
        one = native.panel_linear(x, w, b)
    assert one.shape == (2, 70, 520)
    torch.testing.assert_close(one, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(native.panel_linear(x, w, b), one, rtol=1e-5, atol=1e-4)
    assert native.panel_linear(x[:, :0], w, b).shape == (2, 0, 520)  # no rows


@needs_native
def test_pack_panels_layout_and_bad_input() -> None:
    wd = native.panel_width()
    n, k = wd + 3, 5
    w = torch.arange(n * k, dtype=torch.float32).view(n, k)
    packed = native.pack_panels(w).view(2, k, wd)  # two panels, each k rows of wd outputs
    assert torch.equal(packed[0], w[:wd].t())
    assert torch.equal(packed[1, :, :3], w[wd:].t()) and not packed[1, :, 3:].any()  # zeros past n
    with pytest.raises(ValueError, match="not pack_panels"):
        native.panel_linear_plan(w, packed=packed.flatten()[:-1])
    with pytest.raises(ValueError, match="bias"):
        native.panel_linear(torch.randn(8, k), w, torch.randn(n + 1))
    with pytest.raises(ValueError, match=r"x \(\.\.\., 5\)"):
        native.panel_linear(torch.randn(8, k + 1), w)


def test_panel_linear_is_preferred_on_avx2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    built = native.library() is not None
    for capability, want in (("AVX2", built), ("AVX512", False), ("DEFAULT", False)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert native.panel_linear_preferred() is want
    monkeypatch.setattr(SETTINGS, "native", False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert native.panel_linear_preferred() is False


@needs_native
def test_packed_linear_takes_panel_linear_for_many_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where preferred, a PackedLinear serves from PANEL_MIN_ROWS rows by the panel kernel, equal to nn.Linear; a
    weight changed in place between frozen blocks is packed again; elsewhere its other products serve."""
    from aiayn.accel.cpu.layout import column_major_linears
    from aiayn.accel.cpu.packed import PackedLinear, frozen_weights

    torch.manual_seed(0)
    layer = column_major_linears(torch.nn.Linear(64, 200))
    fast = PackedLinear.from_linear(layer)
    calls = []
    make_plan = native.panel_linear_plan

    def counted_plan(*args: object, **kwargs: object) -> object:
        plan = make_plan(*args, **kwargs)
        return lambda x: calls.append(x.shape) or plan(x)

    monkeypatch.setattr(native, "panel_linear_plan", counted_plan)
    x = torch.randn(2, 40, 64)
    for preferred in (True, False):
        monkeypatch.setattr(native, "panel_linear_preferred", lambda p=preferred: p)
        calls.clear()
        with torch.no_grad():
            for rows in (x[0, :native.MAX_LINEAR_ROWS], x):
                with frozen_weights():
                    torch.testing.assert_close(fast(rows, activation="relu"), layer(rows).relu(), rtol=1e-5,
                                               atol=1e-5)
            assert calls == ([x.shape] if preferred else [])
            if preferred:
                layer.weight.mul_(-1)  # in place: the packed copy and the kept plan must not survive it
                with frozen_weights():
                    torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)


@needs_native
def test_panel_linear_from_several_threads_at_once() -> None:
    """Each calling thread packs its input into its own scratch: concurrent calls of different sizes stay right."""
    import concurrent.futures

    torch.manual_seed(0)
    w, b = torch.randn(300, 200), torch.randn(300)
    plan = native.panel_linear_plan(w, b)
    xs = [torch.randn(rows, 200) for rows in (7, 130, 64, 5, 300, 12) * 3]
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(plan, xs))
    for x, y in zip(xs, got):
        torch.testing.assert_close(y, native.panel_linear_reference(x, w, b), rtol=1e-5, atol=1e-4)


@needs_native
def test_wide_layers_take_the_panel_kernel_from_two_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layers at least PANEL_FEW_ROWS_MIN_FEATURES wide in and out take the panel kernel from two rows where it is
    preferred; one row, and narrower layers up to MAX_LINEAR_ROWS rows, stay with rows_linear."""
    from aiayn.accel.cpu.layout import column_major_linears
    from aiayn.accel.cpu.packed import PackedLinear

    width = native.PANEL_FEW_ROWS_MIN_FEATURES
    monkeypatch.setattr(native, "panel_linear_preferred", lambda: True)
    used = []
    for name in ("panel_linear_plan", "rows_linear_plan"):
        make = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, _make=make, _name=name, **k: used.append(_name) or _make(*a, **k))
    torch.manual_seed(0)
    for n_in, n_out, rows, want in ((width, width, 2, "panel_linear_plan"), (width, width, 1, "rows_linear_plan"),
                                    (width // 2, width, 4, "rows_linear_plan"),
                                    (width, width // 2, native.PANEL_MIN_ROWS, "panel_linear_plan")):
        layer = column_major_linears(torch.nn.Linear(n_in, n_out))
        fast = PackedLinear.from_linear(layer)
        x = torch.randn(rows, n_in)
        used.clear()
        with torch.no_grad():
            torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-4)
        assert used == [want], (n_in, n_out, rows)


@needs_native
@pytest.mark.parametrize("m,k,n", [(7, 70, 33), (64, 130, 200), (131, 512, 1000)])
def test_panel_linear_once_equals_reference_across_blocks(monkeypatch: pytest.MonkeyPatch, m: int, k: int,
                                                          n: int) -> None:
    """Blocks of whole panels, a last block and a last panel that are partial, a strided weight, bias, out=."""
    g = torch.Generator().manual_seed(m + k + n)
    x = torch.randn(m, k + 2, generator=g)[:, 2:]
    w_t = torch.randn(k, n, generator=g) / k ** 0.5  # w = w_t.T: strides (1, n), a weight's transposed view
    bias = torch.randn(n, generator=g)
    for block in (native.PANEL_ONCE_BLOCK_FLOATS, 3 * native.panel_width() * k, 1):  # one, several, one panel each
        monkeypatch.setattr(native, "PANEL_ONCE_BLOCK_FLOATS", block)
        for b in (bias, None):
            want = native.panel_linear_reference(x.double(), w_t.t().double(), None if b is None else b.double())
            torch.testing.assert_close(native.panel_linear_once(x, w_t.t(), b).double(), want, rtol=1e-5, atol=2e-5)
            out = torch.full((m, n + 5), float("nan"))[:, :n]  # rows with a stride of their own
            assert native.panel_linear_once(x, w_t.t(), b, out=out) is out
            torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-5)


@needs_native
def test_panel_linear_once_sees_a_changed_weight_and_checks_its_arguments() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 9, 40), torch.randn(300, 40)
    first = native.panel_linear_once(x, w)
    assert first.shape == (2, 9, 300)
    w.mul_(2.0)  # an optimizer step: nothing packed before may be used again
    torch.testing.assert_close(native.panel_linear_once(x, w), 2 * first, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="bias"):
        native.panel_linear_once(x, w, torch.randn(600)[::2])
    with pytest.raises(ValueError, match=r"out \(18, 300\)"):
        native.panel_linear_once(x, w, out=torch.empty(300, 18).t())
    with pytest.raises(ValueError, match=r"x \(\.\.\., 40\)"):
        native.panel_linear_once(torch.randn(3, 41), w)
