"""In-memory snapshots on several hosts (tests/multihost: real hosts from
network namespaces, each with its own /dev/shm that dies with it; see
hosts.py). With --mem-snapshot-every 1 each rank's shard of every step is
in its host's RAM and in the next host's (src/checkpoint_buddy.c).

- A whole host lost: its rank's shard comes from the buddy's copy. Three
  workers, two ranks (on workers 1 and 2); worker 2 is killed whole once
  the snapshot of step 29 is committed, with no checkpoint in --ckpt yet.
  The relaunch on workers 1 and 3 resumes from RAM at step 29 (worker 3's
  store was empty: it is given what its rank needs), and the final digest
  equals an uninterrupted two-rank run's.
- A host and its buddy lost: four workers, three ranks; workers 2 and 3
  are killed whole, so rank 1's shard (on worker 2, copied to worker 3) is
  in no host's RAM. The relaunch on workers 1 and 4 says the snapshot is
  unusable, falls back to --ckpt's step 20 (resharded from three ranks to
  two), and the final digest equals that of the same fallback made by
  hand (three ranks to step 20, two from there).
- Rank 0's host rebooted: the whole job dies after the step 29 snapshot and
  worker 1 comes back with an empty /dev/shm; a new fsdp-super resumes
  from worker 2's RAM and snapshots go on (worker 2's store is a
  generation ahead of worker 1's: rank 0's writer tag follows the agreed
  generation).

Faults are triggered by events: the rank on worker 2 holds after step 30
(FSDP_TEST_HOLD_AT, in worker 2's login environment only), so the newest
committed snapshot at the kill is step 29's, whatever the machine's speed."""

import os
import shutil
import signal
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402
from harness import CKPT, digest, main, mpirun, prepare_corpus, run  # noqa: E402
from test_supervised import (events_of, finish, output, ranks_on, start_super,  # noqa: E402
                             train_args, wait_event)

STEPS = 60
HOLD_ON_W2 = {"w2": {"FSDP_TEST_HOLD_AT": "30"}}


def args(data, ck, ckpt_every, batch=4):
    a = train_args(data, ck, STEPS) + ["--mem-snapshot-every", "1"]
    a[a.index("--ckpt-every") + 1] = str(ckpt_every)
    a[a.index("--global-batch") + 1] = str(batch)  # 12: three ranks and two
    return a


def lose_hosts(c, tmp, data, ck, np, ckpt_every, victims, batch=4):
    """fsdp-super over every worker with --np np; the victims killed whole
    once the snapshot of step 29 is committed. Returns the events and
    fsdp-super's stderr."""
    p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", str(np), "--min-np", "1",
                                 "--heartbeat-timeout", "5", "--max-restarts", "3"],
                        args(data, ck, ckpt_every, batch))
    wait_event(p, tmp, ev, "the snapshot of step 29",
               lambda e: e["event"] == "checkpoint_committed" and e.get("memory") == 1
               and e["step"] == 29, 180)
    for v in victims:
        assert ranks_on(v), f"no rank on {v.name}: {v.pids()}"
    for v in victims:
        v.kill_all(signal.SIGKILL)
    rc = finish(p, tmp, 600)
    err = output(tmp)[1]
    assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
    return events_of(ev), err


def a_lost_hosts_shard_comes_from_its_buddys_copy(tmp):
    data, _ = prepare_corpus(tmp)
    ref = os.path.join(tmp, "ref")
    mpirun(2, args(data, ref, 40))
    with hosts.Cluster(3, tmp, login_env=HOLD_ON_W2) as c:
        w1, w2, w3 = c.workers
        ck = os.path.join(tmp, "ck")
        evs, err = lose_hosts(c, tmp, data, ck, 2, 40, [w2])
        launches = [e for e in evs if e["event"] == "launch"]
        assert launches[-1]["hosts"] == [w1.addr, w3.addr] and launches[-1]["np"] == 2, launches
        resumed = [e for e in evs if e["event"] == "resumed"]
        assert [(e["step"], bool(e.get("memory"))) for e in resumed] == [(0, False), (29, True)], \
            (resumed, err[-3000:])
        assert "copied to the hosts whose ranks need them" in err, err[-3000:]
        assert "from the in-memory snapshot of step 29" in err, err[-3000:]
        left = c.wait_no_job_processes([c.controller, w1, w3])
        assert not left, f"processes of the job left: {left}"
    run([CKPT, "verify", ck])
    assert digest(ck) == digest(ref), "healing from a buddy's copy changed the bits"
    print(f"  {w2.name} lost at step 30: relaunched on {launches[-1]['hosts']}, resumed from "
          f"RAM at step 29 ({[l for l in err.splitlines() if 'copied to the hosts' in l][0]}); "
          f"digest equal to the uninterrupted run's")


