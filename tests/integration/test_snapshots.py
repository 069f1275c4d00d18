"""In-memory snapshots (--mem-snapshot-every, issue 33) without a
supervisor: a job held after step 15 (test hook) and killed leaves its
snapshot of step 14 in RAM beside the store's checkpoint of step 10.

- The relaunch resumes from the snapshot, reads no shard of the store, and
  ends bit for bit where a run without snapshots and without a kill ends.
- A snapshot whose shard has one byte changed is never used: the digest
  check refuses it, the store's step 10 is loaded, the bits are the same.
- A snapshot that outlived its store (the store removed and the run begun
  again, its generation 1 claimed anew) is another run's: refused, the new
  store's checkpoint is loaded, same bits.
- A snapshot written by 2 ranks resumes on 1, resharded as a checkpoint
  in storage would be, to the same bits.
- Snapshots on or off, the bits are the same; --mem-snapshot-dir without
  --ckpt or on S3 is one line; one that others may write, or a link, is
  refused (what it holds would be loaded as the run's state)."""

import glob
import os
import shutil
import signal
import time

from harness import (TRAIN, committed_steps, digest, launch, main, mpirun,
                     prepare_corpus, run)

MODEL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64"]
STEPS = 40


def args(data, ck, snap=None, extra=()):
    more = ["--mem-snapshot-every", "1", "--mem-snapshot-dir", snap] if snap else []
    return [TRAIN, "--data", data] + MODEL + ["--global-batch", "4", "--steps", str(STEPS),
                                              "--ckpt", ck, "--ckpt-every", "10",
                                              "--log-every", "1000"] + more + list(extra)


def crashed_run(tmp, data, ck, snap):
    """Trains until it holds after step 15, waits for the snapshot of step
    14 and kills the whole job: the store holds step 10, RAM step 14."""
    p = launch(2, args(data, ck, snap), env={"FSDP_TEST_HOLD_AT": "15"})
    manifest = f"{snap}/step-00000014/MANIFEST.json"
    deadline = time.monotonic() + 120
    while not os.path.exists(manifest):
        assert p.poll() is None, f"the job ended before its snapshot of step 14:\n" \
            f"{p.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "no snapshot of step 14 in 120 s"
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert committed_steps(ck)[-1] == 10, committed_steps(ck)


def resume(data, ck, snap):
    p = mpirun(2, args(data, ck, snap))
    return p.stderr


def snapshots_heal_and_keep_the_bits(tmp):
    data, _ = prepare_corpus(tmp)
    ref = f"{tmp}/ref"
    mpirun(2, args(data, ref))  # no snapshots, no kill
    on = f"{tmp}/on"
    snap_on = f"/dev/shm/fsdp-test-snaps-on-{os.getpid()}"
    snap = f"/dev/shm/fsdp-test-snaps-{os.getpid()}"
    saved = f"{tmp}/saved-snapshots"
    try:
        mpirun(2, args(data, on, snap_on))  # snapshots on, no kill
        assert digest(on) == digest(ref), "snapshots changed the bits"
        assert not os.path.exists(snap_on), "the snapshots outlived the finished run"

        # 1. the relaunch heals from RAM
        ck = f"{tmp}/ck"
        crashed_run(tmp, data, ck, snap)
        shutil.copytree(snap, saved, symlinks=True)
        shutil.copytree(ck, f"{tmp}/ck-after-crash", symlinks=True)
        err = resume(data, ck, snap)
        assert f"resumed from the in-memory snapshot of step 14 in {snap} (no shard read " \
            f"from {ck}, whose newest checkpoint is step 10)" in err, err[-2000:]
        assert digest(ck) == digest(ref), "healing from RAM changed the bits"
        assert not os.path.exists(snap), "the snapshots outlived the finished run"

        # 2. one byte of a shard changed: refused by its digest, step 10 loaded
        ck2 = f"{tmp}/ck2"
        shutil.copytree(f"{tmp}/ck-after-crash", ck2, symlinks=True)
        shutil.copytree(saved, snap, symlinks=True)
        shard = sorted(f for f in glob.glob(f"{snap}/step-00000014/*")
                       if not f.endswith("MANIFEST.json"))[0]
        with open(shard, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x01]))
        err = resume(data, ck2, snap)
        assert "checkpoint step 14 is unusable" in err and \
            "no older snapshot: the checkpoint store decides" in err, err[-2000:]
        assert f"resumed from checkpoint step 10 in {ck2}" in err, err[-2000:]
        assert digest(ck2) == digest(ref), "the fallback changed the bits"
        shutil.rmtree(snap, ignore_errors=True)

        # 3. the store removed and begun again (two steps, so that it holds a
        # claim of generation 1 as the old store did, with another nonce):
        # the snapshot is another run's
        ck3 = f"{tmp}/ck3"
        mpirun(2, args(data, ck3, extra=["--stop-at-step", "2"]))
        shutil.copytree(saved, snap, symlinks=True)
        err = resume(data, ck3, snap)
        assert "was written by generation 1, which" in err and "another run's" in err, \
            err[-2000:]
        assert f"resumed from checkpoint step 2 in {ck3}" in err, err[-2000:]
        assert digest(ck3) == digest(ref), "the resume changed the bits"
    finally:
        for d in (snap, snap_on):
            shutil.rmtree(d, ignore_errors=True)
    print("  healed from the snapshot of step 14 (store: step 10); a changed byte and another "
          "run's snapshot refused; digests equal to the run without snapshots")


