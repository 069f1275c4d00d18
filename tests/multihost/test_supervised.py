"""fsdp-super supervising ranks on other hosts (tests/multihost: real hosts
from network namespaces, see hosts.py). fsdp-super runs on the controller,
which runs no rank; the host file lists the workers' addresses; the
checkpoints are on the filesystem every host shares; Open MPI's settings
for the test network (launch agent mh-rsh, both TCP layers held to the
subnet, no core binding) are in fsdp-super's environment, as a user's
would be.

- A fault-free run on two workers: every rank's heartbeats arrive from its
  own host (rank_up names both workers, not local), the final digest equals
  the same job on one host with the same world size, the launch's token is
  on no command line of any process on any host, and the ranks get the
  environment their bits depend on even though the launch agent's login
  environment lacks it.
- Node loss, twice: every process of one worker killed at once (its kernel
  resets the connections), and the worker powered off silently (its link
  cut first, so nothing it had open says goodbye). Either way the loss is
  detected within --heartbeat-timeout + 2 s (an event naming the host,
  timed from the kill), the lost host fails its probe and is left out, the
  job relaunches once on the other worker with the smaller world size
  (resharded), finishes, and the final checkpoint verifies.

- A flaky host: worker 2's rank killed in two launches in a row; the
  second failure sets worker 2 aside and the relaunch on worker 1 alone
  goes ahead at once (no backoff) and finishes.
- A partition: detected in time, the stranded rank and daemon stop by
  themselves, the final step holds only the last generation's objects.
- A stale rank: rank 0 frozen past its fence check on a host that is then
  paused and cut off; thawed after the job moved on, it says "fenced" and
  exits at once instead of committing or hanging.

Faults are triggered by events (a committed checkpoint), never by sleeps.
Every test deletes its hosts and checks that no process is left in them,
pass or fail (hosts.Cluster), and that no process of the job is left on
the hosts that stayed up when it ended."""

import json
import os
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402
from harness import (BUILD, CKPT, TRAIN, committed_steps, digest, main, mpirun,  # noqa: E402
                     prepare_corpus, read_log, run)

SUPER = os.path.join(BUILD, "recovery", "fsdp-super")
MODEL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64", "--global-batch", "4"]
DETECTED = ("heartbeat_lost", "rank_died", "daemon_lost", "peer_lost")


# A rank on worker 2 that finishes step 30 waits there until a preemption
# order (src/testhook.h); set in worker 2's login environment, which
# fsdp-super does not clear, so a relaunch without worker 2 never holds.
HOLD_ON_W2 = {"w2": {"FSDP_TEST_HOLD_AT": "30"}}


def train_args(data, ck, steps):
    # --threads 1: a worker sees one local rank and would pick two threads,
    # the one-host reference two ranks and one thread each; bit equality
    # needs the same thread count.
    return [TRAIN, "--data", data] + MODEL + [
        "--steps", str(steps), "--threads", "1", "--ckpt", ck, "--ckpt-every", "10",
        "--log-every", "100000", "--ckpt-chunk-kib", "64"]


def start_super(c, tmp, args, targs, env=None):
    """fsdp-super on the controller, its output in tmp/super.{out,err};
    returns (Popen, event log path)."""
    ev = os.path.join(tmp, "events.jsonl")
    out = open(os.path.join(tmp, "super.out"), "w")
    err = open(os.path.join(tmp, "super.err"), "w")
    cmd = [SUPER, "--events", ev, "--restart-backoff", "0.1", "--grace", "3"] + args + \
        ["--"] + targs
    p = c.controller.popen(cmd, env=c.mpi_env(env), stdout=out, stderr=err)
    out.close()
    err.close()
    return p, ev


def output(tmp):
    return (open(os.path.join(tmp, "super.out")).read(),
            open(os.path.join(tmp, "super.err")).read())


def events_of(path):
    try:
        return read_log(path)
    except (OSError, ValueError):
        return []


def wait_event(p, tmp, ev, what, pred, limit):
    """The first event that pred accepts; fails when fsdp-super ends first
    or after limit seconds."""
    deadline = time.monotonic() + limit
    while True:
        for e in events_of(ev):
            if pred(e):
                return e
        if p.poll() is not None:
            said = [e["line"] for e in events_of(ev) if e["event"] == "mpirun_output"]
            raise AssertionError(f"fsdp-super exited {p.returncode} before {what}:\n"
                                 f"{output(tmp)[1][-3000:]}\nOpen MPI said:\n" + "\n".join(said))
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {limit} s; last events: "
                                 f"{events_of(ev)[-5:]}")
        time.sleep(0.05)


