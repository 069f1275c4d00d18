"""fsdp-super end to end, with real ranks, real signals and a real spot
notice server on 127.0.0.1: hangs are detected within the heartbeat timeout
and no process of a torn-down job survives; a preemption notice costs at
most the step in progress; a rank of an older generation cannot commit;
chaos runs (kills, stops, preemptions, storage faults, kills during a
commit, host file changes) finish with the fault-free digest, or - when the
world size changes - with every reshard verified and the sample stream
intact, and every planned fault lands with its effect (the restart it must
cause). Faults are placed on training steps, not seconds, so the chaos runs
do not depend on the machine's speed; CHAOS_SEED picks the seed. Timing
bounds here are generous on purpose: precise timing belongs in benchmarks.

The supervisor's refusals are here too: a host file that is missing,
malformed or offers no capacity, a store where no generation can be
claimed, hostile bytes from the network, and Open MPI's explanation of a
failed launch when there is no event log.

And the network side of supervision (src/hbmsg.h, recovery/ranks.c,
recovery/net.c): datagrams without the launch's token (forged, replayed)
are dropped and counted and cannot blind the supervisor to a rank; the
token appears in no output, event or command line; the supervisor listens
on IPv6; ranks that lose the supervisor stop themselves; ranks on "another
host" (their own UTS and PID namespaces, so their pids name unrelated
processes here) are judged by silence and ordered through the answers,
never kill(); and in network namespaces of the test's own, the ranks are
given the address that routes to the first remote host."""

import glob
import hashlib
import hmac
import http.server
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

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


# What each fault must cause: the cause of the restart that ends its launch
# (for storage and commit: of the launch they arm). hosts: see below.
EFFECT = {"kill": ("rank-died", "exit"), "stop": ("heartbeat-lost",),
          "preempt": ("preemption",), "storage": ("rank-died", "exit"), "commit": ("chaos-restart",)}


def plan_text(plan):
    return ", ".join(f"{f['kind']}@{f['step']}" for f in plan)


def chaos_seed(default):
    return int(os.environ.get("CHAOS_SEED", default))


def assert_every_fault_landed(evs, steps):
    """Every planned fault fired at or after its step and caused what it
    must, as the restart events (read on their own) confirm."""
    plans = [e for e in evs if e["event"] == "chaos_plan"]
    assert plans, "no chaos plan in the event log"
    plan = plans[0]["faults"]
    at = [f["step"] for f in plan]
    assert at == sorted(set(at)), f"fault steps do not strictly increase: {at}"
    assert all(steps * 0.05 <= a <= steps * 0.9 for a in at), at
    fired, landed, restart = {}, {}, None
    for e in evs:
        if e["event"] == "restart":
            restart = e
        elif e["event"] == "chaos":
            fired[e["fault"]] = e
        elif e["event"] == "chaos_landed":
            landed[e["fault"]] = (e, restart)
    for i, f in enumerate(plan):
        what = f"fault {i} ({f['kind']} at step {f['step']})"
        assert i in fired, f"{what} never fired"
        assert fired[i]["kind"] == f["kind"] and fired[i]["at_step"] >= f["step"], fired[i]
        assert i in landed, f"{what} fired but its effect was never seen"
        e, r = landed[i]
        if f["kind"] == "hosts":
            shrink = fired[i]["to"] < fired[i]["from"]
            want = ("rank-died", "exit") if shrink else ("preemption",)
            assert e["np"] == fired[i]["to"], f"{what}: relaunched on {e['np']} ranks, " \
                f"not {fired[i]['to']}"
        else:
            want = EFFECT[f["kind"]]
        assert e["cause"] in want and e["ok"], f"{what} caused {e['cause']}, not {want}: {e}"
        assert r and r["cause"] == e["cause"], f"{what}: the restart says {r}"
        if f["kind"] == "storage":
            assert "injected" in e.get("error", ""), e
    summary = [e for e in evs if e["event"] == "chaos_summary"]
    assert summary and summary[-1]["landed_ok"] == len(plan), summary
    return plan


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