def a_snapshot_reshards_to_another_world_size(tmp):
    """Two ranks killed with their snapshot of step 14 in RAM (store: step
    10); the relaunch on one rank resumes from the snapshot, resharded, and
    ends bit for bit where the same world change from a checkpoint of step
    14 in storage ends."""
    data, _ = prepare_corpus(tmp)
    ref = f"{tmp}/ref"
    mpirun(2, args(data, ref, extra=["--stop-at-step", "14"]))
    mpirun(1, args(data, ref))
    ck, snap = f"{tmp}/ck", f"/dev/shm/fsdp-test-snaps-reshard-{os.getpid()}"
    try:
        crashed_run(tmp, data, ck, snap)
        err = mpirun(1, args(data, ck, snap)).stderr
        assert f"resumed from the in-memory snapshot of step 14 in {snap} (no shard read " \
            f"from {ck}, whose newest checkpoint is step 10)" in err, err[-2000:]
        assert digest(ck) == digest(ref), "resharding from RAM changed the bits"
    finally:
        shutil.rmtree(snap, ignore_errors=True)
    print("  a snapshot of 2 ranks resumed on 1: digest equal to the same change from storage")


def a_failed_newer_checkpoint_leaves_the_snapshot_whole(tmp):
    """RAM holds step 14 (of the store's first launch); a later launch
    without snapshots left steps 10 and 20 in the store, and rank 1's shard
    of step 20 is damaged. The resume loads the snapshot, tries step 20
    (rank 0 reads its shard into the engine, rank 1 fails), falls back, and
    loads the snapshot again: the bits are the uninterrupted run's."""
    data, _ = prepare_corpus(tmp)
    ref = f"{tmp}/ref"
    mpirun(2, args(data, ref))
    ck, snap = f"{tmp}/ck", f"/dev/shm/fsdp-test-snaps-newer-{os.getpid()}"
    saved = f"{tmp}/saved"
    try:
        crashed_run(tmp, data, ck, snap)
        shutil.copytree(snap, saved, symlinks=True)
        mpirun(2, args(data, ck, extra=["--stop-at-step", "20"]))  # no snapshots
        assert committed_steps(ck)[-1] == 20, committed_steps(ck)
        shutil.rmtree(snap, ignore_errors=True)
        shutil.copytree(saved, snap, symlinks=True)
        shard = sorted(f for f in glob.glob(f"{ck}/step-00000020/*")
                       if not f.endswith("MANIFEST.json"))[1]
        with open(shard, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x01]))
        err = mpirun(2, args(data, ck, snap)).stderr
        assert "checkpoint step 20 is unusable" in err, err[-2000:]
        assert f"resumed from the in-memory snapshot of step 14 in {snap}" in err, err[-2000:]
        assert digest(ck) == digest(ref), "the failed newer checkpoint changed the bits"
    finally:
        shutil.rmtree(snap, ignore_errors=True)
    print("  step 20 of the store failed on rank 1 after rank 0 read it: the snapshot of "
          "step 14 loaded again, digest equal")


