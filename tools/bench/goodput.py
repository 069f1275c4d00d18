#!/usr/bin/python3
"""Goodput under frequent failures (issue 33), torchft's method at this
machine's scale: a supervised run (fsdp-super --np 2 on this host, --model
small by default: about half a second a step on two cores) with
faults injected at a fixed interval of wall time, for a fixed wall time,
next to the same run without faults.

Each fault is, in turn (seeded), a rank kill (SIGKILL of one fsdp-train
process) or, one time in three, a job kill (SIGKILL of every rank at once,
as a lost host takes all of its ranks; the host's RAM, and so its
snapshots, survive it here: losing the machine itself, RAM and all, is
tests/multihost/test_snapshots.py's, healed from the buddy host's copies).
A fault due while no
rank runs (the supervisor relaunching) waits for the next rank to appear:
a fault never lands on nothing. At the end fsdp-super gets SIGTERM (an
operator's stop: an emergency checkpoint, exit 0) and its summary event
is read.

Reported per row:
  efficiency   steps trained / (the fault-free row's steps per second x wall):
               torchft's "training efficiency", relative to no faults
  goodput      fsdp-super's own: productive step time / wall
  lost/fault   steps computed again per fault (back to the last checkpoint)
  down/fault   seconds from a failure's detection to training again
This is a benchmark, not a test: timing belongs here, and the figures move
with the machine's load.

First it measures what a snapshot every step costs on --model small
(mpirun -np 2, no supervisor, no faults): the time the training loop
spends in snapshot work per step (the log's ckpt_s: handing the step to
the background writer, waiting for its write at the next step's vote, the
commit), and the step time with snapshots on against off in the same run
of the bench. The first is the loop's own cost; the second also holds what
the background writer takes from the compute threads on cores they share. Every interval runs twice: healing from the
checkpoint store (--ckpt-every), and with --mem-snapshot-every (healing
from the snapshot in RAM; on one host every rank's snapshot survives a
rank kill and a kill of every rank).

    tools/bench/goodput.py [--wall S] [--intervals 60,15] [--model M] [--ckpt-every N]
                           [--snapshot-every K] [--cost-steps N] [--seed S]
                           [--out FILE]
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("FSDP_BUILD", os.path.join(ROOT, "build"))
TRAIN = os.path.join(BUILD, "src", "fsdp-train")
DATA = os.path.join(BUILD, "src", "fsdp-data")
SUPER = os.path.join(BUILD, "recovery", "fsdp-super")
FORTUNES = "/usr/share/games/fortunes"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
MODEL = ["--global-batch", "8", "--threads", "1", "--log-every", "1000000"]


def descendants(root):
    """pid -> comm of every process below root (read from /proc)."""
    parent, comm = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        close = st.rfind(")")
        comm[int(d)] = st[st.find("(") + 1:close]
        parent[int(d)] = int(st[close + 2:].split()[1])
    out = {}
    for pid in parent:
        p, seen = pid, 0
        while p in parent and p != root and seen < 64:
            p, seen = parent[p], seen + 1
        if p == root and pid != root:
            out[pid] = comm[pid]
    return out


def ranks(sup):
    return sorted(pid for pid, c in descendants(sup.pid).items() if c == "fsdp-train")


def one_run(tmp, data, model, name, wall, interval, ckpt_every, snap_every, rng):
    ck = os.path.join(tmp, f"ck-{name}")
    ev = os.path.join(tmp, f"events-{name}.jsonl")
    err = open(os.path.join(tmp, f"super-{name}.err"), "w")
    snap = f"/dev/shm/fsdp-goodput-{os.getpid()}-{name}"
    more = ["--mem-snapshot-every", str(snap_every), "--mem-snapshot-dir", snap] \
        if snap_every else []
    cmd = [SUPER, "--np", "2", "--events", ev, "--max-restarts", "1000", "--grace", "2",
           "--heartbeat-timeout", "10", "--", TRAIN, "--data", data, "--steps", "100000000",
           "--ckpt", ck, "--ckpt-every", str(ckpt_every), "--model", model] + MODEL + more
    sup = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    t0 = time.monotonic()
    faults, kinds = [], {"rank": 0, "all": 0}
    next_fault = t0 + interval if interval else None
    while time.monotonic() - t0 < wall and sup.poll() is None:
        now = time.monotonic()
        if next_fault and now >= next_fault:
            live = ranks(sup)
            if live:
                kind = "all" if rng.random() < 1 / 3 else "rank"
                victims = live if kind == "all" else [rng.choice(live)]
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                kinds[kind] += 1
                faults.append(round(now - t0, 1))
                next_fault += interval
                while next_fault <= now:  # one late fault does not bring a burst
                    next_fault += interval
        time.sleep(0.05)
    sup.send_signal(signal.SIGTERM)
    try:
        sup.wait(timeout=120)
    except subprocess.TimeoutExpired:
        sup.kill()
        sup.wait()
        sys.exit(f"goodput: fsdp-super did not stop after SIGTERM ({name})")
    shutil.rmtree(snap, ignore_errors=True)  # a stopped run keeps them for its next launch
    summary = None
    with open(ev) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "summary":
                summary = e
    if summary is None:
        sys.exit(f"goodput: no summary from fsdp-super ({name}); see "
                 f"{os.path.join(tmp, f'super-{name}.err')}")
    return {"name": name, "interval_s": interval, "faults": len(faults), "kinds": kinds,
            "fault_at_s": faults, "wall_s": summary["wall_s"], "steps": summary["final_step"],
            "goodput": summary["goodput"], "steps_lost": summary["steps_lost"],
            "downtime_s": summary["downtime_s"], "restarts": summary["restarts"]}


def snapshot_cost(tmp, data, steps):
    """Per step of --model small: (ms a step, ms of it in checkpoint work)
    with snapshots off and on, steps 2 .. steps-1 (the first step and the
    final checkpoint left out)."""
    out = {}
    for snap in (0, 1):
        ck, log = os.path.join(tmp, f"cost-ck-{snap}"), os.path.join(tmp, f"cost-{snap}.jsonl")
        sdir = f"/dev/shm/fsdp-goodput-{os.getpid()}-cost"
        more = ["--mem-snapshot-every", "1", "--mem-snapshot-dir", sdir] if snap else []
        cmd = ["mpirun", "-np", "2", "--oversubscribe", TRAIN, "--data", data, "--model", "small",
               "--global-batch", "8", "--steps", str(steps), "--ckpt", ck, "--ckpt-every",
               str(10 * steps), "--log", log, "--log-every", "1000000"] + more
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
        shutil.rmtree(sdir, ignore_errors=True)
        if p.returncode:
            sys.exit(f"goodput: the cost run failed:\n{p.stderr[-2000:]}")
        with open(log) as f:
            rows = [r for r in map(json.loads, f) if "step" in r]
        a, b = rows[1], rows[-2]
        n = b["step"] - a["step"]
        out[snap] = (1000 * (b["elapsed_s"] - a["elapsed_s"]) / n,
                     1000 * (b["ckpt_s"] - a["ckpt_s"]) / n)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wall", type=float, default=120, help="seconds per row (120)")
    ap.add_argument("--intervals", default="60,15", help="seconds between faults (60,15)")
    ap.add_argument("--model", default="small", help="fsdp-train --model of the rows (small)")
    ap.add_argument("--ckpt-every", type=int, default=20, help="checkpoint interval in steps (20)")
    ap.add_argument("--snapshot-every", type=int, default=1,
                    help="--mem-snapshot-every of the rows with snapshots (1)")
    ap.add_argument("--cost-steps", type=int, default=24,
                    help="steps of the --model small cost runs (24; 0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="write the rows as JSON here too")
    a = ap.parse_args()
    for exe in (TRAIN, DATA, SUPER):
        if not os.access(exe, os.X_OK):
            sys.exit(f"goodput: {exe} not built (meson setup build && meson compile -C build)")
    rng = random.Random(a.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-goodput-") as tmp:
        data = os.path.join(tmp, "train.bin")
        files = sorted(os.path.join(FORTUNES, f) for f in os.listdir(FORTUNES) if "." not in f)
        subprocess.run([DATA, "prepare", "--doc-sep", "%", "--out", data] + files, check=True,
                       capture_output=True)
        cost = snapshot_cost(tmp, data, a.cost_steps) if a.cost_steps else None
        plan = [("no faults", 0)] + [(f"every {float(i):g} s", float(i))
                                     for i in a.intervals.split(",") if i]
        for name, interval in plan:
            for snap in (0, a.snapshot_every):
                label = f"{name}, " + (f"snapshots {snap}" if snap else "storage")
                row = one_run(tmp, data, a.model, label.replace(" ", "-").replace(",", ""), a.wall,
                              interval, a.ckpt_every, snap, random.Random(rng.random()))
                row["name"], row["snapshot_every"] = label, snap
                rows.append(row)
                print(f"  {label}: {row['steps']} steps in {row['wall_s']:.1f} s, "
                      f"{row['faults']} faults", file=sys.stderr, flush=True)
    rate = rows[0]["steps"] / rows[0]["wall_s"]
    if cost:
        (off, _), (on, work) = cost[0], cost[1]
        print(f"snapshot cost, --model small, mpirun -np 2, {a.cost_steps} steps: "
              f"{work:.1f} ms of a {on:.0f} ms step in snapshot work ({100 * work / on:.1f}%); "
              f"step {off:.0f} ms with snapshots off, {on:.0f} ms on "
              f"({100 * (on / off - 1):+.1f}%)")
    print(f"goodput bench: fsdp-super --np 2 on one host, --model {a.model}, --ckpt-every "
          f"{a.ckpt_every}, {a.wall:g} s a row; 'storage' heals from the checkpoint store, "
          f"'snapshots K' from --mem-snapshot-every K in RAM")
    print(f"{'faults, healing from':<32} {'n':>3} {'rank/all':>9} {'steps':>7} {'efficiency':>10} "
          f"{'goodput':>8} {'lost/fault':>10} {'down/fault':>10}")
    for r in rows:
        n = r["faults"]
        r["efficiency"] = r["steps"] / (rate * r["wall_s"])
        lost = f"{r['steps_lost'] / n:.1f}" if n else "-"
        down = f"{r['downtime_s'] / n:.2f} s" if n else "-"
        print(f"{r['name']:<32} {n:>3} {r['kinds']['rank']:>4}/{r['kinds']['all']:<4} "
              f"{r['steps']:>7} {100 * r['efficiency']:>9.1f}% {100 * r['goodput']:>7.1f}% "
              f"{lost:>10} {down:>10}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "wall_s": a.wall, "cost_ms": cost,
                       "ckpt_every": a.ckpt_every, "seed": a.seed, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
