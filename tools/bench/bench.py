#!/usr/bin/python3
"""The whole system in one invocation: training throughput, checkpoint
overhead (sync and async), durable write, load and reshard-load bandwidth,
and compression. Every figure comes with a baseline measured in the same run
(dd conv=fsync, cat > /dev/null, no checkpoints, no compression). Prints a
table and writes it as JSON. Installs what is missing and builds first.

    tools/bench/bench.py [--out FILE] [--repeats R] [--dir DIR]

  tokens/s        tiny and small, 1 rank x 2 threads and 2 ranks x 1 thread,
                  median of the steps after the first three.
  checkpoints     small model, 2 ranks, 50 steps with none, sync and async
                  checkpoints every 10 steps, R rounds of one run each,
                  interleaved, the order rotated round to round. The
                  window is the 50 steps' wall time (the log's elapsed_s at
                  step 50), which holds the checkpoints of steps 10..40; per
                  checkpoint, the time the training loop spent in checkpoint
                  work (the log's ckpt_s / 4): the whole save when sync, the
                  snapshot, the commit and any wait when async. Medians over
                  the runs.
  write           a --compress none checkpoint of GPT-2 124M's shapes (1.49 GB
                  of state; 2 ranks writing their shards in parallel, fsynced,
                  committed; median of 3 saves; the posix backend writes with
                  O_DIRECT) against dd conv=fsync of the same number of bytes,
                  one stream, on the same disk, through the page cache and
                  with oflag=direct (median of 3 rounds each).
  load            resuming that checkpoint and copies of it (fsdp-ckpt reshard):
                  same world 1->1 (1 rank x 2 threads) and 2->2, reshard 2->1
                  and 2->4 (4 ranks oversubscribe 2 cores), each with SHA-256
                  and XXH3-128 chunk digests (--ckpt-hash), every chunk read
                  and verified, median of 3 loads, against cat of the same
                  files to /dev/null: warm, both read cached bytes. Then cold:
                  the page cache dropped (where permitted) before the 1->1
                  loads and before dd iflag=direct of the same files.
  compression     the trained state of the sync runs (step 50), resharded
                  offline from a raw copy with each codec: ratio, and raw
                  GB/s of the whole reshard (read, verify, compress, hash,
                  write) next to the same with --compress none.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import BUILD, DATA, ENV, ROOT, TRAIN, ours, sh  # noqa: E402

CKPT = os.path.join(BUILD, "tools", "fsdp-ckpt")
SMALL = ["--model", "small"]
# GPT-2 124M's shapes (vocabulary 50257 padded to 50304) at sequence 64 and
# global batch 4, so that a step is cheap: 124M parameters, 1.49 GB of state
# (parameters and both AdamW moments) to write, load and reshard.
BIG = ["--model", "gpt2-124m", "--seq", "64"]
STEPS, EVERY = 50, 10


def train(data, ranks, threads, steps, extra, log, model=SMALL, batch=8):
    if os.path.exists(log):  # fsdp-train appends to its log
        os.unlink(log)
    cmd = [TRAIN, "--data", data, "--global-batch", str(batch), "--steps", str(steps),
           "--threads", str(threads), "--log", log, "--log-every", "1000"] + model + extra
    if ranks > os.cpu_count():
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    elif ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--bind-to", "core"] + cmd
    return sh(cmd).stderr


def last_log(log):
    with open(log) as f:
        return json.loads(f.read().splitlines()[-1])


def step_dir(ck, step):
    return os.path.join(ck, "step-%08d" % step)


def stored_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def timed(args):
    t0 = time.perf_counter()
    p = sh(args)
    return time.perf_counter() - t0, p


def checkpoint_overheads(data, tmp, repeats):
    modes = {"none": [], "sync": ["--ckpt-every", str(EVERY)],
             "async": ["--ckpt-every", str(EVERY), "--ckpt-async"]}
    runs = {m: [] for m in modes}
    names = list(modes)
    for r in range(repeats):
        # the VM's speed drifts by several percent over minutes: each round
        # runs the three modes in a rotated order, so no mode always goes first
        for m in names[r % 3:] + names[:r % 3]:
            extra = modes[m]
            ck = os.path.join(tmp, "ck-" + m)
            shutil.rmtree(ck, ignore_errors=True)
            if m != "none":
                extra = ["--ckpt", ck, "--keep", "1"] + extra
            log = os.path.join(tmp, m + ".jsonl")
            train(data, 2, 1, STEPS, extra, log)
            j = last_log(log)
            runs[m].append({"wall_s": j["elapsed_s"], "ckpt_s": j["ckpt_s"]})
            print(f"  run {r + 1}/{repeats} {m:<5}: {j['elapsed_s']:.2f} s, "
                  f"{j['ckpt_s']:.3f} s in checkpoint work", file=sys.stderr)
    n_ckpt = STEPS // EVERY - 1  # steps 10..40; step 50's comes after the window
    med = {m: statistics.median(x["wall_s"] for x in runs[m]) for m in modes}
    # this VM's step time drifts by +-15% over minutes: the overheads are
    # the median over rounds of each round's ratio (its runs are neighbours)
    paired = {m: statistics.median(runs[m][r]["wall_s"] / runs["none"][r]["wall_s"]
                                   for r in range(repeats)) - 1 for m in ("sync", "async")}
    per = {m: statistics.median(x["ckpt_s"] for x in runs[m]) / n_ckpt for m in ("sync", "async")}
    none = [x["wall_s"] for x in runs["none"]]
    return {
        "runs": runs, "repeats": repeats, "steps": STEPS, "every": EVERY,
        "checkpoints_in_window": n_ckpt,
        "state_bytes_stored": stored_bytes(step_dir(os.path.join(tmp, "ck-sync"), STEPS)),
        "sync_save_s": per["sync"], "async_stall_s": per["async"],
        "stall_over_save": per["async"] / per["sync"],
        "step_s": {m: med[m] / STEPS for m in modes},
        "sync_overhead_of_medians": med["sync"] / med["none"] - 1,
        "async_overhead_of_medians": med["async"] / med["none"] - 1,
        "sync_overhead": paired["sync"], "async_overhead": paired["async"],
        # the noise floor: how far apart the no-checkpoint runs themselves are
        "none_spread": (max(none) - min(none)) / statistics.median(none),
        # what checkpoints cost the loop directly: its time in checkpoint work
        "sync_loop_share": per["sync"] * n_ckpt / med["none"],
        "async_loop_share": per["async"] * n_ckpt / med["none"],
    }


def write_and_load(data, tmp):
    ck = os.path.join(tmp, "ck-raw")
    shutil.rmtree(ck, ignore_errors=True)
    err = train(data, 2, 1, 3, ["--ckpt", ck, "--ckpt-every", "1", "--compress", "none",
                                "--keep", "3"], os.path.join(tmp, "raw.jsonl"), BIG, 4)
    saves = [float(s) for s in re.findall(r"committed in ([0-9.]+) s", err)]
    nbytes = stored_bytes(step_dir(ck, 3))
    save_s = statistics.median(saves)
    dd_file = os.path.join(tmp, "dd.bin")
    mib = (nbytes + (1 << 20) - 1) >> 20
    write = {"bytes": nbytes, "saves_s": saves, "save_s": save_s, "gb_s": nbytes / save_s / 1e9}
    # dd as the filesystem's users write (through the page cache) and as our
    # posix backend does (O_DIRECT), both with a final fsync, 4 MiB blocks;
    # median of 3 rounds each, like the saves
    for name, flags in (("dd", []), ("dd_direct", ["oflag=direct"])):
        rounds = []
        for _ in range(3):
            secs, _ = timed(["dd", "if=/dev/zero", "of=" + dd_file, "bs=4M",
                             "count=%d" % ((mib + 3) // 4), "conv=fsync", "status=none"] + flags)
            dd_bytes = os.path.getsize(dd_file)
            os.unlink(dd_file)
            rounds.append(secs)
        secs = statistics.median(rounds)
        write.update({name + "_bytes": dd_bytes, name + "_s": secs, name + "_rounds_s": rounds,
                      name + "_gb_s": dd_bytes / secs / 1e9})
        write["over_" + name] = write["gb_s"] / write[name + "_gb_s"]
    for s in (1, 2):
        shutil.rmtree(step_dir(ck, s))
    return write, loads(data, tmp, ck, nbytes)


def drop_caches():
    """Empties the page cache (root on Linux); False where not permitted."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def load_once(data, ck, ranks, threads, tmp):
    err = train(data, ranks, threads, 3, ["--ckpt", ck, "--resume", "auto"],
                os.path.join(tmp, "load.jsonl"), BIG, 4)
    m = re.search(r"loading step 3 read ([0-9 ,]+) bytes on ranks 0\.\.\d+, of (\d+) stored, "
                  r"in ([0-9.]+) s", err)
    if not m:
        sys.exit("bench: no load line in:\n" + err[-2000:])
    return float(m.group(3))


