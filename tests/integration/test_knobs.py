"""The FSDP knobs change speed and memory, not the numbers.

Activation checkpointing (--activation-checkpointing none|blocks|every-N)
recomputes blocks' forward passes during the backward instead of keeping
their activations: the per-step losses are bit-identical to keeping
everything, on 1 and 2 real Open MPI ranks, the activation memory the banner
and the log report shrinks, and a checkpoint written under one setting
resumes (bit-exactly at the same world size, resharded at another) under
another.

The matmul library (--matmul onednn|openblas) changes rounding only: the
losses of the two agree to 1e-5 relative, and the banner names the one in
use.

Mixed precision (--precision bf16) follows fp32 over 200 steps of tiny: the
mean loss of each 50-step window within 5% of fp32's for the first window
(the fast early descent, where any rounding moves the curve sideways) and
2% after it, and the final validation loss within 2% (measured here: 2.9%,
0.6%, 0.4%, 0.4%; validation 0.4%). Two bf16 runs give the same bits; a
bf16 checkpoint resumes bit-exactly in bf16 and resumes in fp32 (and the
reverse), since the shards are fp32 master state either way. A CPU or
kernel level without AVX512_BF16 runs fp32 and says so in the banner.

Prefetch (--prefetch on|off, default on) overlaps the collectives with
compute; the losses are the same bits on 2 and 4 ranks for every strategy,
precision, gradient reduction type, recompute setting and gradient
accumulation, and a checkpoint written with one setting resumes under the
other, at the same and at another world size. The log's comm_s is the time
the compute thread spent in collectives (the part prefetch did not hide);
tools/bench/bench_train.py reports it per step.

Wrap granularity (--unit-blocks K) gathers, frees and reduce-scatters K
blocks as one unit with one collective each; the losses are the same bits
for every K on 2 and 4 ranks, and checkpoints do not depend on K (each rank
owns the same slice of every block whatever the grouping): one written with
K = 2 resumes bit-exactly with K = 1 and K = 3 and reshards to another world
size.

Gradient buckets (--bucket-mib X): --shard none all-reduces buckets of
about X MiB as the step's last backward finishes them; the sums are taken
in rank order, so every bucket size gives the same bits (2, 3 and 4 ranks,
with gradient accumulation and bf16 reduction). For grad-op, X sizes the
units (the banner names the blocks per unit)."""

import os
import re
import shutil

from harness import (TRAIN, committed_steps, digest, kill_job, launch, main, mpirun,
                     prepare_corpus, read_log, run, slow, wait_stopped_or_exit)

STEPS = 20
MODES = ("none", "blocks", "every-2", "every-3")


def run_log(tmp, train, np, extra, tag, steps=STEPS):
    log = f"{tmp}/{tag}.jsonl"
    if os.path.exists(log):  # fsdp-train appends (one log across restarts)
        os.remove(log)
    p = mpirun(np, [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                    "--steps", str(steps), "--log", log, "--log-every", "100"] + list(extra))
    return read_log(log), p.stderr


def stopped_after_first_commit(np, argv, ck):
    """Runs argv on np ranks until it has committed its first checkpoint
    (step 6 here), then kills the job: an interrupted run to resume."""
    p = launch(np, argv, {"FSDP_TEST_STOP_AT": "after-commit:1"})
    assert wait_stopped_or_exit(p)
    kill_job(p)
    assert committed_steps(ck) == [6]


def activation_mib(stderr):
    m = re.search(r"activations ([\d.]+) MiB \(activation checkpointing ([\w-]+)\)", stderr)
    assert m, f"no activation line in:\n{stderr}"
    return float(m.group(1)), m.group(2)


