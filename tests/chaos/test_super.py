"""fsdp-super end to end, with real ranks, real signals and a real spot
notice server on 127.0.0.1: hangs are detected within the heartbeat timeout
and no process of a torn-down job survives; a preemption notice costs at
most the step in progress; a rank of an older generation cannot commit;
chaos runs (kills, stops, preemptions, storage faults, kills during a
commit, host file changes) finish with the fault-free digest, or - when the
world size changes - with every reshard verified and the sample stream
intact."""

import glob
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import (BUILD, ENV, TRAIN, committed_steps, digest, main, mpirun,  # noqa: E402
                     prepare_corpus, read_log, run)

SUPER = os.path.join(BUILD, "recovery", "fsdp-super")

# A GPT-2 a tenth of tiny's step time (about 17 ms on 2 ranks here) keeps the
# short runs short; what is tested - detection, teardown, resume, reshard,
# digests - does not depend on the model's size. tools/chaos-long.sh runs tiny.
MODEL = os.environ.get("CHAOS_MODEL", "--layers 2 --dim 64 --heads 2 --seq 64").split()


def trainer(data, ck, steps, extra=()):
    return [TRAIN, "--data", data] + MODEL + ["--global-batch", "12", "--steps",
            str(steps), "--ckpt", ck, "--ckpt-every", "5", "--log-every", "1000"] + list(extra)


def start_super(args, targs, events):
    cmd = [SUPER, "--events", events, "--restart-backoff", "0.1", "--grace", "3"] + args + \
        ["--"] + targs
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")


def events_of(path):
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def last_fault_s(evs):
    """Seconds from the first event to the last injected fault."""
    return max(e["t"] for e in evs if e["event"] == "chaos") - evs[0]["t"]


def wait_event(path, pred, limit=120):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for e in events_of(path):
            if pred(e):
                return e
        time.sleep(0.05)
    raise AssertionError(f"no such event in {path}: {events_of(path)[-5:]}")


def session_pids(sid):
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            f = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[3]) == sid and f[0] != "Z":
            pids.append(int(stat.split("/")[2]))
    return pids


def rank_pids(sid):
    out = []
    for pid in session_pids(sid):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "fsdp-train":
                out.append(pid)
        except OSError:
            pass
    return sorted(out)


def wait_ranks(sid, n, limit=60):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        pids = rank_pids(sid)
        if len(pids) >= n:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"the ranks of session {sid} did not start")


def finish(p, limit=600):
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"fsdp-super did not finish:\n{err[-3000:]}")
    return out, err


def hung_rank_is_detected_and_no_process_survives(tmp):
    data, _ = prepare_corpus(tmp)
    ev = f"{tmp}/ev.jsonl"
    timeout = 3.0
    steps = 1000
    p = start_super(["--np", "2", "--heartbeat-timeout", str(timeout)],
                    trainer(data, f"{tmp}/ck", steps), ev)
    launch = wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
    first = [e for e in events_of(ev) if e["event"] == "launch"][0]
    sid = first["pid"]
    victim = wait_ranks(sid, 2)[1]
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.time()
    lost = wait_event(ev, lambda e: e["event"] == "heartbeat_lost")
    detected = lost["t"] - stopped_at
    print(f"  SIGSTOP of pid {victim}: detected after {detected:.1f} s (timeout {timeout} s)")
    assert lost["pid"] == victim and detected <= timeout + 3, lost
    wait_event(ev, lambda e: e["event"] == "teardown" and e["generation"] == first["generation"])
    assert session_pids(sid) == [], f"left behind: {session_pids(sid)}"
    assert not os.path.exists(f"/proc/{victim}"), "the stopped rank survived"
    # the mpirun of a launch is killed too: the next launch is torn down on exit as well
    second = wait_event(ev, lambda e: e["event"] == "launch" and e["launch"] == 2)
    wait_event(ev, lambda e: e["event"] == "resumed" and e["t"] > second["t"])
    os.kill(wait_ranks(second["pid"], 2)[0], signal.SIGKILL)
    wait_event(ev, lambda e: e["event"] == "rank_died")
    wait_event(ev, lambda e: e["event"] == "teardown" and e["generation"] == second["generation"])
    assert session_pids(second["pid"]) == []
    out, err = finish(p)
    assert p.returncode == 0, err[-2000:]
    assert "restarts        2 (rank-died 1, heartbeat-lost 1)" in err, err[-1500:]
    assert committed_steps(f"{tmp}/ck")[-1] == steps
    del launch