def finish(p, tmp, limit):
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(f"fsdp-super still running after {limit} s:\n"
                             f"{output(tmp)[1][-3000:]}")
    return p.returncode


def ranks_on(host):
    return [pid for pid, comm in host.job_pids() if comm == "fsdp-train"]


def environ_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read().split(b"\0")
    return dict(kv.decode("latin-1").split("=", 1) for kv in raw if b"=" in kv)


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def every_cmdline():
    """The command line of every process on this machine: every test host's
    processes are among them (the root PID namespace sees them all)."""
    return [cmdline_of(int(d)) for d in os.listdir("/proc") if d.isdigit()]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def two_hosts_under_the_supervisor_beat_and_match_one_host(tmp):
    data, _ = prepare_corpus(tmp)
    steps, timeout = 200, 5
    ref = os.path.join(tmp, "ref")
    t = time.monotonic()
    mpirun(2, train_args(data, ref, steps))
    local_s = time.monotonic() - t
    # OMP_NUM_THREADS only in fsdp-super's environment, not in the login
    # environment the launch agent gives the workers (hosts.host_env)
    saved = os.environ.pop("OMP_NUM_THREADS", None)
    try:
        c = hosts.Cluster(2, tmp)
    finally:
        if saved is not None:
            os.environ["OMP_NUM_THREADS"] = saved
    with c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        t = time.monotonic()
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2",
                                     "--heartbeat-timeout", str(timeout)],
                            train_args(data, ck, steps), env={"OMP_NUM_THREADS": "1"})
        wait_event(p, tmp, ev, "a committed checkpoint",
                   lambda e: e["event"] == "checkpoint_committed", 120)
        ranks = {w.name: ranks_on(w) for w in c.workers}
        assert all(len(r) == 1 for r in ranks.values()), f"ranks per worker: {ranks}"
        pids = [r[0] for r in ranks.values()]
        envs = [environ_of(pid) for pid in pids]
        token = envs[0].get("FSDP_SUPER_TOKEN", "")
        assert len(token) == 64 and envs[1].get("FSDP_SUPER_TOKEN") == token, \
            "the ranks have no launch token"
        # the environment the bits depend on, carried with -x to other hosts
        for e in envs:
            assert e.get("OMP_NUM_THREADS") == "1", "OMP_NUM_THREADS did not reach a worker"
            for k in ("OPENBLAS_CORETYPE",):
                assert e.get(k) == os.environ.get(k), f"{k} differs on a worker"
        lines = every_cmdline()
        assert all(alive(pid) for pid in pids), "the job ended before its command lines were read"
        assert not [l for l in lines if token.encode() in l], "the token is on a command line"
        # mpirun and the workers' daemons got the OOB keepalive
        orted = [cmdline_of(pid) for w in c.workers for pid, comm in w.job_pids()
                 if comm == "orted"]
        assert len(orted) == 2 and all(b"oob_tcp_keepalive_time" in o for o in orted), orted
        rc = finish(p, tmp, 600)
        multi_s = time.monotonic() - t
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        evs = events_of(ev)
        ups = {e["rank"]: e for e in evs if e["event"] == "rank_up"}
        assert sorted(ups) == [0, 1], ups
        assert {u["host"] for u in ups.values()} == {w1.hostname, w2.hostname}, ups
        assert not any(u["local"] for u in ups.values()), ups
        assert all(int(u["pid"]) < 1000 for u in ups.values()), ups  # the workers' own pids
        launches = [e for e in evs if e["event"] == "launch"]
        assert len(launches) == 1 and launches[0]["hosts"] == [w1.addr, w2.addr], launches
        assert launches[0]["left_out"] == [], launches
        assert launches[0]["oob_keepalive"] == [3, 1, 2], launches  # 3 + 1 x 2 = 5 s
        assert not [e for e in evs if e["event"] == "host_suspect"]
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        for where, text in (("stdout", out), ("stderr", err), ("events", open(ev).read())):
            assert token not in text, f"the token is in fsdp-super's {where}"
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    run([CKPT, "verify", ck])
    want, got = digest(ref), digest(ck)
    assert got == want, "the supervised two-host checkpoint differs from the one-host one"
    print(f"  rank_up from {sorted(u['host'] for u in ups.values())} (pids "
          f"{sorted(u['pid'] for u in ups.values())}, not local); digest equal ({len(got)} "
          f"entries); token on no command line of {len(lines)} processes; one host "
          f"{local_s:.1f} s, two hosts supervised {multi_s:.1f} s")


