#!/usr/bin/python3
"""S3 throughput of our backend against the AWS CLI, one invocation, same
server, same bytes. Starts Ceph RADOS Gateway on 127.0.0.1 (tests/s3/ceph-s3.sh,
memstore: the objects live in the OSD's memory, so the disk is out of the
picture for both sides), writes a --compress none checkpoint of GPT-2 124M's
shapes (1.49 GB: parameters and both AdamW moments, 2 shards) on the local
disk, then measures, R rounds (default 2) interleaved, medians:

  upload     fsdp-ckpt cp DIR s3://...     (every chunk read and verified,
                                            shards as multipart uploads of
                                            8 MiB parts, 4 in flight, manifest last)
             aws s3 cp --recursive DIR s3://...   (8 MiB parts, 10 in flight)
  download   fsdp-ckpt verify s3://...     (ranged GETs of every chunk, each
                                            hashed; nothing written)
             fsdp-ckpt cp s3://... DIR     (the same, written to disk with fsync)
             aws s3 cp --recursive s3://... DIR   (written, no fsync)

And training with its data from the server (--only data): fsdp-train on
2 ranks x 1 thread, tiny and small, its tokens from a local file and from
the same file as one object on RGW (--data s3://..., ranged GETs ahead of
the step), R rounds alternating, tokens/s of each run's steps after the
first two (medians), and the ratio S3 / local.

    tools/bench/bench_s3.py [--out FILE] [--repeats R] [--dir DIR] [--only checkpoint|data]

Ratios are ours / the AWS CLI's GB/s (above 1: ours is faster). Bytes are
the checkpoint's stored bytes (the manifest included)."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import BIG, build, corpus, stored_bytes, train  # noqa: E402
from bench_train import BUILD, ENV, ROOT  # noqa: E402

TRAIN = os.path.join(BUILD, "src", "fsdp-train")

CKPT = os.path.join(BUILD, "tools", "fsdp-ckpt")
CEPH = os.path.join(ROOT, "tests", "s3", "ceph-s3.sh")
AWS = "/usr/bin/aws"


def timed(args, env, what=None):
    t0 = time.perf_counter()
    p = subprocess.run(args, env=env, capture_output=True, text=True, errors="replace")
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(args)} failed:\n{(p.stdout + p.stderr)[-2000:]}")
    if what:
        print(f"  {what:<28} {secs:7.2f} s", file=sys.stderr)
    return secs


def start_server(tmp):
    d = os.path.join(tmp, "rgw")
    env = dict(os.environ, CEPH_S3_STORE="memstore", CEPH_S3_STORE_GB="8",
               CEPH_S3_PORT="7491", CEPH_MON_PORT="3391")
    p = subprocess.run([CEPH, "start", d], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench: ceph-s3.sh start failed:\n{p.stderr[-2000:]}")
    creds = {}
    for line in p.stdout.splitlines():
        if line.startswith("export "):
            k, v = line[7:].split("=", 1)
            creds[k] = v.strip("'")
    env = dict(ENV, AWS_ACCESS_KEY_ID=creds["AWS_ACCESS_KEY_ID"],
               AWS_SECRET_ACCESS_KEY=creds["AWS_SECRET_ACCESS_KEY"],
               AWS_ENDPOINT_URL=creds["S3_ENDPOINT"], AWS_REGION="us-east-1")
    env.pop("AWS_PROFILE", None)
    return d, env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(BUILD, "bench-s3.json"))
    ap.add_argument("--repeats", type=int, default=2,
                    help="rounds; RGW frees deleted objects lazily, and each round stores "
                         "3 GB in an 8 GB memstore")
    ap.add_argument("--dir", default=BUILD, help="scratch directory")
    ap.add_argument("--only", choices=("checkpoint", "data"), help="one section")
    ap.add_argument("--steps", type=int, default=30, help="steps of each data run")
    a = ap.parse_args()
    build()
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="bench-s3-") as tmp:
        data = corpus(tmp)
        res = {}
        if a.only != "data":
            res = checkpoint_section(tmp, data, a.repeats)
        if a.only != "checkpoint":
            rgw, env = start_server(tmp)
            try:
                res["data"] = data_section(tmp, data, env, a.repeats, a.steps)
            finally:
                subprocess.run([CEPH, "stop", rgw], capture_output=True)
    report(res)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.out}")


def data_run(data, model, steps, log, env):
    """tokens/s of the steps after the first two, and rank 0's seconds
    waiting for its samples (what the read-ahead did not hide; 0 local)"""
    if os.path.exists(log):
        os.unlink(log)
    argv = ["mpirun", "-np", "2", "--bind-to", "core", TRAIN, "--data", data, "--threads", "1",
            "--global-batch", "8", "--steps", str(steps), "--log", log, "--log-every", "1000",
            "--model", model]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(argv)} failed:\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(log)]
    tokens = rows[0]["tokens_per_s"] * rows[0]["ms"] / 1000  # a step's
    waited = [float(l.split("waited ")[1].split()[0]) for l in p.stderr.splitlines()
              if "fsdp-train: data: rank 0" in l]
    return (tokens * (len(rows) - 2) / (rows[-1]["elapsed_s"] - rows[1]["elapsed_s"]),
            waited[0] if waited else 0.0)


def data_section(tmp, data, env, repeats, steps):
    aws = [AWS, "--endpoint-url", env["AWS_ENDPOINT_URL"]]
    timed(aws + ["s3", "mb", "s3://benchdata"], env)
    timed(aws + ["s3", "cp", "--quiet", data, "s3://benchdata/fortunes/train.bin"], env)
    out = {}
    for model in ("tiny", "small"):
        t, w = {"local": [], "s3": []}, []
        for r in range(repeats):
            for where, uri in (("local", data), ("s3", "s3://benchdata/fortunes/train.bin")):
                v, waited = data_run(uri, model, steps, os.path.join(tmp, "data.jsonl"), env)
                print(f"  {model} data {where:<5} round {r + 1}: {v:9.0f} tokens/s"
                      + (f", rank 0 waited {waited:.2f} s for samples" if where == "s3" else ""),
                      file=sys.stderr)
                t[where].append(v)
                if where == "s3":
                    w.append(waited)
        med = {k: statistics.median(v) for k, v in t.items()}
        out[model] = {"tokens_per_s": t, "median": med, "ratio": med["s3"] / med["local"],
                      "waited_s": w, "steps": steps}
    return out


def checkpoint_section(tmp, data, repeats):
    src = os.path.join(tmp, "src")
    print("bench: a checkpoint of GPT-2 124M's shapes", file=sys.stderr)
    train(data, 2, 1, 1, ["--ckpt", src, "--compress", "none"],
          os.path.join(tmp, "log.jsonl"), BIG, 4)
    step = os.path.join(src, "step-00000001")
    nbytes = stored_bytes(step)
    rgw, env = start_server(tmp)
    try:
        return measure(tmp, src, step, nbytes, env, repeats)
    finally:
        subprocess.run([CEPH, "stop", rgw], capture_output=True)


def measure(tmp, src, step, nbytes, env, repeats):
    aws = [AWS, "--endpoint-url", env["AWS_ENDPOINT_URL"]]
    timed(aws + ["s3", "mb", "s3://bench"], env)
    t = {k: [] for k in ("ours_up", "aws_up", "ours_verify", "ours_down", "aws_down")}
    for r in range(repeats):
        print(f"bench: round {r + 1}/{repeats}", file=sys.stderr)
        ours, theirs = f"s3://bench/ours{r}", f"s3://bench/aws{r}/step-00000001/"
        down = os.path.join(tmp, "down")
        t["ours_up"].append(timed([CKPT, "cp", src, ours], env, "fsdp-ckpt cp fs -> s3"))
        t["aws_up"].append(timed(aws + ["s3", "cp", "--recursive", "--quiet", step, theirs], env,
                                 "aws s3 cp fs -> s3"))
        t["ours_verify"].append(timed([CKPT, "verify", ours], env, "fsdp-ckpt verify s3"))
        shutil.rmtree(down, ignore_errors=True)
        t["ours_down"].append(timed([CKPT, "cp", ours, down], env, "fsdp-ckpt cp s3 -> fs"))
        shutil.rmtree(down, ignore_errors=True)
        t["aws_down"].append(timed(aws + ["s3", "cp", "--recursive", "--quiet", theirs, down],
                                   env, "aws s3 cp s3 -> fs"))
        if stored_bytes(down) != nbytes:
            sys.exit(f"bench: the AWS CLI downloaded {stored_bytes(down)} of {nbytes} bytes")
        shutil.rmtree(down)
        timed(aws + ["s3", "rm", "--recursive", "--quiet", ours], env)
        timed(aws + ["s3", "rm", "--recursive", "--quiet", theirs], env)
    med = {k: statistics.median(v) for k, v in t.items()}
    gbs = {k: nbytes / v / 1e9 for k, v in med.items()}
    return {"bytes": nbytes, "repeats": repeats, "seconds": t, "median_s": med, "gb_s": gbs,
            "upload_ratio": gbs["ours_up"] / gbs["aws_up"],
            "download_ratio": gbs["ours_verify"] / gbs["aws_down"],
            "download_to_disk_ratio": gbs["ours_down"] / gbs["aws_down"],
            "server": "Ceph RGW (Debian 12, memstore) on 127.0.0.1"}


def report(res):
    if "data" in res:
        print("training, 2 ranks x 1 thread, data from a local file and from RGW (ranged GETs)")
        print("  model      local tokens/s    s3 tokens/s   s3 / local   waited for samples")
        for model, d in res["data"].items():
            m = d["median"]
            print(f"  {model:<8} {m['local']:15.0f} {m['s3']:14.0f}   {d['ratio']:9.2f}"
                  f"   {statistics.median(d['waited_s']):.2f} s in {d['steps']} steps")
    if "gb_s" not in res:
        return
    g = res["gb_s"]
    print(f"S3 on {res['server']}: a {res['bytes'] / 1e9:.2f} GB checkpoint "
          f"(median of {res['repeats']} rounds)")
    print("                                        GB/s   ratio to aws s3 cp")
    print(f"  upload    fsdp-ckpt cp fs -> s3      {g['ours_up']:7.3f}   {res['upload_ratio']:.2f}")
    print(f"            aws s3 cp --recursive      {g['aws_up']:7.3f}")
    print(f"  download  fsdp-ckpt verify (memory)  {g['ours_verify']:7.3f}   "
          f"{res['download_ratio']:.2f}")
    print(f"            fsdp-ckpt cp s3 -> fs      {g['ours_down']:7.3f}   "
          f"{res['download_to_disk_ratio']:.2f}  (fsynced, verified)")
    print(f"            aws s3 cp --recursive      {g['aws_down']:7.3f}         (not fsynced)")


if __name__ == "__main__":
    main()