def loads(data, tmp, ck, nbytes):
    """Resuming the checkpoint written by 2 ranks, and a copy of it for 1 rank
    (fsdp-ckpt reshard), each with SHA-256 and with XXH3-128 chunk digests:
    same world 1->1 and 2->2, reshard 2->1 and 2->4, against cat of the same
    files (warm: both from the page cache), and cold, after dropping the
    page cache, against dd iflag=direct of the same files."""
    stores = {("xxh3", 2): ck}  # written with the default chunk digest
    for h, w in (("xxh3", 1), ("sha256", 2), ("sha256", 1)):
        dst = os.path.join(tmp, f"ck-{h}-{w}")
        shutil.rmtree(dst, ignore_errors=True)
        sh([CKPT, "reshard", ck + "@3", dst, "--world-size", str(w), "--compress", "none",
            "--hash", h])
        stores[(h, w)] = dst
    cases = [("same world 1->1", 1, 1, 2), ("reshard 2->1", 2, 1, 2),
             ("same world 2->2", 2, 2, 1), ("reshard 2->4", 2, 4, 1)]
    rows, cat_s = [], []
    for name, saved, ranks, threads in cases:
        for h in ("sha256", "xxh3"):
            store = stores[(h, saved)]
            files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir(store, 3)) for f in fs]
            cat_t, _ = timed(["sh", "-c", 'cat "$@" > /dev/null', "cat"] + files)
            cat_s.append(cat_t)
            load_once(data, store, ranks, threads, tmp)  # the page cache holds the files
            secs = statistics.median(load_once(data, store, ranks, threads, tmp)
                                     for _ in range(3))
            rows.append({"case": name, "hash": h, "ranks": ranks, "threads": threads,
                         "s": secs, "gb_s": nbytes / secs / 1e9})
    cat = statistics.median(cat_s)
    for r in rows:
        r["over_cat"] = r["gb_s"] / (nbytes / cat / 1e9)
    res = {"cat_s": cat, "cat_gb_s": nbytes / cat / 1e9, "rows": rows,
           "cache": "warm (both read from the page cache; median of 3 loads)"}
    # cold: the same-world 1-rank loads and dd iflag=direct, caches dropped before each
    if drop_caches():
        cold = []
        for h in ("sha256", "xxh3"):
            store = stores[(h, 1)]
            files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir(store, 3)) for f in fs]
            drop_caches()
            dd_t = 0.0
            for f in files:
                t, _ = timed(["dd", "if=" + f, "of=/dev/null", "bs=4M", "iflag=direct",
                              "status=none"])
                dd_t += t
            drop_caches()
            secs = load_once(data, store, 1, 2, tmp)
            cold.append({"hash": h, "s": secs, "gb_s": nbytes / secs / 1e9,
                         "dd_direct_gb_s": nbytes / dd_t / 1e9,
                         "over_dd_direct": dd_t / secs})
        res["cold"] = cold
    else:
        res["cold"] = "not measured: dropping the page cache is not permitted"
    return res


