"""Sharded checkpoints on a real filesystem: verified reads, fallback from
damage (a chunk, a chunk index, the manifest), refusal of another model's
checkpoint, clean failure on storage errors (injected and real), retention,
format 1 still loading, and a manifest that does not grow with the chunks.
test_kill_resume.py kills runs."""

import glob
import json
import os
import shutil
import subprocess
import time

from harness import (CKPT, TRAIN, committed_steps, digest, kill_job, launch, main, mpirun,
                     prepare_corpus, run, wait_stopped_or_exit)

STEPS = 90  # long enough for a dozen kills to land (test_kill_resume.py)
EVERY = 3


def train_args(data, ckpt, steps=STEPS, extra=()):
    return [TRAIN, "--data", data, "--model", "tiny", "--global-batch", "8", "--steps",
            str(steps), "--ckpt", ckpt, "--ckpt-every", str(EVERY), "--log-every", "1000",
            "--ckpt-chunk-kib", "512"] + list(extra)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def flipped_byte_fails_verify_and_resume_falls_back(tmp):
    train, _ = prepare_corpus(tmp)
    ck, ref = f"{tmp}/ck", f"{tmp}/ref"
    mpirun(2, train_args(train, ref, steps=9))
    # the same run, stopped and killed right after committing step 6
    p = launch(2, train_args(train, ck, steps=9), {"FSDP_TEST_STOP_AT": "after-commit:2"})
    assert wait_stopped_or_exit(p)
    kill_job(p)
    assert committed_steps(ck) == [3, 6]
    shard, = glob.glob(f"{ck}/step-00000006/shard-00001-of-00002.*")
    flip_byte(shard, os.path.getsize(shard) // 2)
    p = run([CKPT, "verify", ck], check=False)
    assert p.returncode == 1, p.stdout
    bad = [l for l in p.stdout.splitlines() if l.startswith("BAD")]
    assert bad and f"{os.path.basename(shard)}: chunk" in bad[0] and "xxh3-128 mismatch" in bad[0], \
        p.stdout
    assert run([CKPT, "verify", f"{ck}@3"]).returncode == 0
    p = mpirun(2, train_args(train, ck, steps=9))
    assert "checkpoint step 6 is unusable" in p.stderr, p.stderr
    assert "xxh3-128 mismatch" in p.stderr and "falling back" in p.stderr, p.stderr
    assert "resumed from checkpoint step 3" in p.stderr, p.stderr
    assert digest(ck) == digest(ref), "resuming from step 3 did not reproduce the run"


def damaged_chunk_index_fails_verify_and_resume_falls_back(tmp):
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    mpirun(1, train_args(train, ck, steps=6))
    shard, = glob.glob(f"{ck}/step-00000006/shard-00000-of-00001.*")
    flip_byte(shard, os.path.getsize(shard) - 20)  # the chunk index ends the shard
    p = run([CKPT, "verify", ck], check=False)
    bad = [l for l in p.stdout.splitlines() if l.startswith("BAD")]
    assert p.returncode == 1 and len(bad) == 1, p.stdout
    assert f"{os.path.basename(shard)}: chunk index" in bad[0] and "sha256 mismatch" in bad[0], bad
    p = run(train_args(train, ck, steps=9))
    assert "checkpoint step 6 is unusable" in p.stderr and "chunk index" in p.stderr, p.stderr
    assert "resumed from checkpoint step 3" in p.stderr, p.stderr
    assert os.path.exists(shard), "a damaged step is kept for fsdp-ckpt verify"


V1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "ckpt-v1")
V1_MODEL = ["--layers", "1", "--dim", "32", "--heads", "2", "--seq", "16"]


def v1_digest():
    with open(V1 + ".digest") as f:
        return {tuple(l.split()[:2]): l.split()[2] for l in f if l.strip()}


def format_of(uri):
    return json.loads(run([CKPT, "inspect", uri, "--json"]).stdout)


