#!/usr/bin/python3
"""A run's report: fsdp-train's JSON step log (--log) and fsdp-super's events
(--events) as one PNG and a text summary.

    tools/report.py LOG [--events EVENTS] [--out PNG]

The PNG: training and validation loss against step (top) and against wall
time (bottom); restarts (red) and resizes (purple) marked, downtime (failure
noticed to training again) shaded, checkpoint commits ticked along the
bottom of each plot. The summary (stdout): steps, losses, launches, restarts
by cause, downtime, goodput, checkpoints. Without events the wall-time axis
is the trainer's own elapsed time and nothing is marked.

Both files are read as JSON lines; a line that is not a JSON object, or a
field that is not what it should be, is skipped and counted, never trusted.
"""

import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_jsonl(path, what):
    out, bad = [], 0
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        sys.exit(f"report: {what} {path}: {e.strerror}")
    with f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                bad += 1
    return out, bad


def num(obj, key):
    v = obj.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        v = float(v)  # an integer too large for a float raises here
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def whole(obj, key):
    v = obj.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="fsdp-train --log FILE")
    ap.add_argument("--events", help="fsdp-super --events FILE")
    ap.add_argument("--out", default="report.png", help="the PNG to write (default report.png)")
    a = ap.parse_args()
    steps, bad_steps = read_jsonl(a.log, "log")
    events, bad_events = read_jsonl(a.events, "events") if a.events else ([], 0)
    rows = [(num(s, "step"), num(s, "loss"), num(s, "val_loss"), num(s, "elapsed_s"),
             whole(s, "generation")) for s in steps]
    rows = [r for r in rows if r[0] is not None and r[1] is not None]
    if not rows:
        sys.exit(f"report: {a.log}: no step with a step and a loss")

    # wall time: a launch's steps count from its "resumed" event
    t0 = next((num(e, "t") for e in events if e.get("event") == "start"), None)
    resumed_at, generation = {}, None
    for e in events:
        if e.get("event") == "launch":
            generation = whole(e, "generation")
        elif e.get("event") == "resumed" and generation is not None and num(e, "t") is not None:
            resumed_at.setdefault(generation, num(e, "t"))

    def wall(r):
        base = resumed_at.get(r[4]) if t0 is not None else None
        return (base - t0 if base is not None else 0.0) + (r[3] or 0.0)

    def at(e):
        return num(e, "t") - t0 if t0 is not None and num(e, "t") is not None else None

    restarts = [e for e in events if e.get("event") == "restart"]
    resizes = [e for e in events if e.get("event") == "resize"]
    commits = [e for e in events if e.get("event") == "checkpoint_committed"]
    # what ends a launch (fsdp-super's names), and the restart that follows any of them
    failures = [e for e in events if e.get("event") in
                ("rank_died", "heartbeat_lost", "exit", "peer_lost", "daemon_lost",
                 "preemption_notice", "host_removed", "restart")]
    launches = [e for e in events if e.get("event") == "launch"]
    resumes = [e for e in events if e.get("event") == "resumed"]
    summary = next((e for e in reversed(events) if e.get("event") == "summary"), {})

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    xs = [r[0] for r in rows]
    top.plot(xs, [r[1] for r in rows], lw=0.8, label="training loss")
    vals = [r for r in rows if r[2] is not None]
    if vals:
        top.plot([r[0] for r in vals], [r[2] for r in vals], "o-", ms=3, label="validation loss")
    bottom.plot([wall(r) for r in rows], [r[1] for r in rows], lw=0.8, label="training loss")
    if vals:
        bottom.plot([wall(r) for r in vals], [r[2] for r in vals], "o-", ms=3,
                    label="validation loss")
    # each outage: its first failure after a resume, to the next resume
    outages, downtime = [], 0.0
    timed = [r for r in resumes if at(r) is not None]
    for prev, nxt in zip(timed, timed[1:]):
        first = next((f for f in failures if at(f) is not None and at(prev) < at(f) < at(nxt)),
                     None)
        if first is not None:
            outages.append((first, nxt))
            downtime += at(nxt) - at(first)
    for fail, back in outages:
        lost_from, lost_to = num(back, "step"), num(fail, "step")
        if lost_to is not None:
            top.axvline(lost_to, color="red", ls="--", lw=0.8)
            if lost_from is not None and lost_from < lost_to:  # steps computed again
                top.axvspan(lost_from, lost_to, color="red", alpha=0.1, lw=0)
        bottom.axvline(at(fail), color="red", ls="--", lw=0.8)
        bottom.axvspan(at(fail), at(back), color="red", alpha=0.15, lw=0)
    for e in resizes:
        if at(e) is not None:
            bottom.axvline(at(e), color="purple", ls=":", lw=1)
            bottom.annotate(f"np {e.get('from')}->{e.get('to')}", (at(e), 1), color="purple",
                            xycoords=("data", "axes fraction"), va="top", fontsize=8)
    for e in commits:
        if num(e, "step") is not None:
            top.plot(num(e, "step"), 0, "|", color="green", ms=10, transform=top.get_xaxis_transform())
        if at(e) is not None:
            bottom.plot(at(e), 0, "|", color="green", ms=10,
                        transform=bottom.get_xaxis_transform())
    top.set_xlabel("step")
    bottom.set_xlabel("wall time (s)" + ("" if t0 is not None else ", the trainer's own"))
    for ax in (top, bottom):
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
    top.legend(loc="upper right")
    top.set_title("red dashes: failures (top: steps computed again shaded; bottom: downtime "
                  "shaded), green ticks: checkpoint commits", fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)

    by_cause = {}
    for e in restarts:
        by_cause[str(e.get("cause"))] = by_cause.get(str(e.get("cause")), 0) + 1
    last = rows[-1]
    print(f"report: {len(rows)} steps logged, last step {last[0]:.0f}, training loss "
          f"{rows[0][1]:.4f} -> {last[1]:.4f}" +
          (f", validation loss {vals[0][2]:.4f} -> {vals[-1][2]:.4f}" if vals else ""))
    if events:
        causes = ", ".join(f"{k} {v}" for k, v in sorted(by_cause.items()))
        print(f"report: {len(launches)} launches, {len(restarts)} restarts"
              + (f" ({causes})" if causes else "") + f", {len(resizes)} resizes, "
              f"downtime {downtime:.1f} s (failure to resumed; the supervisor's own figure, to "
              f"training again: {num(summary, 'downtime_s') or 0:.1f} s), "
              f"{len(commits)} checkpoint commits"
              + (f", goodput {100 * num(summary, 'goodput'):.0f}%"
                 if num(summary, "goodput") is not None else ""))
    if bad_steps or bad_events:
        print(f"report: skipped {bad_steps} unreadable log lines, {bad_events} event lines")
    print(f"report: wrote {a.out}")


if __name__ == "__main__":
    main()