def compression(tmp):
    src = os.path.join(tmp, "ck-sync") + "@%d" % STEPS
    raw = os.path.join(tmp, "cmp-raw")
    shutil.rmtree(raw, ignore_errors=True)
    sh([CKPT, "reshard", src, raw, "--world-size", "2", "--compress", "none"])
    nbytes = stored_bytes(raw)
    rows = []
    for codec in ("none", "zstd:1", "zstd+shuffle:1", "zstd:3", "zstd+shuffle:3"):
        dst = os.path.join(tmp, "cmp-out")
        shutil.rmtree(dst, ignore_errors=True)
        secs, _ = timed([CKPT, "reshard", raw, dst, "--world-size", "2", "--compress", codec])
        out = stored_bytes(dst)
        rows.append({"codec": codec, "s": secs, "ratio": nbytes / out,
                     "raw_gb_s": nbytes / secs / 1e9})
    base = rows[0]["s"]
    for r in rows:
        extra = r["s"] - base
        r["codec_gb_s"] = nbytes / extra / 1e9 if extra > 0 else None
    return {"raw_bytes": nbytes, "rows": rows}


def build():
    """Installs what is missing and builds the release tree."""
    subprocess.run([os.path.join(ROOT, "tools", "setup.sh")], check=True)
    if not os.path.exists(os.path.join(BUILD, "build.ninja")):
        subprocess.run(["meson", "setup", BUILD, ROOT], check=True, capture_output=True)
    subprocess.run(["meson", "compile", "-C", BUILD], check=True, capture_output=True)


