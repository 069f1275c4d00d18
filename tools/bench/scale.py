#!/usr/bin/python3
"""Checkpoint metadata at scale: what a commit and a load cost per rank as
the world grows, for real model layouts, in format 1 (every chunk table in
the manifest) and format 2 (chunk indexes in the shards), with no tensor
data. Each figure comes from fsdp-scale-sim (tools/bench/scale_sim.c), which
runs the real ckpt/ code, one process per measurement (its peak memory is
its own, read with wait4).

    tools/bench/scale.py [--models gpt2-124m,7b,70b,120b] [--worlds 8,...,16384]
                         [--out FILE.json] [--plot FILE.png] [--dir DIR]
    tools/bench/scale.py --replot FILE.json [--plot FILE.png]

Per model, world size and format:
  manifest        its bytes (format 1 above 256 MB: a lower bound from its
                  first shard's entry, not built; a format-1 reader refuses
                  manifests over 64 MiB, so such a step never loads)
  record          what a rank sends rank 0 at commit (the gather, per rank)
  commit          rank 0's time from the gathered records to the manifest's
                  bytes (parse, check, serialise), and that process's peak
  load            a rank of the new world (N, N/2, 2N): metadata bytes it
                  reads from storage (format 1: the whole manifest; format
                  2: the chunk indexes of the old shards it reads - the
                  manifest itself comes by broadcast from rank 0), and its
                  planning time (parse the manifest, plan, fetch indexes),
                  and the peak of that process.
Prints a table, writes JSON and a log-log PNG (matplotlib: tools/setup.sh
--bench installs python3-matplotlib).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SIM = os.path.join(os.environ.get("FSDP_BUILD", os.path.join(ROOT, "build")), "tools",
                   "fsdp-scale-sim")
MODELS = ["gpt2-124m", "7b", "70b", "120b"]
WORLDS = [8 << i for i in range(12)]  # 8 ... 16384
V1_LIMIT = 64 << 20  # the format-1 reader's manifest limit
V1_BUILD = 256 << 20  # format-1 manifests larger than this are sized, not built


def run_one(args):
    """fsdp-scale-sim with its peak resident memory (MiB) from wait4."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.execv(SIM, [SIM] + args)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"scale: fsdp-scale-sim {' '.join(args)} failed (status {status})")
    return json.loads(out), usage.ru_maxrss / 1024


def measure(model, world, tmp):
    row = {"model": model, "world": world}
    for fmt in (1, 2):
        base = ["--model", model, "--world", str(world), "--format", str(fmt)]
        size, _ = run_one(base + ["--phase", "size"]) if fmt == 1 else (None, None)
        f = {}
        if fmt == 1 and size["manifest_bytes"] > V1_BUILD:
            f = {"manifest_bytes": size["manifest_bytes"], "estimated": True}
        else:
            c, peak = run_one(base + ["--phase", "commit"])
            f = {"manifest_bytes": c["manifest_bytes"], "record_bytes": c["record_bytes"],
                 "commit_s": c["commit_s"], "commit_peak_mib": peak}
            d = os.path.join(tmp, f"{model}-{world}-{fmt}")
            ld, peak = run_one(base + ["--phase", "load", "--dir", d])
            shutil.rmtree(d, ignore_errors=True)
            f["load"] = ld["to"]
            f["load_peak_mib"] = peak
        f["loadable"] = fmt == 2 or f["manifest_bytes"] <= V1_LIMIT
        row[f"v{fmt}"] = f
    return row


def human(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def report(rows):
    print("checkpoint metadata per world size (format 1 -> format 2); load: a rank of "
          "N -> N/2 ranks")
    print(f"{'model':<10} {'world':>6} {'manifest':>22} {'gather/rank':>19} "
          f"{'rank 0 commit s':>17} {'read at load/rank':>22} {'plan s':>15} {'peak MiB':>13}")
    for r in rows:
        a, b = r["v1"], r["v2"]
        est = "~" if a.get("estimated") else ""

        def pair(x, y, fmt):
            return f"{fmt(x) if x is not None else '-':>9} -> {fmt(y):<9}"
        half_a = a["load"][1] if "load" in a else None
        half_b = b["load"][1]
        print(f"{r['model']:<10} {r['world']:>6} "
              f"{est + human(a['manifest_bytes']):>10} -> {human(b['manifest_bytes']):<9} "
              f"{pair(a.get('record_bytes'), b['record_bytes'], human)} "
              f"{pair(a.get('commit_s'), b['commit_s'], lambda s: f'{s:.3f}')} "
              f"{pair(half_a and half_a['metadata_read_bytes'], half_b['metadata_read_bytes'], human)} "
              f"{pair(half_a and half_a['parse_s'] + half_a['plan_s'], half_b['parse_s'] + half_b['plan_s'] + half_b['index_s'], lambda s: f'{s:.3f}')} "
              f"{pair(a.get('load_peak_mib'), b['load_peak_mib'], lambda m: f'{m:.0f}')}"
              + ("" if a["loadable"] else "  (format 1: over the reader's 64 MiB limit)"))


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scale: no plot (tools/setup.sh --bench installs python3-matplotlib)",
              file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = [
        ("manifest bytes", lambda f: f["manifest_bytes"]),
        ("metadata a rank reads at load (N -> N/2), bytes",
         lambda f: f["load"][1]["metadata_read_bytes"] if "load" in f else None),
        ("a rank's planning time at load (N -> N/2), s",
         lambda f: (f["load"][1]["parse_s"] + f["load"][1]["plan_s"] + f["load"][1]["index_s"])
         if "load" in f else None),
    ]
    colors = dict(zip(MODELS, ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for ax, (title, get) in zip(axes, panels):
        for model in sorted({r["model"] for r in rows}, key=MODELS.index):
            rs = [r for r in rows if r["model"] == model]
            for fmt, style in (("v1", "--"), ("v2", "-")):
                pts = [(r["world"], get(r[fmt])) for r in rs if get(r[fmt]) is not None]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=colors[model],
                            label=f"{model} format {fmt[1]}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("world size (ranks)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].axhline(V1_LIMIT, color="grey", lw=0.8)
    axes[0].text(8, V1_LIMIT * 1.3, "format 1 reader's 64 MiB limit", fontsize=8, color="grey")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("fsdp-ckpt checkpoint metadata: format 1 (dashed) vs format 2 (solid)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-scale.json"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "build", "bench-scale.png"))
    ap.add_argument("--dir", help="where the sparse shard objects go (default: a temporary "
                                  "directory)")
    ap.add_argument("--replot", metavar="JSON", help="print the table and plot of an earlier "
                    "run's JSON instead of measuring")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            rows = json.load(f)
        report(rows)
        plot(rows, a.plot)
        return
    if not os.path.exists(SIM):
        sys.exit(f"scale: {SIM} is missing: build first (meson setup build && ninja -C build)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-scale-", dir=a.dir) as tmp:
        for model in a.models.split(","):
            for world in map(int, a.worlds.split(",")):
                print(f"scale: {model} on {world} ranks", file=sys.stderr)
                rows.append(measure(model, world, tmp))
    report(rows)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    if plot(rows, a.plot):
        print(f"scale: wrote {a.out} and {a.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
