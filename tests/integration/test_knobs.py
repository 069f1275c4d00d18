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
use."""

import os
import re
import shutil

from harness import (TRAIN, committed_steps, digest, kill_job, launch, main, mpirun,
                     prepare_corpus, read_log, wait_stopped_or_exit)

STEPS = 20
MODES = ("none", "blocks", "every-2", "every-3")


def run_log(tmp, train, np, extra, tag, steps=STEPS):
    log = f"{tmp}/{tag}.jsonl"
    if os.path.exists(log):  # fsdp-train appends (one log across restarts)
        os.remove(log)
    p = mpirun(np, [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                    "--steps", str(steps), "--log", log, "--log-every", "100"] + list(extra))
    return read_log(log), p.stderr


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
    p = launch(2, args(ck, "blocks"), {"FSDP_TEST_STOP_AT": "after-commit:1"})
    assert wait_stopped_or_exit(p)
    kill_job(p)
    assert committed_steps(ck) == [6]
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
    got = {}
    for lib in ("openblas", "onednn"):
        steps, err = run_log(tmp, train, 2, ["--matmul", lib], f"mm-{lib}")
        assert re.search(rf"; {lib}[ \d.]* matmuls;", err), err
        got[lib] = [s["loss"] for s in steps]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got["onednn"], got["openblas"]))
    print(f"  onednn against openblas, {STEPS} steps on 2 ranks: worst relative "
          f"difference {worst:.2e}")
    assert worst < 1e-5, worst


if __name__ == "__main__":
    main([activation_checkpointing_keeps_the_loss_bits,
          checkpoints_resume_across_checkpointing_settings,
          the_matmul_libraries_agree_to_rounding])
