"""Smoke tests of the benchmark suite (``bench/``): each script's core function at a tiny size, so they cannot rot.

They check what makes a comparison valid (same weights, same output lengths, matched batch counts), not speed.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from aiayn import accel

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

pytest.importorskip("transformers")
import ab_revisions  # noqa: E402
import benchlib  # noqa: E402
import converted_gpt2  # noqa: E402
import generate_lm  # noqa: E402
import kernel_gains  # noqa: E402
import matmul_peak  # noqa: E402
import multi30k_epoch  # noqa: E402
import roofline  # noqa: E402
import run_all  # noqa: E402
import step_ops  # noqa: E402
import train_step_profile  # noqa: E402
import train_throughput  # noqa: E402
import translate_beam  # noqa: E402

HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None
TINY_LM = generate_lm.LMSize(n_layers=1, d_model=32, n_heads=2, vocab_size=97, max_len=64)


def test_alternate_interleaves_and_table_formats() -> None:
    calls: list[str] = []
    times = benchlib.alternate({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, runs=2, warmup=1)
    assert calls == ["a", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}
    text = benchlib.table([{"x": 1.23456, "name": "n"}])
    assert "1.23" in text and "name" in text
    assert benchlib.peak_rss_mb() > 0


def test_alternate_starts_every_timed_run_with_the_garbage_collector_settled() -> None:
    """Garbage one contender leaves (here 600 reference cycles, under the collector's first threshold) is collected
    before the next timed run, not inside it; what was alive after the warm-up is frozen."""
    young_at_start: list[int] = []

    def litter() -> None:
        for _ in range(600):
            cycle: list = []
            cycle.append(cycle)

    try:
        benchlib.alternate({"litter": litter, "probe": lambda: young_at_start.append(gc.get_count()[0])},
                           runs=3, warmup=1)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    timed = young_at_start[1:]  # the first call is the warm-up's
    assert len(timed) == 3 and max(timed) < 50, young_at_start


def test_matmul_peak_counts_flops() -> None:
    out = matmul_peak.matmul_peak(n=64, runs=2, warmup=0)
    assert out["median_flops"] > 0 and out["best_flops"] >= out["median_flops"]
    from aiayn.accel.cpu.gemm import onednn_available

    libraries = out["by_library"]
    assert set(libraries) == ({"torch.mm", "onednn"} if onednn_available() else {"torch.mm"})
    assert out["median_flops"] == max(r["median_flops"] for r in libraries.values())  # the faster one counts
    assert out["library"] in libraries and libraries[out["library"]]["median_flops"] == out["median_flops"]
    products = matmul_peak.matmul_products(8)
    reference = products["torch.mm"]().clone()
    for name, fn in products.items():  # every library times the same product
        torch.testing.assert_close(fn(), reference, msg=name)


def test_peak_flops_by_median_or_by_fastest_product() -> None:
    times = {"torch.mm": [2.0, 1.0, 3.0], "onednn": [1.5, 1.5, 1.5], "aiayn": [0.1]}  # other contenders ignored
    assert matmul_peak.peak_flops(10, times) == (2000 / 1.5, "onednn")
    assert matmul_peak.peak_flops(10, times, fastest=True) == (2000 / 1.0, "torch.mm")


def test_gpt2_weight_copy_gives_the_same_model() -> None:
    ours, hf = generate_lm.build_pair(TINY_LM)
    ids = torch.randint(0, TINY_LM.vocab_size, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-4)


def test_generate_bench_forces_equal_lengths() -> None:
    out = generate_lm.bench_generate(TINY_LM, batches=(1, 2), prompt_len=3, new_tokens=4, runs=1, warmup=0)
    assert [r["batch"] for r in out["rows"]] == [1, 2]
    for r in out["rows"]:
        assert r["aiayn_tok_s"] > 0 and r["hf_tok_s"] > 0 and r["ratio_vs_hf"] > 0
        assert r["aiayn_int8_tok_s"] > 0 and 0 <= r["int8_same_tokens"] <= 1
        assert len(r["times_aiayn"]) == 1 and len(r["times_aiayn_int8"]) == 1
        assert r["floor_ms_per_step"] > 0 and r["fp32_bound_vs_hf"] > 0
        assert r["aiayn_bf16_tok_s"] > 0 and r["hf_bf16_tok_s"] > 0 and 0 <= r["bf16_same_tokens"] <= 1
        assert len(r["times_aiayn_bf16"]) == 1 and len(r["times_hf_bf16"]) == 1


def test_matmul_floor_covers_each_step_weight_once() -> None:
    """The floor multiplies by every distinct linear weight (tied ones once), skipping per-sentence ones."""
    ours, _ = generate_lm.build_pair(TINY_LM)
    weights = benchlib.step_linears(ours)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in ours.modules())
    assert len(weights) == n_linear  # the tied output layer is one nn.Linear sharing the embedding
    assert len({id(w) for w in weights}) == len(weights)
    size = translate_beam.Seq2SeqSize("tiny", d_model=32, d_ff=64, n_heads=4, n_layers=2, vocab_size=61)
    dec = translate_beam.aiayn_model(size).decoder
    per_step = benchlib.step_linears(dec, skip=("kv_proj",))
    assert len(per_step) == len(benchlib.step_linears(dec)) - 2  # one cross K/V projection per layer
    benchlib.matmul_floor(per_step, rows=3, steps=2)()  # runs


def test_aiayn_contenders_are_the_models_users_get(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding contenders are accelerated as ``load_pretrained`` does it (int8: its quantized copy, accelerated);
    ``AIAYN_ACCEL=none`` times the reference core instead."""
    size = translate_beam.Seq2SeqSize("tiny", d_model=32, d_ff=64, n_heads=4, n_layers=1, vocab_size=61)
    assert benchlib.has_accel_api()
    assert accel.describe(translate_beam.aiayn_model(size))
    assert not accel.describe(translate_beam.reference_model(size))
    assert accel.describe(translate_beam.aiayn_model(size, "int8")).get("Int8Linear")
    assert accel.describe(generate_lm.build_pair(TINY_LM)[0])
    assert not accel.describe(generate_lm.build_pair(TINY_LM, variant=None)[0])
    with pytest.raises(ValueError, match="variant"):
        benchlib.for_decoding(translate_beam.reference_model(size), "int4")
    monkeypatch.setenv(accel.ENV_VAR, "none")
    assert not accel.describe(translate_beam.aiayn_model(size))


def test_train_bench_aiayn_is_accelerated_and_agrees_with_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """"aiayn" trains the model accelerated as the trainer does, its loss through ``lm_head.loss``; the ablation
    ("aiayn-reference") is the reference core, and both give the same losses up to float rounding."""
    accelerated: list[torch.nn.Module] = []
    real = benchlib.for_training
    monkeypatch.setattr(benchlib, "for_training", lambda m: accelerated.append(real(m)) or accelerated[-1])
    cfg = dict(d_model=32, d_ff=64, n_heads=2, n_layers=1, vocab_size=120, max_len=64, dropout=0.0)
    losses = {}
    for setup in ("seq2seq-paper-base", "lm-gpt2-small"):
        for impl in ("aiayn", train_throughput.ABLATION):
            step, _ = train_throughput.build_step(setup, impl, cfg=cfg, shape=dict(batch=2, src=5, tgt=6))
            losses[setup, impl] = [step() for _ in range(3)]
        assert losses[setup, "aiayn"] == pytest.approx(losses[setup, train_throughput.ABLATION], rel=1e-4)
    assert len(accelerated) == 2 and all(accel.describe(m).get("LMHead.loss_kernel=fused_loss") for m in accelerated)


def test_translate_bench_forces_equal_lengths() -> None:
    size = translate_beam.Seq2SeqSize("tiny", d_model=32, d_ff=64, n_heads=4, n_layers=1, vocab_size=61)
    out = translate_beam.bench_translate([size], batches=(2,), src_len=5, out_len=4, rounds=1, runs=1, warmup=0)
    (row,) = out["rows"]
    assert row["out_lengths"]["aiayn"] == [5] and row["out_lengths"]["transformers"] == [5]
    assert row["out_lengths"]["aiayn-int8"] == [5] and row["aiayn_int8_sent_s"] > 0
    assert row["out_lengths"]["aiayn-bf16"] == [5] and row["out_lengths"]["transformers-bf16"] == [5]
    assert row["aiayn_bf16_sent_s"] > 0 and row["bf16_ratio_vs_hf_bf16"] > 0
    assert row["floor_ms_per_step"] > 0 and row["fp32_bound_vs_hf"] > 0
    if HAS_CT2:
        assert row["out_lengths"]["ctranslate2-float32"] == [5] and row["out_lengths"]["ctranslate2-int8"] == [5]
        assert row["ct2_sent_s"] > 0 and row["ct2_int8_sent_s"] > 0
        assert row["out_lengths"]["ctranslate2-int8-parallel"] == [5] and row["ct2_int8_parallel_sent_s"] > 0
        assert row["int8_ratio_vs_ct2_int8_best_config"] <= row["int8_ratio_vs_ct2_int8"]  # the faster setting
    else:
        assert row["ct2_sent_s"] != row["ct2_sent_s"]  # NaN: CTranslate2 part skipped


def test_translate_bench_groups_contenders_by_library() -> None:
    groups = translate_beam.contender_groups(list(translate_beam.CONTENDERS))
    assert groups == [["aiayn", "aiayn-int8", "aiayn-bf16", "matmul-floor"], ["transformers", "transformers-bf16"],
                      ["ctranslate2-float32", "ctranslate2-float32-parallel", "ctranslate2-int8",
                       "ctranslate2-int8-parallel"]]
    assert sorted(n for g in groups for n in g) == sorted(translate_beam.CONTENDERS)  # each exactly once
    with pytest.raises(SystemExit):
        translate_beam.main(["--child", "aiayn,nope", "--spec", "{}"])


def test_translate_bench_batches_option_names_its_own_results(capsys: pytest.CaptureFixture[str]) -> None:
    assert translate_beam.results_name(translate_beam.DEFAULT_BATCHES, benchlib.THREADS) == "translate_beam"
    assert translate_beam.results_name((16,), 1) == "translate_beam-batch16-threads1"
    assert translate_beam.results_name((1, 32), 1) == "translate_beam-batch1-32-threads1"
    with pytest.raises(SystemExit):
        translate_beam.main(["--batches", "0", "--sizes", "multi30k"])
    assert "positive numbers of sentences" in capsys.readouterr().err


def test_ab_revisions_times_a_fixed_length_decode_and_checks_its_cases() -> None:
    size = translate_beam.Seq2SeqSize("tiny", d_model=32, d_ff=64, n_heads=4, n_layers=1, vocab_size=61)
    a = ab_revisions.time_case(size, batch=2, runs=2, src_len=5, out_len=4)
    assert len(a["times"]) == 2 and all(t > 0 for t in a["times"])
    assert a["digest"] == ab_revisions.time_case(size, batch=2, runs=1, src_len=5, out_len=4)["digest"]
    assert ab_revisions.parse_case("multi30k:32") == (translate_beam.SIZES["multi30k"], 32, False)
    assert ab_revisions.parse_case("int8-paper-base:1") == (translate_beam.SIZES["paper-base"], 1, True)
    int8 = ab_revisions.time_case(size, batch=2, runs=1, src_len=5, out_len=4, int8=True)
    assert len(int8["times"]) == 1 and int8["digest"]
    with pytest.raises(SystemExit, match="SIZE:BATCH"):
        ab_revisions.parse_case("multi30k")
    assert ab_revisions.checkout("WORKTREE", Path("/nonexistent")) == ab_revisions.REPO / "src"


def test_ab_revisions_times_greedy_generation() -> None:
    size = generate_lm.LMSize(n_layers=1, d_model=32, n_heads=2, vocab_size=300, max_len=64)
    a = ab_revisions.time_generate_case(2, runs=2, size=size, prompt_len=3, new_tokens=5)
    assert len(a["times"]) == 2 and a["units"] == 10
    assert a["digest"] == ab_revisions.time_generate_case(2, runs=1, size=size, prompt_len=3, new_tokens=5)["digest"]
    assert ab_revisions.parse_case("generate:16") == 16
    with pytest.raises(SystemExit, match="generate:BATCH"):
        ab_revisions.parse_case("generate:x")


def test_ab_revisions_times_training_steps_with_a_loss_digest() -> None:
    setup = ab_revisions.parse_case("train:seq2seq-multi30k-tiny")
    assert setup == "seq2seq-multi30k-tiny"
    a = ab_revisions.time_train_case(setup, runs=2, quick=True)
    assert len(a["times"]) == 2 and a["units"] > 0
    assert a["digest"] == ab_revisions.time_train_case(setup, runs=2, quick=True)["digest"]  # same seed, same losses
    with pytest.raises(SystemExit, match="train:SETUP"):
        ab_revisions.parse_case("train:nonexistent")


def test_eos_mask_blocks_eos_until_the_last_call() -> None:
    head = torch.nn.Linear(3, 5)
    with translate_beam.EosMask(head, eos_id=2, n_calls=2) as mask:
        outs = [head(torch.randn(1, 3)) for _ in range(3)]
        mask.reset()
        again = head(torch.randn(1, 3))
    assert outs[0][0, 2] == float("-inf") and outs[1][0, 2] == float("-inf")
    assert torch.isfinite(outs[2]).all() and again[0, 2] == float("-inf")
    assert torch.isfinite(head(torch.randn(1, 3))).all()  # hook removed on exit


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_bench_runs_every_implementation(dtype: str) -> None:
    cfg = dict(d_model=32, d_ff=64, n_heads=2, n_layers=1, vocab_size=120, max_len=64)
    out = train_throughput.bench_train(quick=True, runs=1, warmup=0, memory=False, cfg=cfg,
                                       shape=dict(batch=2, src=5, tgt=6), dtype=dtype)
    impls = [(r["setup"], r["impl"]) for r in out["rows"]]
    assert impls == [(s, i) for s, v in train_throughput.SETUPS.items() for i in v["impls"]]
    for r in out["rows"]:
        assert r["tok_s"] > 0 and 0 < r["mfu"] and r["peak_gflops"] > 0 and r["dtype"] == dtype
        assert r["src"] == (0 if r["setup"].startswith("lm") else 5) and r["tgt"] == 6


def test_torch_seq2seq_baseline_learns() -> None:
    step, tokens = train_throughput.build_step("seq2seq-paper-base", "torch.nn.Transformer", cfg=dict(
        d_model=32, d_ff=64, n_heads=2, n_layers=1, vocab_size=50, max_len=32, dropout=0.0),
        shape=dict(batch=2, src=4, tgt=4))
    losses = [step() for _ in range(30)]
    assert tokens == 8 and losses[-1] < losses[0]
    assert losses[0] < 1.5 * math.log(50)  # a sane init (near-uniform logits), as aiayn's: no softmax underflow


def test_multi30k_epoch_bench_on_synthetic_pairs() -> None:
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(1, 20, (120,), generator=g).tolist()
    src = [torch.randint(5, 40, (n,), generator=g).tolist() for n in lens]
    tgt = [torch.randint(5, 40, (max(1, n + 2),), generator=g).tolist() for n in lens]
    cfg = multi30k_epoch.recipe_config(40, d_model=16, n_heads=2, d_ff=32, n_layers=1, n_encoder_layers=1)
    out = multi30k_epoch.bench_epoch(src, tgt, cfg, max_tokens=128, fraction=0.2)
    rows = {r["batching"]: r for r in out["rows"]}
    assert abs(rows["token_budget"]["batches"] - rows["fixed_size"]["batches"]) <= 1
    assert rows["token_budget"]["padding"] < rows["fixed_size"]["padding"]
    assert rows["fixed_size"]["speedup_vs_fixed"] == 1.0
    assert all(r["slice_batches"] >= 1 and r["epoch_s_est"] >= r["slice_s"] for r in rows.values())


def test_multi30k_loader_on_real_data(shared_data: Path) -> None:
    if not (shared_data / "multi30k" / "train.en.gz").exists():
        pytest.skip("multi30k not in shared data")
    src, tgt, vocab, prep = multi30k_epoch.load_tokenized(shared_data / "multi30k", vocab_size=300, limit=200)
    assert len(src) == len(tgt) > 150 and vocab <= 300 and set(prep) == {"read_s", "tokenizer_s", "encode_s"}


def test_train_step_profile_splits_kernel_time() -> None:
    row = train_step_profile.profile_setup("lm-gpt2-small", steps=1, quick=True, batch=12, rounds=1)  # own batch: 8
    assert row["batch"] == 12 and row["matmul_ms"] > 0 and row["other_ms"] > 0 and row["attention_ms"] > 0
    assert 0 < row["mfu"] < row["matmul_only_mfu"]  # the same FLOPs over less time
    # 2 layers: 4 products forward and 8 backward each, the output layer's 3, attention's bmm's
    assert row["products"] >= 2 * 12 + 3 and 0 < row["replay_ms"] < row["step_ms"]


def test_recorded_products_replay_the_same_calls_on_fresh_operands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every product of a step is recorded in order with its operands' shapes and strides (a transposed operand
    stays transposed; ``out=`` and in-place products keep their targets' layout), the native panel kernel's too,
    and nothing else; the replay runs the same products on operands of its own."""
    from aiayn.accel.cpu import native

    seen = []
    monkeypatch.setattr(native, "panel_linear_once",
                        lambda a, b, bias=None, out=None: seen.append((a.shape, b.shape)) or a @ b.T)
    x, w = torch.randn(6, 4), torch.randn(5, 4)
    acc, out = torch.zeros(4, 4), torch.empty(6, 5)

    def step() -> float:
        y = torch.relu(x @ w.t())  # mm of a transposed weight, then an op that is no product
        torch.mm(x, w.t(), out=out)
        acc.addmm_(x.t(), x)
        z = torch.bmm(y[None], y.t()[None])
        return float(native.panel_linear_once(x, w).sum() + z.sum())

    calls = train_step_profile.record_products(step)
    assert [c.func._schema.name if hasattr(c.func, "_schema") else "native" for c in calls] == [
        "aten::mm", "aten::mm", "aten::addmm_", "aten::bmm", "native"]
    assert calls[0].args[1].shape == (4, 5) and calls[0].args[1].stride() == (1, 4)  # w.t() as it was
    assert calls[1].keywords["out"].shape == (6, 5) and calls[2].args[0].shape == (4, 4)
    assert all(a is not x and a is not w for c in calls for a in c.args)  # fresh operands
    assert seen == [((6, 4), (5, 4))]  # the native product ran in the step ...
    assert train_step_profile.time_replay(calls) > 0 and seen == [((6, 4), (5, 4))] * 2  # ... and in the replay


def test_run_all_knows_every_script() -> None:
    for name in run_all.SCRIPTS:
        assert (BENCH / f"{name}.py").is_file()
    assert set(run_all.EXTRA_ARGS) <= set(run_all.SCRIPTS)
    for name in set(re.findall(r"`(\w+\.py)`", (BENCH / "README.md").read_text())):  # no deleted script described
        assert (BENCH / name).is_file(), name


def test_train_bench_leaves_out_the_ablation_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(train_throughput.SETUPS, "lm-gpt2-small",
                        {**train_throughput.SETUPS["lm-gpt2-small"], "impls": ("aiayn", train_throughput.ABLATION)})
    out = train_throughput.bench_train(["lm-gpt2-small"], quick=True, runs=1, warmup=0, memory=False,
                                       peak_flops=1e9, ablation=False)
    assert [r["impl"] for r in out["rows"]] == ["aiayn"]
    assert "--no-ablation" in run_all.EXTRA_ARGS["train_throughput"]


def test_memory_worker_reports_peak_rss() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker uses the caller's thread count; 1 is steadiest on a busy machine
    try:
        mem = train_throughput.measure_memory("lm-gpt2-small", "aiayn", quick=True)
    finally:
        torch.set_num_threads(threads)
    assert mem["peak_rss_mb"] > mem["delta_rss_mb"] > 0


def test_train_bench_batch_override_reaches_the_memory_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(train_throughput.SETUPS, "lm-gpt2-small",
                        {**train_throughput.SETUPS["lm-gpt2-small"], "impls": ("aiayn",)})
    out = train_throughput.bench_train(["lm-gpt2-small"], quick=True, runs=1, warmup=0, memory=True,
                                       shape={"batch": 3}, peak_flops=1e9)
    assert [(r["impl"], r["batch"]) for r in out["rows"]] == [("aiayn", 3)]
    assert out["rows"][0]["peak_rss_mb"] > 0
    with pytest.raises(ValueError, match="only a batch size"):
        train_throughput.bench_train(["lm-gpt2-small"], quick=True, memory=True, shape={"batch": 3, "tgt": 8})


def test_malloc_option_reaches_every_process_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--malloc keep-freed`` is exported, so each contender's subprocess applies it in ``benchlib.setup``."""
    import argparse
    import subprocess

    monkeypatch.setenv(benchlib.MALLOC_ENV, "glibc")  # restored afterwards
    p = argparse.ArgumentParser()
    benchlib.add_common_args(p)
    assert p.parse_args([]).malloc is None and benchlib.malloc_setting() == "glibc"
    assert p.parse_args(["--malloc", "keep-freed"]).malloc == "keep-freed"
    assert os.environ[benchlib.MALLOC_ENV] == "keep-freed" == benchlib.malloc_setting()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import benchlib; benchlib.setup(1); "
            "from aiayn.accel.cpu.allocator import keeps_freed_memory; "
            "print(benchlib.machine_info()['malloc'], keeps_freed_memory())")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, check=True)
    from aiayn.accel.cpu.allocator import malloc_is_glibcs

    assert out.stdout.split() == ["keep-freed", str(malloc_is_glibcs())]
    monkeypatch.setenv(benchlib.MALLOC_ENV, "jemalloc")
    with pytest.raises(ValueError, match="keep-freed"):
        benchlib.malloc_setting()


