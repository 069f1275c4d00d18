#!/bin/sh
# Fails when a C or CUDA source differs from what clang-format makes of it
# with the project's .clang-format (one line per difference, then a count).
# The suite 'style' runs it; to fix a tree: clang-format -i FILE...
#   tools/check-format.sh [FILE...]    default: every source git tracks or would (not ignored)
set -u
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null 2>&1 ||
    { echo "check-format: clang-format not found (tools/setup.sh installs it)" >&2; exit 1; }
if [ $# -eq 0 ]; then
    if [ -d .git ] || [ -f .git ]; then
        set -- $(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' '*.cc')
    else
        set -- $(find src ckpt storage recovery tools tests -name '*.[ch]' -o -name '*.cu' -o -name '*.cc')
    fi
fi
out=$(clang-format --dry-run --Werror "$@" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | grep ': error:' | head -50 >&2
    n=$(printf '%s\n' "$out" | grep -c ': error:')
    echo "check-format: $n places differ from .clang-format (clang-format -i FILE fixes them)" >&2
    exit 1
fi
echo "check-format: $# files match .clang-format"
