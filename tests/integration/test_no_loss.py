"""Nothing committed is ever lost: each case below destroyed or hid a
committed checkpoint before the deletion rules moved into ckpt/cleanup.c
(and shard objects got per-writer names). Every case ends by checking that
each checkpoint committed before it still verifies, byte for byte where
that is the point."""

import glob
import hashlib
import os
import signal
import subprocess
import time

from harness import (BUILD, CKPT, TRAIN, committed_steps, digest, job_pids, launch, main, mpirun,
                     prepare_corpus, read_log, run, wait_stopped_or_exit)

SUPER = os.path.join(BUILD, "recovery", "fsdp-super")
MODEL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64"]


def args(data, ck, steps, every=3, extra=()):
    return [TRAIN, "--data", data] + MODEL + ["--global-batch", "4", "--steps", str(steps),
                                              "--ckpt", ck, "--ckpt-every", str(every),
                                              "--log-every", "1000"] + list(extra)


def files_of(path):
    """{relative path: sha256} of every file under path."""
    out = {}
    for f in glob.glob(f"{path}/**", recursive=True):
        if os.path.isfile(f) and not os.path.islink(f):
            out[os.path.relpath(f, path)] = hashlib.sha256(open(f, "rb").read()).hexdigest()
    return out


def verifies(uri):
    return run([CKPT, "verify", uri], check=False).returncode == 0


def a_second_run_on_the_same_store_never_destroys_a_commit(tmp):
    """Run A (seed 1) has its step-3 shards durable and is about to commit;
    run B (seed 2) starts on the same store, writes its own step 3 and stops
    before committing too; then A goes on. Before: B's start removed A's
    shards, B's same-named shards took their place, and A committed a
    manifest describing bytes it never wrote - A exited 0 with a step that
    no longer verified. Now B fences A (a newer generation), A refuses to
    commit, names why and exits non-zero, and B commits its own step."""
    data, _ = prepare_corpus(tmp)
    ck, ref = f"{tmp}/ck", f"{tmp}/ref"
    mpirun(1, args(data, ref, 3, extra=["--seed", "2"]))  # as launched below: same threads
    a = launch(1, args(data, ck, 3, extra=["--seed", "1"]), {"FSDP_TEST_STOP_AT": "before-commit:1"})
    assert wait_stopped_or_exit(a), "run A did not reach its commit"
    b = launch(1, args(data, ck, 3, extra=["--seed", "2"]), {"FSDP_TEST_STOP_AT": "before-commit:1"})
    assert wait_stopped_or_exit(b), "run B did not reach its commit"
    for p in (a, b):  # A first: the order in which the old code lost data
        for pid, _ in job_pids(p.pid):
            os.kill(pid, signal.SIGCONT)
        p.wait(timeout=120)
    a_err, b_err = a.stderr.read(), b.stderr.read()
    print(f"  run A: exit {a.returncode}: "
          f"{[l for l in a_err.splitlines() if 'fenced' in l][:1]}")
    assert a.returncode != 0 and "fenced" in a_err, a_err[-2000:]
    assert b.returncode == 0, b_err[-2000:]
    assert committed_steps(ck) == [3] and verifies(ck)
    assert digest(ck) == digest(ref), "step 3 is not run B's"


def a_failed_retention_never_touches_the_step_just_committed(tmp):
    """Retention fails half-way (a delete of an old step's shard): before,
    the trainer then removed its own shards of the step it had just
    committed, leaving a manifest without shards - no usable checkpoint."""
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    # deletes: 1 the start-up probe, 2 step 2's manifest, 3 step 2's shard
    p = run(args(data, f"fault:delete=EIO@3;{ck}", 4, every=2, extra=["--keep", "1"]),
            check=False)
    line = [l for l in p.stderr.splitlines() if "removing older checkpoints" in l]
    assert p.returncode != 0 and line and "step 4 is committed" in line[0], p.stderr[-2000:]
    assert verifies(f"{ck}@4"), "the step just committed does not verify"