def activation_checkpointing_keeps_the_loss_bits(tmp):
    train, _ = prepare_corpus(tmp)
    for np in (1, 2):
        ref = None
        mib = {}
        for mode in MODES:
            steps, err = run_log(tmp, train, np, ["--activation-checkpointing", mode],
                                 f"np{np}-{mode}")
            assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
            losses = [s["loss"] for s in steps]
            mib[mode], named = activation_mib(err)
            assert named == mode, f"the banner names {named} for {mode}"
            assert abs(steps[0]["activation_bytes"] / 2**20 - mib[mode]) < 0.01, steps[0]
            assert re.search(r"peak resident memory per rank: [\d.]+ MiB \(rank \d+\)", err), err
            if ref is None:
                ref = losses
                assert ref[-1] < ref[0] - 1.0, "the reference run did not learn"
            assert losses == ref, f"{np} rank(s), {mode}: losses differ from none:\n" \
                f"{losses}\n{ref}"
            print(f"  {np} rank(s), {mode:7s}: same {STEPS} losses, activations "
                  f"{mib[mode]:.2f} MiB")
        # tiny has 4 blocks: every-2 and every-3 recompute two of them
        assert mib["blocks"] < mib["every-2"] < mib["none"], mib
        assert mib["every-3"] == mib["every-2"], mib


def checkpoints_resume_across_checkpointing_settings(tmp):
    train, _ = prepare_corpus(tmp)
    args = lambda ck, mode: [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                             "--steps", "12", "--ckpt", ck, "--ckpt-every", "6",
                             "--log-every", "100", "--activation-checkpointing", mode]
    ref = f"{tmp}/ref"
    mpirun(2, args(ref, "none"))
    # written under "blocks", stopped and killed right after committing step 6
    ck = f"{tmp}/ck"
    stopped_after_first_commit(2, args(ck, "blocks"), ck)
    other = f"{tmp}/ck-1rank"
    shutil.copytree(ck, other, symlinks=True)
    p = mpirun(2, args(ck, "every-2"))
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert digest(ck) == digest(ref), "the resumed run's final state differs from the reference"
    print("  blocks -> every-2 on 2 ranks: final digest equals the uninterrupted run's")
    p = mpirun(1, args(other, "every-3") + ["--verify-load", "on"])
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert committed_steps(other) == [6, 12]
    print("  blocks on 2 ranks -> every-3 on 1 rank: resharded, resumed and finished")


def the_matmul_libraries_agree_to_rounding(tmp):
    train, _ = prepare_corpus(tmp)
    p = run([TRAIN, "--data", train, "--matmul", "onednn", "--steps", "1"], check=False)
    if "has no oneDNN" in p.stderr:
        print("  skipped: this build has no oneDNN (libdnnl-dev)")
        return
    got = {}
    for lib in ("openblas", "onednn"):
        steps, err = run_log(tmp, train, 2, ["--matmul", lib], f"mm-{lib}")
        assert re.search(rf"; {lib}[ \d.]* matmuls;", err), err
        got[lib] = [s["loss"] for s in steps]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got["onednn"], got["openblas"]))
    print(f"  onednn against openblas, {STEPS} steps on 2 ranks: worst relative "
          f"difference {worst:.2e}")
    assert worst < 1e-5, worst


def precision_of(stderr):
    m = re.search(r"precision (fp32|bf16)( \(bf16 asked for, but [^)]*\))?", stderr)
    assert m, f"no precision in the banner:\n{stderr}"
    return m.group(1), m.group(0)