def a_dead_mpirun_is_noticed_and_its_ranks_do_not_linger(tmp):
    data, _ = prepare_corpus(tmp)
    ev = f"{tmp}/ev.jsonl"
    hosts = f"{tmp}/hosts"
    open(hosts, "w").write("localhost 0\n")  # no capacity yet: the supervisor waits
    p = start_super(["--np", "2", "--min-np", "2", "--hosts", hosts, "--heartbeat-timeout", "5"],
                    trainer(data, f"{tmp}/ck", 800), ev)
    wait_event(ev, lambda e: e["event"] == "waiting_for_capacity")
    assert not [e for e in events_of(ev) if e["event"] == "launch"]
    open(hosts, "w").write("localhost 2\n")
    first = wait_event(ev, lambda e: e["event"] == "launch")
    wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
    ranks = wait_ranks(first["pid"], 2)
    os.kill(first["pid"], signal.SIGKILL)  # mpirun itself
    failed = wait_event(ev, lambda e: e["event"] in ("exit", "rank_died"))
    wait_event(ev, lambda e: e["event"] == "teardown")
    assert session_pids(first["pid"]) == [], session_pids(first["pid"])
    assert all(not os.path.exists(f"/proc/{r}") for r in ranks), "orphaned ranks linger"
    out, err = finish(p)
    assert p.returncode == 0, err[-2000:]
    print(f"  mpirun killed: noticed as {failed['event']}; its {len(ranks)} ranks are gone")


class Notice(http.server.BaseHTTPRequestHandler):
    body = None

    def do_GET(self):
        if self.path != "/latest/meta-data/spot/instance-action" or Notice.body is None:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(Notice.body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def preemption_notice_costs_at_most_the_step_in_progress(tmp):
    data, _ = prepare_corpus(tmp)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Notice)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/latest/meta-data/spot/instance-action"
    ev, log = f"{tmp}/ev.jsonl", f"{tmp}/log.jsonl"
    Notice.body = None
    p = start_super(["--np", "2", "--heartbeat-timeout", "10", "--preempt-url", url,
                     "--preempt-poll", "0.5"],
                    trainer(data, f"{tmp}/ck", 800, ["--log", log]), ev)
    wait_event(ev, lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 10)
    deadline = time.gmtime(time.time() + 10)
    Notice.body = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", deadline)}
    posted = time.time()
    emergency = wait_event(ev, lambda e: e["event"] == "emergency_checkpoint")
    took = emergency["t"] - posted
    resumed = wait_event(ev, lambda e: e["event"] == "resumed" and e["step"] > 0)
    # everything the first launch computed was saved: its last logged step is the checkpoint
    lines = read_log(log)
    first_gen = min(s["generation"] for s in lines)
    steps_gen1 = [s["step"] for s in lines if s["generation"] == first_gen]
    print(f"  notice -> emergency checkpoint at step {emergency['step']} in {took:.1f} s; "
          f"last step computed {steps_gen1[-1]}; relaunch resumed at {resumed['step']}")
    assert took < 10, "the emergency checkpoint missed the 10 s deadline"
    assert steps_gen1[-1] == emergency["step"] == resumed["step"], "a step was lost"
    Notice.body = None
    out, err = finish(p)
    assert p.returncode == 0, err[-2000:]
    # SIGTERM to the supervisor: emergency checkpoint, exit 0, resumable
    ev2 = f"{tmp}/ev2.jsonl"
    p = start_super(["--np", "2"], trainer(data, f"{tmp}/ck2", 1000), ev2)
    wait_event(ev2, lambda e: e["event"] == "checkpoint_committed" and e["step"] >= 10)
    p.send_signal(signal.SIGTERM)
    out, err = finish(p)
    em = [e for e in events_of(ev2) if e["event"] == "emergency_checkpoint"]
    assert p.returncode == 0 and em and "preempted" in err, err[-2000:]
    assert committed_steps(f"{tmp}/ck2")[-1] == em[0]["step"]
    srv.shutdown()


def older_generation_cannot_commit(tmp):
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    for n in (1, 2):
        p = start_super(["--np", "1"], trainer(data, ck, 5 * n), f"{tmp}/ev{n}.jsonl")
        out, err = finish(p)
        assert p.returncode == 0, err[-2000:]
    assert sorted(os.listdir(f"{ck}/generations"))[-1].endswith("2")
    zombie = dict(ENV, FSDP_GENERATION="1")
    z = subprocess.run(trainer(data, ck, 15), env=zombie, capture_output=True, text=True)
    assert z.returncode == 1, z.stderr
    assert "fenced: this process belongs to generation 1" in z.stderr, z.stderr
    assert "generation 2" in z.stderr
    assert committed_steps(ck) == [5, 10], committed_steps(ck)


