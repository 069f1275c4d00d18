"""Shared helpers for the integration tests: where the programs are, how to
run them (alone or under mpirun with real ranks), a real English corpus, and
a tiny test runner that prints one line per test and exits non-zero on any
failure."""

import json
import os
import glob
import subprocess
import sys
import tempfile
import traceback

BUILD = os.environ.get("FSDP_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TRAIN = os.path.join(BUILD, "src", "fsdp-train")
DATA = os.path.join(BUILD, "src", "fsdp-data")
FORTUNES = "/usr/share/games/fortunes"

ENV = dict(os.environ)
ENV.update({
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
})


def run(args, check=True, **kw):
    """Runs a command; returns the CompletedProcess with text stdout/stderr."""
    p = subprocess.run(args, env=ENV, capture_output=True, text=True, errors="replace", **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args[0]} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def mpirun(np, args, check=True, **kw):
    return run(["mpirun", "--oversubscribe", "-np", str(np)] + args, check=check, **kw)


def fortune_files():
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if not f.endswith((".dat", ".u8")) and os.path.isfile(f))
    assert files, f"no fortune files under {FORTUNES} (tools/setup.sh installs them)"
    return files


def prepare_corpus(tmp):
    """Tokenises the fortunes corpus; returns (train, val) paths."""
    train, val = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    run([DATA, "prepare", "--out", train, "--val-out", val, "--doc-sep", "%"] + fortune_files())
    return train, val


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def token_file(path, tokens, count=None, magic=20240520, version=1):
    """Writes an llm.c token file by the format's rules (not by our code)."""
    import struct
    header = [0] * 256
    header[0], header[1] = magic, version
    header[2] = len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main(tests):
    only = sys.argv[1:]
    failed = 0
    for t in tests:
        if only and t.__name__ not in only:
            continue
        with tempfile.TemporaryDirectory(prefix="fsdp-test-") as tmp:
            try:
                t(tmp)
                print(f"ok   {t.__name__}", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}", flush=True)
                traceback.print_exc()
    sys.exit(1 if failed else 0)
