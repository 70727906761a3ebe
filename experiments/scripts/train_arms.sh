#!/usr/bin/env bash
# Training variants of one config side by side, each evaluated by the suite on the same held-out questions:
# the paired training comparison of issue 10 (the whole method against the plain agent) on one node.
#
#   experiments/scripts/train_arms.sh OUT "COMMON SETS" NAME "SETS" [NAME "SETS" ...]
#
# Every arm runs `kunlunlab train --config $CONFIG --set COMMON SETS` in OUT/NAME (one process per arm,
# $THREADS CPU threads each), then `kunlunlab suite` on its final checkpoint and its own held-out split
# ($SUITE_SETS, e.g. world_questions=200). Logs go to OUT/NAME.{train,suite}.log; a finished arm leaves
# OUT/NAME/suite/tables.md. Compare the arms afterwards with `kunlunlab compare-runs a=OUT/A b=OUT/B` and the
# suite records (paired by question id). Exits non-zero when any arm failed.
set -uo pipefail
set -f  # JSON values such as baselines=["naive_rag"] are words, not globs
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-experiments/configs/training/train_embedded_cpu.json}
THREADS=${THREADS:-4}
SUITE_SETS=${SUITE_SETS:-}
TRAIN_FLAGS=${TRAIN_FLAGS:-}  # e.g. --smoke
if [ $# -lt 4 ] || [ $(( ($# - 2) % 2 )) -ne 0 ]; then
    echo "usage: $0 OUT \"COMMON SETS\" NAME \"SETS\" [NAME \"SETS\" ...]" >&2
    exit 2
fi
out=$1; common=$2; shift 2
mkdir -p "$out"
pids=(); names=()
while [ $# -gt 0 ]; do
    name=$1; sets=$2; shift 2
    (
        # shellcheck disable=SC2086  # the sets are space-separated key=value words
        $PY -m kunlunlab.cli train --config "$CONFIG" --run-dir "$out/$name" $TRAIN_FLAGS --set threads=$THREADS $common $sets \
            >"$out/$name.train.log" 2>&1 || exit 1
        final="$out/$name/dapo/final"; [ -d "$final" ] || final="$out/$name/sft/final"
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$THREADS $PY -m kunlunlab.cli suite --model "$final" --train-config "$out/$name/train_config.json" \
            --out "$out/$name/suite" --set $SUITE_SETS >"$out/$name.suite.log" 2>&1
    ) &
    pids+=($!); names+=("$name")
done
status=0
for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then echo "arm ${names[$i]}: done"; else echo "arm ${names[$i]}: FAILED (see $out/${names[$i]}.*.log)"; status=1; fi
done
exit $status