def alive(pid):
    """pid is a process that has not ended (a zombie has)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


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
    steps = int(os.environ.get("HUNG_STEPS", "1000"))  # the ThreadSanitizer run trains fewer
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
    assert lost["pid"] == victim and detected <= timeout + 15, lost
    wait_event(ev, lambda e: e["event"] == "teardown" and e["generation"] == first["generation"])
    assert session_pids(sid) == [], f"left behind: {session_pids(sid)}"
    assert not os.path.exists(f"/proc/{victim}"), "the stopped rank survived"
    # the mpirun of a launch is killed too: the next launch is torn down on exit as well
    second = wait_event(ev, lambda e: e["event"] == "launch" and e["launch"] == 2)
    wait_event(ev, lambda e: e["event"] == "resumed" and e["t"] > second["t"])
    os.kill(wait_ranks(second["pid"], 2)[0], signal.SIGKILL)
    # the supervisor or mpirun may notice first: a dead rank or mpirun's exit
    wait_event(ev, lambda e: e["event"] in ("rank_died", "exit"))
    wait_event(ev, lambda e: e["event"] == "teardown" and e["generation"] == second["generation"])
    assert session_pids(second["pid"]) == []
    out, err = finish(p)
    assert p.returncode == 0, err[-2000:]
    assert ("restarts        2 (rank-died 1, heartbeat-lost 1)" in err or
            "restarts        2 (exit 1, heartbeat-lost 1)" in err), err[-1500:]
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
    assert not [r for r in ranks if alive(r)], "orphaned ranks linger"
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
    deadline = time.gmtime(time.time() + 30)
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
    assert took < 30, "the emergency checkpoint missed the notice's 30 s deadline"
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


def a_supervisor_whose_store_another_launcher_took_stops(tmp):
    """While fsdp-super trains, another launcher claims the store (here an
    unsupervised fsdp-train on it, which claims generation 2 at start).
    The supervised rank 0 is fenced at its next commit: it says so and
    exits at once (status 4). Before, fsdp-super relaunched and claimed the
    store back, fencing the other launcher in turn (two launchers taking a
    store from each other until one ran out of restarts); now it sees that
    the store is another's and stops, saying so."""
    data, _ = prepare_corpus(tmp)
    ck, ev = f"{tmp}/ck", f"{tmp}/ev.jsonl"
    p = start_super(["--np", "1", "--max-restarts", "3"], trainer(data, ck, 100000), ev)
    try:
        wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
        other = run(trainer(data, ck, 1, ["--resume", "none"]), check=False)
        assert other.returncode != 0, "the second run trained beside the first"
        out, err = finish(p, 120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    evs = events_of(ev)
    assert p.returncode == 1 and "claimed by another launcher" in err, err[-2000:]
    assert len([e for e in evs if e["event"] == "launch"]) == 1, "it launched again"
    fenced = [e for e in evs if e["event"] == "fenced"]
    assert fenced and fenced[0]["by"] == 2, fenced
    said = [l for l in err.splitlines() if l.startswith("fsdp-train: fenced")]
    assert said, f"the rank did not say fenced:\n{err[-2000:]}"
    print(f"  rank 0: {said[0][:140]}")
    print(f"  fsdp-super: {[l for l in err.splitlines() if 'another launcher' in l][0][:140]}")


def chaos_at_a_fixed_world_size_keeps_the_digest(tmp):
    data, _ = prepare_corpus(tmp)
    steps = int(os.environ.get("CHAOS_STEPS", "1200"))
    ref = f"{tmp}/ref"
    mpirun(2, trainer(data, ref, steps))
    ev = f"{tmp}/ev.jsonl"
    spec = os.environ.get("CHAOS_SPEC", f"seed={chaos_seed(5)},kill=1,stop=1,preempt=1,"
                          "storage=1,commit=1")
    p = start_super(["--np", "2", "--heartbeat-timeout", "3", "--max-restarts", "1000",
                     "--healthy-after", "1",
                     "--chaos", spec], trainer(data, f"{tmp}/ck", steps), ev)
    out, err = finish(p, limit=3000)
    assert p.returncode == 0, err[-3000:]
    evs = events_of(ev)
    plan = assert_every_fault_landed(evs, steps)
    kinds = [f["kind"] for f in plan]
    print(f"  {spec}: {len(plan)} faults landed as planned ({plan_text(plan)}); the last "
          f"{last_fault_s(evs):.1f} s after the start")
    print("  " + "\n  ".join(l for l in err.splitlines()[-9:]))
    assert digest(f"{tmp}/ck") == digest(ref), "the chaos run's final state differs"
    want = dict(x.split("=") for x in spec.split(",") if x.split("=")[0] in EFFECT)
    for k, n in want.items():
        assert kinds.count(k) == int(n), f"{k}: {kinds.count(k)} of {n} planned"


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
                     os.environ.get("CHAOS_HOSTS_SPEC", f"seed={chaos_seed(2)},hosts=3,kill=1")],
                    trainer(data, f"{tmp}/ck", steps,
                            ["--log", log, "--log-samples", "on", "--verify-load", "on"]), ev)
    out, err = finish(p, limit=3000)
    assert p.returncode == 0, err[-3000:]
    evs = events_of(ev)
    plan = assert_every_fault_landed(evs, steps)
    print(f"  {len(plan)} faults landed as planned ({plan_text(plan)}); "
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


# ---- refusals and hostile input ------------------------------------------------------

def run_super(args, targs, env=None, limit=120):
    """fsdp-super to the end; returns (returncode, stderr, seconds)."""
    t0 = time.monotonic()
    p = subprocess.run([SUPER] + args + ["--"] + targs, env=dict(ENV, **(env or {})),
                       capture_output=True, text=True, errors="replace", timeout=limit)
    return p.returncode, p.stderr, time.monotonic() - t0


def one_line(err):
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, f"want one line, got:\n{err}"
    return lines[0]


def a_bad_host_file_is_refused_at_once_with_its_line(tmp):
    data, _ = prepare_corpus(tmp)
    targs = trainer(data, f"{tmp}/ck", 10)
    cases = {
        "missing": (None, "cannot read the host file"),
        "junk slots": ("localhost 2\nnode1 two\n", ":2: slots must be a whole number"),
        "int overflow": ("a 2147483647\nb 2147483647\n", ":1: slots must be a whole number"),
        "above the bound": ("a 4097\n", ":1: slots must be"),
        "negative": ("a -1\n", ":1: slots must be"),
        "three fields": ("localhost 2 3\n", ":1: expected"),
        "bad name": ("local;host 2\n", ":1: a host name is"),
        "NUL byte": ("localhost 2\nx\0y 1\n", ":2: a NUL byte"),
        "too many hosts": ("".join(f"h{i} 1\n" for i in range(65)), ":65: more than 64 hosts"),
    }
    for name, (text, want) in cases.items():
        hosts = f"{tmp}/hosts-{name.replace(' ', '-')}"
        if text is not None:
            open(hosts, "w").write(text)
        rc, err, took = run_super(["--hosts", hosts, "--capacity-timeout", "600"], targs)
        line = one_line(err)
        assert rc == 1 and hosts in line and want in line, f"{name}: rc {rc}: {line}"
        assert took < 30, f"{name}: took {took:.0f} s"
    print(f"  {len(cases)} bad host files refused at once, each naming its file and line")


def no_capacity_ends_after_the_capacity_timeout(tmp):
    data, _ = prepare_corpus(tmp)
    hosts = f"{tmp}/hosts"
    open(hosts, "w").write("localhost 0  # nothing yet\n")
    rc, err, took = run_super(["--hosts", hosts, "--capacity-timeout", "1"],
                              trainer(data, f"{tmp}/ck", 10))
    assert rc == 1 and "no capacity" in err and "--capacity-timeout" in err, err
    assert "launch 1:" not in err, err
    print(f"  0 slots: gave up after {took:.1f} s (--capacity-timeout 1)")


def a_store_without_a_claimable_generation_is_not_launched_on(tmp):
    data, _ = prepare_corpus(tmp)
    open(f"{tmp}/file", "w").write("not a directory\n")
    junk = f"{tmp}/junk"
    os.makedirs(f"{junk}/generations")
    open(f"{junk}/generations/99999999999999999999999", "w").write("1\n")
    top = f"{tmp}/top"
    os.makedirs(f"{top}/generations")
    open(f"{top}/generations/09223372036854775807", "w").write("1\n")  # 2^63 - 1: no next
    for ck in (f"{tmp}/file/ck", junk, top):
        ev = f"{tmp}/ev-{os.path.basename(ck)}.jsonl"
        rc, err, _ = run_super(["--np", "1", "--events", ev], trainer(data, ck, 5))
        line = one_line(err)
        assert rc == 1 and "refusing to launch without fencing" in line and ck in line, line
        assert not [e for e in events_of(ev) if e["event"] == "launch"], "it launched"
        print(f"  {ck[len(tmp) + 1:]}: {line[:150]}")


def a_malformed_generation_stops_the_trainer_at_start(tmp):
    data, _ = prepare_corpus(tmp)
    args = trainer(data, f"{tmp}/ck", 2)
    for bad in ["", "abc", "12abc", "0", "-1", "+5", " 5", "5 ", "0x10", "9223372036854775808",
                "18446744073709551616", "99999999999999999999999"]:
        p = run(args, check=False, env={"FSDP_GENERATION": bad})
        line = one_line(p.stderr)
        assert p.returncode != 0 and "FSDP_GENERATION" in line, f"{bad!r}: {p.stderr}"
    assert not os.path.exists(f"{tmp}/ck/step-00000002"), "a refused trainer trained"
    p = run(args, env={"FSDP_GENERATION": "9223372036854775807"})  # the largest is fine
    print(f"  12 malformed generations refused; 2^63-1 accepted")


def a_run_stopped_by_its_time_limit_ends_the_supervisor_without_a_relaunch(tmp):
    """SLURM_JOB_END_TIME already past: the ranks stop after their first
    step with a checkpoint; fsdp-super ends with 0 and relaunches nothing;
    run again without the limit it finishes from that checkpoint."""
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    gone = {"SLURM_JOB_END_TIME": str(int(time.time()) - 1)}
    rc, err, _ = run_super(["--np", "2"], trainer(data, ck, 12), env=gone)
    assert rc == 0 and "summary (stopped)" in err and "stopped at step 1" in err, err
    assert "launch 2" not in err and committed_steps(ck) == [1], err
    rc, err, _ = run_super(["--np", "2"], trainer(data, ck, 12))
    assert rc == 0 and "training finished at step 12" in err, err


def a_refused_resume_is_not_relaunched(tmp):
    """A resume the trainer refuses (another --seed than the checkpoint's)
    fails the same way on every launch: fsdp-super relaunches nothing, says
    why, exits 2 as fsdp-train does, and its summary and events say
    refused; it accounts the run from the step it resumed at, not from 0."""
    data, _ = prepare_corpus(tmp)
    ck, ev = f"{tmp}/ck", f"{tmp}/ev.jsonl"
    mpirun(2, trainer(data, ck, 200))
    rc, err, _ = run_super(["--np", "2", "--events", ev, "--restart-backoff", "5"],
                           trainer(data, ck, 260, ["--seed", "7"]))
    assert rc == 2, (rc, err)
    assert "was trained with --seed 1337, this run has --seed 7" in err, err
    assert "a relaunch would be refused again" in err and "launch 2" not in err, err
    assert "summary (refused)" in err, err
    evs = events_of(ev)
    assert [e for e in evs if e["event"] == "give_up"][0]["why"] == "refused", evs
    assert not [e for e in evs if e["event"] == "restart"], evs
    # the same store goes on under the supervisor from step 200: its goodput
    # counts its own 60 steps (the summary's productive time over the steps'
    # mean time, read from the log), not the 260 of the history
    log = f"{tmp}/log.jsonl"
    rc, err, _ = run_super(["--np", "2", "--events", f"{tmp}/ev2.jsonl"],
                           trainer(data, ck, 260, ["--log", log, "--allow-changed", "lr"]))
    assert rc == 0 and "training finished at step 260" in err, err
    summary = [e for e in events_of(f"{tmp}/ev2.jsonl") if e["event"] == "summary"][0]
    ms = [r["ms"] for r in read_log(log)]
    credited = summary["goodput"] * summary["wall_s"] / (sum(ms) / len(ms) / 1000)
    print(f"  goodput {summary['goodput']:.3f}: {credited:.0f} steps' time of 60")
    assert len(ms) == 60 and 20 < credited < 150, (credited, summary, ms)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prom_query(port, query):
    """The value of a Prometheus instant query, or None while there is none."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            res = json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return None
    return float(res[0]["value"][1]) if res else None


def prom_wait(port, query, pred, limit=90):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        v = prom_query(port, query)
        if v is not None and pred(v):
            return v
        time.sleep(0.2)
    raise AssertionError(f"Prometheus never answered {query} as wanted (last: "
                         f"{prom_query(port, query)})")


DASHBOARD = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "grafana", "fsdp.json")


def dashboard_metrics():
    """The fsdp_* series every panel's PromQL names."""
    with open(DASHBOARD) as f:
        board = json.load(f)
    names = set()
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            names |= set(re.findall(r"\bfsdp_[a-z_]+", t["expr"]))
    return names


def a_real_prometheus_scrapes_restarts_and_the_last_checkpoint(tmp):
    """fsdp-super --metrics during a supervised run with one rank killed,
    scraped every second by Debian's Prometheus on 127.0.0.1: its HTTP API
    returns the restart, the newest committed step, the loss and the save
    histogram."""
    data, _ = prepare_corpus(tmp)
    for bad in ("127.0.0.1:70000", "127.0.0.1:0", "127.0.0.1", "[::1]:x", "localhost:9464"):
        rc, err, _ = run_super(["--np", "1", "--metrics", bad], trainer(data, f"{tmp}/no", 2))
        assert rc == 2 and "--metrics" in one_line(err), (bad, rc, err)
    assert not os.path.exists(f"{tmp}/no"), "a refused supervisor launched"
    # while it waits for capacity (a host file of 0 slots), it still answers
    open(f"{tmp}/hosts", "w").write("localhost 0\n")
    wport = free_port()
    p = start_super(["--np", "2", "--hosts", f"{tmp}/hosts", "--metrics", f"127.0.0.1:{wport}"],
                    trainer(data, f"{tmp}/wait", 10), f"{tmp}/wait.jsonl")
    try:
        wait_event(f"{tmp}/wait.jsonl", lambda e: e["event"] == "waiting_for_capacity")
        deadline, text = time.monotonic() + 30, ""
        while "fsdp_launches_total 0" not in text and time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{wport}/metrics",
                                              timeout=5).read().decode()
            except OSError:
                pass
            time.sleep(0.1)
        assert "fsdp_launches_total 0" in text and "fsdp_ranks_up 0" in text, text[:500]
    finally:
        p.send_signal(signal.SIGTERM)
        finish(p)
    ev, ck = f"{tmp}/ev.jsonl", f"{tmp}/ck"
    mport, pport = free_port(), free_port()
    open(f"{tmp}/prom.yml", "w").write(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: fsdp, static_configs: [{{targets: ['127.0.0.1:{mport}']}}]}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp}/prom.yml",
                             f"--storage.tsdb.path={tmp}/tsdb",
                             f"--web.listen-address=127.0.0.1:{pport}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    p = start_super(["--np", "2", "--metrics", f"127.0.0.1:{mport}"],
                    trainer(data, ck, 100000, ["--precision", "fp16"]), ev)
    try:
        first = wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
        launch = [e for e in events_of(ev) if e["event"] == "launch"][0]
        os.kill(wait_ranks(launch["pid"], 2)[1], signal.SIGKILL)
        second = wait_event(ev, lambda e: e["event"] == "launch" and e["launch"] == 2)
        after = wait_event(ev, lambda e: e["event"] == "checkpoint_committed" and
                           e["t"] > second["t"])
        restarts = prom_wait(pport, "sum(fsdp_restarts_total)", lambda v: v >= 1)
        step = prom_wait(pport, "fsdp_last_checkpoint_step", lambda v: v >= after["step"])
        saves = prom_wait(pport, "fsdp_checkpoint_save_seconds_count", lambda v: v >= 2)
        loss = prom_wait(pport, "fsdp_loss", lambda v: v > 0)
        up = prom_wait(pport, "fsdp_ranks_up", lambda v: v == 2)
        # fp16: the scale is a power of two at or below the first (65536)
        scale = prom_wait(pport, "fsdp_loss_scale", lambda v: v > 0)
        skipped = prom_wait(pport, "fsdp_skipped_steps", lambda v: v >= 0)
        assert scale <= 65536 and math.log2(scale).is_integer(), scale
        # every metric the Grafana board (tools/grafana/fsdp.json) asks for is served
        served = set()
        for line in urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                           timeout=5).read().decode().splitlines():
            if line and not line.startswith("#"):
                served.add(re.split(r"[{ ]", line, 1)[0])
        wanted = dashboard_metrics()
        assert wanted and wanted <= served, f"the board names {sorted(wanted - served)}"
        print(f"  Prometheus: restarts {restarts:.0f}, last checkpoint step {step:.0f} (events: "
              f"{first['step']} then {after['step']}), {saves:.0f} saves timed, loss "
              f"{loss:.3f}, {up:.0f} ranks up; fp16 loss scale {scale:g}, {skipped:.0f} skipped")
        assert restarts == 1, restarts
        # what the endpoint itself answers to anything else
        base = f"http://127.0.0.1:{mport}"
        for path, code in (("/", 404), ("/metrics/../x", 404)):
            try:
                urllib.request.urlopen(base + path, timeout=5)
                raise AssertionError(f"{path} answered 200")
            except urllib.error.HTTPError as e:
                assert e.code == code, (path, e.code)
    finally:
        p.send_signal(signal.SIGTERM)
        finish(p)
        prom.terminate()
        prom.wait(timeout=30)
    assert p.returncode == 0


