"""Shared helpers for the integration tests: where the programs are, how to
run them (alone or under mpirun with real ranks), a real English corpus, and
a tiny test runner that prints one line per test and exits non-zero on any
failure."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

BUILD = os.environ.get("FSDP_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TRAIN = os.path.join(BUILD, "src", "fsdp-train")
DATA = os.path.join(BUILD, "src", "fsdp-data")
CKPT = os.path.join(BUILD, "tools", "fsdp-ckpt")
FORTUNES = "/usr/share/games/fortunes"

ENV = dict(os.environ)
ENV.update({
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
})


def run(args, check=True, env=None, **kw):
    """Runs a command (env: variables to set on top of ENV); returns the
    CompletedProcess with text stdout/stderr."""
    p = subprocess.run(args, env=dict(ENV, **(env or {})), capture_output=True, text=True,
                       errors="replace", **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args[0]} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def mpirun(np, args, check=True, **kw):
    return run(["mpirun", "--oversubscribe", "-np", str(np)] + args, check=check, **kw)


def digest(uri):
    """fsdp-ckpt digest as {(tensor, kind): sha256}."""
    out = run([CKPT, "digest", uri]).stdout.split("\n")
    return {tuple(l.split()[:2]): l.split()[2] for l in out if l.strip()}


def committed_steps(uri):
    out = run([CKPT, "ls", uri]).stdout.splitlines()[1:]
    return [int(l.split()[0][5:]) for l in out if l.split()[1] == "committed"]


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


_jobs = []


def launch(np, args, env=None):
    """Starts mpirun in a session of its own (so the whole job can be found
    and killed); the job is killed at the end of the test if still alive."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(np)] + args
    p = subprocess.Popen(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True, text=True,
                         errors="replace")
    _jobs.append(p)
    return p


def job_pids(sid):
    """(pid, state) of every process in the job's session: mpirun starts
    each rank in a process group of its own, but they stay in its session."""
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append((int(stat.split("/")[2]), fields[0]))
    return pids


def wait_stopped_or_exit(p, limit=120):
    """Waits until a process of the job stopped itself (test hook) or the
    job ended. Returns True if stopped."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return False
        if any(state == "T" for _, state in job_pids(p.pid)):
            return True
        time.sleep(0.02)
    raise AssertionError("the job neither stopped nor finished")


def kill_job(p):
    """SIGKILL to every process of the job at once."""
    for pid, _ in job_pids(p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()
    deadline = time.monotonic() + 10
    while job_pids(p.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not job_pids(p.pid), f"processes survived SIGKILL: {job_pids(p.pid)}"


def slow(test):
    """Marks a test that FSDP_QUICK=1 skips (the sanitizer build runs quick ones)."""
    test.slow = True
    return test


def main(tests):
    only = sys.argv[1:]
    if only == ["--list"]:
        print("\n".join(t.__name__ for t in tests))
        sys.exit(0)
    unknown = sorted(set(only) - {t.__name__ for t in tests})
    if unknown:
        sys.exit(f"{sys.argv[0]}: no test named {', '.join(unknown)} (--list names them)")
    failed = 0
    for t in tests:
        if only and t.__name__ not in only:
            continue
        if os.environ.get("FSDP_QUICK") == "1" and getattr(t, "slow", False):
            print(f"skip {t.__name__} (slow; FSDP_QUICK=1)", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix="fsdp-test-") as tmp:
            t0 = time.monotonic()
            try:
                t(tmp)
                print(f"ok   {t.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}", flush=True)
                traceback.print_exc()
            finally:
                while _jobs:
                    kill_job(_jobs.pop())
    sys.exit(1 if failed else 0)
