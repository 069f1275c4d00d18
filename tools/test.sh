#!/bin/sh
# The whole test suite, from a fresh Debian 12 machine: installs what is
# missing, builds the default (release, -Werror), the sanitizer (ASan +
# UBSan) and the ThreadSanitizer configurations, runs every suite on the
# first, the unit tests, the bad-input suite and the single-process
# integration tests on the second, the tests whose code runs threads of our
# own on the third, a short run of every libFuzzer target (clang, ASan +
# UBSan, tests/fuzz) on the fourth, and ends with one line: "N passed, M
# failed", followed by ", K skipped (names)" when some were skipped (the GPU
# tests, where there is no GPU).
#
#   tools/test.sh                  everything
#   tools/test.sh --suite unit     only some suites of the default build
set -u
cd "$(dirname "$0")/.."
./tools/setup.sh || { echo "0 passed, 1 failed (setup)"; exit 1; }
# The CUDA toolkit's compiler, where the machine has one: the default build
# then compiles and links the CUDA backend (-Dcuda=auto); its tests need a
# GPU and are skipped without one (tools/device-check.sh runs them).
if [ -x /usr/local/cuda/bin/nvcc ]; then
    PATH=$PATH:/usr/local/cuda/bin
    export PATH
fi

configure() { # DIR ARGS...
    dir=$1
    shift
    if [ -f "$dir/build.ninja" ]; then
        meson setup --reconfigure "$dir" "$@" >"$dir.setup.log" 2>&1
    else
        meson setup "$dir" "$@" >"$dir.setup.log" 2>&1
    fi || { cat "$dir.setup.log"; return 1; }
    meson compile -C "$dir" || return 1
}

build_failed=0
configure build || build_failed=$((build_failed + 1))
rm -f build/meson-logs/*.json build-asan/meson-logs/*.json build-tsan/meson-logs/*.json \
    build-fuzz/meson-logs/*.json
if [ -f build/build.ninja ]; then
    if [ $# -eq 0 ]; then
        meson test -C build --print-errorlogs --no-suite tsan
    else
        meson test -C build --print-errorlogs "$@"
    fi
fi
if [ $# -eq 0 ]; then
    configure build-asan -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Dcuda=disabled ||
        build_failed=$((build_failed + 1))
    # Open MPI and OpenBLAS keep allocations alive until exit; leak reports
    # from them are noise, so leak checking covers the unit tests only. Any
    # undefined behaviour ends the process (and fails the test).
    export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
    ASAN_OPTIONS=detect_leaks=1 meson test -C build-asan --print-errorlogs --logbase unit \
        --suite unit
    FSDP_QUICK=1 ASAN_OPTIONS=detect_leaks=0 meson test -C build-asan --print-errorlogs \
        --logbase programs \
        cli token-files checkpoint reshard no-loss bad-inputs bad-files formats s3-signing-and-storage \
        knobs llama llama-hf snapshots hdf5-data fp16
    # ThreadSanitizer: our threads (async checkpoint writers, the O_DIRECT
    # I/O thread, the parallel chunk readers and verifiers, S3 requests from
    # several threads, the heartbeat thread; flash.cu's kernels on emulated
    # CUDA threads, where a missing barrier is a race) with Open MPI's own reports
    # suppressed (tests/sanitizers/tsan.supp) and one OpenMP thread per rank
    # (GCC's libgomp is not instrumented, so its barriers look like races).
    configure build-tsan -Db_sanitize=thread -Dbuildtype=debugoptimized -Dcuda=disabled ||
        build_failed=$((build_failed + 1))
    OMP_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1:exitcode=66:suppressions=$PWD/tests/sanitizers/tsan.supp" \
        meson test -C build-tsan --print-errorlogs --logbase tsan \
        storage ckpt s3-requests super-parsers tsan-async-checkpoint tsan-snapshots tsan-heartbeat \
        tsan-data-store \
        tsan-flash-emu
    # libFuzzer: every target over its seeds (the regression inputs among
    # them), then 20000 executions each (tests/fuzz/README.md)
    (export CC=clang && configure build-fuzz -Dfuzz=true -Db_sanitize=address,undefined \
        -Dbuildtype=debugoptimized) || build_failed=$((build_failed + 1))
    rm -f build-fuzz/meson-logs/*.json
    meson test -C build-fuzz --print-errorlogs --logbase fuzz --suite fuzz
fi

/usr/bin/python3 - "$build_failed" <<'PY'
import glob, json, sys
passed, failed, skipped = 0, int(sys.argv[1]), []
for log in sorted(glob.glob("build/meson-logs/*.json") + glob.glob("build-asan/meson-logs/*.json")
                  + glob.glob("build-tsan/meson-logs/*.json")
                  + glob.glob("build-fuzz/meson-logs/*.json")):
    for line in open(log):
        r = json.loads(line)
        if r["result"] == "SKIP":
            skipped.append(r["name"])
        elif r["result"] in ("OK", "EXPECTEDFAIL"):
            passed += 1
        else:
            failed += 1
            print(f"failed: {r['name']} ({log.split('/')[0]}): {r['result']}")
print(f"{passed} passed, {failed} failed" +
      (f", {len(skipped)} skipped ({', '.join(sorted(set(skipped)))})" if skipped else ""))
sys.exit(1 if failed else 0)
PY