@slow
def bf16_follows_fp32_over_200_steps(tmp):
    train, val = prepare_corpus(tmp)
    runs = {}
    for prec in ("fp32", "bf16", "bf16"):
        steps, err = run_log(tmp, train, 1, ["--precision", prec, "--val-data", val],
                             f"prec-{prec}-{len(runs)}", steps=200)
        got, banner = precision_of(err)
        if prec == "bf16" and got != "bf16":
            print(f"  {banner}: comparing fp32 with itself")
        runs[prec if prec not in runs else "bf16-again"] = steps
    a, b = runs["fp32"], runs["bf16"]
    assert [s["loss"] for s in b] == [s["loss"] for s in runs["bf16-again"]], \
        "two bf16 runs differ"
    for w in range(4):
        ma = sum(s["loss"] for s in a[50 * w:50 * w + 50]) / 50
        mb = sum(s["loss"] for s in b[50 * w:50 * w + 50]) / 50
        rel = abs(ma - mb) / ma
        tol = 0.05 if w == 0 else 0.02
        print(f"  steps {50 * w + 1}-{50 * w + 50}: mean loss fp32 {ma:.4f}, bf16 {mb:.4f} "
              f"({rel:.2%}, tolerance {tol:.0%})")
        assert rel <= tol, f"window {w}: {rel:.2%} > {tol:.0%}"
    va, vb = a[-1]["val_loss"], b[-1]["val_loss"]
    print(f"  validation loss fp32 {va:.4f}, bf16 {vb:.4f} ({abs(va - vb) / va:.2%})")
    assert abs(va - vb) / va <= 0.02
    assert b[-1]["loss"] < 0.6 * b[0]["loss"], "bf16 did not learn"


def bf16_is_the_same_for_every_strategy(tmp):
    """NO_SHARD in bf16 reads a rounded copy of its parameters, as the
    sharded strategies' bf16 gathers give them."""
    train, _ = prepare_corpus(tmp)
    got = {}
    for shard in ("full", "grad-op", "none"):
        steps, _ = run_log(tmp, train, 2, ["--precision", "bf16", "--shard", shard],
                           f"bf16-{shard}")
        got[shard] = [s["loss"] for s in steps]
    for shard in ("grad-op", "none"):
        worst = max(abs(a - b) / abs(b) for a, b in zip(got[shard], got["full"]))
        print(f"  2 ranks, bf16, {shard} against full: worst relative difference {worst:.2e}")
        assert worst <= 1e-4, worst


def checkpoints_move_between_precisions(tmp):
    train, _ = prepare_corpus(tmp)
    args = lambda ck, prec: [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                             "--steps", "12", "--ckpt", ck, "--ckpt-every", "6",
                             "--log-every", "100", "--precision", prec]
    for first, then in (("bf16", "bf16"), ("bf16", "fp32"), ("fp32", "bf16")):
        ref, ck = f"{tmp}/ref-{then}", f"{tmp}/ck-{first}-{then}"
        if not os.path.exists(ref):
            mpirun(2, args(ref, then))
        stopped_after_first_commit(2, args(ck, first), ck)
        p = mpirun(2, args(ck, then))
        assert "resumed from checkpoint step 6" in p.stderr, p.stderr
        assert committed_steps(ck) == [6, 12]
        same = digest(ck) == digest(ref)
        print(f"  {first} -> {then}: resumed and finished; final state "
              f"{'equals' if same else 'differs from'} the uninterrupted {then} run's")
        if first == then:
            assert same, "a bf16 run resumed in bf16 did not reproduce the uninterrupted run"


