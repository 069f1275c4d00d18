"""Open MPI runs fsdp-train across real test hosts (network namespaces with
their own PID namespace and hostname, see hosts.py): a cluster comes up and
goes away leaving nothing; two ranks on two workers, launched from the
controller through the launch agent, train bit-identically to the same job
on one host; a launch onto a partitioned or dead host fails within the
agent's connect timeout, naming the host; a node loss ends mpirun; a
partition ends mpirun within seconds only with short OOB keepalives (the MCA
parameters printed here are the ones fsdp-super must set). Every test
deletes its hosts and checks that no process is left in them, pass or fail."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402
from harness import CKPT, TRAIN, digest, main, mpirun, prepare_corpus, run  # noqa: E402

MODEL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64", "--global-batch", "4"]

# Partition detection: mpirun's OOB connections to its daemons carry TCP
# keepalives after this much idle time, probe every intvl seconds and give up
# after probes unanswered ones (defaults 300 / 20 / 9: about 8 minutes).
FAST_KEEPALIVE = {
    "OMPI_MCA_oob_tcp_keepalive_time": "1",
    "OMPI_MCA_oob_tcp_keepalive_intvl": "1",
    "OMPI_MCA_oob_tcp_keepalive_probes": "2",
}


def train_args(data, ck, steps, extra=()):
    # --threads 1: each worker sees one local rank and would pick two threads,
    # the one-host job two ranks and one thread each; bit-equality needs the
    # same thread count.
    return [TRAIN, "--data", data] + MODEL + [
        "--steps", str(steps), "--threads", "1", "--ckpt", ck, "--ckpt-every", "10",
        "--log-every", "100000", "--ckpt-chunk-kib", "64"] + list(extra)


def where_ranks_ran(tmp):
    """A wrapper for a rank's command: records `hostname pid` (as the rank's
    own host sees them) in tmp/rank-N, then becomes the rank."""
    return ["/bin/sh", "-c",
            'echo "$(hostname) $$" > "$1/rank-$OMPI_COMM_WORLD_RANK"; shift; exec "$@"',
            "sh", tmp]


def committed(ck):
    return sorted(glob.glob(os.path.join(ck, "step-*", "MANIFEST.json")))


def wait_for(what, cond, limit, poll=0.02):
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit} s waiting for {what}")
        time.sleep(poll)


def wait_exit(p, limit):
    """Seconds until p exits, or None if it is still running after limit."""
    t0 = time.monotonic()
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - t0


def start_long_job(c, tmp, data, ck, env=None):
    """Two ranks, one per worker, on a run far longer than any test; returns
    mpirun once a checkpoint is committed (the job is past startup and into
    steady training)."""
    p = c.mpirun(2, where_ranks_ran(tmp) + train_args(data, ck, 1_000_000), env=env)
    wait_for("the first committed checkpoint",
             lambda: committed(ck) or p.poll() is not None, 120)
    assert p.poll() is None, f"mpirun exited {p.returncode}:\n{p.communicate()[1][-3000:]}"
    return p


def cluster_comes_up_and_goes_away_leaving_nothing(tmp):
    t0 = time.monotonic()
    c = hosts.Cluster(2, tmp)
    try:
        built = time.monotonic() - t0
        names = {h.hostname for h in c.hosts}
        assert len(names) == 3
        for h in c.hosts:
            # own hostname and PID namespace: the shell is a small pid there
            out = h.run(["sh", "-c", "hostname; echo $$"]).stdout.split()
            assert out[0] == h.hostname and int(out[1]) < 1000, out
            addrs = h.run(["ip", "-o", "addr"]).stdout
            assert f"inet {h.addr}/24" in addrs and "inet6" not in addrs, addrs
            routes = h.run(["ip", "route"]).stdout
            assert "default" not in routes, routes
            # through the network, as Open MPI gets there
            p = c.agent(c.controller, h, ["hostname"])
            assert p.returncode == 0 and p.stdout.strip() == h.hostname, p.stderr
        w1, w2 = c.workers
        # worker to worker too (Open MPI's tree spawn does that)
        p = c.agent(w1, w2, ["sh", "-c", "'echo $$; exit 7'"])
        assert p.returncode == 7 and int(p.stdout) < 1000, (p.returncode, p.stdout, p.stderr)
        # an unreachable host fails like ssh: 255, one line, within the connect timeout
        w2.link(False)
        t = time.monotonic()
        p = c.agent(c.controller, w2, ["true"])
        assert p.returncode == 255 and len(p.stderr.strip().splitlines()) == 1, p
        assert time.monotonic() - t < 6, time.monotonic() - t
        w2.link(True)
        c.wait_reachable([w2])
        w2.kill_all(signal.SIGKILL)
        assert not w2.pids()
        p = c.agent(c.controller, w2, ["true"])
        assert p.returncode == 255 and "refused" in p.stderr, p
        w2.start()
        c.wait_reachable([w2])
        # something left running is killed by teardown, which checks that
        c.agent(c.controller, w1, ["sh", "-c", "'sleep 1000 & sleep 1000 &'", ">/dev/null",
                                   "2>&1"], timeout=10)
        assert any(comm == "sleep" for _, comm in w1.job_pids()), w1.pids()
    finally:
        t1 = time.monotonic()
        c.teardown()
    assert not [n for n in os.listdir(hosts.NETNS_DIR) if n.startswith(c.id)]
    print(f"  cluster of 3 hosts up in {built:.1f} s, torn down in "
          f"{time.monotonic() - t1:.2f} s")


def two_hosts_train_bit_identically_to_one_host(tmp):
    data, _ = prepare_corpus(tmp)
    ref = os.path.join(tmp, "ref")
    t = time.monotonic()
    mpirun(2, train_args(data, ref, 20))
    local_s = time.monotonic() - t
    with hosts.Cluster(2, tmp) as c:
        ck = os.path.join(tmp, "ck")
        t = time.monotonic()
        p = c.mpirun(2, where_ranks_ran(tmp) + train_args(data, ck, 20))
        out, err = p.communicate(timeout=300)
        multi_s = time.monotonic() - t
        assert p.returncode == 0, f"mpirun exited {p.returncode}:\n{err[-3000:]}"
        ran = [open(os.path.join(tmp, f"rank-{r}")).read().split() for r in (0, 1)]
        assert [h for h, _ in ran] == [w.hostname for w in c.workers], ran
        assert all(int(pid) < 1000 for _, pid in ran), ran  # pids of the workers' namespaces
        assert not c.wait_no_job_processes(), c.job_processes()
    run([CKPT, "verify", ck])
    want, got = digest(ref), digest(ck)
    assert got == want, "the two-host checkpoint differs from the one-host one"
    print(f"  ranks ran on {ran[0][0]} and {ran[1][0]}; digest equal ({len(got)} entries); "
          f"one host {local_s:.1f} s, two hosts {multi_s:.1f} s")


def launch_onto_an_unreachable_host_fails_fast_and_names_it(tmp):
    with hosts.Cluster(2, tmp) as c:
        w1, w2 = c.workers
        for how in ("partitioned", "dead"):
            if how == "partitioned":
                w2.link(False)
            else:
                w2.link(True)
                w2.kill_all(signal.SIGKILL)
            p = c.mpirun(2, ["sleep", "1000"])
            took = wait_exit(p, 30)
            assert took is not None, f"mpirun onto a {how} host still running after 30 s"
            err = p.communicate()[1]
            assert p.returncode != 0, f"mpirun onto a {how} host exited 0"
            # Open MPI's rsh launcher may warn first that its setpgid of the
            # agent lost a race with the agent's exec (EACCES): not ours
            lines = [l for l in err.strip().splitlines()
                     if not re.search(r"plm:rsh: Warning: setpgid\(.*\) failed in parent", l)]
            first = lines[0] if lines else ""
            assert first.startswith(f"mh-rsh: connect to host {w2.addr} "), err[-2000:]
            left = c.wait_no_job_processes([c.controller, w1], limit=10)
            assert not left, f"processes left after a failed launch: {left}"
            print(f"  {how} host: mpirun exited {p.returncode} after {took:.1f} s; "
                  f"first line: {first}")


def node_loss_ends_mpirun(tmp):
    data, _ = prepare_corpus(tmp)
    with hosts.Cluster(2, tmp) as c:
        ck = os.path.join(tmp, "ck")
        p = start_long_job(c, tmp, data, ck)
        w1, w2 = c.workers
        assert any(comm == "fsdp-train" for _, comm in w2.job_pids()), w2.pids()
        w2.kill_all(signal.SIGKILL)
        took = wait_exit(p, 30)
        assert took is not None, "mpirun did not notice a node loss within 30 s"
        err = p.communicate()[1]
        assert p.returncode != 0, f"mpirun exited 0 after a node loss:\n{err[-2000:]}"
        left = c.wait_no_job_processes([c.controller, w1], limit=10)
        assert not left, f"processes left on the surviving hosts: {left}"
        print(f"  mpirun exited {p.returncode} {took:.2f} s after the node loss; "
              f"the other hosts were clean")


def partition_detection(c, tmp, data, name, env, limit):
    """Cuts w2's link during training; returns (seconds until mpirun exits or
    None, seconds until w2 has no job process left or None)."""
    ck = os.path.join(tmp, f"ck-{name}")
    p = start_long_job(c, tmp, data, ck, env)
    w2 = c.workers[1]
    w2.link(False)
    t0 = time.monotonic()
    took = wait_exit(p, limit)
    stranded = None
    if took is not None:
        if not c.wait_no_job_processes([w2], limit=max(0.0, limit - (time.monotonic() - t0))):
            stranded = time.monotonic() - t0
        p.communicate()
        assert p.returncode != 0, "mpirun exited 0 after a partition"
    print(f"  {name}: mpirun "
          + (f"exited {p.returncode} after {took:.2f} s" if took is not None
             else f"still running after {limit} s")
          + "; the partitioned host's processes "
          + (f"were gone after {stranded:.2f} s" if stranded is not None
             else f"still there: {[comm for _, comm in w2.job_pids()]}"),
          flush=True)
    if took is None:
        p.kill()
        p.wait()
    return took, stranded


def partition_ends_mpirun_within_seconds_with_short_keepalives(tmp):
    data, _ = prepare_corpus(tmp)
    default_window = float(os.environ.get("FSDP_MH_DEFAULT_WINDOW", "15"))
    with hosts.Cluster(2, tmp) as c:
        took, _ = partition_detection(c, tmp, data, "Open MPI defaults", None, default_window)
    with hosts.Cluster(2, tmp) as c:
        params = " ".join(f"{k[9:]}={v}" for k, v in FAST_KEEPALIVE.items())
        fast, stranded = partition_detection(c, tmp, data, params, FAST_KEEPALIVE, 30)
    assert fast is not None and fast < 10, f"mpirun took {fast} s with short keepalives"
    assert stranded is not None and stranded < 15, "the partitioned host kept its processes"


if __name__ == "__main__":
    why = hosts.unsupported()
    if why:
        print(f"skip: {why}")
        sys.exit(77)  # meson: skipped
    main([cluster_comes_up_and_goes_away_leaving_nothing,
          two_hosts_train_bit_identically_to_one_host,
          launch_onto_an_unreachable_host_fails_fast_and_names_it,
          node_loss_ends_mpirun,
          partition_ends_mpirun_within_seconds_with_short_keepalives])