REPORT = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "report.py")


def independent_failures_relaunch_at_once_recurring_ones_back_off(tmp):
    """The restart policy (recovery/policy.c). Three ranks killed at three
    steps, the job training between them, with --restart-backoff 20: each
    relaunch is at once (before, 20 + 30 + 30 s of waiting: the backoff
    doubled over faults that had nothing to do with each other). A trainer
    that fails before it trains a step fails again: it backs off 0.2, 0.4 s
    and gives up after --max-restarts 2 of them."""
    data, _ = prepare_corpus(tmp)
    ev = f"{tmp}/ev.jsonl"
    rc, err, took = run_super(["--np", "2", "--restart-backoff", "20", "--grace", "3", "--events",
                               ev, "--chaos", "seed=3,kill=3"],
                              trainer(data, f"{tmp}/ck", 60), limit=300)
    assert rc == 0, err[-2000:]
    restarts = [e for e in events_of(ev) if e["event"] == "restart"]
    assert len(restarts) == 3, restarts
    assert all(e["backoff_s"] == 0 and e["recurring"] is False for e in restarts), restarts
    print(f"  3 independent kills: 3 relaunches at once, {took:.1f} s in all")
    ev2 = f"{tmp}/ev2.jsonl"
    rc, err, took = run_super(["--np", "1", "--restart-backoff", "0.2", "--max-restarts", "2",
                               "--events", ev2],
                              trainer(f"{tmp}/no-such-data", f"{tmp}/ck2", 60), limit=120)
    evs = events_of(ev2)
    restarts = [e for e in evs if e["event"] == "restart"]
    assert rc == 1 and [e["backoff_s"] for e in restarts] == [0.2, 0.4], (rc, restarts)
    assert all(e["recurring"] for e in restarts) and evs[-1]["event"] in ("give_up", "summary")
    assert "giving up after 3 failures in a row that recurred" in err, err[-1500:]
    print(f"  a trainer that cannot start: backoff {[e['backoff_s'] for e in restarts]}, gave up")