def a_users_open_mpi_env_list_reaches_the_remote_ranks(tmp):
    """The user carries variables with Open MPI's own list
    (OMPI_MCA_mca_base_env_list; mpirun refuses -x beside it), one of them
    unset. fsdp-super puts its own names first in that list (Open MPI stops
    reading at a name it cannot find), so the remote ranks get the launch's
    token and generation and the user's variables before the unset one,
    and the job runs under supervision on both workers."""
    data, _ = prepare_corpus(tmp)
    with hosts.Cluster(2, tmp) as c:
        ck = os.path.join(tmp, "ck")
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2",
                                     "--heartbeat-timeout", "5", "--max-restarts", "0"],
                            train_args(data, ck, 400),
                            env={"OMPI_MCA_mca_base_env_list": "SITE_VAR;SITE_UNSET;SITE_LATE",
                                 "SITE_VAR": "42", "SITE_LATE": "1"})
        wait_event(p, tmp, ev, "a committed checkpoint",
                   lambda e: e["event"] == "checkpoint_committed", 120)
        envs = [environ_of(pid) for w in c.workers for pid in ranks_on(w)]
        assert len(envs) == 2, envs
        for e in envs:
            assert len(e.get("FSDP_SUPER_TOKEN", "")) == 64 and e.get("FSDP_GENERATION") and \
                e.get("SITE_VAR") == "42", {k: v for k, v in e.items() if k.startswith(("FSDP", "SITE"))}
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        ups = [e for e in events_of(ev) if e["event"] == "rank_up"]
        assert len(ups) == 2 and not any(u["local"] for u in ups), ups
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    print("  the remote ranks got the token, the generation and SITE_VAR through the user's list")


def node_loss(tmp, how):
    """Loses worker 2 (how: 'kill' or 'power_off') once a checkpoint is
    committed; the job must detect it in time, go on without it, finish."""
    data, _ = prepare_corpus(tmp)
    steps, timeout = 150, 3
    with hosts.Cluster(2, tmp) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2", "--min-np", "1",
                                     "--heartbeat-timeout", str(timeout), "--max-restarts", "3"],
                            train_args(data, ck, steps))
        wait_event(p, tmp, ev, "a committed checkpoint at step 20",
                   lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 20, 120)
        assert ranks_on(w2), f"no rank on {w2.name}: {w2.pids()}"
        names = {w2.hostname, w2.addr}
        t0 = time.time()
        if how == "kill":
            w2.kill_all(signal.SIGKILL)
        else:
            w2.power_off()
        lost = wait_event(p, tmp, ev, f"an event naming {w2.addr}",
                          lambda e: e["event"] in DETECTED and e.get("host") in names
                          and e["t"] >= t0, timeout + 30)
        took = lost["t"] - t0
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        assert took < timeout + 2, f"{how}: detected after {took:.2f} s: {lost}"
        evs = events_of(ev)
        suspect = [e for e in evs if e["event"] == "host_suspect"]
        assert [e["host"] for e in suspect] == [w2.addr], suspect
        launches = [e for e in evs if e["event"] == "launch"]
        assert [e["np"] for e in launches] == [2, 1], launches  # one restart, not one per try
        assert launches[1]["hosts"] == [w1.addr] and launches[1]["left_out"] == [w2.addr], \
            launches[1]
        assert len([e for e in evs if e["event"] == "restart"]) == 1
        reshard = [e for e in evs if e["event"] == "reshard"]
        assert reshard and reshard[0]["from"] == 2 and reshard[0]["to"] == 1, reshard
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        ups = [e for e in evs if e["event"] == "rank_up" and e["generation"] ==
               launches[1]["generation"]]
        assert [u["host"] for u in ups] == [w1.hostname], ups
        left = c.wait_no_job_processes([c.controller, w1])
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    print(f"  {how}: {lost['event']} naming {lost['host']} after {took:.2f} s "
          f"(--heartbeat-timeout {timeout}); {suspect[0]['host']} suspect "
          f"({suspect[0]['why']}); relaunched on {launches[1]['hosts']} with 1 rank from step "
          f"{reshard[0]['step']}; finished at step {steps}, verified")


def a_killed_host_is_detected_and_the_job_finishes_without_it(tmp):
    node_loss(tmp, "kill")