def test_ab_revisions_sets_each_sides_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--base-env`` / ``--head-env``: one revision timed under two settings, each child getting only its own."""
    parsed = ab_revisions.parse_env(["AIAYN_ACCEL=none", "X=a=b"])
    assert parsed == {"AIAYN_ACCEL": "none", "X": "a=b"}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        ab_revisions.parse_env(["AIAYN_ACCEL"])
    seen: list[tuple[str | None, str]] = []

    def fake_child(cmd: list[str], env: dict[str, str]) -> dict:
        seen.append((env.get("AIAYN_ACCEL"), env["PYTHONPATH"]))
        return {"times": [1.0], "units": 1, "digest": "d"}

    monkeypatch.setattr(ab_revisions.benchlib, "run_json_child", fake_child)
    payload = ab_revisions.bench_ab("WORKTREE", "WORKTREE", ["multi30k:1"], rounds=2, runs=1, threads=1,
                                    base_env={"AIAYN_ACCEL": "none"}, head_env={"AIAYN_ACCEL": "auto"})
    assert [setting for setting, _ in seen] == ["none", "auto", "none", "auto"]
    assert {path for _, path in seen} == {str(ab_revisions.REPO / "src")}
    assert payload["base_env"] == {"AIAYN_ACCEL": "none"} and payload["rows"][0]["same_output"]


def test_converted_gpt2_decodes_what_transformers_decodes(tmp_path: Path) -> None:
    from transformers import GPT2Config

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97, n_positions=64, bos_token_id=96,
                        eos_token_id=96)
    row = converted_gpt2.bench_converted(config, prompt_len=5, new_tokens=6, runs=1, folder=tmp_path, read_gb_s=10.0)
    assert row["same_tokens"] == 1.0 and row["new_tokens"] == 6
    assert row["aiayn_tok_s"] > 0 and row["hf_tok_s"] > 0 and row["from_hf_s"] > 0 and row["int8_tok_s"] > 0
    assert 0 < row["fraction_of_bound"] and 0 < row["int8_fraction_of_bound"] and 0 < row["hf_fraction_of_bound"]
    assert (tmp_path / "aiayn" / "model.safetensors").is_file() and (tmp_path / "hf-again" / "config.json").is_file()


def test_step_ops_counts_a_steps_operations_by_module() -> None:
    """A step's count is the same whatever the two decode lengths, and every operation is charged somewhere."""
    model = translate_beam.reference_model(translate_beam.Seq2SeqSize("tiny", 16, 32, 2, 1, 50))
    ops = step_ops.count(model, step_ops.seq2seq_decode)
    assert ops["MultiHeadAttention"] > 0 and ops[step_ops.OUTSIDE] > 0 and ops["benchmark's EOS mask"] == 3
    assert all(float(v).is_integer() for v in ops.values())  # the same operations at every step
    share = step_ops.time_share(model, step_ops.seq2seq_decode, runs=1)
    assert share["operators_ms"] > 0 and 0 < share["share_in_operators"] <= 1.0