def a_killed_rank_heals_from_the_snapshot_in_memory(tmp):
    """--mem-snapshot-every 1 (issue 33): a rank killed at a planned step;
    the relaunch resumes from the snapshot in RAM of the step before
    (the resumed event says memory, and it is newer than the store's
    checkpoint), at most one step is lost, the final state is bit for bit
    the uninterrupted run's (which took no snapshots), and the snapshots'
    directory is gone once the last checkpoint is committed."""
    data, _ = prepare_corpus(tmp)
    steps, snap = 60, f"/dev/shm/fsdp-test-snap-{os.getpid()}"
    ref = f"{tmp}/ref"
    mpirun(2, trainer(data, ref, steps, ["--ckpt-every", "25"]))
    ev = f"{tmp}/ev.jsonl"
    try:
        rc, err, took = run_super(
            ["--np", "2", "--restart-backoff", "0.1", "--events", ev, "--chaos", "seed=1,kill=1"],
            trainer(data, f"{tmp}/ck", steps, ["--ckpt-every", "25", "--mem-snapshot-every", "1",
                                               "--mem-snapshot-dir", snap]), limit=300)
        assert rc == 0, err[-2000:]
        evs = events_of(ev)
        killed = [e for e in evs if e["event"] == "chaos"]
        resumed = [e for e in evs if e["event"] == "resumed"]
        assert len(killed) == 1 and len(resumed) == 2, (killed, resumed)
        assert resumed[0]["memory"] is False and resumed[1]["memory"] is True, resumed
        at = resumed[1]["step"]
        assert 25 < at <= killed[0]["at_step"] and at >= killed[0]["at_step"] - 1, \
            (killed, resumed)
        assert f"resumed from the in-memory snapshot of step {at} in {snap} (no shard read " \
            f"from {tmp}/ck, whose newest checkpoint is step 25)" in err, err[-2000:]
        summary = [e for e in evs if e["event"] == "summary"][0]
        assert summary["steps_lost"] <= 1, summary
        assert not os.path.exists(snap), os.listdir(snap)
    finally:
        shutil.rmtree(snap, ignore_errors=True)
    assert digest(f"{tmp}/ck") == digest(ref), "healing from RAM changed the bits"
    print(f"  killed at step {killed[0]['at_step']}: healed from the snapshot of step {at} "
          f"(the store's newest: 25), {summary['steps_lost']} step lost, "
          f"{summary['downtime_s']:.2f} s down; digest equal to the run without snapshots")


