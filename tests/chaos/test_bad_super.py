"""fsdp-super against hostile surroundings while it supervises: a host file
that a FIFO is renamed over mid-run never blocks the supervisor (it says so
once, keeps the last good host list, and still notices a dead rank and
relaunches).

The one-line refusals at start (a FIFO, a directory or a device as the host
file, host names the launch agent would take for options or that hold
control or shell characters) are in tests/integration/test_bad_inputs.py.
Runs are started as tests/chaos/test_super.py starts them; every wait is
for an event of the run or a reply on a socket, never for a guessed time."""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import main, prepare_corpus  # noqa: E402
from test_super import (events_of, finish, session_pids, start_super, trainer,  # noqa: E402
                        wait_event, wait_ranks)


def kill_everything(p, evs):
    """After a failed test: the supervisor and every launch's session."""
    if p.poll() is None:
        p.kill()
        p.communicate()
    for e in evs:
        if e["event"] == "launch":
            for pid in session_pids(e["pid"]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def a_fifo_renamed_over_the_host_file_blocks_nothing(tmp):
    """Once a second the supervisor re-reads the host file during a launch
    (a host that leaves it is a planned restart). A FIFO renamed over it
    used to block that read in open() for good: a rank killed afterwards
    was never noticed. Now the FIFO is refused without being read, said
    once (a hosts_error event naming it), the last good host list is kept,
    and the dead rank is noticed and the job relaunched on that list."""
    data, _ = prepare_corpus(tmp)
    ev, ck, hosts = f"{tmp}/ev.jsonl", f"{tmp}/ck", f"{tmp}/hosts"
    open(hosts, "w").write("localhost 2\n")
    p = start_super(["--np", "2", "--hosts", hosts, "--heartbeat-timeout", "5"],
                    trainer(data, ck, 100000), ev)
    try:
        wait_event(ev, lambda e: e["event"] == "checkpoint_committed")
        first = [e for e in events_of(ev) if e["event"] == "launch"][0]
        ranks = wait_ranks(first["pid"], 2)
        os.mkfifo(f"{tmp}/fifo")
        os.rename(f"{tmp}/fifo", hosts)
        said = wait_event(ev, lambda e: e["event"] == "hosts_error", limit=30)
        assert hosts in said["error"] and "FIFO" in said["error"], said
        assert said.get("kept") == ["localhost"], said
        os.kill(ranks[1], signal.SIGKILL)
        died = wait_event(ev, lambda e: e["event"] in ("rank_died", "exit"), limit=60)
        second = wait_event(ev, lambda e: e["event"] == "launch" and e["launch"] == 2)
        assert second["np"] == 2 and second["hosts"] == ["localhost"], second
        after = wait_event(ev, lambda e: e["event"] == "checkpoint_committed" and
                           e["t"] > second["t"])
        p.send_signal(signal.SIGTERM)
        out, err = finish(p)
    except BaseException:
        kill_everything(p, events_of(ev))
        raise
    assert p.returncode == 0, err[-2000:]
    told = [e for e in events_of(ev) if e["event"] == "hosts_error"]
    assert len(told) == 1, told
    lines = [l for l in err.splitlines() if hosts in l]
    assert len(lines) == 1 and "FIFO" in lines[0] and "last good" in lines[0], lines
    assert os.path.exists(hosts) and not os.path.isfile(hosts), "the FIFO was replaced"
    print(f"  FIFO over the host file: said once ({lines[0][:110]}); a killed rank noticed as "
          f"{died['event']}, relaunched on {second['hosts']}, committed step {after['step']}")


if __name__ == "__main__":
    main([a_fifo_renamed_over_the_host_file_blocks_nothing])