def a_powered_off_host_is_detected_and_the_job_finishes_without_it(tmp):
    node_loss(tmp, "power_off")


def a_host_removed_from_the_host_file_gets_a_planned_restart(tmp):
    """Worker 2 leaves the host file mid-run (a spot notice for one host, or
    an operator draining it): fsdp-super notices within a second, asks every
    rank for an emergency checkpoint, relaunches on worker 1 alone from that
    checkpoint (no step lost), and the job finishes and verifies."""
    data, _ = prepare_corpus(tmp)
    steps = 150
    # worker 2's rank holds after step 30 (worker 1's waits for it in the next
    # collective), so the job cannot finish before the host file changes
    # (150 steps take 0.3 s here); the emergency checkpoint releases it, and
    # the relaunch on worker 1 alone has no hold
    with hosts.Cluster(2, tmp, login_env=HOLD_ON_W2) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        hf = c.hostfile()
        p, ev = start_super(c, tmp, ["--hosts", hf, "--np", "2", "--min-np", "1",
                                     "--heartbeat-timeout", "20", "--max-restarts", "0"],
                            train_args(data, ck, steps))
        wait_event(p, tmp, ev, "a committed checkpoint at step 20",
                   lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 20, 120)
        t0 = time.time()
        c.hostfile(hosts=[w1])  # rewritten in place: worker 2 is gone from it
        removed = wait_event(p, tmp, ev, "host_removed",
                             lambda e: e["event"] == "host_removed", 30)
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        evs = events_of(ev)
        assert removed["host"] == w2.addr and removed["t"] - t0 < 2.5, removed
        emergency = [e for e in evs if e["event"] == "emergency_checkpoint"]
        restarts = [e for e in evs if e["event"] == "restart"]
        launches = [e for e in evs if e["event"] == "launch"]
        resumed = [e for e in evs if e["event"] == "resumed"]
        assert [e["cause"] for e in restarts] == ["host-removed"], restarts
        assert [(e["np"], e["hosts"]) for e in launches] == [(2, [w1.addr, w2.addr]),
                                                              (1, [w1.addr])], launches
        assert len(emergency) == 1 and resumed[-1]["step"] == emergency[0]["step"], \
            (emergency, resumed)
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        assert "steps lost      0" in err, err[-1500:]
        left = c.wait_no_job_processes([c.controller, w1, w2])
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    print(f"  host_removed {removed['host']} after {removed['t'] - t0:.2f} s; emergency "
          f"checkpoint at step {emergency[0]['step']}; relaunched on {launches[1]['hosts']}, "
          f"resumed from step {resumed[-1]['step']}; finished at step {steps}, verified")