def corpus(tmp):
    """The fortunes as byte-level tokens; returns the file."""
    data = os.path.join(tmp, "train.bin")
    files = sorted(f for f in os.listdir("/usr/share/games/fortunes") if "." not in f)
    sh([DATA, "prepare", "--doc-sep", "%", "--out", data] +
       [os.path.join("/usr/share/games/fortunes", f) for f in files])
    return data


SECTIONS = ("tokens", "checkpoints", "write", "compression")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(BUILD, "bench.json"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=BUILD, help="scratch directory on the disk to measure")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help="comma-separated sections (compression needs checkpoints)")
    a = ap.parse_args()
    only = a.only.split(",")
    if set(only) - set(SECTIONS) or ("compression" in only and "checkpoints" not in only):
        ap.error(f"--only: sections are {', '.join(SECTIONS)}; compression needs checkpoints")
    build()
    res = {}
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="bench-") as tmp:
        data = corpus(tmp)
        if "tokens" in only:
            print("bench: tokens/s", file=sys.stderr)
            res["tokens_per_s"] = {
                name: {"1x2": ours(data, margs, steps, 1, 2, tmp),
                       "2x1": ours(data, margs, steps, 2, 1, tmp)}
                for name, margs, steps in (("tiny", ["--model", "tiny"], 40),
                                           ("small", SMALL, 12))}
        if "checkpoints" in only:
            print("bench: checkpoints every %d steps" % EVERY, file=sys.stderr)
            res["checkpoints"] = checkpoint_overheads(data, tmp, a.repeats)
        if "write" in only:
            print("bench: durable write, load", file=sys.stderr)
            res["write"], res["load"] = write_and_load(data, tmp)
        if "compression" in only:
            print("bench: compression", file=sys.stderr)
            res["compression"] = compression(tmp)
    report(res)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.out}")


def report(res):
    if "tokens_per_s" in res:
        print("tokens/s (global batch 8)        1 rank x 2 thr   2 ranks x 1 thr")
        for name, v in res["tokens_per_s"].items():
            print(f"  {name:<30} {v['1x2']:14.0f} {v['2x1']:17.0f}")
    if "checkpoints" in res:
        report_checkpoints(res["checkpoints"])
    if "write" in res:
        report_io(res["write"], res["load"])
    if "compression" in res:
        report_compression(res["compression"])