def test_roofline_counts_the_weights_a_step_reads_at_their_stored_width() -> None:
    """fp32: every linear weight once (the tied output layer too); int8: a byte a weight; the bound and the
    fraction follow from them."""
    model = roofline.decoder(quick=True)
    linears = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert roofline.weight_bytes_per_token(model) == 4 * sum(linears.values())  # the reference: no screen
    fast, small = benchlib.for_decoding(roofline.decoder(quick=True)), benchlib.for_decoding(model, "int8")
    assert roofline.weight_bytes_per_token(small) < roofline.weight_bytes_per_token(fast) < 4 * sum(linears.values())
    payload = roofline.main(["--quick", "--threads", "1"])
    assert [r["variant"] for r in payload["rows"]] == ["float32", "int8"]
    for row in payload["rows"]:
        assert row["read_gb_s"] > 0 and 0 < row["fraction"] < 1
        assert row["bound_tok_s"] == pytest.approx(row["read_gb_s"] * 1e3 / row["weight_mb_per_token"])


def test_kernel_gains_times_every_path_on_the_same_weights() -> None:
    tiny = translate_beam.Seq2SeqSize("tiny", d_model=32, d_ff=64, n_heads=4, n_layers=2, vocab_size=61)
    medians, differ = kernel_gains.measure(lambda: translate_beam.reference_model(tiny), kernel_gains.beam_decode(2),
                                           greedy=False, runs=1)
    assert set(medians) == {kernel_gains.ALL_ON} | {p for p in kernel_gains.PATHS if "screen" not in p}
    assert all(t > 0 for t in medians.values()) and differ == []