def a_new_supervisor_takes_over_from_a_killed_one(tmp):
    """fsdp-super is SIGKILLed mid-run: its ranks on both workers hear
    nothing more and stop themselves within --rank-silence (+ 2 s), nothing
    of that launch is left on any host, and a new fsdp-super started with
    the same arguments claims the next generation, resumes from the newest
    checkpoint and finishes; the final checkpoint verifies."""
    data, _ = prepare_corpus(tmp)
    steps, silence = 1000, 5  # a few ms a step: seconds of training left at the kill
    with hosts.Cluster(2, tmp) as c:
        ck = os.path.join(tmp, "ck")
        sargs = ["--hosts", c.hostfile(), "--np", "2", "--heartbeat-timeout", "3",
                 "--rank-silence", str(silence), "--max-restarts", "1"]
        first = os.path.join(tmp, "first")
        os.mkdir(first)
        p, ev = start_super(c, first, sargs, train_args(data, ck, steps))
        wait_event(p, first, ev, "a committed checkpoint at step 20",
                   lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 20, 120)
        assert all(ranks_on(w) for w in c.workers), "no rank on a worker"
        t0 = time.monotonic()
        p.kill()
        p.wait()
        killed_at = max(e["step"] for e in events_of(ev) if e["event"] == "checkpoint_committed")
        assert killed_at < steps, "the first launch had finished"
        while any(ranks_on(w) for w in c.workers):
            assert time.monotonic() - t0 < silence + 10, \
                f"ranks still up {time.monotonic() - t0:.1f} s after fsdp-super died"
            time.sleep(0.05)
        took = time.monotonic() - t0
        left = c.wait_no_job_processes()
        assert not left, f"processes of the first launch left: {left}"
        assert took < silence + 2, f"the ranks stopped {took:.2f} s after fsdp-super died"
        gen1 = [e for e in events_of(ev) if e["event"] == "launch"][0]["generation"]
        q, ev2 = start_super(c, tmp, sargs, train_args(data, ck, steps))
        rc = finish(q, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"the new fsdp-super exited {rc}:\n{err[-3000:]}"
        evs = events_of(ev2)
        launch2 = [e for e in evs if e["event"] == "launch"]
        resumed = [e for e in evs if e["event"] == "resumed"]
        assert launch2[0]["generation"] > gen1 and resumed and \
            killed_at <= resumed[0]["step"] < steps, (killed_at, launch2, resumed)
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    print(f"  ranks stopped {took:.2f} s after fsdp-super was killed (--rank-silence {silence}); "
          f"the new fsdp-super (generation {launch2[0]['generation']}) resumed from step "
          f"{resumed[0]['step']} and finished at {steps}, verified")


def a_partitioned_host_is_left_out_and_its_processes_stop(tmp):
    """Worker 2's link goes down with its processes alive (PARTITION_S
    seconds), then comes back. The loss is detected within
    --heartbeat-timeout + 2 s and named; the stranded rank and daemon on
    worker 2 stop by themselves (the rank hears no supervisor for
    --rank-silence, the daemon loses mpirun by the OOB keepalive) while the
    partition lasts; the job relaunches on worker 1 without trying worker 2
    (its probe fails), finishes after the link is back, and the final
    checkpoint holds only objects of the last generation and verifies."""
    data, _ = prepare_corpus(tmp)
    steps, timeout, silence = 600, 3, 5
    partition_s = float(os.environ.get("PARTITION_S", "20"))
    with hosts.Cluster(2, tmp) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2", "--min-np", "1",
                                     "--heartbeat-timeout", str(timeout), "--rank-silence",
                                     str(silence), "--max-restarts", "3"],
                            train_args(data, ck, steps))
        wait_event(p, tmp, ev, "a committed checkpoint at step 20",
                   lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 20, 120)
        assert ranks_on(w2), f"no rank on {w2.name}"
        names = {w2.hostname, w2.addr}
        t0 = time.time()
        w2.link(False)
        try:
            lost = wait_event(p, tmp, ev, f"an event naming {w2.addr}",
                              lambda e: e["event"] in DETECTED and e.get("host") in names
                              and e["t"] >= t0, timeout + 30)
            while w2.job_pids():  # stranded: they must stop on their own
                assert time.time() - t0 < silence + 10, f"left on {w2.name}: {w2.job_pids()}"
                time.sleep(0.05)
            gone = time.time() - t0
            wait_event(p, tmp, ev, "a launch without worker 2",
                       lambda e: e["event"] == "launch" and e["launch"] == 2, 60)
            while time.time() - t0 < partition_s:
                time.sleep(0.1)  # the partition's length, not a wait for an outcome
        finally:
            w2.link(True)
            down = time.time() - t0
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        took = lost["t"] - t0
        assert took < timeout + 2, f"detected after {took:.2f} s: {lost}"
        evs = events_of(ev)
        launches = [e for e in evs if e["event"] == "launch"]
        assert [e["np"] for e in launches] == [2, 1], launches
        assert launches[1]["left_out"] == [w2.addr], launches[1]
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    man = json.loads(run([CKPT, "inspect", f"{ck}@{steps}", "--json"]).stdout)
    last = launches[-1]["generation"]
    tags = {s_["file"].split(".", 1)[1] for s_ in man["shards"]}
    assert man["generation"] == last and all(t.startswith(f"g{last}-") for t in tags), \
        (man["generation"], tags)
    print(f"  partition of {w2.addr}: {lost['event']} after {took:.2f} s (--heartbeat-timeout "
          f"{timeout}); its processes gone after {gone:.2f} s, link down {down:.0f} s; "
          f"relaunched without it; the final step holds only generation {last}'s objects")