def format1_checkpoint_loads_verifies_and_converts(tmp):
    """tests/data/ckpt-v1 was written by the last release of format 1."""
    train, _ = prepare_corpus(tmp)
    old = f"{tmp}/v1"
    shutil.copytree(V1, old)
    man = format_of(old)
    assert man["version"] == 1 and "sections" in man["shards"][0], man["version"]
    assert run([CKPT, "verify", old]).stdout.startswith(f"{old}/step-00000003: OK")
    assert digest(old) == v1_digest()
    # cp rewrites it as format 2: the same logical bytes, fewer chunks, a small manifest
    new = f"{tmp}/v2"
    p = run([CKPT, "cp", old, new])
    assert "step 3 rewritten from format 1 as format 2" in p.stdout, p.stdout
    man2 = format_of(new)
    assert man2["version"] == 2 and all(set(s) == {"rank", "file", "raw_size", "stored_size",
                                                   "sha256", "chunks", "index"}
                                        for s in man2["shards"]), man2["shards"][0]
    assert run([CKPT, "verify", new]).returncode == 0 and digest(new) == v1_digest()
    assert os.path.getsize(f"{new}/step-00000003/MANIFEST.json") < \
        os.path.getsize(f"{old}/step-00000003/MANIFEST.json") / 2
    # cp of a format-2 step copies the stored bytes as they are
    again = f"{tmp}/v2-again"
    p = run([CKPT, "cp", new, again, "--hash", "xxh3"])
    assert "step 3 copied" in p.stdout and "copied as it is" in p.stderr, p.stderr
    a, b = (sorted(glob.glob(f"{d}/step-00000003/shard-*")) for d in (new, again))
    assert [open(x, "rb").read() for x in a] == [open(x, "rb").read() for x in b]
    # reshard reads format 1 too
    three = f"{tmp}/v1-on-3"
    run([CKPT, "reshard", old, three, "--world-size", "3"])
    assert digest(three) == v1_digest() and format_of(three)["version"] == 2
    # the trainer resumes from format 1 on 1 and 3 ranks (the loaded state's digest
    # checked against the checkpoint's), and writes format 2
    for np in (1, 3):
        ck = f"{tmp}/resume-{np}"
        shutil.copytree(V1, ck)
        # (global batch 6, not the fixture's 4, so that 3 ranks divide it)
        p = mpirun(np, [TRAIN, "--data", train, "--global-batch", "6", "--steps", "5",
                        "--ckpt", ck, "--ckpt-every", "5", "--threads", "1", "--verify-load",
                        "on", "--allow-changed", "global-batch"] + V1_MODEL)
        assert "resumed from checkpoint step 3" in p.stderr, p.stderr
        assert "digest equal to the checkpoint's" in p.stderr, p.stderr
        assert committed_steps(ck) == [3, 5] and format_of(ck)["version"] == 2
        assert run([CKPT, "verify", ck]).returncode == 0


def manifest_does_not_grow_with_the_number_of_chunks(tmp):
    """Format 2 keeps chunk tables in the shards: 4 KiB chunks (hundreds per
    shard) and 4 MiB chunks give manifests of the same size."""
    train, _ = prepare_corpus(tmp)
    sizes, chunks = {}, {}
    for kib in (4, 4096):
        ck = f"{tmp}/ck-{kib}"
        mpirun(2, train_args(train, ck, steps=3, extra=["--ckpt-chunk-kib", str(kib)]))
        sizes[kib] = os.path.getsize(f"{ck}/step-00000003/MANIFEST.json")
        chunks[kib] = sum(s["chunks"] for s in format_of(ck)["shards"])
        assert run([CKPT, "verify", ck]).returncode == 0
    assert chunks[4] >= 100 * chunks[4096], chunks
    assert abs(sizes[4] - sizes[4096]) <= 64, sizes


def xxh3_chunk_digests_load_verify_and_catch_damage(tmp):
    """--ckpt-hash xxh3 (the default) against sha256: the same state (logical
    digests); xxh3 loaded on 2 threads and on 2 ranks, a flipped byte caught
    and named."""
    train, _ = prepare_corpus(tmp)
    sha, xxh = f"{tmp}/sha", f"{tmp}/xxh"
    run(train_args(train, sha, steps=6, extra=["--ckpt-hash", "sha256"]))
    run(train_args(train, xxh, steps=6))  # the default
    man = format_of(xxh)
    assert man["chunk_hash"] == "xxh3-128" and format_of(sha)["chunk_hash"] == "sha256"
    assert digest(xxh) == digest(sha)
    assert run([CKPT, "verify", xxh]).returncode == 0
    for np, extra in ((1, ["--threads", "2"]), (2, ["--threads", "1"])):
        ck = f"{tmp}/resume-{np}"
        shutil.copytree(xxh, ck)
        p = mpirun(np, train_args(train, ck, steps=9, extra=extra + ["--verify-load", "on"]))
        assert "digest equal to the checkpoint's" in p.stderr, p.stderr
    shard, = glob.glob(f"{xxh}/step-00000006/shard-00000-of-00001.*")
    flip_byte(shard, 1000)
    p = run([CKPT, "verify", xxh], check=False)
    assert p.returncode == 1 and "xxh3-128 mismatch" in p.stdout, p.stdout
    p = run(train_args(train, xxh, steps=9, extra=["--threads", "2"]))
    assert "xxh3-128 mismatch" in p.stderr and "resumed from checkpoint step 3" in p.stderr, \
        p.stderr


