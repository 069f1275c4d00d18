"""Resume is bit-exact (with synchronous and with --ckpt-async checkpoints):
a run killed with SIGKILL (every process of the job)
at a dozen moments - mid-shard, after the shards are durable but before the
manifest, right after the manifest, and while it computes a random step -
and resumed with
--resume auto each time ends with the same digest as an uninterrupted run
with the same seed, on 1 and on 2 ranks. After every kill, every step that
fsdp-ckpt ls calls committed verifies."""

import json
import os
import random
import time

from harness import (CKPT, committed_steps, digest, kill_job, launch, main, mpirun,
                     prepare_corpus, run, slow, wait_stopped_or_exit)
from test_checkpoint import train_args


def assert_committed_verify(ck):
    for step in committed_steps(ck):
        p = run([CKPT, "verify", f"{ck}@{step}"], check=False)
        assert p.returncode == 0, f"step {step} is listed committed but fails verify:\n{p.stdout}"


def wait_logged_or_exit(p, log, step, limit=120):
    """Waits until rank 0's step log has a line for `step` (it writes one as
    each step ends) or the job ended. Returns True if the step was logged."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return False
        try:
            with open(log) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                if json.loads(line)["step"] >= step:
                    return True
            except (ValueError, KeyError):
                pass  # a line being written
        time.sleep(0.02)
    raise AssertionError(f"the job neither logged step {step} nor finished")


def kill_and_resume(tmp, np, seed, extra=()):
    train, _ = prepare_corpus(tmp)
    ref = f"{tmp}/ref-{np}"
    mpirun(np, train_args(train, ref))  # the reference is always synchronous
    want = digest(ref)

    ck = f"{tmp}/ck-{np}"
    rng = random.Random(seed)
    # Kill points: the test hook stops a rank at a precise place of a given
    # save (mid-shard, shards durable but no manifest, just after the
    # manifest), or while it computes the step after a random one. Every
    # kill is SIGKILL of every process. Faults land on events (a stop, a
    # logged step), never after wall-clock seconds.
    plan = []
    for point in ("shard-chunk", "before-commit", "after-commit"):
        for _ in range(2):
            plan.append((point, rng.randint(1, 2)))
    # Random steps: 1-4 past the step the launch resumes from, so that all
    # the kills together cannot finish the run (STEPS) early.
    plan += [("step", rng.randint(1, 4)) for _ in range(6)]
    rng.shuffle(plan)
    kills = 0
    for i, (kind, arg) in enumerate(plan + [("none", 0)]):
        env = {"FSDP_TEST_STOP_AT": f"{kind}:{arg}"} if kind not in ("step", "none") else {}
        log = f"{tmp}/log-{np}-{i}.jsonl"
        resumes_from = (committed_steps(ck) or [0])[-1] if os.path.exists(ck) else 0
        p = launch(np, train_args(train, ck, extra=list(extra) + ["--log", log]), env)
        if kind == "step":
            stopped = wait_logged_or_exit(p, log, resumes_from + arg)
        elif kind == "none":
            stopped = False
        else:
            stopped = wait_stopped_or_exit(p)
        if os.environ.get("VERBOSE"):
            print(f"    {kind}:{arg}: {'killed' if stopped else 'ran to the end'}; "
                  f"committed {committed_steps(ck)[-1:]}")
        if stopped:
            kill_job(p)
            kills += 1
            assert_committed_verify(ck)
        else:
            err = p.communicate()[1]
            assert p.returncode == 0, f"run exited {p.returncode}:\n{err[-2000:]}"
            if kind == "none":
                break
    # finish whatever is left
    p = launch(np, train_args(train, ck, extra=extra))
    err = p.communicate()[1]
    assert p.returncode == 0, err[-2000:]
    print(f"  {np} rank(s): {kills} SIGKILLs, final digest "
          f"{'equal' if digest(ck) == want else 'DIFFERENT'}")
    assert kills >= 10, f"only {kills} kills landed"
    assert_committed_verify(ck)
    got = digest(ck)
    assert got == want, [k for k in want if want[k] != got.get(k)][:5]


@slow
def resume_after_kill_is_bit_exact_one_rank(tmp):
    kill_and_resume(tmp, 1, seed=11)


@slow
def resume_after_kill_is_bit_exact_two_ranks(tmp):
    kill_and_resume(tmp, 2, seed=12)



@slow
def resume_after_kill_is_bit_exact_with_async_checkpoints(tmp):
    """Kills also land while the background thread writes a shard."""
    kill_and_resume(tmp, 2, seed=13, extra=["--ckpt-async"])


if __name__ == "__main__":
    main([resume_after_kill_is_bit_exact_one_rank, resume_after_kill_is_bit_exact_two_ranks,
          resume_after_kill_is_bit_exact_with_async_checkpoints])