def bf16_gradient_reduction_follows_fp32_and_resumes(tmp):
    """--reduce-dtype bf16: every strategy's gradients cross the ranks in
    bf16 (rounded per partial sum); on 2 and 4 ranks, with and without
    gradient accumulation, the losses stay within 1e-2 of fp32 reduction for
    20 steps (measured: 3.8e-3 on 2 ranks), two runs give the same bits, and
    the setting resumes from fp32 checkpoints, bit-exactly from its own, and
    on another world size."""
    train, _ = prepare_corpus(tmp)
    # (ranks, strategy, micro-batch): 4 ranks make partial sums of partial
    # sums; micro-batch 2 accumulates two rounded reductions per step
    for np, shard, micro in ((2, "full", 4), (2, "grad-op", 4), (2, "none", 4), (4, "full", 2),
                             (2, "full", 2), (2, "none", 2)):
        extra = ["--shard", shard, "--micro-batch", str(micro)]
        tag = f"{np}-{shard}-{micro}"
        ref, _ = run_log(tmp, train, np, extra, f"r32-{tag}")
        got, err = run_log(tmp, train, np, extra + ["--reduce-dtype", "bf16"], f"r16-{tag}")
        assert "gradients reduced in bf16" in err, err
        a, b = [s["loss"] for s in got], [s["loss"] for s in ref]
        worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        print(f"  {np} ranks, {shard}, micro-batch {micro}, bf16 reduction against fp32: worst "
              f"relative difference {worst:.2e} over {len(a)} steps")
        assert 0 < worst <= 1e-2, worst
        if np == 4:
            again, _ = run_log(tmp, train, np, extra + ["--reduce-dtype", "bf16"], "r16-again")
            assert [s["loss"] for s in again] == a, "two bf16-reduction runs differ"
    args = lambda ck, red: [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                            "--steps", "12", "--ckpt", ck, "--ckpt-every", "6",
                            "--log-every", "100", "--reduce-dtype", red]
    ref = f"{tmp}/ref-bf16"
    mpirun(2, args(ref, "bf16"))
    for first in ("fp32", "bf16"):
        ck = f"{tmp}/ck-{first}"
        stopped_after_first_commit(2, args(ck, first), ck)
        p = mpirun(2, args(ck, "bf16"))
        assert "resumed from checkpoint step 6" in p.stderr, p.stderr
        same = digest(ck) == digest(ref)
        print(f"  {first} reduction -> bf16: resumed and finished; final state "
              f"{'equals' if same else 'differs from'} the uninterrupted run's")
        if first == "bf16":
            assert same, "a bf16-reduction run resumed from its own checkpoint differs"
    ck = f"{tmp}/ck-fp32"  # its step 12 as written on 2 ranks, continued on 1
    longer = args(ck, "bf16")
    longer[longer.index("--steps") + 1] = "18"
    p = run(longer)
    assert "resumed from checkpoint step 12" in p.stderr and committed_steps(ck)[-1] == 18, \
        p.stderr


def prefetch_keeps_the_loss_bits_and_resumes(tmp):
    train, _ = prepare_corpus(tmp)
    cases = ((2, ["--shard", "full"]),
             (2, ["--shard", "grad-op", "--micro-batch", "2"]),
             (2, ["--shard", "none"]),
             (2, ["--shard", "full", "--precision", "bf16", "--reduce-dtype", "bf16",
                  "--activation-checkpointing", "every-2"]),
             # 4 ranks: the reduce-scatter sums four parts; its order must not
             # depend on whether the collective blocked
             (4, ["--shard", "full", "--micro-batch", "1"]),
             (4, ["--shard", "grad-op", "--precision", "bf16"]))
    for np, extra in cases:
        got = {}
        for pf in ("off", "on"):
            steps, err = run_log(tmp, train, np, extra + ["--prefetch", pf], f"pf-{pf}", steps=10)
            shard = extra[1]
            want = "on" if pf == "on" and shard != "none" else "off"
            assert f"prefetch {want}," in err, f"the banner should say prefetch {want}:\n{err}"
            comm = [s["comm_s"] for s in steps]
            assert comm == sorted(comm) and comm[-1] > 0, comm
            got[pf] = ([s["loss"] for s in steps], comm[-1] / len(comm))
        assert got["on"][0] == got["off"][0], f"{np} ranks {extra}: prefetch changed the losses" \
            f"\n{got['on'][0]}\n{got['off'][0]}"
        print(f"  {np} ranks, {' '.join(extra)}: same 10 losses; time in collectives per step "
              f"{got['off'][1] * 1e3:.1f} ms off, {got['on'][1] * 1e3:.1f} ms on")
    args = lambda ck, pf: [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                           "--steps", "12", "--ckpt", ck, "--ckpt-every", "6",
                           "--log-every", "100", "--prefetch", pf]
    ref = f"{tmp}/ref-pf"
    mpirun(2, args(ref, "off"))
    ck = f"{tmp}/ck-pf"
    stopped_after_first_commit(2, args(ck, "off"), ck)
    other = f"{tmp}/ck-pf-4"
    shutil.copytree(ck, other, symlinks=True)
    p = mpirun(2, args(ck, "on"))
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert digest(ck) == digest(ref), "prefetch on, resumed from prefetch off, differs"
    print("  off -> on on 2 ranks: final digest equals the uninterrupted run's")
    p = mpirun(4, args(other, "on") + ["--verify-load", "on"])
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert committed_steps(other) == [6, 12]
    print("  off on 2 ranks -> on on 4 ranks: resharded, verified, resumed and finished")