def chaos_at_a_fixed_world_size_keeps_the_digest(tmp):
    data, _ = prepare_corpus(tmp)
    steps = int(os.environ.get("CHAOS_STEPS", "1200"))
    ref = f"{tmp}/ref"
    mpirun(2, trainer(data, ref, steps))
    ev = f"{tmp}/ev.jsonl"
    spec = os.environ.get("CHAOS_SPEC",
                          "seed=5,kill=1,stop=1,preempt=1,storage=1,commit=1,interval=0.5-1.5")
    p = start_super(["--np", "2", "--heartbeat-timeout", "3", "--max-restarts", "1000",
                     "--healthy-after", "1",
                     "--chaos", spec], trainer(data, f"{tmp}/ck", steps), ev)
    out, err = finish(p, limit=3000)
    assert p.returncode == 0, err[-3000:]
    chaos = [e["kind"] for e in events_of(ev) if e["event"] == "chaos" and not e.get("armed")]
    kinds = {k: chaos.count(k) for k in set(chaos)}
    print(f"  faults injected: {kinds}; the last {last_fault_s(events_of(ev)):.1f} s "
          "after the start")
    print("  " + "\n  ".join(l for l in err.splitlines()[-9:]))
    assert digest(f"{tmp}/ck") == digest(ref), "the chaos run's final state differs"
    want = dict(x.split("=") for x in spec.split(",") if x.split("=")[0] in
                ("kill", "stop", "preempt", "storage", "commit"))
    for k, n in want.items():
        assert kinds.get(k, 0) >= int(n), f"{k}: {kinds.get(k, 0)} of {n} injected"


def chaos_with_host_changes_verifies_every_reshard(tmp):
    data, _ = prepare_corpus(tmp)
    steps = int(os.environ.get("CHAOS_HOSTS_STEPS", "800"))
    ref_log = f"{tmp}/ref.jsonl"
    mpirun(1, trainer(data, f"{tmp}/ref", steps, ["--log", ref_log, "--log-samples", "on"]))
    want = {s["step"]: s["samples"] for s in read_log(ref_log)}
    hosts = f"{tmp}/hosts"
    open(hosts, "w").write("localhost 3\n")
    ev, log = f"{tmp}/ev.jsonl", f"{tmp}/log.jsonl"
    p = start_super(["--np", "3", "--min-np", "1", "--hosts", hosts, "--heartbeat-timeout", "3",
                     "--healthy-after", "1",
                     "--max-restarts", "1000", "--chaos",
                     os.environ.get("CHAOS_HOSTS_SPEC", "seed=2,hosts=3,kill=1,interval=1-2")],
                    trainer(data, f"{tmp}/ck", steps,
                            ["--log", log, "--log-samples", "on", "--verify-load", "on"]), ev)
    out, err = finish(p, limit=3000)
    assert p.returncode == 0, err[-3000:]
    evs = events_of(ev)
    chaos = [e["kind"] for e in evs if e["event"] == "chaos" and not e.get("armed")]
    print(f"  faults injected: { {k: chaos.count(k) for k in sorted(set(chaos))} }; "
          f"the last {last_fault_s(evs):.1f} s after the start")
    print("  " + "\n  ".join(l for l in err.splitlines()[-9:]))
    resizes = [e for e in evs if e["event"] == "resize"]
    verified = [e for e in evs if e["event"] == "load_verified"]
    print(f"  {len(resizes)} resizes: {[(e['from'], e['to']) for e in resizes]}; "
          f"{len(verified)} loads verified")
    assert resizes, "the world size never changed"
    reshards = [e for e in verified if e["from"] != e["to"]]
    assert reshards and all(e["digest"] == "equal" for e in verified), verified
    got = {}
    for s in read_log(log):  # steps computed again after a restart must match the first time
        if s["step"] in got:
            assert got[s["step"]] == s["samples"], f"step {s['step']} saw other samples"
        got[s["step"]] = s["samples"]
    assert got == want, "the sample stream has repeats or gaps"


if __name__ == "__main__":
    main([older_generation_cannot_commit,
          hung_rank_is_detected_and_no_process_survives,
          a_dead_mpirun_is_noticed_and_its_ranks_do_not_linger,
          preemption_notice_costs_at_most_the_step_in_progress,
          chaos_at_a_fixed_world_size_keeps_the_digest,
          chaos_with_host_changes_verifies_every_reshard])