def a_lost_host_and_its_buddy_fall_back_to_the_checkpoint_store(tmp):
    data, _ = prepare_corpus(tmp)
    ref = os.path.join(tmp, "ref")
    mpirun(3, args(data, ref, 20, 12) + ["--keep", "100"])
    for name in os.listdir(ref):  # the same fallback by hand: only step 20 stays
        if name.startswith("step-") and int(name[5:]) > 20:
            shutil.rmtree(os.path.join(ref, name))
    mpirun(2, args(data, ref, 20, 12))
    with hosts.Cluster(4, tmp, login_env=HOLD_ON_W2) as c:
        w1, w2, w3, w4 = c.workers
        ck = os.path.join(tmp, "ck")
        evs, err = lose_hosts(c, tmp, data, ck, 3, 20, [w2, w3], 12)
        launches = [e for e in evs if e["event"] == "launch"]
        assert launches[-1]["hosts"] == [w1.addr, w4.addr] and launches[-1]["np"] == 2, launches
        resumed = [e for e in evs if e["event"] == "resumed"]
        assert [(e["step"], bool(e.get("memory"))) for e in resumed][-1] == (20, False), \
            (resumed, err[-3000:])
        assert "checkpoint step 29 is unusable" in err, err[-3000:]
        reshard = [e for e in evs if e["event"] == "reshard"]
        assert reshard and reshard[-1]["from"] == 3 and reshard[-1]["to"] == 2, reshard
        left = c.wait_no_job_processes([c.controller, w1, w4])
        assert not left, f"processes of the job left: {left}"
    run([CKPT, "verify", ck])
    assert digest(ck) == digest(ref), "the fallback to --ckpt differs from the one made by hand"
    why = [l for l in err.splitlines() if "step 29 is unusable" in l][0]
    print(f"  {w2.name} and {w3.name} lost at step 30: {why[:200]}; resumed from --ckpt step "
          f"20, resharded 3 -> 2; digest equal to the fallback made by hand")


def a_rebooted_rank_0_host_heals_and_snapshots_go_on(tmp):
    """The whole job dies at step 30 (supervisor, ranks) and worker 1, rank
    0's host, comes back rebooted: its RAM store is empty, worker 2's holds
    the step 29 snapshot and a newer generation than worker 1's. A new
    fsdp-super resumes from RAM at step 29 (worker 1's store completed from
    worker 2's), snapshots stay on (rank 0's writer tag is made for the
    agreed generation), and the digest equals an uninterrupted run's."""
    data, _ = prepare_corpus(tmp)
    ref = os.path.join(tmp, "ref")
    mpirun(2, args(data, ref, 40))
    with hosts.Cluster(2, tmp, login_env={"w1": {"FSDP_TEST_HOLD_AT": "30"}}) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        targs = args(data, ck, 40)
        sup = ["--hosts", c.hostfile(), "--np", "2", "--heartbeat-timeout", "5",
               "--max-restarts", "3"]
        p, ev = start_super(c, tmp, sup, targs)
        wait_event(p, tmp, ev, "the snapshot of step 29",
                   lambda e: e["event"] == "checkpoint_committed" and e.get("memory") == 1
                   and e["step"] == 29, 180)
        p.kill()
        p.wait()
        w1.kill_all(signal.SIGKILL)  # rank 0's host, RAM and all
        for h in (c.controller, w2):  # the rest of the job, not worker 2's RAM
            for pid, _ in h.job_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert not c.wait_no_job_processes([c.controller, w2])
        w1.login_env = {}
        w1.start()  # rebooted: an empty /dev/shm, no hold
        c.wait_reachable([w1])
        os.rename(ev, ev + ".first")
        p, ev = start_super(c, tmp, sup, targs)
        rc = finish(p, tmp, 600)
        err = output(tmp)[1]
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        resumed = [e for e in events_of(ev) if e["event"] == "resumed"]
        assert [(e["step"], bool(e.get("memory"))) for e in resumed] == [(29, True)], \
            (resumed, err[-3000:])
        assert "copied to the hosts whose ranks need them" in err, err[-3000:]
        assert "snapshots are off" not in err, err[-3000:]
    run([CKPT, "verify", ck])
    assert digest(ck) == digest(ref), "healing a rebooted rank 0's host changed the bits"
    print("  worker 1 rebooted after step 29: resumed from worker 2's RAM, snapshots on, "
          "digest equal to the uninterrupted run's")


if __name__ == "__main__":
    why = hosts.unsupported()
    if why:
        print(f"skip: {why}")
        sys.exit(77)  # meson: skipped
    main([a_lost_hosts_shard_comes_from_its_buddys_copy,
          a_lost_host_and_its_buddy_fall_back_to_the_checkpoint_store,
          a_rebooted_rank_0_host_heals_and_snapshots_go_on])