def the_report_plots_a_supervised_run_with_its_restart(tmp):
    """tools/report.py on a real supervised run with one rank killed: a PNG
    and a summary that counts the launch, the restart and the commits;
    garbage lines are skipped and counted, a missing file is one line."""
    data, _ = prepare_corpus(tmp)
    ev, log, png = f"{tmp}/ev.jsonl", f"{tmp}/log.jsonl", f"{tmp}/r.png"
    rc, err, _ = run_super(["--np", "2", "--restart-backoff", "0.1", "--events", ev, "--chaos",
                            "seed=1,kill=1"],
                           trainer(data, f"{tmp}/ck", 60, ["--log", log]), limit=300)
    assert rc == 0, err[-2000:]
    with open(log, "a") as f:  # two lines that are not objects; two that carry no usable step
        f.write("not json\n[1, 2]\n" + '{"step": %s, "loss": 1}\n' % ("9" * 400) +
                '{"step": 5, "generation": {}}\n')
    p = run(["/usr/bin/python3", REPORT, log, "--events", ev, "--out", png])
    print("  " + p.stdout.splitlines()[1])
    commits = len([e for e in events_of(ev) if e["event"] == "checkpoint_committed"])
    assert "2 launches, 1 restarts (" in p.stdout and f"{commits} checkpoint commits" in \
        p.stdout, p.stdout
    assert "last step 60" in p.stdout and "skipped 2 unreadable log lines" in p.stdout, p.stdout
    head = open(png, "rb").read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 20000, head
    p = run(["/usr/bin/python3", REPORT, f"{tmp}/nothing.jsonl"], check=False)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and \
        "nothing.jsonl" in p.stderr, p.stderr


def open_mpi_explains_a_failed_launch_without_an_event_log(tmp):
    rc, err, _ = run_super(["--np", "1", "--max-restarts", "0"],
                           [f"{tmp}/no-such-trainer", "--steps", "5"])
    assert rc == 1 and "Open MPI said" in err and "no-such-trainer" in err, err
    said = err.split("Open MPI said", 1)[1].splitlines()[1:6]
    print("  " + "\n  ".join(said))


def a_users_open_mpi_env_list_does_not_break_the_launch(tmp):
    """OMPI_MCA_mca_base_env_list is Open MPI's own way to carry variables
    to every host, and mpirun refuses it beside -x. Before, every launch
    failed ("does not support mixing these two methods") until fsdp-super
    gave up; now its variables are appended to the user's list, and the
    user's variables arrive too."""
    data, _ = prepare_corpus(tmp)
    log = f"{tmp}/log.jsonl"
    rc, err, _ = run_super(["--np", "2", "--max-restarts", "0"],
                           trainer(data, f"{tmp}/ck", 4, ["--log", log]),
                           env={"OMPI_MCA_mca_base_env_list": "FSDP_DIRECT_IO=0;SITE_VAR",
                                "SITE_VAR": "1"})
    assert rc == 0 and "launches        1" in err, err[-2000:]
    gens = {r.get("generation") for r in read_log(log)}
    assert len(gens) == 1 and None not in gens, gens  # the ranks got FSDP_GENERATION
    print("  one launch with the user's list; the ranks got the supervisor's variables")


