#!/usr/bin/python3
"""The CPU kernel tables against a -march=native build, one invocation,
ratios measured in the same run.

The default build runs on any x86-64 host and picks its kernel table at
start (src/README.md: "One binary for a mixed fleet"). This measures what that
costs on the build host: fsdp-train's tokens/s with each table the CPU runs
(--cpu-kernels x86-64, x86-64-v3, x86-64-v4; auto is the widest) against the
same job from a -Dnative=true build (build-native/, configured and built
here). Runs alternate between the builds, ROUNDS times, so drift of the
machine hits both sides; each figure is the median over rounds of the
median tokens/s of the steps after the first three. One rank, --threads
(default 1, so another job on a second core disturbs less).

    tools/bench/bench_kernels.py [--out FILE] [--rounds N] [--threads N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, "build")
NATIVE = os.path.join(ROOT, "build-native")
WARMUP = 3
MODELS = [
    ("tiny", ["--model", "tiny"], 24),
    ("small", ["--model", "small"], 8),
    ("comparison", ["--layers", "4", "--dim", "256", "--heads", "4", "--seq", "256"], 10),
]


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(args[:4])}... failed:\n{p.stderr[-2000:]}")
    return p


def build(d, native):
    want = f"-Dnative={'true' if native else 'false'}"
    if not os.path.exists(os.path.join(d, "build.ninja")):
        sh(["meson", "setup", d, ROOT, want])
    else:  # an existing directory keeps the value it was configured with
        sh(["meson", "configure", d, want])
    sh(["meson", "compile", "-C", d])


def levels():
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    out = ["x86-64"]
    if {"avx2", "fma", "bmi2", "movbe"} <= flags:
        out.append("x86-64-v3")
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"} <= flags:
            out.append("x86-64-v4")
    return out


def rate(train, data, margs, steps, threads, extra, tmp):
    log = os.path.join(tmp, "log.jsonl")
    if os.path.exists(log):
        os.unlink(log)
    sh([train, "--data", data, "--global-batch", "8", "--steps", str(steps), "--threads",
        str(threads), "--log", log, "--log-every", "1000"] + margs + extra)
    rates = [json.loads(l)["tokens_per_s"] for l in open(log)][WARMUP:]
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(BUILD, "bench-kernels.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    build(BUILD, False)
    build(NATIVE, True)
    train = os.path.join(BUILD, "src", "fsdp-train")
    train_native = os.path.join(NATIVE, "src", "fsdp-train")
    isas = levels()
    variants = [("native build", train_native, [])] + \
        [(isa, train, ["--cpu-kernels", isa]) for isa in isas]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "train.bin")
        files = sorted(f for f in os.listdir("/usr/share/games/fortunes") if "." not in f)
        sh([os.path.join(BUILD, "src", "fsdp-data"), "prepare", "--doc-sep", "%", "--out",
            data] + [os.path.join("/usr/share/games/fortunes", f) for f in files])
        for name, margs, steps in MODELS:
            got = {v[0]: [] for v in variants}
            for _ in range(a.rounds):
                for label, exe, extra in variants:
                    got[label].append(rate(exe, data, margs, steps, a.threads, extra, tmp))
            med = {k: statistics.median(v) for k, v in got.items()}
            rows.append({"model": name, "tokens_per_s": med,
                         "over_native": {k: med[k] / med["native build"] for k in med}})
    print(f"{'model':<11} " + " ".join(f"{v[0]:>14}" for v in variants))
    for r in rows:
        print(f"{r['model']:<11} " + " ".join(
            f"{r['tokens_per_s'][v[0]]:8.0f} {r['over_native'][v[0]]:4.2f}x" for v in variants))
    print(f"(tokens/s and ratio to the -march=native build; 1 rank x {a.threads} thread(s), "
          f"median of {a.rounds} alternating rounds; the default build's auto choice is "
          f"{isas[-1]})")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"threads": a.threads, "rounds": a.rounds, "rows": rows}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
