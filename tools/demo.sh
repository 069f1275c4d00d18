#!/bin/sh
# The demo: installs what is missing, builds, turns the English fortunes that
# Debian's fortunes package ships into byte-level tokens, trains the tiny
# GPT-2 on 2 Open MPI ranks with fully sharded parameters, gradients and
# optimizer state, and prints the loss going down and a text sample.
set -eu
cd "$(dirname "$0")/.."
./tools/setup.sh
if [ ! -f build/build.ninja ]; then
    meson setup build >/dev/null
fi
meson compile -C build >/dev/null

mkdir -p data
files=$(ls /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$')
# shellcheck disable=SC2086
./build/src/fsdp-data prepare --doc-sep % --out data/fortunes-train.bin \
    --val-out data/fortunes-val.bin $files

if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpirun --oversubscribe -np 2 ./build/src/fsdp-train --model tiny \
    --data data/fortunes-train.bin --val-data data/fortunes-val.bin \
    --global-batch 8 --steps 800 --val-every 100 --log-every 50 \
    --log data/demo-log.jsonl --sample 500

/usr/bin/python3 - <<'PY'
import json
steps = [json.loads(l) for l in open("data/demo-log.jsonl")]
first, last = steps[0], steps[-1]
vals = [s["val_loss"] for s in steps if "val_loss" in s]
print(f"demo: training loss {first['loss']:.3f} -> {last['loss']:.3f}, "
      f"validation loss {vals[0]:.3f} -> {vals[-1]:.3f} over {last['step']} steps")
PY
