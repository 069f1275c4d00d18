"""A minimal remote shell for the test hosts: the server (one per host, run
by the host's init) and the client (the launch agent mh-rsh that Open MPI
runs as plm_rsh_agent).

Why not nsenter: a launch agent that only entered another host's namespaces
would bypass the test network, so a partitioned or dead host would still
"answer". Here every session is a TCP connection over the test network, as
with ssh: the client connects to HOST:PORT (refused, unreachable or timed
out -> exit 255 with one line on stderr, as ssh does), sends the command
line, and the server runs it with /bin/sh -c in the host's namespaces (it
lives there), relaying stdin, stdout, stderr and the exit status as framed
messages. A session whose connection breaks ends the client with 255; on
the server the command keeps running with its pipes closed, as under sshd
without a tty. Like ssh there are no keepalives unless asked for
(-o ServerAliveInterval=N -o ServerAliveCountMax=M, via plm_rsh_args).

No authentication: the server listens only on the host's address inside a
test network that nothing outside the test can reach.

Frame: 1 byte channel, 4 bytes big-endian length, payload. Client -> server:
a REQ frame (JSON {"cmd": "..."}), then STDIN frames (empty = EOF). Server
-> client: STDOUT, STDERR, then one EXIT frame (JSON {"status": N} or
{"signal": N})."""

import json
import os
import socket
import struct
import subprocess
import sys
import threading

PORT = 7022
REQ, STDIN, STDOUT, STDERR, EXIT = 0, 1, 2, 3, 4
HEADER = struct.Struct("!BI")
MAX_FRAME = 1 << 20


def send_frame(sock, lock, channel, data):
    with lock:
        sock.sendall(HEADER.pack(channel, len(data)) + data)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_frame(sock):
    """(channel, payload), or None at end of stream."""
    head = recv_exact(sock, HEADER.size)
    if head is None:
        return None
    channel, length = HEADER.unpack(head)
    if length > MAX_FRAME:
        raise OSError(f"frame of {length} bytes")
    data = recv_exact(sock, length) if length else b""
    if data is None:
        return None
    return channel, data


# ---------------------------------------------------------------- server

def _pump_out(pipe, sock, lock, channel, dead):
    """Copies a child's output to the connection; after the connection broke
    the pipe is closed, so the child sees EPIPE like under sshd."""
    try:
        while True:
            data = os.read(pipe.fileno(), 65536)
            if not data:
                break
            if not dead.is_set():
                try:
                    send_frame(sock, lock, channel, data)
                except OSError:
                    dead.set()
                    break
    finally:
        pipe.close()


def _session(conn):
    lock, dead = threading.Lock(), threading.Event()
    try:
        first = recv_frame(conn)
        if first is None or first[0] != REQ:
            return
        cmd = json.loads(first[1])["cmd"]
        child = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, cwd=os.environ.get("HOME", "/"))
    except (OSError, ValueError, KeyError) as e:
        try:
            send_frame(conn, lock, STDERR, f"mh-rshd: {e}\n".encode())
            send_frame(conn, lock, EXIT, b'{"status": 127}')
        except OSError:
            pass
        conn.close()
        return
    pumps = [threading.Thread(target=_pump_out, args=(p, conn, lock, ch, dead), daemon=True)
             for p, ch in ((child.stdout, STDOUT), (child.stderr, STDERR))]
    for t in pumps:
        t.start()

    def pump_in():
        try:
            while True:
                frame = recv_frame(conn)
                if frame is None or (frame[0] == STDIN and not frame[1]):
                    break
                if frame[0] == STDIN:
                    child.stdin.write(frame[1])
                    child.stdin.flush()
        except OSError:
            pass
        try:
            child.stdin.close()
        except OSError:
            pass
    threading.Thread(target=pump_in, daemon=True).start()
    for t in pumps:
        t.join()
    status = child.wait()
    msg = {"status": status} if status >= 0 else {"signal": -status}
    try:
        send_frame(conn, lock, EXIT, json.dumps(msg).encode())
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    conn.close()