def a_host_that_fails_twice_in_a_row_is_set_aside(tmp):
    """Worker 2's rank is killed in two launches in a row (a flaky host):
    the first failure relaunches on both workers at once, the second sets
    worker 2 aside (host_set_aside naming it) and relaunches at once on
    worker 1 alone, which finishes; the final checkpoint verifies. The rank
    on worker 2 holds after step 30 in every launch (HOLD_ON_W2), so no
    launch with it can finish before its kill."""
    data, _ = prepare_corpus(tmp)
    steps = 150
    with hosts.Cluster(2, tmp, login_env=HOLD_ON_W2) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2", "--min-np", "1",
                                     "--heartbeat-timeout", "20", "--max-restarts", "3",
                                     "--restart-backoff", "20"],
                            train_args(data, ck, steps))
        for launch in (1, 2):
            gen = wait_event(p, tmp, ev, f"launch {launch}",
                             lambda e: e["event"] == "launch" and e["launch"] == launch,
                             120)["generation"]
            wait_event(p, tmp, ev, f"launch {launch}'s rank on {w2.name}",
                       lambda e: e["event"] == "rank_up" and e["host"] == w2.hostname
                       and e["generation"] == gen, 120)
            if launch == 1:
                wait_event(p, tmp, ev, "a committed checkpoint at step 20",
                           lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 20,
                           120)
            pids = ranks_on(w2)
            assert len(pids) == 1, f"launch {launch}: ranks on {w2.name}: {pids}"
            os.kill(pids[0], signal.SIGKILL)
            wait_event(p, tmp, ev, f"the restart after launch {launch}",
                       lambda e: e["event"] == "restart" and
                       len([x for x in events_of(ev) if x["event"] == "restart"]) == launch, 120)
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        evs = events_of(ev)
        aside = [e for e in evs if e["event"] == "host_set_aside"]
        assert [e["host"] for e in aside] == [w2.addr], (aside, err[-2000:])
        launches = [e for e in evs if e["event"] == "launch"]
        assert [e["np"] for e in launches] == [2, 2, 1], launches
        assert launches[2]["hosts"] == [w1.addr] and launches[2]["left_out"] == [w2.addr], \
            launches[2]
        restarts = [e for e in evs if e["event"] == "restart"]
        assert [e["backoff_s"] for e in restarts] == [0, 0], restarts
        assert f"host {w2.addr} failed twice in a row: set aside" in err, err[-2000:]
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        left = c.wait_no_job_processes([c.controller, w1, w2])
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    print(f"  worker 2's rank killed in launches 1 and 2: {aside[0]['host']} set aside for "
          f"{aside[0]['for_s']:.0f} s; launch 3 on {launches[2]['hosts']} finished at step "
          f"{steps}, verified")


def a_process_an_earlier_launch_left_on_a_host_is_cleared_before_a_launch(tmp):
    """Something of an earlier launch of this job still runs on worker 2: a
    rank stuck in the kernel when its daemon died, or a process a rank
    started (Open MPI kills a rank whose daemon dies only if the rank can
    still act: a frozen rank gets SIGHUP and SIGCONT from the kernel, one
    in uninterruptible sleep nothing). Here a process of the job's id
    (FSDP_SUPER_JOB, the digest of the checkpoint store's address) stands
    for it. Before launching, the probe through the launch agent finds it
    by that id in its environment, kills it and says so (host_cleaned);
    the launch uses both workers, and nothing is left anywhere."""
    import hashlib
    data, _ = prepare_corpus(tmp)
    steps = 60
    with hosts.Cluster(2, tmp) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        job = hashlib.sha256(b"fsdp-super job\nfile://" + os.path.realpath(tmp).encode() +
                             b"/ck").hexdigest()[:32]
        other = hashlib.sha256(b"another job").hexdigest()[:32]
        left_over = w2.popen(["env", f"FSDP_SUPER_JOB={job}", "sleep", "600"])
        bystander = w2.popen(["env", f"FSDP_SUPER_JOB={other}", "sleep", "600"])
        deadline = time.monotonic() + 10
        while len([pid for pid, comm in w2.job_pids() if comm == "sleep"]) < 2:
            assert time.monotonic() < deadline, w2.job_pids()
            time.sleep(0.02)
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2",
                                     "--heartbeat-timeout", "5", "--max-restarts", "0"],
                            train_args(data, ck, steps))
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        left_over.wait(timeout=10)
        assert bystander.poll() is None, "another job's process was killed"
        bystander.kill()
        bystander.wait()
        evs = events_of(ev)
        cleaned = [e for e in evs if e["event"] == "host_cleaned"]
        assert [(e["host"], e["killed"]) for e in cleaned] == [(w2.addr, 1)], cleaned
        order = [e["event"] for e in evs if e["event"] in ("host_cleaned", "launch")]
        assert order == ["host_cleaned", "launch"], order
        launches = [e for e in evs if e["event"] == "launch"]
        assert launches[0]["hosts"] == [w1.addr, w2.addr], launches
        assert f"host {w2.addr}: killed 1 process of an earlier launch" in err, err[-1500:]
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    run([CKPT, "verify", ck])
    print(f"  the probe killed the left-over process on {w2.name} before the launch "
          f"(another job's process untouched); trained on both workers, verified")