def the_work_directory_is_private_and_removed(tmp):
    data, _ = prepare_corpus(tmp)
    tmpdir = f"{tmp}/tmpdir"
    os.makedirs(tmpdir)
    ev = f"{tmp}/ev.jsonl"
    p = subprocess.Popen([SUPER, "--np", "1", "--events", ev, "--"] + trainer(data, f"{tmp}/ck", 400),
                         env=dict(ENV, TMPDIR=tmpdir), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace")
    wait_event(ev, lambda e: e["event"] == "launch")
    # Open MPI's own session directory (ompi.HOST.UID) may be there by now, or not yet
    inside = [d for d in os.listdir(tmpdir) if not d.startswith("ompi.")]
    assert len(inside) == 1 and inside[0].startswith("fsdp-super-"), inside
    assert inside[0] != f"fsdp-super-{p.pid}", "a predictable name"
    assert os.stat(f"{tmpdir}/{inside[0]}").st_mode & 0o077 == 0, "not private"
    out, err = finish(p)
    assert p.returncode == 0, err[-2000:]
    assert os.listdir(tmpdir) == [], os.listdir(tmpdir)


def hostile_network_bytes_cannot_break_the_event_log(tmp):
    import socket
    data, _ = prepare_corpus(tmp)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Notice)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/latest/meta-data/spot/instance-action"
    ev = f"{tmp}/ev.jsonl"
    hostile_time = 'x","evil":1,"y":"\\'
    Notice.body = None
    p = start_super(["--np", "2", "--heartbeat-timeout", "10", "--preempt-url", url,
                     "--preempt-poll", "0.3"], trainer(data, f"{tmp}/ck", 600), ev)
    launch = wait_event(ev, lambda e: e["event"] == "launch")
    port = [e for e in events_of(ev) if e["event"] == "start"][0]["heartbeat_port"]
    wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
    gen = launch["generation"]
    pid = wait_ranks(launch["pid"], 2)[0]
    hostile = [f'fsdp-hb {gen} 0 {pid} 5 tr"ain 7', f"fsdp-hb {gen} 0 {pid} 5 train 7 extra",
               f"fsdp-hb {gen} 0 {pid} 99999999999999999999999 train 7",
               f"fsdp-hb {gen} -1 {pid} 5 train 7", f"fsdp-hb {gen} 0 {pid} 5 train\n 7",
               f'fsdp-ev {gen} 0 load_verified step=1 from=1 to=2 digest=a"b',
               f"fsdp-ev {gen} 0 resumed step=\xff\xfe world=2",
               f"fsdp-ev {gen} 0 checkpoint_committed step=1\0 x", "x" * 4000, ""]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for d in hostile:
        sock.sendto(d.encode("latin-1"), ("127.0.0.1", port))
    Notice.body = {"action": "terminate", "time": hostile_time}
    notice = wait_event(ev, lambda e: e["event"] == "preemption_notice" and e["source"] == "url")
    wait_event(ev, lambda e: e["event"] == "restart")
    Notice.body = None
    out, err = finish(p)
    srv.shutdown()
    assert p.returncode == 0, err[-2000:]
    lines = open(ev).read().splitlines()
    for l in lines:
        json.loads(l)  # every line is one JSON object
    assert notice["time"] == hostile_time and "evil" not in notice, notice
    summary = [e for e in events_of(ev) if e["event"] == "summary"][-1]
    # none of them carries the launch's MAC ("" may not arrive)
    assert summary["unauthenticated_datagrams"] >= len(hostile) - 1, summary
    print(f"  {len(lines)} event lines, all JSON; {summary['unauthenticated_datagrams']} datagrams "
          "dropped; the notice's time kept as text")


# ---- the network: tokens, addresses, identity ------------------------------------------

def launch_env(pid):
    """The environment of a launch's mpirun (the session leader), as a dict."""
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(kv.decode("latin-1").split("=", 1) for kv in raw if b"=" in kv)


def sealed(token_hex, host, seq, body):
    """A datagram in hbmsg.h's envelope, sealed by this test's own hand."""
    covered = f"{host} {seq} {body}".encode()
    mac = hmac.new(bytes.fromhex(token_hex), covered, hashlib.sha256).hexdigest()
    return b"fsdp1 " + mac.encode() + b" " + covered


def cmdlines():
    out = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            out.append(open(path, "rb").read())
        except OSError:
            pass
    return out


def a_forged_or_replayed_datagram_is_dropped_and_cannot_blind_the_supervisor(tmp):
    data, _ = prepare_corpus(tmp)
    ev = f"{tmp}/ev.jsonl"
    p = start_super(["--np", "2", "--heartbeat-timeout", "2"], trainer(data, f"{tmp}/ck", 3000),
                    ev)
    launch = wait_event(ev, lambda e: e["event"] == "launch")
    port = [e for e in events_of(ev) if e["event"] == "start"][0]["heartbeat_port"]
    wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
    gen, sid = launch["generation"], launch["pid"]
    token = launch_env(sid)["FSDP_SUPER_TOKEN"]
    assert len(token) == 64, "no token in the launch's environment"
    assert not any(token.encode() in c for c in cmdlines()), "the token is on a command line"
    ups = {e["rank"]: e for e in events_of(ev) if e["event"] == "rank_up"}
    assert sorted(ups) == [0, 1] and all(u["local"] and u["host"] for u in ups.values()), ups
    victim = ups[1]["pid"]
    # 'done' for both ranks: bare, sealed with another secret, with a broken MAC, and with
    # the real secret but a SEQ the rank already used (a replay)
    host = ups[1]["host"]
    forged = []
    for r in (0, 1):
        body = f"fsdp-hb {gen} {r} {ups[r]['pid']} 999 done 1"
        forged += [body.encode(), sealed(os.urandom(32).hex(), host, 10**6, body),
                   sealed(token, host, 10**6, body)[:-1] + b"2"]
    replays = [sealed(token, host, 1, f"fsdp-hb {gen} {r} {ups[r]['pid']} 999 done 1")
               for r in (0, 1)]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for d in forged + replays:
        sock.sendto(d, ("127.0.0.1", port))
    time.sleep(0.5)  # a forged 'done' believed would hide the stopped rank from now on
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.time()
    lost = wait_event(ev, lambda e: e["event"] == "heartbeat_lost", limit=30)
    assert lost["pid"] == victim and lost["rank"] == 1 and lost["host"] == host, lost
    assert lost["t"] - stopped_at < 2 + 10, lost
    unauth = wait_event(ev, lambda e: e["event"] == "unauthenticated_datagram")
    assert unauth["from"].startswith("127.0.0.1:"), unauth
    wait_event(ev, lambda e: e["event"] == "teardown")
    p.send_signal(signal.SIGTERM)
    out, err = finish(p, limit=120)
    summary = [e for e in events_of(ev) if e["event"] == "summary"][-1]
    assert summary["unauthenticated_datagrams"] >= len(forged), summary
    assert summary["replayed_datagrams"] >= len(replays), summary
    assert "without the launch's token" in err, err[-1500:]
    for where, text in (("stdout", out), ("stderr", err), ("events", open(ev).read())):
        assert token not in text, f"the token is in fsdp-super's {where}"
    print(f"  {len(forged)} forged and {len(replays)} replayed 'done' datagrams dropped "
          f"({summary['unauthenticated_datagrams']} unauthenticated, "
          f"{summary['replayed_datagrams']} replayed); the stopped rank was still found "
          f"after {lost['t'] - stopped_at:.1f} s; the token is in no output or command line")


def ipv6_loopback_works():
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.bind(("::1", 0))
        s.close()
        return True
    except OSError:
        return False