def unit_grouping_keeps_the_loss_bits_and_the_checkpoints(tmp):
    train, _ = prepare_corpus(tmp)
    # tiny has 4 blocks: K = 3 leaves a last unit of one block
    for np, extra in ((2, ["--shard", "full"]),
                      (2, ["--shard", "grad-op", "--micro-batch", "2"]),
                      (4, ["--shard", "full", "--precision", "bf16", "--reduce-dtype", "bf16",
                           "--activation-checkpointing", "every-2"]),
                      (4, ["--shard", "full", "--prefetch", "off", "--micro-batch", "1"])):
        ref = None
        for k in (1, 2, 3, 4):
            steps, err = run_log(tmp, train, np, extra + ["--unit-blocks", str(k)], f"ub{k}",
                                 steps=8)
            want = f"{k} block{'s' if k > 1 else ''} per unit"
            assert want in err, f"the banner should say {want}:\n{err}"
            losses = [s["loss"] for s in steps]
            ref = ref or losses
            assert losses == ref, f"{np} ranks {extra}: --unit-blocks {k} changed the losses"
        print(f"  {np} ranks, {' '.join(extra)}: the same 8 losses for 1, 2, 3 and 4 blocks "
              "per unit")
    args = lambda ck, k: [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                          "--steps", "12", "--ckpt", ck, "--ckpt-every", "6",
                          "--log-every", "100", "--unit-blocks", str(k)]
    ref = f"{tmp}/ref-ub"
    mpirun(2, args(ref, 1))
    ck = f"{tmp}/ck-ub"
    stopped_after_first_commit(2, args(ck, 2), ck)
    other = f"{tmp}/ck-ub-4"
    shutil.copytree(ck, other, symlinks=True)
    p = mpirun(2, args(ck, 3))
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert digest(ck) == digest(ref), "written with 2 blocks per unit, resumed with 3: differs"
    print("  2 blocks per unit -> 3 on 2 ranks: final digest equals the uninterrupted run's "
          "(1 block per unit)")
    p = mpirun(4, args(other, 4) + ["--verify-load", "on"])
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert committed_steps(other) == [6, 12]
    print("  2 blocks per unit on 2 ranks -> 4 on 4 ranks: resharded, verified and finished")


