#!/bin/sh
# The demo: installs what is missing, builds, turns the English fortunes that
# Debian's fortunes package ships into byte-level tokens, and trains the tiny
# GPT-2 on 2 Open MPI ranks (fully sharded parameters, gradients and AdamW
# state) with sharded checkpoints in data/demo-ckpt. Part way through, every
# process of the job is killed with SIGKILL; the relaunch resumes from the
# newest committed checkpoint, finishes, verifies the checkpoints and prints
# the loss going down and a text sample.
set -eu
cd "$(dirname "$0")/.."
./tools/setup.sh
if [ ! -f build/build.ninja ]; then
    meson setup build >/dev/null
fi
meson compile -C build >/dev/null

mkdir -p data
rm -rf data/demo-ckpt data/demo-log.jsonl
files=$(ls /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$')
# shellcheck disable=SC2086
./build/src/fsdp-data prepare --doc-sep % --out data/fortunes-train.bin \
    --val-out data/fortunes-val.bin $files

if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
ARGS="--model tiny --data data/fortunes-train.bin --val-data data/fortunes-val.bin
      --global-batch 8 --steps 800 --val-every 100 --log-every 50
      --ckpt data/demo-ckpt --ckpt-every 100 --keep 3 --log data/demo-log.jsonl"
committed() {
    ./build/tools/fsdp-ckpt ls data/demo-ckpt | grep -c committed || true
}

# First launch, in a session of its own so that every process of the job
# can be killed at once.
# shellcheck disable=SC2086
setsid mpirun --oversubscribe -np 2 ./build/src/fsdp-train $ARGS &
job=$!
while [ "$(committed)" -lt 3 ] && kill -0 "$job" 2>/dev/null; do
    sleep 0.2
done
echo "demo: three checkpoints committed; killing every process of the job with SIGKILL" >&2
pkill -KILL -s "$job" 2>/dev/null || true
wait "$job" 2>/dev/null || true
./build/tools/fsdp-ckpt ls data/demo-ckpt >&2

echo "demo: relaunching; the trainer resumes from the newest committed checkpoint" >&2
# shellcheck disable=SC2086
mpirun --oversubscribe -np 2 ./build/src/fsdp-train $ARGS --sample 500

./build/tools/fsdp-ckpt verify data/demo-ckpt >&2
/usr/bin/python3 - <<'PY'
import json
steps = [json.loads(l) for l in open("data/demo-log.jsonl")]
first, last = steps[0], steps[-1]
vals = [s["val_loss"] for s in steps if "val_loss" in s]
redone = len(steps) - len({s["step"] for s in steps})
print(f"demo: training loss {first['loss']:.3f} -> {last['loss']:.3f}, "
      f"validation loss {vals[0]:.3f} -> {vals[-1]:.3f} over {last['step']} steps; "
      f"{redone} steps redone after the kill")
PY