def the_supervisor_listens_on_ipv6_loopback(tmp):
    if not ipv6_loopback_works():
        print("  skip: no IPv6 loopback on this machine")
        return
    data, _ = prepare_corpus(tmp)
    ev = f"{tmp}/ev.jsonl"
    p = start_super(["--np", "2", "--listen", "[::1]:0"], trainer(data, f"{tmp}/ck", 20), ev)
    out, err = finish(p, limit=300)
    assert p.returncode == 0, err[-2000:]
    evs = events_of(ev)
    launch = [e for e in evs if e["event"] == "launch"][0]
    start = [e for e in evs if e["event"] == "start"][0]
    assert launch["addr"] == f"[::1]:{start['heartbeat_port']}" and start["family"] == "ipv6", \
        (launch, start)
    assert sorted(e["rank"] for e in evs if e["event"] == "rank_up") == [0, 1]
    assert committed_steps(f"{tmp}/ck")[-1] == 20
    print(f"  the ranks beat to {launch['addr']}; training finished")


def alive(pid):
    """Running or stopped, not ended (a zombie waits on a parent that may be
    gone: this machine's init does not always reap at once)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def ranks_stop_themselves_when_the_supervisor_is_killed(tmp):
    data, _ = prepare_corpus(tmp)
    ev = f"{tmp}/ev.jsonl"
    silence = 3.0
    p = start_super(["--np", "2", "--heartbeat-timeout", "1", "--rank-silence", str(silence)],
                    trainer(data, f"{tmp}/ck", 3000), ev)
    launch = wait_event(ev, lambda e: e["event"] == "launch")
    wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
    sid = launch["pid"]
    ranks = wait_ranks(sid, 2)
    assert launch_env(sid)["FSDP_SUPER_SILENCE_S"] == "3.000"
    p.kill()
    killed = time.monotonic()
    gone = {}
    while len(gone) < len(ranks) and time.monotonic() - killed < silence + 10:
        for r in ranks:
            if r not in gone and not alive(r):
                gone[r] = time.monotonic() - killed
        time.sleep(0.05)
    assert len(gone) == len(ranks), f"ranks alive {silence + 10:.0f} s after fsdp-super died"
    while session_pids(sid) and time.monotonic() - killed < silence + 15:
        time.sleep(0.1)
    left = session_pids(sid)
    for pid in left:  # never leave them behind, even when failing
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the job survived: {left}"
    p.communicate()  # (its pipes stay open as long as mpirun and the ranks do)
    took = max(gone.values())
    # within the bound (earlier is fine: the last answer a rank heard came
    # before the kill, and mpirun losing its parent may end it first)
    assert took < silence + 5, f"the ranks stopped {took:.1f} s after (bound {silence})"
    print(f"  fsdp-super SIGKILLed: its ranks stopped after {sorted(round(t, 1) for t in gone.values())} s "
          f"(--rank-silence {silence:g}); nothing of the job is left")


REMOTE_MPIRUN = """#!/bin/sh
# mpirun in UTS and PID namespaces of its own: to fsdp-super its ranks are on
# another host, and their pids name unrelated processes (or none) here.
exec unshare --uts --pid --fork --mount-proc sh -c 'hostname rankhost && exec mpirun "$@"' sh "$@"
"""


def ranks_on_another_host_are_judged_by_silence_and_ordered_by_answers(tmp):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("  skip: needs root and unshare(1) for UTS and PID namespaces")
        return
    data, _ = prepare_corpus(tmp)
    wrapper = f"{tmp}/mpirun-remote"
    open(wrapper, "w").write(REMOTE_MPIRUN)
    os.chmod(wrapper, 0o755)
    steps = 100
    ev = f"{tmp}/ev.jsonl"
    spec = f"seed={chaos_seed(3)},kill=1,stop=1,preempt=1"
    p = start_super(["--np", "2", "--heartbeat-timeout", "3", "--max-restarts", "100",
                     "--healthy-after", "1", "--mpirun", wrapper, "--chaos", spec],
                    trainer(data, f"{tmp}/ck", steps), ev)
    out, err = finish(p, limit=600)
    assert p.returncode == 0, err[-3000:]
    evs = events_of(ev)
    ups = [e for e in evs if e["event"] == "rank_up"]
    assert ups and all(u["host"] == "rankhost" and not u["local"] for u in ups), ups
    landed = [e for e in evs if e["event"] == "chaos_landed"]
    assert len(landed) == 3 and all(e["ok"] for e in landed), landed
    lost = [e for e in evs if e["event"] == "heartbeat_lost"]
    silent = [e for e in lost if "silent_s" in e]  # (a loaded machine may add a stall)
    assert all(e.get("host") == "rankhost" for e in lost), lost
    assert silent and all(e["state"] == "?" and not e["local"] for e in silent), lost
    # /proc was never consulted about them: no death was decided from here
    assert not [e for e in evs if e["event"] == "rank_died" and e.get("source") == "proc"]
    assert committed_steps(f"{tmp}/ck")[-1] == steps
    causes = [e["cause"] for e in landed]
    if "exit" in causes:  # mpirun noticed the killed rank first, and said where it was
        said = [e for e in evs if e["event"] == "rank_died" and e.get("source") == "mpirun"]
        assert said and all(e["host"] == "rankhost" for e in said), said
    print(f"  {spec}: faults landed as {causes}; ranks seen on host rankhost with pids "
          f"{sorted({u['pid'] for u in ups})} (namespace pids)")


FAKE_MPIRUN = """#!/bin/sh
# records what a launch hands to mpirun, then ends at once
{ echo "ADDR=$FSDP_SUPER_ADDR"; echo "TOKEN=$FSDP_SUPER_TOKEN"; echo "ARGV=$*"; } > "$0.out"
"""

# the launch agent (plm_rsh_agent) fsdp-super probes the remote hosts with:
# records each probe and answers for the host, sending nothing
FAKE_AGENT = """#!/bin/sh
echo "$*" >> "$0.out"
"""


def in_netns(ns, *cmd, check=True):
    return subprocess.run(["ip", "netns", "exec", ns] + list(cmd), check=check,
                          capture_output=True, text=True)


def the_ranks_are_given_the_address_that_routes_to_the_first_remote_host(tmp):
    """Two network namespaces of the test's own joined by a veth pair (a
    controller 10.213.7.1 and a worker 10.213.7.2): fsdp-super in the
    controller, with a host file whose first remote host is the worker,
    gives the ranks 10.213.7.1. No packet is sent anywhere (the route is
    looked up with a UDP connect, and mpirun and the launch agent that
    probes the worker are stand-ins)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        print("  skip: needs root and ip(8) for network namespaces")
        return
    tag = f"{os.getpid() % 100000}"
    ctl, wrk = f"fsdpt-ctl-{tag}", f"fsdpt-wrk-{tag}"
    fake = f"{tmp}/mpirun-fake"
    open(fake, "w").write(FAKE_MPIRUN)
    os.chmod(fake, 0o755)
    agent = f"{tmp}/agent-fake"
    open(agent, "w").write(FAKE_AGENT)
    os.chmod(agent, 0o755)
    hosts = f"{tmp}/hosts"
    open(hosts, "w").write("localhost 1\n10.213.7.2 2\n")
    try:
        for ns in (ctl, wrk):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            in_netns(ns, "ip", "link", "set", "lo", "up")
        subprocess.run(["ip", "link", "add", f"v{tag}a", "netns", ctl, "type", "veth", "peer",
                        "name", f"v{tag}b", "netns", wrk], check=True)
        for ns, dev, addr in ((ctl, f"v{tag}a", "10.213.7.1/24"), (wrk, f"v{tag}b", "10.213.7.2/24")):
            in_netns(ns, "ip", "addr", "add", addr, "dev", dev)
            in_netns(ns, "ip", "link", "set", dev, "up")
        for listen in ([], ["--listen", "10.213.7.1:0"]):
            ev = f"{tmp}/ev{len(listen)}.jsonl"
            r = in_netns(ctl, "env", *[f"{k}={v}" for k, v in ENV.items() if k.startswith("OMPI")],
                         f"OMPI_MCA_plm_rsh_agent={agent}", SUPER, "--hosts", hosts, "--np", "3", "--max-restarts", "0", "--events",
                         ev, "--mpirun", fake, *listen, "--", TRAIN, "--steps", "5", check=False)
            got = dict(l.split("=", 1) for l in open(f"{fake}.out").read().splitlines())
            port = [e for e in events_of(ev) if e["event"] == "start"][0]["heartbeat_port"]
            assert got["ADDR"] == f"10.213.7.1:{port}", (listen, got["ADDR"], r.stderr[-500:])
            assert len(got["TOKEN"]) == 64 and got["TOKEN"] not in got["ARGV"], got["ARGV"]
            assert "-x FSDP_SUPER_TOKEN" in got["ARGV"], got["ARGV"]
            assert got["TOKEN"] not in r.stderr + r.stdout + open(ev).read()
            # the worker was probed (and cleared of this job's earlier launches,
            # agent.c) through the agent before the launch; this host was not
            probed = open(f"{agent}.out").read().splitlines()
            assert len(probed) == 1 and probed[0].startswith("10.213.7.2 exec /bin/sh -c '") \
                and "FSDP_SUPER_JOB=" in probed[0], probed
            os.unlink(f"{agent}.out")
            how = [e for e in events_of(ev) if e["event"] == "advertise"][0]["how"]
            print(f"  {' '.join(listen) or 'every interface'}: ranks told {got['ADDR']} ({how})")
    finally:
        for ns in (ctl, wrk):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                          text=True).stdout.split() if n in (ctl, wrk)]


