#!/usr/bin/python3
"""Memory against time for activation checkpointing, one invocation, ratios
measured in the same run.

gpt2-124m shapes (L12 C768 H12 T1024) at global batch 8 on one rank (--threads,
default 2), a few steps per setting of --activation-checkpointing: the
activation bytes the banner reports, the peak resident memory (VmHWM) the run
reports at its end, and the step time (median of the steps after the first).
Each row's ratios are against "none" at the same precision (--precision
fp32 and bf16), from the same run. Byte-level tokens (the
fortunes), so the run needs no tokenizer; the vocabulary is still GPT-2's.

    tools/bench/bench_memory.py [--out FILE] [--steps N] [--modes none,blocks]

--llama-1b: peak memory per rank for Llama 3.2 1B's shapes (L16 C2048 H32
KV8 F8192 V128256, tied; --seq, default 256) on 2 and 4 Open MPI ranks,
shard full, fp32 master state, none vs blocks recompute. The whole model's
state (16 bytes a parameter: 19.8 GB over the ranks, before gathers and
activations) does not fit this 24 GiB machine beside the ranks' gathered
embedding, so it measures the peak RSS of every rank (the largest is
reported) at 2 and 4 of the 16 layers and extrapolates linearly to 16
(each layer adds its state shard, its activations and nothing else that
stays; the embedding, the gathered units and the activations of the head
are the fixed part). Where 4 layers do not fit (4 ranks: the fixed part,
about 5 GiB a rank, is mostly the gathered 128,256 x 2,048 embedding and
its full gradient, which every rank holds), the rank count is measured at 2
layers, and a layer costs what it costs on 2 ranks less the half of its
state shard that 4 ranks do not hold.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, "build")
TRAIN = os.path.join(BUILD, "src", "fsdp-train")
DATA = os.path.join(BUILD, "src", "fsdp-data")
MODEL = ["--model", "gpt2-124m", "--global-batch", "8"]


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(args[:4])}... failed:\n{p.stderr[-2000:]}")
    return p


def one(data, mode, prec, steps, threads, tmp):
    log = os.path.join(tmp, f"{mode}-{prec}.jsonl")
    if os.path.exists(log):
        os.unlink(log)
    p = sh([TRAIN, "--data", data, "--steps", str(steps), "--threads", str(threads), "--log",
            log, "--log-every", "1", "--activation-checkpointing", mode, "--precision", prec] +
           MODEL)
    act = re.search(r"activations ([\d.]+) MiB", p.stderr)
    peak = re.search(r"peak resident memory per rank: ([\d.]+) MiB", p.stderr)
    if not act or not peak:
        sys.exit(f"bench: no memory figures in:\n{p.stderr[-2000:]}")
    ms = [json.loads(l)["ms"] for l in open(log)][1:]
    return {"mode": mode, "precision": prec, "activation_mib": float(act.group(1)),
            "peak_rss_mib": float(peak.group(1)), "step_ms": statistics.median(ms),
            "steps_ms": ms}


def llama_run(data, seq, steps, ranks, mode, layers, env):
    """(peak RSS MiB of the largest rank, the banner's per-rank figures), or
    None where the OOM killer ended it."""
    p = subprocess.run(
        ["mpirun", "--oversubscribe", "-np", str(ranks), TRAIN, "--data", data,
         "--model", "llama-1b", "--layers", str(layers), "--seq", str(seq),
         "--global-batch", str(ranks), "--steps", str(steps), "--threads", "1",
         "--activation-checkpointing", mode, "--log-every", "1000"],
        capture_output=True, text=True, errors="replace", env=env)
    if p.returncode != 0 and "signal 9" in p.stderr:
        # the kernel's OOM killer: the ranks' fixed part (the gathered
        # embedding, its gradient, its state shard) times the ranks does
        # not fit this machine
        print(f"  {ranks} ranks, {mode}, L{layers}: killed by the OOM killer "
              "(does not fit this machine)", flush=True)
        return None
    if p.returncode != 0:
        sys.exit(f"bench: llama-1b L{layers} on {ranks} ranks failed:\n{p.stderr[-2000:]}")
    m = re.search(r"peak resident memory per rank: ([\d.]+) MiB", p.stderr)
    acct = re.search(r"per rank: params ([\d.]+) MiB, grads ([\d.]+) MiB, optimizer "
                     r"([\d.]+) MiB .*gathered params ([\d.]+) MiB, full grads "
                     r"([\d.]+) MiB, activations ([\d.]+) MiB", p.stderr)
    print(f"  {ranks} ranks, {mode}, L{layers}: peak {float(m.group(1)):.0f} MiB", flush=True)
    return float(m.group(1)), [float(x) for x in acct.groups()]


def llama_1b(data, tmp, seq, steps, out):
    rows, killed = [], []
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for ranks in (2, 4):
        for mode in ("none", "blocks"):
            peaks, plan = {}, {}
            for layers in (2, 4):
                got = llama_run(data, seq, steps, ranks, mode, layers, env)
                if got is None:
                    killed.append({"ranks": ranks, "mode": mode, "layers": layers})
                    break
                peaks[layers], plan[layers] = got
            if len(peaks) == 2:
                per_layer = (peaks[4] - peaks[2]) / 2
                # the sharded state (params, grads, optimizer) of a layer, per rank
                state_layer = (sum(plan[4][:3]) - sum(plan[2][:3])) / 2
                rows.append({"ranks": ranks, "mode": mode, "peak_l2_mib": peaks[2],
                             "peak_l4_mib": peaks[4], "per_layer_mib": per_layer,
                             "state_layer_mib": state_layer,
                             "peak_l16_mib": peaks[4] + 12 * per_layer, "acct_l4": plan[4],
                             "how": "measured at L2 and L4, extrapolated"})
                continue
            # L4 does not fit: a layer costs what it costs on fewer ranks
            # (its activations and gathered slots do not depend on the world
            # size) less the part of its state shard these ranks do not hold
            base = [r for r in rows if r["mode"] == mode and r["ranks"] < ranks]
            if 2 not in peaks or not base:
                continue
            b = base[-1]
            per_layer = b["per_layer_mib"] - b["state_layer_mib"] * (1 - b["ranks"] / ranks)
            rows.append({"ranks": ranks, "mode": mode, "peak_l2_mib": peaks[2],
                         "peak_l4_mib": None, "per_layer_mib": per_layer,
                         "peak_l16_mib": peaks[2] + 14 * per_layer, "acct_l2": plan[2],
                         "how": f"measured at L2 (L4 OOM-killed); a layer as on {b['ranks']} "
                                f"ranks less the state shard {ranks} ranks do not hold"})
    print(f"{'ranks':>5} {'recompute':<9} {'L2 MiB':>8} {'L4 MiB':>8} {'per layer':>10} "
          f"{'L16 MiB':>9}  how")
    for r in sorted(rows, key=lambda r: (r["ranks"], r["mode"])):
        l4 = f"{r['peak_l4_mib']:8.0f}" if r["peak_l4_mib"] else f"{'-':>8}"
        print(f"{r['ranks']:>5} {r['mode']:<9} {r['peak_l2_mib']:8.0f} {l4} "
              f"{r['per_layer_mib']:10.0f} {r['peak_l16_mib']:9.0f}  {r['how']}")
    print(f"(llama-1b shapes at --seq {seq}, global batch = ranks (micro-batch 1), shard full, "
          f"fp32, 1 thread per rank; peak RSS of the largest rank after {steps} steps)")
    with open(out, "w") as f:
        json.dump({"rows": rows, "killed": killed, "seq": seq}, f, indent=1)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(BUILD, "bench-memory.json"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="none,blocks")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--llama-1b", action="store_true")
    ap.add_argument("--seq", type=int, default=256)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        subprocess.run(["meson", "setup", BUILD, ROOT], check=True, capture_output=True)
    subprocess.run(["meson", "compile", "-C", BUILD], check=True, capture_output=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "train.bin")
        files = sorted(f for f in os.listdir("/usr/share/games/fortunes") if "." not in f)
        sh([DATA, "prepare", "--doc-sep", "%", "--out", data] +
           [os.path.join("/usr/share/games/fortunes", f) for f in files])
        if a.llama_1b:
            return llama_1b(data, tmp, a.seq, max(2, a.steps), a.out)
        for prec, mode in [(p, m) for p in a.precisions.split(",") for m in a.modes.split(",")]:
            rows.append(one(data, mode, prec, max(2, a.steps), a.threads, tmp))
            r = rows[-1]
            print(f"  {mode} {prec}: activations {r['activation_mib']:.0f} MiB, peak "
                  f"{r['peak_rss_mib']:.0f} MiB, step {r['step_ms'] / 1e3:.1f} s", flush=True)
    print(f"{'checkpointing':<14} {'precision':<10} {'activations MiB':>16} {'peak RSS MiB':>13} "
          f"{'step s':>8} {'act vs none':>12} {'time vs none':>13}")
    for r in rows:
        base = next(b for b in rows if b["precision"] == r["precision"])
        r["activation_ratio"] = base["activation_mib"] / r["activation_mib"]
        r["time_ratio"] = r["step_ms"] / base["step_ms"]
        print(f"{r['mode']:<14} {r['precision']:<10} {r['activation_mib']:16.0f} "
              f"{r['peak_rss_mib']:13.0f} "
              f"{r['step_ms'] / 1e3:8.1f} {r['activation_ratio']:11.2f}x "
              f"{r['time_ratio']:12.2f}x")
    print(f"(gpt2-124m shapes, global batch 8 x T 1024 on 1 rank x {a.threads} threads; "
          f"step time: median of steps 2..{max(2, a.steps)})")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "threads": a.threads}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
