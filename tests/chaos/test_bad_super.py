"""fsdp-super against hostile surroundings while it supervises: a host file
that a FIFO is renamed over mid-run never blocks the supervisor (it says so
once, keeps the last good host list, and still notices a dead rank and
relaunches), and slow clients of --metrics (slowloris: a request head
dribbled a line at a time, never finished) cannot lock out a real scrape.

The one-line refusals at start (a FIFO, a directory or a device as the host
file, host names the launch agent would take for options or that hold
control or shell characters) are in tests/integration/test_bad_inputs.py.
Runs are started as tests/chaos/test_super.py starts them; every wait is
for an event of the run or a reply on a socket, never for a guessed time."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import BUILD, ENV, main, prepare_corpus  # noqa: E402
from test_super import (events_of, finish, free_port, session_pids, start_super,  # noqa: E402
                        trainer, wait_event, wait_ranks)


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


# --metrics: a slow client sends a partial request head and then one more
# header line every DRIBBLE_S, never the blank line that ends it; a real
# scrape must be served within SCRAPE_S, well inside one dribble.
DRIBBLE_S = 5.0
SCRAPE_S = 1.5


class Slowloris:
    def __init__(self, port):
        self.port, self.socks, self.stop = port, [], threading.Event()
        self.thread = threading.Thread(target=self.dribble, daemon=True)
        self.thread.start()

    def open(self, n):
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            self.socks.append(s)

    def dribble(self):
        while not self.stop.wait(DRIBBLE_S):
            for s in list(self.socks):
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass

    def closed_by_the_server(self, limit):
        """How many of the slow connections the server has closed within
        limit seconds (each read until EOF or a reset)."""
        deadline, closed = time.monotonic() + limit, 0
        for s in self.socks:
            try:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                while s.recv(4096):
                    pass
                closed += 1
            except (ConnectionResetError, BrokenPipeError):
                closed += 1
            except OSError:
                pass
        return closed

    def close(self):
        self.stop.set()
        for s in self.socks:
            s.close()


def scrape(port):
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_S) as r:
        text = r.read().decode()
    return text, time.monotonic() - t0


def slow_clients_cannot_lock_out_a_scrape(tmp):
    """20 slow clients (more than the 16 connections the endpoint once
    allowed, which they held for as long as they dribbled), then 100 (more
    than any connection limit it has now): each time a real scrape is served
    within SCRAPE_S, and every slow client is cut off well before its
    second dribble (a request head must arrive within a few seconds)."""
    data, _ = prepare_corpus(tmp)
    ev, hosts, port = f"{tmp}/ev.jsonl", f"{tmp}/hosts", free_port()
    open(hosts, "w").write("localhost 0\n")  # waits for capacity: no ranks needed
    p = start_super(["--np", "1", "--hosts", hosts, "--metrics", f"127.0.0.1:{port}"],
                    trainer(data, f"{tmp}/ck", 10), ev)
    slow = []
    try:
        wait_event(ev, lambda e: e["event"] == "waiting_for_capacity")
        deadline = time.monotonic() + 30
        while True:  # the endpoint is up
            try:
                scrape(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "the metrics endpoint never answered"
                time.sleep(0.1)
        took = []
        for n in (20, 100):
            s = Slowloris(port)
            slow.append(s)
            s.open(n)
            for _ in range(3):
                try:
                    text, t = scrape(port)
                except OSError as e:
                    raise AssertionError(f"with {n} slow clients open a scrape failed: {e!r}")
                assert "fsdp_launches_total 0" in text, text[:300]
                assert t < SCRAPE_S, f"with {n} slow clients a scrape took {t:.2f} s"
                took.append(t)
            closed = s.closed_by_the_server(2 * DRIBBLE_S)
            assert closed == n, f"{n - closed} of {n} slow clients still held after " \
                f"{2 * DRIBBLE_S:.0f} s"
            s.close()
        text, t = scrape(port)
        p.send_signal(signal.SIGTERM)
        finish(p)
    except BaseException:
        kill_everything(p, events_of(ev))
        raise
    finally:
        for s in slow:
            s.close()
    assert p.returncode == 0
    print(f"  20 then 100 slow clients: every scrape served, the slowest in "
          f"{max(took) * 1000:.0f} ms; each slow client cut off")


def a_fifo_as_the_events_file_blocks_nothing(tmp):
    """--events naming a FIFO nobody reads: fsdp-super says so once and
    supervises the run without events (before, it hung in open())."""
    train, _ = prepare_corpus(tmp)
    fifo = f"{tmp}/events.fifo"
    os.mkfifo(fifo)
    p = subprocess.run([os.path.join(BUILD, "recovery", "fsdp-super"), "--np", "1", "--events",
                        fifo, "--", os.path.join(BUILD, "src", "fsdp-train"), "--data", train,
                        "--layers", "1", "--dim", "32", "--heads", "2", "--seq", "32",
                        "--global-batch", "4", "--steps", "2"],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    said = [l for l in p.stderr.splitlines() if fifo in l]
    assert len(said) == 1 and "no reader" in said[0], p.stderr[-2000:]


if __name__ == "__main__":
    main([a_fifo_renamed_over_the_host_file_blocks_nothing,
          slow_clients_cannot_lock_out_a_scrape,
          a_fifo_as_the_events_file_blocks_nothing])