def gradient_buckets_keep_the_loss_bits(tmp):
    train, _ = prepare_corpus(tmp)
    for np, extra in ((2, []), (4, ["--micro-batch", "1"]),
                      (3, ["--global-batch", "6", "--precision", "bf16", "--reduce-dtype", "bf16"]),
                      (4, ["--reduce-dtype", "bf16", "--prefetch", "off"])):
        ref = None
        for mib in ("0", "0.3", "1", "25"):
            steps, err = run_log(tmp, train, np, extra + ["--shard", "none", "--bucket-mib", mib],
                                 f"bk{mib}", steps=8)
            m = re.search(r"gradients all-reduced in (\d+) buckets?", err)
            assert m, f"the banner should count the buckets:\n{err}"
            # tiny's blocks are 0.79 MB of gradient each: 0.3 MiB makes a bucket of each,
            # the final LayerNorm's 1 KB joining the last block's, and the embeddings'
            want = {"0": 1, "0.3": 5}.get(mib)
            assert want is None or int(m.group(1)) == want, (mib, m.group(0))
            losses = [s["loss"] for s in steps]
            ref = ref or losses
            assert losses == ref, f"{np} ranks {extra}: --bucket-mib {mib} changed the losses"
        print(f"  {np} ranks, none {' '.join(extra)}: the same 8 losses for buckets of 0 (one "
              "after the backward), 0.3, 1 and 25 MiB")
    steps, err = run_log(tmp, train, 2, ["--shard", "grad-op", "--bucket-mib", "1.6"], "bk-go",
                         steps=3)
    assert "2 blocks per unit" in err, err
    print("  grad-op, --bucket-mib 1.6: 2 blocks per unit")
    # a checkpoint of full on 2 ranks continues as none with small buckets on 4
    args = [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8", "--steps", "6",
            "--ckpt", f"{tmp}/ck-bk", "--ckpt-every", "3", "--log-every", "100"]
    mpirun(2, args)
    longer = args + ["--shard", "none", "--bucket-mib", "0.3"]
    longer[longer.index("--steps") + 1] = "9"
    p = mpirun(4, longer + ["--verify-load", "on"])
    assert "resumed from checkpoint step 6" in p.stderr and committed_steps(f"{tmp}/ck-bk")[-1] == 9
    print("  full on 2 ranks -> none with 0.3 MiB buckets on 4 ranks: resharded and finished")


def bf16_without_the_instructions_runs_fp32_and_says_so(tmp):
    train, _ = prepare_corpus(tmp)
    p = run([TRAIN, "--data", train, "--cpu-kernels", "x86-64-v3", "--steps", "1"], check=False)
    if p.returncode != 0:
        print(f"  skipped: {p.stderr.strip()}")
        return
    # x86-64-v3 (AVX2) has no AVX512_BF16: the kernels' level caps oneDNN too
    steps, err = run_log(tmp, train, 1, ["--precision", "bf16", "--cpu-kernels", "x86-64-v3"],
                         "fallback", steps=6)
    got, banner = precision_of(err)
    assert got == "fp32" and ("lacks AVX512_BF16" in banner or "has no oneDNN" in banner), \
        banner
    ref, _ = run_log(tmp, train, 1, ["--precision", "fp32", "--cpu-kernels", "x86-64-v3"],
                     "fallback-ref", steps=6)
    assert [s["loss"] for s in steps] == [s["loss"] for s in ref]
    print(f"  {banner}; the losses equal an fp32 run's")
    # a fleet where one rank can and one cannot: all ranks agree on fp32 (the
    # gathers' element type must match), rank 0 reporting the count
    args = [TRAIN, "--data", train, "--model", "tiny", "--steps", "3", "--precision", "bf16"]
    if precision_of(run(args).stderr)[0] != "bf16":
        print("  (mixed fleet skipped: no rank here runs bf16)")
        return
    p = run(["mpirun", "--oversubscribe", "-np", "1"] + args + [":", "-np", "1"] + args +
            ["--cpu-kernels", "x86-64-v3"])
    got, banner = precision_of(p.stderr)
    assert got == "fp32" and "1 of 2 ranks lack" in banner, banner
    print(f"  rank 1 without bf16: {banner}")


if __name__ == "__main__":
    main([activation_checkpointing_keeps_the_loss_bits,
          checkpoints_resume_across_checkpointing_settings,
          the_matmul_libraries_agree_to_rounding,
          bf16_follows_fp32_over_200_steps,
          bf16_is_the_same_for_every_strategy,
          checkpoints_move_between_precisions,
          bf16_gradient_reduction_follows_fp32_and_resumes,
          prefetch_keeps_the_loss_bits_and_resumes,
          unit_grouping_keeps_the_loss_bits_and_the_checkpoints,
          gradient_buckets_keep_the_loss_bits,
          bf16_without_the_instructions_runs_fp32_and_says_so])
