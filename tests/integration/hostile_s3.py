"""A hostile S3 server on 127.0.0.1 for the bad-input suite: it checks no
signature and behaves as the bucket's name says, each a way a broken or
malicious server can answer ListObjectsV2 or PutObject:

  sametoken   every page IsTruncated, with the same continuation token
  cycle       tokens A, B, A, ...: a loop of two pages
  endless     a fresh token every page and no keys, forever
  manykeys    one page of 1,001 keys (S3 sends at most 1,000)
  unsorted    keys out of S3's ascending order
  huge        a 20 MiB answer (a page is at most about 1.5 MiB)
  nested      20,000 nested elements
  blackhole   acknowledges every PUT and stores nothing; lists nothing

Any other bucket: an empty listing. GET of an object: 404 NoSuchKey."""

import http.server
import threading

XML = b'<?xml version="1.0" encoding="UTF-8"?>'


def page(keys=(), token=None):
    body = [XML, b"<ListBucketResult><Name>b</Name>"]
    for k in keys:
        body.append(b"<Contents><Key>%s</Key><Size>1</Size><ETag>&quot;x&quot;</ETag>"
                    b"<StorageClass>STANDARD</StorageClass></Contents>" % k.encode())
    if token is not None:
        body.append(b"<IsTruncated>true</IsTruncated><NextContinuationToken>%s"
                    b"</NextContinuationToken>" % token.encode())
    else:
        body.append(b"<IsTruncated>false</IsTruncated>")
    body.append(b"</ListBucketResult>")
    return b"".join(body)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counter = 0

    def answer(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"d41d8cd98f00b204e9800998ecf8427e"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def parts(self):
        path, _, query = self.path.partition("?")
        bits = path.lstrip("/").split("/", 1)
        q = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
        return bits[0], bits[1] if len(bits) > 1 else "", q

    def do_GET(self):
        bucket, key, q = self.parts()
        if key or q.get("list-type") != "2":
            return self.answer(404, XML + b"<Error><Code>NoSuchKey</Code></Error>")
        prefix = q.get("prefix", "").replace("%2F", "/")
        token = q.get("continuation-token")
        Handler.counter += 1
        if bucket == "sametoken":
            body = page([], "same")
        elif bucket == "cycle":
            body = page([], "B" if token == "A" else "A")
        elif bucket == "endless":
            body = page([], f"t{Handler.counter}")
        elif bucket == "manykeys":
            body = page([f"{prefix}k{i:05d}" for i in range(1001)])
        elif bucket == "unsorted":
            body = page([f"{prefix}b", f"{prefix}a"])
        elif bucket == "huge":
            filler = b"<Owner><ID>" + b"x" * (20 << 20) + b"</ID></Owner>"
            body = XML + b"<ListBucketResult>" + filler + b"</ListBucketResult>"
        elif bucket == "nested":
            body = XML + b"<ListBucketResult>" + b"<a>" * 20000 + b"</a>" * 20000 + \
                b"</ListBucketResult>"
        else:
            body = page()
        self.answer(200, body)

    def do_HEAD(self):
        self.answer(404)

    def do_PUT(self):
        n = int(self.headers.get("Content-Length", "0"))
        while n > 0:
            n -= len(self.rfile.read(min(n, 1 << 20)))
        self.answer(200)

    def do_DELETE(self):
        self.answer(204)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        self.answer(200, XML + b"<DeleteResult></DeleteResult>")

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hangs up on an answer it refuses is the point


class HostileS3:
    def __init__(self):
        self.srv = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()