NOTICE_SERVER = r"""
import http.server, os, sys
addr, port, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Notice(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # /spot/HOST: a notice for the host named in the flag file
        host = self.path.rsplit("/", 1)[-1]
        up = os.path.exists(flag) and open(flag).read().strip() == host
        body = b'{"action": "terminate", "time": "2026-12-04T12:00:00Z"}' if up else b""
        self.send_response(200 if up else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((addr, port), Notice).serve_forever()
"""


def a_spot_notice_for_one_host_moves_the_job_off_it(tmp):
    """--preempt-url with {host}: each host of the launch has its own spot
    notice (AWS gives one per instance), served here by an HTTP server on
    the controller. When worker 2's notice appears, fsdp-super asks for an
    emergency checkpoint and relaunches on worker 1 alone, leaving worker 2
    out while its notice stands (no step lost); the job finishes and
    verifies."""
    data, _ = prepare_corpus(tmp)
    steps = 150
    with hosts.Cluster(2, tmp, login_env=HOLD_ON_W2) as c:  # as the host-file test
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        flag = os.path.join(tmp, "noticed-host")
        server = c.controller.popen([sys.executable, "-c", NOTICE_SERVER, c.controller.addr,
                                     "8780", flag])
        try:
            url = f"http://{c.controller.addr}:8780/spot/{{host}}"
            p, ev = start_super(c, tmp, ["--hosts", c.hostfile(), "--np", "2", "--min-np", "1",
                                         "--heartbeat-timeout", "20", "--max-restarts", "0",
                                         "--preempt-url", url, "--preempt-poll", "0.2"],
                                train_args(data, ck, steps))
            wait_event(p, tmp, ev, "a committed checkpoint at step 20",
                       lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 20, 120)
            with open(flag + ".new", "w") as f:
                f.write(w2.addr)
            os.rename(flag + ".new", flag)
            notice = wait_event(p, tmp, ev, "the notice for worker 2",
                                lambda e: e["event"] == "preemption_notice", 30)
            rc = finish(p, tmp, 600)
        finally:
            server.kill()
            server.wait()
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        evs = events_of(ev)
        assert notice.get("host") == w2.addr, notice
        restarts = [e for e in evs if e["event"] == "restart"]
        launches = [e for e in evs if e["event"] == "launch"]
        emergency = [e for e in evs if e["event"] == "emergency_checkpoint"]
        resumed = [e for e in evs if e["event"] == "resumed"]
        assert [e["cause"] for e in restarts] == ["host-notice"], restarts
        assert [(e["np"], e["hosts"], e["left_out"]) for e in launches] == \
            [(2, [w1.addr, w2.addr], []), (1, [w1.addr], [w2.addr])], launches
        assert len(emergency) == 1 and resumed[-1]["step"] == emergency[0]["step"], \
            (emergency, resumed)
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        assert "steps lost      0" in err, err[-1500:]
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    print(f"  notice for {notice['host']}: emergency checkpoint at step {emergency[0]['step']}; "
          f"relaunched on {launches[1]['hosts']} ({launches[1]['left_out']} left out); "
          f"finished at step {steps}, verified")


