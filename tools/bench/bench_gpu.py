#!/usr/bin/env python3
"""Training throughput and MFU of fsdp-train --device cuda on one GPU.

gpt2-124m (L12 C768 H12 T1024, vocabulary 50257 padded to 50304) on random
tokens, one rank, FULL_SHARD, micro-batch = global batch. Each setting runs
--steps steps; the first --warmup are dropped (cuBLAS heuristics, first
allocations) and the median of the rest is reported.

MFU is llm.c's (gpt2_estimate_mfu in its train_gpt2.cu): 6 N + 6 L T C
FLOPs per token (N parameters with the padded vocabulary: 124,475,904),
against the GPU's dense bf16 peak (--peak-tflops; default 989.4, the
H100/H200 SXM figure NVIDIA publishes without sparsity; llm.c's table says
988.8 for the H100 SXM and has no H200). fp32 runs use the same peak, so
their MFU reads as a fraction of what bf16 could reach. The anchor, llm.c's
published 124M run: 8 x A100 80GB SXM, about 300 ms per 524,288-token step
(scripts/run_gpt2_124M.sh), about 218,000 tokens/s per GPU.

Settings (--settings): bf16 (attention by flash.cu, the default for bf16
runs), bf16-gemm (FSDP_CUDA_ATTENTION=gemm: cuBLAS products that keep the
T x T softmax, as before flash.cu: the baseline in the same run) and fp32.

  python3 tools/bench/bench_gpu.py --build build-cuda [--batch 16] [--steps 12]
"""

import argparse
import array
import json
import os
import statistics
import subprocess
import sys
import tempfile

L, C, T, V, VP = 12, 768, 1024, 50257, 50304


def gpt2_params():
    block = 12 * C * C + 13 * C  # qkv, proj, fc, fcproj weights and biases; two LayerNorms
    return VP * C + T * C + L * block + 2 * C


def flops_per_token():
    return 6 * gpt2_params() + 6 * L * T * C


def token_file(path, n_seqs, seed=1):
    """llm.c's format: 256 int32 header (magic, version, count), uint16 tokens."""
    x = seed
    toks = array.array("H")
    for _ in range(n_seqs * (T + 1)):
        x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        toks.append((x >> 33) % V)
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        header.tofile(f)
        toks.tofile(f)


# setting: (--precision, environment)
SETTINGS = {"bf16": ("bf16", {}), "bf16-gemm": ("bf16", {"FSDP_CUDA_ATTENTION": "gemm"}),
            "fp32": ("fp32", {})}


def run(build, data, tmp, precision, batch, steps, extra=(), env=None):
    log = os.path.join(tmp, f"{precision}-{batch}-{len(os.listdir(tmp))}.jsonl")
    cmd = [os.path.join(build, "src", "fsdp-train"), "--device", "cuda", "--data", data,
           "--model", "gpt2-124m", "--precision", precision, "--global-batch", str(batch),
           "--steps", str(steps), "--warmup", "2", "--log", log, "--log-every", "1"] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                       env=dict(os.environ, **(env or {})))
    if p.returncode != 0: # the other settings still run: one failing must not hide them
        print(f"bench_gpu: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}",
              file=sys.stderr)
        return None, []
    with open(log) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    banner = [l for l in p.stderr.splitlines()
              if "model gpt2-124m" in l or "peak" in l or "CUDA profile" in l or
              l.startswith("  ") and " ms " in l]
    return rows, banner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-cuda")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--settings", default="bf16,bf16-gemm,fp32")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", action="store_true",
                    help="then 4 bf16 steps with FSDP_CUDA_PROFILE=1: GPU time per kernel")
    a = ap.parse_args()
    results, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "tokens.bin")
        token_file(data, max(64, a.batch * 2))
        for setting in a.settings.split(","):
            if setting not in SETTINGS:
                sys.exit(f"bench_gpu: --settings: '{setting}' is not one of {', '.join(SETTINGS)}")
            prec, env = SETTINGS[setting]
            rows, banner = run(a.build, data, tmp, prec, a.batch, a.steps, env=env)
            if rows is None:
                failed.append(setting)
                continue
            for line in banner:
                print("  " + line)
            timed = rows[a.warmup:]
            tps = statistics.median(r["tokens_per_s"] for r in timed)
            ms = statistics.median(r["ms"] for r in timed)
            mfu = tps * flops_per_token() / (a.peak_tflops * 1e12)
            results.append({"model": "gpt2-124m", "setting": setting, "precision": prec,
                            "batch": a.batch, "seq": T,
                            "tokens_per_s": round(tps), "ms_per_step": round(ms, 1),
                            "mfu": round(mfu, 4), "steps_timed": len(timed),
                            "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"]})
        if a.profile:
            _, lines = run(a.build, data, tmp, "bf16", a.batch, 4, env={"FSDP_CUDA_PROFILE": "1"})
            for line in lines:
                print(line)
    print(f"gpt2-124m on one GPU, batch {a.batch} x {T} tokens, "
          f"{flops_per_token() / 1e9:.3f} GFLOP/token, peak {a.peak_tflops} TFLOP/s")
    print(f"{'setting':>9} {'tokens/s':>10} {'ms/step':>8} {'MFU':>6}")
    for r in results:
        print(f"{r['setting']:>9} {r['tokens_per_s']:>10} {r['ms_per_step']:>8} "
              f"{100 * r['mfu']:>5.1f}%")
    base = {r["setting"]: r["tokens_per_s"] for r in results}
    if base.get("bf16") and base.get("bf16-gemm"):
        print(f"flash attention: {base['bf16'] / base['bf16-gemm']:.2f}x the tokens/s of bf16-gemm")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if failed:
        sys.exit(f"bench_gpu: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
