#!/bin/sh
# Runs libFuzzer targets of a -Dfuzz=true build: each over its seed corpus
# (tests/fuzz/corpus/TARGET), then RUNS mutated inputs with a fixed seed,
# one target at a time. Prints one line per target and exits non-zero if
# any target crashed (a sanitizer report, a broken property, a leak, a
# timeout or running out of memory all count).
#
#   tests/fuzz/run.sh BUILD_DIR [RUNS [TARGET...]]
#
#   RUNS      executions per target, the seeds first (libFuzzer's -runs;
#             default 20000)
#   TARGET    manifest_raw manifest_sealed chunk_index safetensors_header
#             token_header s3_xml hbmsg hosts notice hf_config llmc_header
#             (default: all)
#
# Environment:
#   FUZZ_MAX_TIME=S    stop a target after S seconds even if RUNS are not
#                      done (default 600; 0: no cap); the line says so
#   FUZZ_SEED=N        libFuzzer's -seed (default 1)
#   FUZZ_KEEP_CORPUS=DIR  keep the inputs found (DIR/TARGET), else discarded
#   FUZZ_NICE=N        run the targets under nice -n N (default 0)
#   FUZZ_ARGS="..."    more libFuzzer flags (e.g. -use_value_profile=1)
#
# Logs: BUILD_DIR/fuzz-logs/TARGET.log; a crashing input is written as
# BUILD_DIR/fuzz-artifacts/TARGET-crash-SHA1 (see README.md to minimise it).
set -u
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [RUNS [TARGET...]]" >&2
    exit 2
fi
build=$1
runs=${2:-20000}
if [ $# -ge 2 ]; then shift 2; else shift $#; fi
here=$(cd "$(dirname "$0")" && pwd)
targets=${*:-manifest_raw manifest_sealed chunk_index safetensors_header token_header s3_xml hbmsg hosts notice hf_config llmc_header}
max_time=${FUZZ_MAX_TIME:-600}
seed=${FUZZ_SEED:-1}
nice_n=${FUZZ_NICE:-0}
mkdir -p "$build/fuzz-logs" "$build/fuzz-artifacts" || exit 2

# Leaks are bugs here; any undefined behaviour ends the input (the build
# also compiles with -fno-sanitize-recover=all). ASan's quarantine of freed
# memory is cut from 256 to 32 MiB: on these VMs the first touch of a fresh
# page is slow (DESIGN.md), and a smaller quarantine recycles pages sooner,
# which doubles the executions per second of the JSON targets; a use after
# free within the same input is still caught.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:quarantine_size_mb=32:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

stat_of() { # KEY LOG
    sed -n "s/^stat::$1: *//p" "$2" | tail -n 1
}

failed=0
for t in $targets; do
    exe=$build/tests/fuzz/fuzz_$t
    seeds=$here/corpus/$t
    log=$build/fuzz-logs/$t.log
    if [ ! -x "$exe" ] || [ ! -d "$seeds" ]; then
        echo "fuzz_$t: missing $exe or $seeds"
        failed=$((failed + 1))
        continue
    fi
    if [ -n "${FUZZ_KEEP_CORPUS:-}" ]; then
        new=$FUZZ_KEEP_CORPUS/$t
        mkdir -p "$new" || exit 2
    else
        new=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-$t.XXXXXX") || exit 2
    fi
    dict=
    d=$here/dict/${t%%_*}.dict # manifest_raw and manifest_sealed share one
    [ -f "$d" ] && dict=-dict=$d
    nseeds=$(find "$seeds" -type f | wc -l)
    start=$(date +%s.%N)
    # new inputs go to the first directory; the seeds in tree stay as they are
    # shellcheck disable=SC2086
    nice -n "$nice_n" "$exe" -runs="$runs" -seed="$seed" -max_total_time="$max_time" \
        -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz-artifacts/$t-" $dict ${FUZZ_ARGS:-} \
        "$new" "$seeds" >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    [ -z "${FUZZ_KEEP_CORPUS:-}" ] && rm -rf "$new"
    execs=$(stat_of number_of_executed_units "$log")
    crashes=0
    note=
    if [ "$rc" -ne 0 ]; then
        crashes=1 # libFuzzer stops at the first
        art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        what=$(grep -m 1 -E '^==[0-9]+==ERROR|^SUMMARY|property failed|ALARM|out-of-memory|deadly signal' "$log")
        note=" -- exit $rc: ${what:-see $log}${art:+; input: $art}"
        failed=$((failed + 1))
    elif [ -n "$execs" ] && [ "$execs" -lt "$runs" ] 2>/dev/null; then
        note=" (stopped by FUZZ_MAX_TIME=$max_time before $runs runs)"
    fi
    secs=$(echo "$start $end" | awk '{printf "%.1f", $2 - $1}')
    # libFuzzer's own figure is whole executions per whole second: 0 for short runs
    rate=$(echo "$start $end ${execs:-0}" | awk '{printf "%.0f", $3 / ($2 - $1)}')
    echo "fuzz_$t: ${execs:-?} executions (-runs=$runs -seed=$seed, $nseeds seeds), $crashes crashes, ${secs} s, ${rate:-?} exec/s$note"
done
exit $((failed > 0))