def a_step_another_run_committed_stops_this_one(tmp):
    """Run A is about to commit step 3 when another run's step 3 lands (a
    cp): before, A called it "already committed by an earlier run", went on
    and exited 0 - its next resume would have continued another run's
    weights. Now A stops, says so, and the other run's step is untouched."""
    data, _ = prepare_corpus(tmp)
    ck, other = f"{tmp}/ck", f"{tmp}/other"
    run(args(data, other, 3, extra=["--seed", "9"]))
    a = launch(1, args(data, ck, 6), {"FSDP_TEST_STOP_AT": "before-commit:1"})
    assert wait_stopped_or_exit(a), "run A did not reach its commit"
    run([CKPT, "cp", f"{other}@3", ck])
    for pid, _ in job_pids(a.pid):
        os.kill(pid, signal.SIGCONT)
    a.wait(timeout=120)
    err = a.stderr.read()
    line = [l for l in err.splitlines() if "committed by another run" in l]
    print(f"  {line[:1]}")
    assert a.returncode != 0 and line, err[-2000:]
    assert digest(f"{ck}@3") == digest(f"{other}@3") and verifies(f"{ck}@3")
    assert committed_steps(ck) == [3], committed_steps(ck)


def a_symlinked_step_is_refused_and_its_target_untouched(tmp):
    """A store whose step directory is a symlink into another run's store:
    before, listing skipped it (lstat) but the writes followed it and
    replaced the other run's committed shard. Now the store refuses it at
    start, naming the path, and trains nothing."""
    data, _ = prepare_corpus(tmp)
    other, ck = f"{tmp}/other", f"{tmp}/ck"
    run(args(data, other, 3, extra=["--seed", "5"]))
    before = files_of(other)
    os.makedirs(ck)
    os.symlink(f"{other}/step-00000003", f"{ck}/step-00000003")
    log = f"{tmp}/log.jsonl"
    p = run(args(data, ck, 3, extra=["--log", log]), check=False)
    err = [l for l in p.stderr.splitlines() if l.startswith("fsdp-train:") and "step-00000003"
           in l]
    print(f"  {err[:1]}")
    assert p.returncode != 0 and err and "symbolic link" in err[0], p.stderr[-2000:]
    assert not os.path.exists(log) or not read_log(log), "it trained before refusing"
    assert files_of(other) == before and verifies(other), "the other run's step changed"


