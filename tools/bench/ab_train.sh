#!/bin/bash
# Two fsdp-train binaries against each other on the same job, alternating
# (so the machine's drift hits both), ROUNDS times: each run's median
# tokens/s over its steps after the first two, then the medians of both and
# their ratio. For a change's before and after: build the old commit into
# another build directory and pass both programs.
#
#   tools/bench/ab_train.sh OLD_FSDP_TRAIN NEW_FSDP_TRAIN ROUNDS [fsdp-train flags...]
#   (default flags add --data data/fortunes-train.bin --log-every 1)
set -eu
old=$1 new=$2 rounds=$3
shift 3
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq "$rounds"); do
    for v in old new; do
        bin=$old
        [ "$v" = new ] && bin=$new
        "$bin" --data "$root/data/fortunes-train.bin" --log "$work/$v-$r.jsonl" --log-every 1 "$@" \
            >"$work/$v-$r.out" 2>&1 || { echo "$v run $r failed:"; tail -3 "$work/$v-$r.out"; exit 1; }
    done
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for v in ("old", "new"):
    runs = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l) for l in open(f"{work}/{v}-{r}.jsonl") if '"tokens_per_s"' in l]
        runs.append(statistics.median(s["tokens_per_s"] for s in steps[2:]))
    med[v] = statistics.median(runs)
    print(f"{v}: {' '.join(f'{x:.0f}' for x in runs)} tokens/s; median {med[v]:.0f}")
print(f"new/old: {med['new'] / med['old']:.3f}")
PY