def report_checkpoints(c):
    mb = 1e6
    print(f"checkpoints, small model, 2 ranks, state {c['state_bytes_stored'] / mb:.1f} MB stored "
          f"(median of {c['repeats']} runs)")
    print(f"  sync save per checkpoint       {c['sync_save_s'] * 1e3:10.1f} ms")
    print(f"  async stall per checkpoint     {c['async_stall_s'] * 1e3:10.1f} ms   "
          f"stall / save {c['stall_over_save'] * 100:.1f}%")
    print(f"  step time, {c['steps']} steps, none     {c['step_s']['none'] * 1e3:10.1f} ms")
    print(f"            sync every {c['every']}       {c['step_s']['sync'] * 1e3:10.1f} ms   "
          f"overhead {c['sync_overhead'] * 100:+.1f}% "
          f"({c['sync_overhead_of_medians'] * 100:+.1f}% of medians)")
    print(f"            async every {c['every']}      {c['step_s']['async'] * 1e3:10.1f} ms   "
          f"overhead {c['async_overhead'] * 100:+.1f}% "
          f"({c['async_overhead_of_medians'] * 100:+.1f}% of medians)")
    print("  (overhead: median over rounds of the round's ratio to its no-checkpoint run;")
    print(f"   the no-checkpoint runs alone spread over {c['none_spread'] * 100:.1f}% of their "
          f"median; time the loop spent in checkpoint work: sync "
          f"{c['sync_loop_share'] * 100:.2f}%, async {c['async_loop_share'] * 100:.2f}%)")


def report_io(w, ld):
    mb = 1e6
    print(f"durable write, GPT-2 124M shapes, {w['bytes'] / mb:.1f} MB, --compress none")
    print(f"  checkpoint (2 ranks)           {w['gb_s']:10.3f} GB/s")
    print(f"  dd bs=4M conv=fsync            {w['dd_gb_s']:10.3f} GB/s   "
          f"checkpoint / dd {w['over_dd']:.2f}")
    print(f"  dd bs=4M oflag=direct,fsync    {w['dd_direct_gb_s']:10.3f} GB/s   "
          f"checkpoint / dd {w['over_dd_direct']:.2f}")
    print(f"load, the same {w['bytes'] / mb:.1f} MB, {ld['cache']}; "
          f"cat > /dev/null {ld['cat_gb_s']:.3f} GB/s")
    same = {r["hash"]: r["gb_s"] for r in ld["rows"] if r["case"] == "same world 1->1"}
    for r in ld["rows"]:
        extra = ""
        if r["case"] == "reshard 2->1":
            extra = f"   reshard / same-world load {r['gb_s'] / same[r['hash']]:.2f}"
        setting = f"{r['ranks']} x {r['threads']} thr, {r['hash']}"
        print(f"  {r['case']:<16} {setting:<20} {r['gb_s']:8.3f} GB/s   "
              f"ratio to cat {r['over_cat']:.2f}{extra}")
    if isinstance(ld["cold"], str):
        print(f"cold cache: {ld['cold']}")
    else:
        for c in ld["cold"]:
            print(f"cold cache, same world 1->1, 1 x 2 thr, {c['hash']:<7} {c['gb_s']:8.3f} GB/s   "
                  f"dd bs=4M iflag=direct {c['dd_direct_gb_s']:.3f} GB/s   "
                  f"ratio {c['over_dd_direct']:.2f}")


def report_compression(cm):
    mb = 1e6
    print(f"compression of the trained state ({cm['raw_bytes'] / mb:.1f} MB raw), offline reshard")
    print("  codec              ratio   whole reshard GB/s   codec-only GB/s")
    for r in cm["rows"]:
        cg = f"{r['codec_gb_s']:.3f}" if r["codec_gb_s"] else "-"
        print(f"  {r['codec']:<16} {r['ratio']:7.3f} {r['raw_gb_s']:20.3f} {cg:>17}")


if __name__ == "__main__":
    main()