def state_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def a_frozen_stale_rank_thawed_after_healing_is_fenced(tmp):
    """Worker 2 holds rank 0. It passes its fence check for the checkpoint
    of step 20 and freezes there (the test hook, set in worker 2's login
    environment only, so the next launch on worker 1 does not stop); then the
    whole host is paused (every process stopped, its Open MPI daemon too,
    so nothing on it can act) and cut off. fsdp-super detects the loss,
    relaunches on worker 1 (a new generation, resuming from step 10) and
    the new launch commits. Then the link comes back and the frozen rank
    alone is thawed: its commit of step 20 must not count. It says
    "fenced" on its stderr and exits at once (status 4) instead of
    committing or hanging in a collective with ranks that are gone; the
    rest of the host, thawed, stops too; the job finishes and its final
    step holds only the last generation's objects."""
    data, _ = prepare_corpus(tmp)
    steps, timeout = 400, 3
    with hosts.Cluster(2, tmp, login_env={"w2": {"FSDP_TEST_STOP_AT": "fence-checked:2"}}) as c:
        w1, w2 = c.workers
        ck = os.path.join(tmp, "ck")
        p, ev = start_super(c, tmp, ["--hosts", c.hostfile(hosts=[w2, w1]), "--np", "2",
                                     "--min-np", "1", "--heartbeat-timeout", str(timeout),
                                     "--rank-silence", "30", "--max-restarts", "3"],
                            train_args(data, ck, steps))
        deadline = time.monotonic() + 120
        while True:  # the event: rank 0 stopped itself past its fence check
            stale = ranks_on(w2)
            if stale and state_of(stale[0]) == "T":
                break
            assert p.poll() is None and time.monotonic() < deadline, \
                f"rank 0 on {w2.name} did not stop at its fence check:\n{output(tmp)[1][-2000:]}"
            time.sleep(0.05)
        stale = stale[0]
        w2.signal_all(signal.SIGSTOP)
        w2.link(False)
        try:
            wait_event(p, tmp, ev, "a launch without worker 2",
                       lambda e: e["event"] == "launch" and e["launch"] == 2, 60)
            wait_event(p, tmp, ev, "a commit of the new launch",
                       lambda e: e["event"] == "checkpoint_committed" and
                       e.get("generation", 0) > 1, 120)
        finally:
            w2.link(True)
        # the stale rank's stderr is a pipe to its frozen daemon: read it
        # from here, then thaw the rank alone
        assert os.readlink(f"/proc/{stale}/fd/2").startswith("pipe:"), \
            os.readlink(f"/proc/{stale}/fd/2")
        fd = os.open(f"/proc/{stale}/fd/2", os.O_RDONLY | os.O_NONBLOCK)
        said = b""
        try:
            os.kill(stale, signal.SIGCONT)
            deadline = time.monotonic() + 60
            while state_of(stale) not in ("gone", "Z", "X"):
                assert time.monotonic() < deadline, \
                    f"the thawed stale rank is still running ({state_of(stale)}): {said!r}"
                try:
                    said += os.read(fd, 65536)
                except BlockingIOError:
                    time.sleep(0.02)
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                said += chunk
        finally:
            os.close(fd)
        said = said.decode(errors="replace")
        fenced = [l for l in said.splitlines() if "fenced" in l]
        assert fenced and "step 20" in fenced[0], f"the stale rank said: {said!r}"
        w2.signal_all(signal.SIGCONT)
        left = c.wait_no_job_processes([w2], limit=30)
        assert not left, f"processes of the stale launch left on {w2.name}: {left}"
        rc = finish(p, tmp, 600)
        out, err = output(tmp)
        assert rc == 0, f"fsdp-super exited {rc}:\n{err[-3000:]}"
        evs = events_of(ev)
        launches = [e for e in evs if e["event"] == "launch"]
        assert [e["np"] for e in launches] == [2, 1], launches
        assert [e["step"] for e in evs if e["event"] == "finished"] == [steps]
        left = c.wait_no_job_processes()
        assert not left, f"processes of the job left: {left}"
    assert committed_steps(ck)[-1] == steps
    run([CKPT, "verify", ck])
    last = launches[-1]["generation"]
    for step in committed_steps(ck):
        man = json.loads(run([CKPT, "inspect", f"{ck}@{step}", "--json"]).stdout)
        assert man["generation"] == last, (step, man["generation"], last)
    print(f"  the stale rank of generation {launches[0]['generation']}, thawed after the new "
          f"launch committed, said: {fenced[0].strip()[:160]}")


if __name__ == "__main__":
    why = hosts.unsupported()
    if why:
        print(f"skip: {why}")
        sys.exit(77)  # meson: skipped
    main([two_hosts_under_the_supervisor_beat_and_match_one_host,
          a_users_open_mpi_env_list_reaches_the_remote_ranks,
          a_killed_host_is_detected_and_the_job_finishes_without_it,
          a_powered_off_host_is_detected_and_the_job_finishes_without_it,
          a_host_removed_from_the_host_file_gets_a_planned_restart,
          a_spot_notice_for_one_host_moves_the_job_off_it,
          a_host_that_fails_twice_in_a_row_is_set_aside,
          a_process_an_earlier_launch_left_on_a_host_is_cleared_before_a_launch,
          a_new_supervisor_takes_over_from_a_killed_one,
          a_partitioned_host_is_left_out_and_its_processes_stop,
          a_frozen_stale_rank_thawed_after_healing_is_fenced])
