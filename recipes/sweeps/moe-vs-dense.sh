#!/bin/bash
# A dense and a mixture-of-experts char-level model of Tiny Shakespeare (recipes/shakespeare-char-cpu.toml and
# recipes/shakespeare-char-moe.toml: the same 6 x 192 model, the MoE one with 4 experts of the same width and one
# expert per token, so equal active parameters) trained side by side for the same wall time, one thread each, then
# compared. Both stop at MINUTES into the same 2900-step schedule. Run from the repository root:
#
#   bash recipes/sweeps/moe-vs-dense.sh OUT_DIR MINUTES
#
# Prints one line per model: steps, tokens/s (median of the logged steps), the last validation loss, parameters
# stored, and for the MoE model the heaviest and lightest expert's share of the tokens at the last logged step.
set -euo pipefail
if [ $# -lt 2 ]; then sed -n 2,11p "$0"; exit 2; fi
out=$1 minutes=$2
aiayn="python3 -m aiayn.cli.main"
[ -x .venv/bin/python ] && aiayn=".venv/bin/python -m aiayn.cli.main"
mkdir -p "$out"
for name in dense moe; do
  recipe=recipes/shakespeare-char-cpu.toml
  [ $name = moe ] && recipe=recipes/shakespeare-char-moe.toml
  [ -e "$out/$name" ] && { echo "$out/$name exists: choose another OUT_DIR" >&2; exit 2; }
  $aiayn train $recipe train.threads=1 train.progress=false train.max_minutes="$minutes" train.eval_every=250 \
    train.out_dir="$out/$name" > "$out/$name.log" 2>&1 &
done
wait
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
$python - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path

from aiayn.models.stats import count_parameters
from aiayn.pretrained import load_pretrained

out = Path(sys.argv[1])
print("| model | steps | tokens/s | val loss | parameters | expert load max / min |")
print("| --- | --- | --- | --- | --- | --- |")
for name in ("dense", "moe"):
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = max(r["step"] for r in rows if "step" in r)
    speed = statistics.median(r["tokens_per_s"] for r in rows if "tokens_per_s" in r)
    val = [r["val_loss"] for r in rows if "val_loss" in r][-1]
    params = count_parameters(load_pretrained(out / name / "last", accel="none").model)
    load = [r for r in rows if "moe_load_max" in r]
    loads = f"{load[-1]['moe_load_max']:.3f} / {load[-1]['moe_load_min']:.3f}" if load else "-"
    print(f"| {name} | {steps} | {speed:,.0f} | {val:.3f} | {params / 1e6:.2f}M | {loads} |")
PY