def verify_on_several_threads_reports_what_one_thread_reports(tmp):
    """fsdp-ckpt verify --threads N: the chunks of a shard checked by N
    threads, every damaged one reported, in chunk order, as on one thread."""
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run(train_args(train, ck, steps=3, extra=["--ckpt-chunk-kib", "64"]))
    shard, = glob.glob(f"{ck}/step-00000003/shard-00000-of-00001.*")
    size = os.path.getsize(shard)
    for at in (size // 5, size // 2, size * 4 // 5):
        flip_byte(shard, at)
    outs = []
    for threads in ("1", "2", "5"):
        p = run([CKPT, "verify", ck, "--threads", threads], check=False)
        bad = [l for l in p.stdout.splitlines() if l.startswith("BAD")]
        assert p.returncode == 1 and len(bad) == 3, (threads, p.stdout)
        assert "3 problems" in p.stderr, p.stderr
        outs.append(bad)
    chunks = [int(l.split(": chunk ")[1].split()[0]) for l in outs[0]]
    assert chunks == sorted(chunks) and len(set(chunks)) == 3, outs[0]
    assert outs[0] == outs[1] == outs[2], outs
    p = run([CKPT, "verify", ck, "--threads", "0"], check=False)
    assert p.returncode == 2 and "--threads" in p.stderr, p.stderr


def early_stops_checkpoint_and_the_same_command_continues(tmp):
    """--stop-at-step and a time limit (SLURM_JOB_END_TIME already past: the
    run stops after its first step) end with a checkpoint and exit 0; the
    same command then runs on to --steps with the uninterrupted run's digest,
    so the learning-rate schedule followed --steps throughout."""
    train, _ = prepare_corpus(tmp)
    ref, ck, past = f"{tmp}/ref", f"{tmp}/ck", f"{tmp}/past"
    mpirun(2, train_args(train, ref, steps=9))
    cmd = train_args(train, ck, steps=9, extra=["--stop-at-step", "5", "--log", f"{tmp}/a.jsonl"])
    p = mpirun(2, cmd)
    assert "stopped at step 5 of 9 (--stop-at-step)" in p.stderr, p.stderr
    assert committed_steps(ck) == [3, 5]
    assert [json.loads(l)["step"] for l in open(f"{tmp}/a.jsonl")][-1] == 5
    p = mpirun(2, cmd)  # resumed at 5, so --stop-at-step 5 is behind it
    assert "resumed from checkpoint step 5" in p.stderr and "done: 9 steps" in p.stderr, p.stderr
    assert digest(ck) == digest(ref), "stopping and continuing changed the run"
    gone = {"SLURM_JOB_END_TIME": str(int(time.time()) - 1)}
    p = mpirun(2, train_args(train, past, steps=9), env=gone)
    assert "time limit (SLURM_JOB_END_TIME)" in p.stderr and "checkpoint at step 1" in p.stderr, \
        p.stderr
    assert "stopped at step 1 of 9" in p.stderr and committed_steps(past) == [1], p.stderr
    p = mpirun(2, train_args(train, past, steps=9, extra=["--time-limit", "1h"]))
    assert "resumed from checkpoint step 1" in p.stderr and "done: 9 steps" in p.stderr, p.stderr
    assert digest(past) == digest(ref)
    # an end before the machine booted (a negative monotonic deadline) is
    # still in the past, and the earlier of the two limits applies
    ancient = {"SLURM_JOB_END_TIME": "1000"}
    p = run(train_args(train, f"{tmp}/ancient", steps=9, extra=["--time-limit", "1h"]),
            env=ancient)
    assert "stopped at step 1 of 9 (time limit (SLURM_JOB_END_TIME) passed" in p.stderr, p.stderr
    for bad_env, bad_arg, want in (({"SLURM_JOB_END_TIME": "soon"}, [], "SLURM_JOB_END_TIME"),
                                   ({}, ["--time-limit", "10 min"], "--time-limit"),
                                   ({}, ["--time-limit", "-5m"], "--time-limit")):
        p = run(train_args(train, f"{tmp}/bad", steps=9, extra=bad_arg), check=False,
                env=bad_env)
        assert p.returncode == 2 and want in p.stderr, p.stderr
    assert not os.path.exists(f"{tmp}/bad"), "a refused run wrote a checkpoint"


def damaged_manifest_is_not_committed_and_falls_back(tmp):
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    mpirun(1, train_args(train, ck, steps=6))
    man = f"{ck}/step-00000006/MANIFEST.json"
    text = open(man).read().replace('"data_cursor": 48', '"data_cursor": 40')
    assert '"data_cursor": 40' in text
    open(man, "w").write(text)
    ls = run([CKPT, "ls", ck]).stdout
    assert "step-00000006  damaged" in ls and "its own digest" in ls, ls
    p = mpirun(1, train_args(train, ck, steps=6))
    assert "resumed from checkpoint step 3" in p.stderr, p.stderr
    # the damaged step is never deleted because it did not load: it stays for
    # `verify`, and this run's step 6 does not replace it
    assert "step 6 stays in the store" in p.stderr, p.stderr
    assert "step 6 is already committed" in p.stderr and "not overwritten" in p.stderr, p.stderr
    assert open(man).read() == text
    assert committed_steps(ck) == [3]


def other_model_is_refused(tmp):
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    mpirun(1, train_args(train, ck, steps=3))
    p = run(train_args(train, ck, steps=6, extra=["--dim", "64"]), check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert any("was written for model" in l and "refusing to resume" in l for l in lines), \
        p.stderr
    assert committed_steps(ck) == [3]


def resume_none_refuses_a_store_with_checkpoints(tmp):
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run(train_args(train, ck, steps=3))
    p = run(train_args(train, ck, steps=3, extra=["--resume", "none"]), check=False)
    assert p.returncode == 1 and "already holds committed checkpoints" in p.stderr, p.stderr


def retention_keeps_newest_k(tmp):
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    os.makedirs(f"{ck}/step-00000001")
    open(f"{ck}/step-00000001/shard-00000-of-00001", "w").write("leftover of a crashed run")
    run(train_args(train, ck, steps=12, extra=["--keep", "2"]))
    assert committed_steps(ck) == [9, 12]
    assert sorted(d for d in os.listdir(ck) if d.startswith("step-")) == \
        ["step-00000009", "step-00000012"]


def no_temporaries(ck):
    return [f for f in glob.glob(f"{ck}/**", recursive=True) if ".tmp." in f]


def writes_per_checkpoint(train, tmp):
    """Storage writes of one save: each shard's chunks, then its chunk index."""
    ck = f"{tmp}/count"
    run(train_args(train, ck, steps=3))
    man = json.loads(run([CKPT, "inspect", ck, "--json"]).stdout)
    return sum(s["chunks"] + 1 for s in man["shards"])


def storage_errors_fail_the_save_and_keep_committed(tmp):
    train, _ = prepare_corpus(tmp)
    # The first checkpoint (step 3) succeeds, the second (step 6) fails:
    # a write in the middle of its shard, its commit, its creation, or its
    # manifest. (At start the trainer claims a generation and seals the store
    # with it - two put_if_absent - and probes the store with one put, write,
    # commit and delete.)
    n = writes_per_checkpoint(train, tmp)
    for spec, errno_text in ((f"write=ENOSPC@{1 + n + n // 2}", "No space left on device"),
                             (f"write=EIO@{n + 2}", "Input/output error"),
                             ("commit=EACCES@3", "Permission denied"),
                             ("put=EROFS@3", "Read-only file system"),
                             ("put_if_absent=EIO@4", "Input/output error")):
        ck = f"{tmp}/ck-{spec.split('=')[0]}-{errno_text.split()[0]}"
        print(f"  --ckpt 'fault:{spec};DIR': {errno_text}")
        p = run(train_args(train, f"fault:{spec};{ck}", steps=9), check=False)
        assert p.returncode == 1, f"{spec}: exit {p.returncode}"
        line = [l for l in p.stderr.splitlines() if "checkpoint of step 6 failed" in l]
        assert line and errno_text in line[0] and "newest committed checkpoint is step 3" in \
            line[0], f"{spec}: {p.stderr}"
        assert committed_steps(ck) == [3], f"{spec}: {committed_steps(ck)}"
        assert run([CKPT, "verify", ck]).returncode == 0
        assert not no_temporaries(ck) or spec.startswith("put_if"), no_temporaries(ck)
        # and the run resumes from what is there
        p = run(train_args(train, ck, steps=9))
        assert "resumed from checkpoint step 3" in p.stderr
        assert committed_steps(ck) == [3, 6, 9]


def async_checkpoints_equal_sync_ones_and_surface_errors(tmp):
    train, _ = prepare_corpus(tmp)
    sync, asyn = f"{tmp}/sync", f"{tmp}/async"
    mpirun(2, train_args(train, sync, steps=12))
    p = mpirun(2, train_args(train, asyn, steps=12, extra=["--ckpt-async"]))
    assert "snapshot and write in the background" in p.stderr and "committed (async" in p.stderr, p.stderr
    assert committed_steps(asyn) == committed_steps(sync) == [6, 9, 12]
    for step in committed_steps(sync):
        assert digest(f"{asyn}@{step}") == digest(f"{sync}@{step}"), f"step {step} differs"
    # retention runs on rank 0's background thread: only the newest K stay
    kept = f"{tmp}/kept"
    mpirun(2, train_args(train, kept, steps=12, extra=["--ckpt-async", "--keep", "1"]))
    steps_left = sorted(d for d in os.listdir(kept) if d.startswith("step-"))
    assert committed_steps(kept) == [12] and steps_left == ["step-00000012"], steps_left
    assert digest(f"{kept}@12") == digest(f"{sync}@12")
    # an error in the background surfaces as one line; the committed step stays
    ck = f"{tmp}/faulty"  # rank 0's second shard cannot even be created (its put 1 is the probe)
    p = mpirun(2, train_args(train, f"fault:put=EIO@3;{ck}", steps=9,
                             extra=["--ckpt-async"]), check=False)
    line = [l for l in p.stderr.splitlines() if "background checkpoint of step 6 failed" in l]
    assert p.returncode != 0 and line and "Input/output error" in line[0], p.stderr
    assert "newest committed checkpoint is step 3" in line[0], line
    assert committed_steps(ck) == [3] and run([CKPT, "verify", ck]).returncode == 0


def real_enospc_on_a_full_filesystem(tmp):
    mnt = f"{tmp}/small"
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=13m", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        print("  skipped: cannot mount a tmpfs here (needs root)")
        return
    try:
        train, _ = prepare_corpus(tmp)
        ck = f"{mnt}/ck"
        # one tiny checkpoint is about 8.2 MB: the second does not fit
        p = run(train_args(train, ck, steps=9, extra=["--compress", "none"]), check=False)
        assert p.returncode == 1, p.stderr
        assert "No space left on device" in p.stderr and "checkpoint of step 6 failed" in \
            p.stderr, p.stderr
        assert committed_steps(ck) == [3]
        assert run([CKPT, "verify", ck]).returncode == 0
        assert not no_temporaries(ck), no_temporaries(ck)
        subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
        p = run(train_args(train, ck, steps=9, extra=["--compress", "none"]), check=False)
        assert p.returncode == 1 and "Read-only file system" in p.stderr, p.stderr
        assert run([CKPT, "verify", ck]).returncode == 0
    finally:
        subprocess.run(["umount", mnt])


if __name__ == "__main__":
    main([flipped_byte_fails_verify_and_resume_falls_back,
          damaged_chunk_index_fails_verify_and_resume_falls_back,
          format1_checkpoint_loads_verifies_and_converts,
          manifest_does_not_grow_with_the_number_of_chunks,
          xxh3_chunk_digests_load_verify_and_catch_damage,
          verify_on_several_threads_reports_what_one_thread_reports,
          early_stops_checkpoint_and_the_same_command_continues,
          damaged_manifest_is_not_committed_and_falls_back,
          other_model_is_refused,
          resume_none_refuses_a_store_with_checkpoints,
          retention_keeps_newest_k,
          storage_errors_fail_the_save_and_keep_committed,
          async_checkpoints_equal_sync_ones_and_surface_errors,
          real_enospc_on_a_full_filesystem])
