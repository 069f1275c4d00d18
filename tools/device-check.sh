#!/bin/sh
# The GPU checks in one run, sized for a few minutes on one GPU (GPU time
# is scarce: everything that can be tested on the CPU is tested there):
#   1. the CUDA kernels against the CPU's (flash.cu's attention against
#      its CPU reference), the engine's gradients, a finite-difference check
#      and repeatability (tests/unit/test_cuda.c); again with
#      FSDP_CUDA_ATTENTION=gemm, the bf16 attention that keeps the softmax
#   2. tiny for 20 steps on the GPU against the CPU, GPU runs repeating
#      their bits and resuming exactly, checkpoints moving GPU -> CPU ranks
#      and CPU ranks -> GPU (tests/integration/test_cuda.py)
#   3. gpt2-124m tokens/s and MFU: bf16, bf16 with FSDP_CUDA_ATTENTION=gemm
#      (the baseline flash attention is measured against) and fp32
#      (tools/bench/bench_gpu.py)
#   4. gpt2-124m's matmuls alone, fp32 and bf16 outputs, cuBLASLt and
#      cublasGemmEx (fsdp-gemm-bench, tools/bench/gemm_gpu.cu)
# and prints one summary. Logs and results go to $OUT (default
# /tmp/device-check); gpu-run.tar.gz there holds the GPU run's checkpoint
# and log, for the two-CPU-rank half on a machine with mpirun:
#   tar xzf gpu-run.tar.gz && FSDP_GPU_RUN=$PWD/gpu-run \
#       meson test -C build cuda
#
#   tools/device-check.sh                  builds build-cuda (-Dcuda=enabled)
#   tools/device-check.sh BUILD            an existing CUDA build
#   tools/device-check.sh --bundle DIR     a bare GPU machine: programs and
#                                          libraries from tools/device-bundle.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
if [ "${1:-}" = "--bundle" ]; then
    bundle=$(cd "$2" && pwd)
    BUILD=$bundle/build
    export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export FSDP_CORPUS=$bundle/corpus FSDP_CPU2_RUN=$bundle/cpu2-run
else
    BUILD=${1:-build-cuda}
    if [ ! -x "$BUILD/src/fsdp-train" ]; then
        meson setup "$BUILD" -Dcuda=enabled >"$OUT/setup.log" 2>&1 &&
            meson compile -C "$BUILD" >>"$OUT/setup.log" 2>&1 ||
            { tail -30 "$OUT/setup.log"; echo "device-check: build failed"; exit 1; }
    fi
fi
# CUDA's libraries where this machine keeps them (a toolkit, or pip's
# nvidia-* wheels beside PyTorch)
module=$BUILD/src/libfsdp-cuda.so
[ -f "$module" ] || { echo "device-check: $module is missing (a build without CUDA)"; exit 1; }
export FSDP_CUDA_MODULE=$module
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudart.so.13; do
    if ldd "$module" | grep -q "$lib => not found"; then
        d=$(find /usr/local/cuda*/lib64 /usr/local/lib /usr/lib /opt -name "$lib" 2>/dev/null |
            head -1)
        [ -n "$d" ] && export LD_LIBRARY_PATH="$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
done
if ldd "$BUILD/src/fsdp-train" "$module" | grep "not found"; then
    echo "device-check: fsdp-train or its CUDA module cannot load the libraries above"
    exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    tee "$OUT/summary.txt"

passed=0 failed=0 skipped=0
check() { # NAME COMMAND...: runs it, logs to $OUT/NAME.log, counts the outcome
    name=$1
    shift
    t0=$(date +%s)
    "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    case $rc in
    0) passed=$((passed + 1)) r=ok ;;
    77) skipped=$((skipped + 1)) r=skipped ;;
    *) failed=$((failed + 1)) r="FAILED (exit $rc)" ;;
    esac
    echo "device-check: $name: $r in ${dt} s" | tee -a "$OUT/summary.txt"
    [ "$rc" = 0 ] || tail -40 "$OUT/$name.log"
}

check kernels "$BUILD/tests/unit/test_cuda-kernels"
grep -E "^(ok|FAIL)|check failed|against|vs reference" "$OUT/kernels.log"
FSDP_CUDA_ATTENTION=gemm check kernels-gemm "$BUILD/tests/unit/test_cuda-kernels"
grep -E "^(ok|FAIL)|check failed" "$OUT/kernels-gemm.log"
art=$(mktemp -d)
mkdir -p "$art/gpu-run"
FSDP_BUILD=$BUILD FSDP_ARTIFACTS=$art check integration python3 tests/integration/test_cuda.py
grep -E "^(ok|FAIL|skip)|worst relative" "$OUT/integration.log"
tar czf "$OUT/gpu-run.tar.gz" -C "$art" gpu-run
rm -rf "$art"
check bench python3 tools/bench/bench_gpu.py --build "$BUILD" --profile --json "$OUT/bench_gpu.json"
cat "$OUT/bench.log"
check gemm "$BUILD/tools/fsdp-gemm-bench"
cat "$OUT/gemm.log"
echo "device-check: $passed passed, $failed failed, $skipped skipped" | tee -a "$OUT/summary.txt"
[ "$failed" = 0 ]
