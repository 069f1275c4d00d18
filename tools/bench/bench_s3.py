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

    tools/bench/bench_s3.py [--out FILE] [--repeats R] [--dir DIR]

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
    a = ap.parse_args()
    build()
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="bench-s3-") as tmp:
        data = corpus(tmp)
        src = os.path.join(tmp, "src")
        print("bench: a checkpoint of GPT-2 124M's shapes", file=sys.stderr)
        train(data, 2, 1, 1, ["--ckpt", src, "--compress", "none"],
              os.path.join(tmp, "log.jsonl"), BIG, 4)
        step = os.path.join(src, "step-00000001")
        nbytes = stored_bytes(step)
        rgw, env = start_server(tmp)
        try:
            res = measure(tmp, src, step, nbytes, env, a.repeats)
        finally:
            subprocess.run([CEPH, "stop", rgw], capture_output=True)
    report(res)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.out}")


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