def serve(addr, port=PORT):
    """Accepts sessions forever (the host's init starts this)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_session, args=(conn,), daemon=True).start()


# ---------------------------------------------------------------- client

USAGE = ("usage: mh-rsh [-n] [-x] [-o ConnectTimeout=S] [-o ServerAliveInterval=S] "
         "[-o ServerAliveCountMax=N] HOST [COMMAND...]")


def _fail(msg):
    sys.stderr.write(f"mh-rsh: {msg}\n")
    sys.stderr.flush()
    os._exit(255)


def _parse(argv):
    """ssh-like options: the ones that matter here, the rest accepted and
    ignored so that anything written for ssh (plm_rsh_args) still parses."""
    opts = {"connecttimeout": 3.0, "serveraliveinterval": 0.0, "serveralivecountmax": 3,
            "stdin": True, "port": PORT}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-o", "-p", "-l", "-i", "-F"):
            if i + 1 >= len(argv):
                _fail(f"option {a} needs a value ({USAGE})")
            val = argv[i + 1]
            if a == "-p":
                opts["port"] = int(val)
            elif a == "-o":
                key, _, v = val.partition("=")
                key = key.strip().lower()
                if key in ("connecttimeout", "serveraliveinterval"):
                    opts[key] = float(v)
                elif key == "serveralivecountmax":
                    opts[key] = int(v)
            i += 2
            continue
        if "n" in a[1:]:
            opts["stdin"] = False
        i += 1
    if i >= len(argv):
        _fail(f"no host given ({USAGE})")
    return opts, argv[i], argv[i + 1:]


def _resolve(host):
    """An IPv4 literal, or a name from the cluster's host map (FSDP_MH_HOSTMAP,
    lines 'NAME ADDRESS'): never DNS, so nothing is asked of any resolver."""
    try:
        socket.inet_aton(host)
        return host
    except OSError:
        pass
    path = os.environ.get("FSDP_MH_HOSTMAP")
    if path:
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == host:
                        return parts[1]
        except OSError:
            pass
    _fail(f"could not resolve hostname {host}: not an IPv4 address nor in FSDP_MH_HOSTMAP")


def client_main(argv):
    opts, host, words = _parse(argv)
    addr = _resolve(host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(opts["connecttimeout"])
    try:
        sock.connect((addr, opts["port"]))
    except socket.timeout:
        _fail(f"connect to host {host} port {opts['port']}: Connection timed out")
    except OSError as e:
        _fail(f"connect to host {host} port {opts['port']}: {e.strerror or e}")
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    alive, count = opts["serveraliveinterval"], opts["serveralivecountmax"]
    if alive > 0:
        # ssh's ServerAlive*, done by the kernel: probes after `alive` idle
        # seconds, `count` unanswered ones end the session; the user timeout
        # bounds unacknowledged data the same way.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, int(alive)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, int(alive)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, count))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(alive * (count + 1) * 1000))
    lock = threading.Lock()
    try:
        send_frame(sock, lock, REQ, json.dumps({"cmd": " ".join(words)}).encode())
    except OSError as e:
        _fail(f"connection to {host} lost: {e.strerror or e}")

    def pump_stdin():
        try:
            if opts["stdin"]:
                while True:
                    data = os.read(0, 65536)
                    if not data:
                        break
                    send_frame(sock, lock, STDIN, data)
            send_frame(sock, lock, STDIN, b"")
        except OSError:
            pass
    threading.Thread(target=pump_stdin, daemon=True).start()

    while True:
        try:
            frame = recv_frame(sock)
        except OSError as e:
            _fail(f"connection to {host} lost: {e.strerror or e}")
        if frame is None:
            _fail(f"connection to {host} closed by remote host")
        channel, data = frame
        if channel in (STDOUT, STDERR):
            fd = 1 if channel == STDOUT else 2
            try:
                while data:
                    data = data[os.write(fd, data):]
            except OSError:
                pass
        elif channel == EXIT:
            msg = json.loads(data)
            # ssh exits 255 when the remote command died by a signal
            os._exit(msg["status"] if "status" in msg else 255)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else PORT)
    else:
        client_main(sys.argv[1:])