def a_read_error_at_resume_never_deletes_the_newer_step(tmp):
    """A transient read error while loading the newest step: before, resume
    fell back and then deleted the intact newer step without a word. Now the
    step is skipped, reported, and stays - byte for byte."""
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run(args(data, ck, 6))
    assert committed_steps(ck) == [3, 6]
    before = {k: v for k, v in files_of(ck).items() if k.startswith("step-00000006")}
    # gets: the start's claim seals the store with the live manifests (3,
    # 6), then the resume reads step 6's manifest, the seal that judges it
    # (generation 2's), and step 6's first shard chunk: the fifth
    # (to --steps 6 again: a --steps below the newest step is refused)
    p = run(args(data, f"fault:get=ETIMEDOUT@5;{ck}", 6), check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    line = [l for l in p.stderr.splitlines() if "checkpoint step 6 is unusable" in l]
    assert line and "timed out" in line[0].lower() and "stays in the store" in line[0], p.stderr
    assert "resumed from checkpoint step 3" in p.stderr, p.stderr
    assert committed_steps(ck) == [3, 6], committed_steps(ck)
    after = {k: v for k, v in files_of(ck).items() if k.startswith("step-00000006")}
    assert after == before and verifies(f"{ck}@6")


def import_into_a_store_holding_step_0_leaves_it(tmp):
    """Importing into a store that already holds step 0: before, the failed
    conditional commit was followed by deleting step 0. Now it is refused up
    front and nothing in the store changes."""
    data, _ = prepare_corpus(tmp)
    ck, st, dst = f"{tmp}/ck", f"{tmp}/w.safetensors", f"{tmp}/dst"
    run([TRAIN, "--data", data, "--model", "tiny", "--global-batch", "4", "--steps", "2",
         "--ckpt", ck, "--ckpt-every", "2", "--log-every", "1000"])
    run([CKPT, "export", ck, st])
    run([CKPT, "import", st, dst, "--model", "tiny", "--world-size", "2"])
    before = files_of(dst)
    p = run([CKPT, "import", st, dst, "--model", "tiny", "--world-size", "3"], check=False)
    lines = p.stderr.strip().splitlines()
    print(f"  {lines}")
    assert p.returncode == 1 and len(lines) == 1 and "already holds a committed step 0" in \
        lines[0], p.stderr
    assert files_of(dst) == before and verifies(dst)


def reshard_and_cp_into_a_store_holding_the_step_leave_it(tmp):
    data, _ = prepare_corpus(tmp)
    ck, dst = f"{tmp}/ck", f"{tmp}/dst"
    run(args(data, ck, 3))
    run([CKPT, "reshard", ck, dst, "--world-size", "2"])
    before = files_of(dst)
    for cmd in ([CKPT, "reshard", ck, dst, "--world-size", "3"], [CKPT, "cp", ck, dst]):
        p = run(cmd, check=False)
        assert p.returncode == 1 and "already holds a committed step 3" in p.stderr, p.stderr
        assert files_of(dst) == before and verifies(dst), cmd[1]
    # cp writes shards under its own names: the copy verifies and digests equal
    cp = f"{tmp}/cp"
    run([CKPT, "cp", ck, cp])
    assert verifies(cp) and digest(cp) == digest(ck)
    assert {os.path.basename(f) for f in glob.glob(f"{cp}/step-00000003/shard-*")}.isdisjoint(
        os.path.basename(f) for f in glob.glob(f"{ck}/step-00000003/shard-*"))


def prune_keep_0_is_refused(tmp):
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run(args(data, ck, 6))
    before = files_of(ck)
    p = run([CKPT, "prune", ck, "--keep", "0"], check=False)
    assert p.returncode == 2 and "--keep 0" in p.stderr, p.stderr
    assert files_of(ck) == before
    p = run([CKPT, "prune", ck, "--keep", "1"])
    assert committed_steps(ck) == [6] and verifies(ck), p.stdout


def prune_leaves_a_live_writers_step(tmp):
    """prune removes what retention drops and the garbage of fenced
    generations; an incomplete step of the store's current generation may
    have a writer on it right now and stays."""
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run(args(data, ck, 6))  # generation 1
    live = f"{ck}/step-00000009/shard-00000-of-00001.g1-00000000000000aa"
    old = f"{ck}/step-00000012/shard-00000-of-00001"  # from before tags
    for f in (live, old):
        os.makedirs(os.path.dirname(f), exist_ok=True)
        open(f, "w").write("in flight")
    p = run([CKPT, "prune", ck, "--keep", "1"])
    print("  " + p.stdout.strip().replace("\n", "\n  "))
    assert os.path.exists(live) and not os.path.exists(os.path.dirname(old)), p.stdout
    assert committed_steps(ck) == [6] and verifies(ck)


def an_unwritable_store_is_found_before_training(tmp):
    """A read-only --ckpt was found only at the first save, after the
    training time was spent. Now the store is probed at start."""
    data, _ = prepare_corpus(tmp)
    mnt = f"{tmp}/ro"
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        print("  skipped: cannot mount a tmpfs here (needs root)")
        return
    try:
        log = f"{tmp}/log.jsonl"
        p = run(args(data, f"{mnt}/ck", 50, every=50, extra=["--log", log]), check=False)
        lines = [l for l in p.stderr.splitlines() if "not writable" in l or "generation" in l]
        print(f"  {lines[:1]}")
        assert p.returncode == 1 and lines and "Read-only file system" in lines[0], p.stderr
        assert not os.path.exists(log) or not read_log(log), "it trained before failing"
    finally:
        subprocess.run(["umount", mnt])


def a_writer_frozen_past_its_fence_check_commits_nothing_live(tmp):
    """Run A passes its fence check for step 6 and freezes (a stopped or
    partitioned rank 0) before its manifest lands; run B takes the store
    (generation 2, sealed with step 3), resumes, commits step 4 and dies;
    then A thaws and commits step 6. Before: A's late step 6 was live, A
    exited 0, and the next resume continued from a step of a generation
    that had been fenced. Now A reads its commit back, finds that the seal
    leaves it out, says "fenced" and exits non-zero; its manifest stays,
    dead (ls: fenced); the next run resumes from B's step 4, passes over
    step 6 and reaches the same bits as a run never interrupted."""
    data, _ = prepare_corpus(tmp)
    ck, ref = f"{tmp}/ck", f"{tmp}/ref"
    mpirun(1, args(data, ref, 9))  # as launched below: same threads
    a = launch(1, args(data, ck, 9), {"FSDP_TEST_STOP_AT": "fence-checked:2"})
    assert wait_stopped_or_exit(a), "run A did not reach its second commit"
    assert committed_steps(ck) == [3], committed_steps(ck)
    b = launch(1, args(data, ck, 9, every=4, extra=["--resume", "auto"]),
               {"FSDP_TEST_STOP_AT": "after-commit:1"})
    assert wait_stopped_or_exit(b), "run B did not commit step 4"
    for pid, _ in job_pids(b.pid):
        os.kill(pid, signal.SIGKILL)
    b.wait(timeout=60)
    assert committed_steps(ck) == [3, 4], committed_steps(ck)
    for pid, _ in job_pids(a.pid):
        os.kill(pid, signal.SIGCONT)
    a.wait(timeout=120)
    a_err = a.stderr.read()
    line = [l for l in a_err.splitlines() if "fenced" in l]
    print(f"  run A: exit {a.returncode}: {line[:1]}")
    assert a.returncode != 0 and line and "step 6" in line[0], a_err[-2000:]
    ls = run([CKPT, "ls", ck]).stdout
    assert [l.split()[1] for l in ls.splitlines() if l.startswith("step-")] == \
        ["committed", "committed", "fenced"], ls
    c = mpirun(1, args(data, ck, 9, extra=["--resume", "auto"]))
    resumed = [l for l in c.stderr.splitlines() if "resum" in l]
    assert any("step 4" in l for l in resumed), c.stderr[-2000:]
    assert verifies(f"{ck}@9")
    assert digest(f"{ck}@9") == digest(f"{ref}@9"), "step 9 differs from an uninterrupted run"


FAKE_MPIRUN = """#!/bin/sh
echo launched > "$0.out"
exec sleep 600
"""


def a_commit_landing_after_a_new_launch_sealed_the_store_does_not_count(tmp):
    """The window the shard check cannot see: fsdp-super has claimed
    generation 2 for a new launch (its mpirun, a stand-in here, has not
    started a rank, so nothing has cleaned up yet), and run A of generation
    1, frozen past its fence check, thaws and commits step 6 with every
    shard in place. Before: that commit was live, A exited 0, and the new
    launch would have resumed from a fenced generation's late step. Now the
    claim sealed the store with the live steps then (3); A reads its commit
    back, finds the seal leaves step 6 out and exits non-zero saying
    "fenced" (ls: fenced); the next run resumes from step 3, its clean-up
    removes the dead step 6, its own step 6 takes the place, and it reaches
    the same bits at step 9."""
    data, _ = prepare_corpus(tmp)
    ck, ref = f"{tmp}/ck", f"{tmp}/ref"
    mpirun(1, args(data, ref, 9))
    a = launch(1, args(data, ck, 9), {"FSDP_TEST_STOP_AT": "fence-checked:2"})
    assert wait_stopped_or_exit(a), "run A did not reach its second commit"
    fake = f"{tmp}/mpirun-fake"
    open(fake, "w").write(FAKE_MPIRUN)
    os.chmod(fake, 0o755)
    sup = subprocess.Popen([SUPER, "--np", "1", "--max-restarts", "0", "--startup-timeout", "600",
                            "--mpirun", fake, "--"] + args(data, ck, 9),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{fake}.out"):  # the event: generation 2 is claimed
            assert sup.poll() is None and time.monotonic() < deadline, sup.stderr.read()
            time.sleep(0.02)
        assert sorted(os.listdir(f"{ck}/fences")) == ["0" * 19 + "1", "0" * 19 + "2"]
        for pid, _ in job_pids(a.pid):
            os.kill(pid, signal.SIGCONT)
        a.wait(timeout=120)
    finally:
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
    a_err = a.stderr.read()
    line = [l for l in a_err.splitlines() if "fenced" in l]
    print(f"  run A: exit {a.returncode}: {line[:1]}")
    assert a.returncode != 0 and line and "generation 2 sealed" in line[0], a_err[-2000:]
    ls = run([CKPT, "ls", ck]).stdout
    assert [l.split()[1] for l in ls.splitlines() if l.startswith("step-")] == \
        ["committed", "fenced"], ls
    c = mpirun(1, args(data, ck, 9, extra=["--resume", "auto"]))
    assert any("step 3" in l for l in c.stderr.splitlines() if "resum" in l), c.stderr[-2000:]
    ls = run([CKPT, "ls", ck]).stdout  # the dead step 6 made way for the new run's
    assert all(l.split()[1] == "committed" for l in ls.splitlines() if l.startswith("step-")), ls
    assert verifies(f"{ck}@6") and verifies(f"{ck}@9")
    assert digest(f"{ck}@9") == digest(f"{ref}@9"), "step 9 differs from an uninterrupted run"


def an_unreadable_seal_stops_the_resume_and_skips_no_step(tmp):
    """A file under fences/ that is not a seal (or a seal that cannot be
    read) leaves every manifest's liveness unknown. Before, the resume
    treated that like a damaged step: it skipped every step, started from
    scratch and trained over them. Now the run stops before training with
    one line naming the object (its claim cannot seal the store), no step
    is touched, and it resumes once the object is gone."""
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run(args(data, ck, 6))
    before = files_of(ck)
    open(f"{ck}/fences/notes.txt", "w").write("x")
    p = run(args(data, ck, 9, extra=["--resume", "auto"]), check=False)
    line = [l for l in p.stderr.splitlines() if "notes.txt" in l]
    print(f"  {line[:1]}")
    assert p.returncode != 0 and line and "scratch" not in p.stderr, p.stderr[-2000:]
    after = {k: v for k, v in files_of(ck).items()  # a claim that never sealed fences nothing
             if k != "fences/notes.txt" and not k.startswith("generations/")}
    assert after == {k: v for k, v in before.items() if not k.startswith("generations/")}, \
        f"the store changed: {set(after) ^ set(before)}"
    os.unlink(f"{ck}/fences/notes.txt")
    p = run(args(data, ck, 9, extra=["--resume", "auto"]))
    assert any("step 6" in l for l in p.stderr.splitlines() if "resum" in l), p.stderr[-2000:]


if __name__ == "__main__":
    main([a_second_run_on_the_same_store_never_destroys_a_commit,
          a_failed_retention_never_touches_the_step_just_committed,
          a_step_another_run_committed_stops_this_one,
          a_symlinked_step_is_refused_and_its_target_untouched,
          a_read_error_at_resume_never_deletes_the_newer_step,
          import_into_a_store_holding_step_0_leaves_it,
          reshard_and_cp_into_a_store_holding_the_step_leave_it,
          prune_keep_0_is_refused,
          prune_leaves_a_live_writers_step,
          an_unwritable_store_is_found_before_training,
          a_writer_frozen_past_its_fence_check_commits_nothing_live,
          a_commit_landing_after_a_new_launch_sealed_the_store_does_not_count,
          an_unreadable_seal_stops_the_resume_and_skips_no_step])
