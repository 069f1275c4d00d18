#!/bin/sh
# Packs what tools/device-check.sh needs on a bare GPU machine that cannot
# build the project (no Debian packages, no network): the CUDA build's
# programs and GPU tests, the shared libraries they load from Debian (not
# glibc, not the CUDA libraries, which such a machine has), the tokenised
# test corpus, and a 20-step run of 2 CPU ranks with its checkpoint (the
# CPU-to-GPU half of the device-agnostic checkpoint test).
#
#   tools/device-bundle.sh [OUT.tar.gz]     (default .devbundle.tar.gz)
#
# On the GPU machine:
#   tar xzf .devbundle.tar.gz && tools/device-check.sh --bundle .devbundle
set -eu
cd "$(dirname "$0")/.."
out=${1:-.devbundle.tar.gz}
build=build-cuda
if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" -Dcuda=enabled -Donednn=disabled >/dev/null
else
    meson setup "$build" -Dcuda=enabled -Donednn=disabled >/dev/null
fi
meson compile -C "$build" >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/.devbundle
mkdir -p "$b/build/src" "$b/build/tools" "$b/build/tests/unit" "$b/lib" "$b/corpus"
cp "$build/src/fsdp-train" "$build/src/fsdp-data" "$build/src/libfsdp-cuda.so" "$b/build/src/"
cp "$build/tools/fsdp-ckpt" "$build/tools/fsdp-gemm-bench" "$b/build/tools/"
cp "$build/tests/unit/test_cuda-kernels" "$b/build/tests/unit/"
# every library the programs load, but the C runtime and CUDA's own
for exe in "$b"/build/src/* "$b"/build/tools/* "$b"/build/tests/unit/*; do
    ldd "$exe" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
        libstdc++.so.* | libgcc_s.so.* | libcublas* | libnccl* | libcuda.so*) ;;
    *) cp -L "$lib" "$b/lib/" ;;
    esac
done
# a part of the fortunes corpus: enough for 20 steps of tiny, a small bundle
./"$build"/src/fsdp-data prepare --out "$b/corpus/train.bin" --val-out "$b/corpus/val.bin" \
    --doc-sep % $(ls /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$' | head -4)
# a 20-step tiny run on 2 CPU ranks, checkpoint every 10 steps: the
# arguments of tests/integration/test_cuda.py's train(), --lr included,
# since the GPU run resumed from it is compared step by step
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$b/cpu2-run"
mpirun --oversubscribe -np 2 "$build/src/fsdp-train" --data "$b/corpus/train.bin" \
    --model tiny --global-batch 8 --steps 20 --lr 1e-3 --log "$b/cpu2-run/log.jsonl" \
    --log-every 100 --ckpt "$stage/ck" --ckpt-every 10 2>/dev/null
./"$build"/tools/fsdp-ckpt cp "$stage/ck@10" "$b/cpu2-run/ckpt" >/dev/null
tar czf "$out" -C "$stage" .devbundle
ls -la "$out"