def a_full_tmpfs_turns_snapshots_off_and_training_goes_on(tmp):
    """--mem-snapshot-dir on a 64 KiB tmpfs: the first snapshot cannot be
    written; one line says snapshots are off, the run trains to the end
    with its checkpoints, exit 0, the bits of a run without snapshots."""
    data, _ = prepare_corpus(tmp)
    ref = f"{tmp}/ref"
    mpirun(2, args(data, ref))
    mnt = f"{tmp}/small-tmpfs"
    os.mkdir(mnt, 0o700)
    run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", mnt])
    try:
        ck = f"{tmp}/ck"
        err = mpirun(2, args(data, ck, f"{mnt}/snaps")).stderr
        off = [l for l in err.splitlines() if "snapshots are off for the rest of this run" in l]
        assert len(off) == 1 and "failed" in off[0], err[-2000:]
        assert digest(ck) == digest(ref), "turning snapshots off changed the bits"
    finally:
        run(["umount", mnt], check=False)
    print(f"  {off[0][len('fsdp-train: '):][:110]}...; trained on, digest equal")


def snapshots_that_are_not_this_runs_are_passed_over(tmp):
    """A directory holding files of its own is refused (the run's end would
    remove them) and they stay; snapshots of another model left in the
    directory are passed over by a new run, not fatal."""
    data, _ = prepare_corpus(tmp)
    mine = f"{tmp}/mine"
    os.mkdir(mine, 0o700)
    with open(f"{mine}/notes.txt", "w") as f:
        f.write("mine\n")
    p = run([TRAIN, "--data", data] + MODEL + ["--steps", "2", "--ckpt", f"{tmp}/ck0",
                                               "--mem-snapshot-every", "1",
                                               "--mem-snapshot-dir", mine], check=False)
    assert p.returncode != 0 and f"--mem-snapshot-dir {mine} holds 'notes.txt'" in p.stderr, \
        p.stderr
    assert os.listdir(mine) == ["notes.txt"], os.listdir(mine)
    ck, snap = f"{tmp}/ck", f"/dev/shm/fsdp-test-snaps-other-{os.getpid()}"
    try:
        crashed_run(tmp, data, ck, snap)
        other = [TRAIN, "--data", data, "--layers", "1", "--dim", "32", "--heads", "2",
                 "--seq", "64", "--global-batch", "4", "--steps", "3", "--ckpt", f"{tmp}/ck2",
                 "--mem-snapshot-every", "1", "--mem-snapshot-dir", snap]
        p = mpirun(2, other)
        assert f"the snapshots in {snap} are not used" in p.stderr, p.stderr[-2000:]
        assert committed_steps(f"{tmp}/ck2")[-1] == 3, committed_steps(f"{tmp}/ck2")
    finally:
        shutil.rmtree(snap, ignore_errors=True)
    print("  a directory with a file of its own refused, the file kept; another model's "
          "snapshots passed over")


def snapshot_flags_that_cannot_work_are_one_line(tmp):
    data, _ = prepare_corpus(tmp)
    for extra, want in ((["--mem-snapshot-every", "1"], "--mem-snapshot-every needs --ckpt"),
                        (["--ckpt", f"{tmp}/ck", "--mem-snapshot-dir", "/dev/shm/x"],
                         "--mem-snapshot-dir needs --mem-snapshot-every"),
                        (["--ckpt", f"{tmp}/ck", "--mem-snapshot-every", "1",
                          "--mem-snapshot-dir", "s3://b/p"], "not S3")):
        p = run([TRAIN, "--data", data] + MODEL + ["--steps", "2"] + extra, check=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert p.returncode == 2 and len(lines) == 1 and want in lines[0], (p.returncode,
                                                                           p.stderr)
    # a directory others may write, or a link, is never loaded from
    shared, link = f"{tmp}/shared", f"{tmp}/link"
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    os.symlink(shared, link)
    for d, want in ((shared, "closed to others (chmod 700)"), (link, "not a directory")):
        p = run([TRAIN, "--data", data] + MODEL + ["--steps", "2", "--ckpt", f"{tmp}/ck",
                                                   "--mem-snapshot-every", "1",
                                                   "--mem-snapshot-dir", d], check=False)
        assert p.returncode != 0 and f"--mem-snapshot-dir {d}: " in p.stderr and \
            want in p.stderr, p.stderr
    assert os.listdir(shared) == [], os.listdir(shared)


if __name__ == "__main__":
    main([snapshots_heal_and_keep_the_bits, a_snapshot_reshards_to_another_world_size,
          a_failed_newer_checkpoint_leaves_the_snapshot_whole,
          a_full_tmpfs_turns_snapshots_off_and_training_goes_on,
          snapshots_that_are_not_this_runs_are_passed_over,
          snapshot_flags_that_cannot_work_are_one_line])