def mpirun_forwards_sigusr1_so_orders_travel_in_answers(tmp):
    """Why preemption is an order in the supervisor's answers and not
    SIGUSR1 to mpirun: Open MPI forwards SIGUSR1 to every rank (on by
    default), and a rank that has not yet installed its handler dies of it."""
    trapped = subprocess.Popen(["mpirun", "-np", "1", "sh", "-c",
                                'trap "echo got USR1; exit 0" USR1; echo ready; '
                                'sleep 20 & wait'],
                               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    bare = subprocess.Popen(["mpirun", "-np", "1", "sh", "-c", "echo ready; exec sleep 20"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for p in (trapped, bare):  # both ranks up (a signal forwarded before that is lost)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        p.send_signal(signal.SIGUSR1)
    out1, _ = trapped.communicate(timeout=60)
    out2, _ = bare.communicate(timeout=60)
    assert "got USR1" in out1, out1
    assert bare.returncode != 0 and "exited on signal 10" in out2, out2
    print("  mpirun forwarded SIGUSR1: a handler caught it, a rank without one died of it")


if __name__ == "__main__":
    main([a_bad_host_file_is_refused_at_once_with_its_line,
          no_capacity_ends_after_the_capacity_timeout,
          a_store_without_a_claimable_generation_is_not_launched_on,
          a_malformed_generation_stops_the_trainer_at_start,
          a_run_stopped_by_its_time_limit_ends_the_supervisor_without_a_relaunch,
          a_refused_resume_is_not_relaunched,
          a_real_prometheus_scrapes_restarts_and_the_last_checkpoint,
          the_report_plots_a_supervised_run_with_its_restart,
          independent_failures_relaunch_at_once_recurring_ones_back_off,
          a_killed_rank_heals_from_the_snapshot_in_memory,
          open_mpi_explains_a_failed_launch_without_an_event_log,
          a_users_open_mpi_env_list_does_not_break_the_launch,
          the_work_directory_is_private_and_removed,
          hostile_network_bytes_cannot_break_the_event_log,
          a_forged_or_replayed_datagram_is_dropped_and_cannot_blind_the_supervisor,
          the_supervisor_listens_on_ipv6_loopback,
          ranks_stop_themselves_when_the_supervisor_is_killed,
          ranks_on_another_host_are_judged_by_silence_and_ordered_by_answers,
          the_ranks_are_given_the_address_that_routes_to_the_first_remote_host,
          mpirun_forwards_sigusr1_so_orders_travel_in_answers,
          older_generation_cannot_commit,
          a_supervisor_whose_store_another_launcher_took_stops,
          hung_rank_is_detected_and_no_process_survives,
          a_dead_mpirun_is_noticed_and_its_ranks_do_not_linger,
          preemption_notice_costs_at_most_the_step_in_progress,
          chaos_at_a_fixed_world_size_keeps_the_digest,
          chaos_with_host_changes_verifies_every_reshard])
