#!/bin/sh
# The demo: installs what is missing, builds, turns the English fortunes that
# Debian's fortunes package ships into byte-level tokens, and trains the tiny
# GPT-2 under fsdp-super on 2 Open MPI ranks (fully sharded parameters,
# gradients and AdamW state) with sharded checkpoints in data/demo-ckpt.
# Part way through, the supervisor's chaos injector SIGKILLs a rank; the
# supervisor notices, stops the whole job, relaunches it, the trainer
# resumes from the newest committed checkpoint, and at the end the
# supervisor prints its recovery summary and the trainer a text sample.
set -eu
cd "$(dirname "$0")/.."
./tools/setup.sh
if [ ! -f build/build.ninja ]; then
    meson setup build >/dev/null
fi
meson compile -C build >/dev/null

mkdir -p data
rm -rf data/demo-ckpt data/demo-log.jsonl data/demo-events.jsonl
files=$(ls /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$')
# shellcheck disable=SC2086
./build/src/fsdp-data prepare --doc-sep % --out data/fortunes-train.bin \
    --val-out data/fortunes-val.bin $files

./build/recovery/fsdp-super --np 2 --heartbeat-timeout 10 --restart-backoff 0.5 \
    --events data/demo-events.jsonl --chaos "seed=1,kill=1" -- \
    ./build/src/fsdp-train --model tiny \
    --data data/fortunes-train.bin --val-data data/fortunes-val.bin \
    --global-batch 8 --steps 800 --val-every 100 --log-every 50 \
    --ckpt data/demo-ckpt --ckpt-every 100 --keep 3 --log data/demo-log.jsonl --sample 500

./build/tools/fsdp-ckpt ls data/demo-ckpt >&2
./build/tools/fsdp-ckpt verify data/demo-ckpt >&2
/usr/bin/python3 tools/report.py data/demo-log.jsonl --events data/demo-events.jsonl \
    --out data/demo-report.png
/usr/bin/python3 - <<'PY'
import json
steps = [json.loads(l) for l in open("data/demo-log.jsonl")]
first, last = steps[0], steps[-1]
vals = [s["val_loss"] for s in steps if "val_loss" in s]
events = [json.loads(l) for l in open("data/demo-events.jsonl")]
chaos = [e for e in events if e["event"] == "chaos"]
resumed = [e["step"] for e in events if e["event"] == "resumed" and e["step"] > 0]
print(f"demo: training loss {first['loss']:.3f} -> {last['loss']:.3f}, "
      f"validation loss {vals[0]:.3f} -> {vals[-1]:.3f} over {last['step']} steps; "
      f"{len(chaos)} rank killed, resumed from step {resumed}")
PY
