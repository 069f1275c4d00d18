#!/bin/sh
# Installs every build and run dependency of fsdp-ckpt from Debian 12's archive.
# Idempotent: a second run only checks that the packages are there.
# Run as root (or with sudo available) on a fresh Debian 12 machine.
#   tools/setup.sh          what the build, the demo and the tests need
#   tools/setup.sh --bench  also PyTorch (python3-torch), the benchmarks' baseline
set -eu

PKGS="build-essential pkg-config meson ninja-build python3 curl
      libopenmpi-dev openmpi-bin libopenblas-openmp-dev libdnnl-dev
      libzstd-dev libxxhash-dev libssl-dev libjansson-dev libcurl4-openssl-dev libexpat1-dev
      python3-numpy python3-matplotlib libmicrohttpd-dev prometheus libhdf5-dev python3-h5py
      awscli ceph-mon ceph-osd radosgw ceph-common
      fortunes-min fortunes
      iproute2 procps clang libclang-rt-14-dev clang-format
      qemu-user"
if [ "${1:-}" = "--bench" ]; then
    PKGS="$PKGS python3-torch"
fi

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >&2
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing >&2
