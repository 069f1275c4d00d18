#!/bin/sh
# The long chaos run (about 30 minutes on 2 cores, with the tiny model): at a fixed world size,
# 10 faults of every kind (SIGKILL, SIGSTOP, preemption, storage fault, kill
# during a commit: 50 in all) against a 2000-step run, whose final digest
# must equal a fault-free run's; then 60 host-file changes and kills with
# every reshard verified and the sample stream checked. Faults are placed on
# training steps drawn from the seed (recovery/chaos.c), so every planned
# fault lands on any machine; the tests assert each one's effect.
# CHAOS_SEED=N picks other seeds for both runs (default 11 and 12).
set -eu
cd "$(dirname "$0")/.."
./tools/setup.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
export FSDP_BUILD="$PWD/build"
seed=${CHAOS_SEED:-11}
CHAOS_MODEL="--model tiny" \
CHAOS_STEPS=2000 \
CHAOS_SPEC="seed=$seed,kill=10,stop=10,preempt=10,storage=10,commit=10" \
CHAOS_HOSTS_SPEC="seed=$((seed + 1)),hosts=40,kill=20" \
CHAOS_HOSTS_STEPS=2500 \
    /usr/bin/python3 tests/chaos/test_super.py chaos_at_a_fixed_world_size_keeps_the_digest \
    chaos_with_host_changes_verifies_every_reshard
