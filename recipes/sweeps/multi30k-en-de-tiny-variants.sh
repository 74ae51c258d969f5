#!/bin/bash
# Variants of recipes/multi30k-en-de-tiny.toml trained side by side for the same wall time on one device (a
# GPU: every run shares it, so the comparison is at equal time, not equal steps), then each averaged over its
# last 10 checkpoints and scored with beam 4, alpha 1.0 on val and test_2016_flickr. A screen for ideas before
# a 2-hour CPU run of the recipe, not a substitute for one. Run from the repository root:
#
#   bash recipes/sweeps/multi30k-en-de-tiny-variants.sh OUT_DIR MINUTES NAME:KEY=VALUE,KEY=VALUE ...
#   e.g. ... runs/sweep 6.3 base: base-s2:train.seed=2 v10k:tokenizer.vocab_size=10000
#
# Prints one line per variant: name, steps reached, tokenized-lowercase BLEU on val and test. Logs, metrics
# and checkpoints are under OUT_DIR/NAME. Extra settings for every run: COMMON="key=value ..." (default: CUDA,
# 2 threads per run, validation every 2500 steps).
set -euo pipefail
if [ $# -lt 3 ]; then sed -n 2,13p "$0"; exit 2; fi
out=$1 minutes=$2
shift 2
recipe=recipes/multi30k-en-de-tiny.toml
data=../shared/data/multi30k
common=${COMMON:-"train.device=cuda train.threads=2 train.eval_every=2500"}
aiayn="python3 -m aiayn.cli.main"
mkdir -p "$out"
names=()
for spec in "$@"; do
  name=${spec%%:*} overrides=${spec#*:}
  [ -e "$out/$name" ] && { echo "$out/$name exists: choose another OUT_DIR or NAME" >&2; exit 2; }
  names+=("$name")
  # shellcheck disable=SC2086  # the settings are separate words on purpose
  $aiayn train $recipe $common train.progress=false train.max_minutes="$minutes" train.out_dir="$out/$name" \
    ${overrides//,/ } > "$out/$name.log" 2>&1 &
done
wait
score() {
  local name=$1 run=$out/$1
  $aiayn average --run "$run" --last 10 --out "$run/avg10" > /dev/null
  for split in val test_2016_flickr; do
    $aiayn evaluate --checkpoint "$run/avg10" --beam 4 --alpha 1.0 --src $data/$split.en.gz \
      --ref $data/$split.de.gz > "$run/eval-avg10-b4-a1.0-$split.json"
  done
  python3 - "$run" "$name" <<'PY'
import json, sys
run, name = sys.argv[1:]
steps = max(r["step"] for r in map(json.loads, open(f"{run}/metrics.jsonl")) if "step" in r)
bleu = [json.load(open(f"{run}/eval-avg10-b4-a1.0-{s}.json"))["tokenized_lowercase_bleu"] for s in ("val", "test_2016_flickr")]
print(f"{name:14s} steps {steps:6d}  val {bleu[0]:5.2f}  test {bleu[1]:5.2f}")
PY
}
for name in "${names[@]}"; do score "$name" & done
wait
