"""A long multi-host chaos run (not in the default suite): fsdp-super on the
controller supervises a job on three workers while this driver breaks
things, one fault at a time, each on an event (a checkpoint committed by
the launch that followed the previous fault), never on a clock:

  node-kill   every process of one worker killed at once (booted again once
              the job runs without it)
  power-off   a worker's link cut, then its processes killed (booted and
              linked again later)
  partition   a worker's link down with its processes alive, up again once
              the job runs without it
  host-remove a worker taken out of the host file (put back once the job
              runs without it: a host added is used at the next launch)
  rank-kill   SIGKILL of one rank
  hang        SIGSTOP of one rank (frozen: heartbeats stop)

After the last fault fsdp-super gets SIGTERM (an operator's stop: every
rank writes an emergency checkpoint), which must verify; the summary
(faults, restarts by cause, downtime, goodput) is printed.

  FSDP_BUILD=$PWD/build python3 tests/multihost/chaos_long.py [FAULTS [SEED]]

FAULTS defaults to 32, SEED to 1. Needs root (tests/multihost/README.md)."""

import os
import random
import shutil
import signal
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402
from harness import CKPT, committed_steps, prepare_corpus, run  # noqa: E402
from test_supervised import (events_of, finish, output, ranks_on, start_super,  # noqa: E402
                             train_args)

KINDS = ["node-kill", "power-off", "partition", "host-remove", "rank-kill", "hang"]
EXPECT = {  # what fsdp-super must call each fault's restart
    "node-kill": {"exit", "rank-died", "heartbeat-lost"},
    "power-off": {"exit", "rank-died", "heartbeat-lost"},
    "partition": {"exit", "rank-died", "heartbeat-lost"},
    "host-remove": {"host-removed"},
    "rank-kill": {"exit", "rank-died"},
    "hang": {"heartbeat-lost"},
}


def wait_for(p, tmp, ev, what, pred, limit=180):
    """The first event pred(e, events) accepts."""
    deadline = time.monotonic() + limit
    while True:
        evs = events_of(ev)
        for e in evs:
            if pred(e, evs):
                return e
        if p.poll() is not None:
            raise AssertionError(f"fsdp-super exited {p.returncode} before {what}:\n"
                                 f"{output(tmp)[1][-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {limit} s; last events: {evs[-6:]}")
        time.sleep(0.05)


def job_args(data, ck):
    """test_supervised's job, with a global batch every world size 1-3 divides."""
    a = train_args(data, ck, 10 ** 6)
    a[a.index("--global-batch") + 1] = "12"
    return a


def newest_generation(evs):
    gens = [e["generation"] for e in evs if e["event"] == "launch"]
    return gens[-1] if gens else None


def main():
    faults = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    why = hosts.unsupported()
    if why:
        print(f"skip: {why}")
        sys.exit(77)
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="fsdp-chaos-long-")
    data, _ = prepare_corpus(tmp)
    t_start = time.monotonic()
    with hosts.Cluster(3, tmp) as c:
        ck = os.path.join(tmp, "ck")
        hf = c.hostfile()
        p, ev = start_super(c, tmp, ["--hosts", hf, "--np", "3", "--min-np", "1",
                                     "--heartbeat-timeout", "3", "--rank-silence", "5",
                                     "--max-restarts", "1000", "--healthy-after", "5",
                                     "--probe-timeout", "2", "--capacity-timeout", "120"],
                            job_args(data, ck))
        done = []
        try:
            for n in range(1, faults + 1):
                # the event: the newest launch is training and has committed
                commit = wait_for(p, tmp, ev, f"a commit before fault {n}",
                                  lambda e, evs: e["event"] == "checkpoint_committed" and
                                  e["generation"] == newest_generation(evs))
                gen = commit["generation"]
                running = [w for w in c.workers if w.up() and ranks_on(w)]
                kind = rng.choice(KINDS)
                if kind in ("node-kill", "power-off", "partition", "host-remove") and \
                        len(running) < 2:
                    kind = rng.choice(["rank-kill", "hang"])  # keep a host to go on with
                victim = rng.choice(running)
                t0 = time.time()
                if kind == "node-kill":
                    victim.kill_all(signal.SIGKILL)
                elif kind == "power-off":
                    victim.power_off()
                elif kind == "partition":
                    victim.link(False)
                elif kind == "host-remove":
                    c.hostfile(hosts=[w for w in c.workers if w is not victim])
                elif kind == "rank-kill":
                    os.kill(ranks_on(victim)[0], signal.SIGKILL)
                else:
                    os.kill(ranks_on(victim)[0], signal.SIGSTOP)
                restart = wait_for(p, tmp, ev, f"the restart after fault {n} ({kind})",
                                   lambda e, _: e["event"] == "restart" and e["t"] >= t0)
                nxt = wait_for(p, tmp, ev, f"the launch after fault {n}",
                               lambda e, _: e["event"] == "launch" and e["generation"] > gen)
                # repair what stays broken, for later launches
                if kind == "node-kill":
                    victim.start()
                elif kind == "power-off":
                    victim.link(True)
                    victim.start()
                elif kind == "partition":
                    victim.link(True)
                elif kind == "host-remove":
                    c.hostfile()
                ok = restart["cause"] in EXPECT[kind]
                done.append((kind, victim.name, restart["cause"], restart["t"] - t0, ok))
                print(f"fault {n:2d}: {kind:11s} {victim.name}: restart '{restart['cause']}' "
                      f"after {restart['t'] - t0:5.2f} s, relaunched with {nxt['np']} rank(s) "
                      f"on {len(nxt['hosts'])} host(s){'' if ok else '  UNEXPECTED'}",
                      flush=True)
                assert ok, f"fault {n} ({kind}) ended in restart cause {restart['cause']}"
            wait_for(p, tmp, ev, "a commit after the last fault",
                     lambda e, evs: e["event"] == "checkpoint_committed" and
                     e["generation"] == newest_generation(evs))
            p.send_signal(signal.SIGTERM)
            rc = finish(p, tmp, 300)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    final = committed_steps(ck)[-1]
    run([CKPT, "verify", f"{ck}@{final}"])
    summary = err[err.rfind("fsdp-super summary"):]
    print(f"\n{faults} faults (seed {seed}) in {time.monotonic() - t_start:.0f} s; "
          f"final checkpoint step {final} verifies\n")
    by_kind = {}
    for kind, _, cause, _, _ in done:
        by_kind.setdefault(kind, []).append(cause)
    for kind in KINDS:
        if kind in by_kind:
            print(f"  {kind:11s} x{len(by_kind[kind]):2d}: causes {sorted(set(by_kind[kind]))}")
    print("\n" + summary)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
