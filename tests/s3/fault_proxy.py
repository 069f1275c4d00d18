"""A fault-injecting HTTP proxy on 127.0.0.1 between our S3 client and the
server. Each request takes the next action of the plan (then "pass"):

  pass       forward, relay the whole answer
  reset      close the connection with a TCP reset before answering
  slowdown   answer 503 SlowDown (S3's throttling error) without forwarding
  truncate   forward, relay only half of the answer's body, close
  stall:S    say nothing for S seconds, then close
  forbid     answer 403 AccessDenied (a final error: must not be retried)
  drop       forward (the server acts on the request), then reset the
             client's connection without relaying the answer: a lost answer
  nosuchupload  answer 404 NoSuchUpload without forwarding (what some
             servers say to a CompleteMultipartUpload already carried out)

set_rate(share, seed, actions) instead draws, for every request, one of the
actions with probability share (seeded) and passes the rest.

Requests are forwarded unchanged (the Host header the client signed
included), each on its own upstream connection."""

import random
import socket
import struct
import threading
import time

SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
            b"<Message>Please reduce your request rate.</Message></Error>")
FORBID = b"<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message></Message></Error>"
NOSUCHUPLOAD = b"<?xml version=\"1.0\"?><Error><Code>NoSuchUpload</Code><Message></Message></Error>"

ANSWERS = {"slowdown": (b"503 Slow Down", SLOWDOWN), "forbid": (b"403 Forbidden", FORBID),
           "nosuchupload": (b"404 Not Found", NOSUCHUPLOAD)}


def read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            return None, buf
        buf += data
    i = buf.index(b"\r\n\r\n") + 4
    return buf[:i], buf[i:]


def content_length(head):
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


class FaultProxy:
    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.plan = []
        self.rate = None
        self.seen = []  # (method and path, action) of every request
        self.lock = threading.Lock()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def set_plan(self, actions):
        with self.lock:
            self.plan = list(actions)
            self.rate = None
            self.seen = []

    def set_rate(self, share, seed, actions):
        with self.lock:
            self.plan = []
            self.rate = (share, random.Random(seed), list(actions))
            self.seen = []

    def faults(self):
        with self.lock:
            return [a for _, a in self.seen if a != "pass"]

    def _next(self, what):
        with self.lock:
            if self.rate:
                share, rng, actions = self.rate
                action = rng.choice(actions) if rng.random() < share else "pass"
            else:
                action = self.plan.pop(0) if self.plan else "pass"
            self.seen.append((what, action))
            return action

    def _accept(self):
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        try:
            while True:
                head, buf = read_head(conn, buf)
                if head is None:
                    return
                need = content_length(head)
                while len(buf) < need:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:need], buf[need:]
                what = head.split(b"\r\n", 1)[0].decode(errors="replace")
                action = self._next(what)
                if action == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if action in ANSWERS:
                    status, xml = ANSWERS[action]
                    conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: " + str(len(xml)).encode() + b"\r\n\r\n" + xml)
                    continue
                if action.startswith("stall:"):
                    time.sleep(float(action.split(":")[1]))
                    return
                answer = self._forward(head, body)
                if action == "drop":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if action == "truncate":
                    rhead, rbody = answer.split(b"\r\n\r\n", 1)
                    conn.sendall(rhead + b"\r\n\r\n" + rbody[:len(rbody) // 2])
                    return
                conn.sendall(answer)
                return  # the answer says Connection: close
        except OSError:
            return
        finally:
            conn.close()

    def _forward(self, head, body):
        lines = [l for l in head.split(b"\r\n")
                 if l and not l.lower().startswith(b"connection:")]
        head = b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n"
        up = socket.create_connection(self.upstream)
        up.sendall(head + body)
        answer = b""
        while True:
            data = up.recv(65536)
            if not data:
                break
            answer += data
        up.close()
        return answer
