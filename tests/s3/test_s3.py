"""The S3 backend against a real S3 server that verifies signatures: Ceph
RADOS Gateway from Debian's packages on 127.0.0.1, started here
(ceph-s3.sh). Signing is checked by the server (a wrong secret is
refused); multipart objects cross over with the AWS CLI byte for byte,
ranged reads across part boundaries included; a fault-injecting proxy
(resets, 503 SlowDown, truncated bodies, stalls) is ridden through, a
permanent failure is reported clearly; DeleteObjects carries keys full of
XML specials; s3://bucket/../x never leaves its bucket; and training,
resume and every fsdp-ckpt command work on s3:// URIs."""

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import (BUILD, CKPT, ENV, TRAIN, committed_steps, digest, job_pids,  # noqa: E402
                     kill_job, launch, main, mpirun, prepare_corpus, read_log, run, slow,
                     token_file, wait_stopped_or_exit)
from fault_proxy import FaultProxy  # noqa: E402

CAT = os.path.join(BUILD, "tests", "s3", "s3_cat")
CEPH = os.environ.get("CEPH_S3_SH", os.path.join(os.path.dirname(__file__), "ceph-s3.sh"))
AWS = "/usr/bin/aws"  # Debian's, not a pip one earlier on PATH
MIB = 1 << 20


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="fsdp-rgw-")
        self.port = free_port()
        env = dict(os.environ, CEPH_S3_PORT=str(self.port), CEPH_MON_PORT=str(free_port()),
                   CEPH_S3_STORE="memstore", CEPH_S3_STORE_GB="4")
        p = subprocess.run([CEPH, "start", self.dir], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"ceph-s3.sh start failed:\n{p.stderr[-3000:]}")
        self.env = {}
        for line in p.stdout.splitlines():
            if line.startswith("export "):
                k, v = line[7:].split("=", 1)
                self.env[k] = v.strip("'")
        self.endpoint = self.env["S3_ENDPOINT"]
        ENV.update({k: self.env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        ENV.update({"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1",
                    "FSDP_S3_RETRY_BASE_MS": "20", "FSDP_S3_TIMEOUT_S": "2"})
        ENV.pop("AWS_PROFILE", None)

    def stop(self):
        subprocess.run([CEPH, "stop", self.dir], capture_output=True)

    def stop_gateway(self):
        """Stops radosgw alone (the objects live on in the OSD), so the
        endpoint refuses connections until start_gateway."""
        pidfile = f"{self.dir}/run/rgw.a.pid"
        pid = int(open(pidfile).read())
        self.rgw_argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
        while port_open(self.port):
            time.sleep(0.05)

    def start_gateway(self):
        with open(f"{self.dir}/log/rgw.a.out", "ab") as log:
            p = subprocess.Popen(self.rgw_argv, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=log, start_new_session=True)
        open(f"{self.dir}/run/rgw.a.pid", "w").write(f"{p.pid}\n")
        deadline = time.monotonic() + 60
        while not port_open(self.port):
            assert p.poll() is None and time.monotonic() < deadline, "radosgw did not come back"
            time.sleep(0.1)


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


server = None


def aws(*args, check=True):
    return run([AWS, "--endpoint-url", server.endpoint] + list(args), check=check)


def bucket(name):
    aws("s3", "mb", f"s3://{name}")
    return f"s3://{name}"


def cat(*args, check=True, data=None, env=None):
    e = dict(ENV, **(env or {}))
    p = subprocess.run([CAT] + list(args), env=e, input=data, capture_output=True)
    if check and p.returncode != 0:
        raise AssertionError(f"s3_cat {args[0]} exited {p.returncode}: {p.stderr.decode()}")
    return p


def random_bytes(n, seed):
    return random.Random(seed).randbytes(n)


def a_wrong_secret_is_refused_and_never_printed(tmp):
    b = bucket("signing")
    cat("put", b, "hello", data=b"hello world")
    assert cat("get", b, "hello").stdout == b"hello world"
    wrong = "wrongsecretwrongsecretwrongsecret0000000"
    p = cat("get", b, "hello", "0", "5", check=False, env={"AWS_SECRET_ACCESS_KEY": wrong})
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "HTTP 403" in err and "SignatureDoesNotMatch" in err, err
    assert wrong not in err and ENV["AWS_SECRET_ACCESS_KEY"] not in err, "a secret was printed"
    p = run([CKPT, "ls", b], check=False)
    assert p.returncode == 0, p.stderr


def put_get_list_delete_and_put_if_absent(tmp):
    b = bucket("basics")
    small, big = random_bytes(1000, 1), random_bytes(21 * MIB + 12345, 2)
    cat("put", b, "dir/small", data=small)
    cat("put", b, "dir/big", data=big)  # three parts of 8 MiB, in parallel
    assert cat("get", b, "dir/small").stdout == small
    assert cat("get", b, "dir/big").stdout == big
    assert cat("stat", b, "dir/big").stdout.strip() == str(len(big)).encode()
    for off, n in ((0, 10), (8 * MIB - 7, 20), (16 * MIB - 1, 2), (len(big) - 5, 5)):
        assert cat("get", b, "dir/big", str(off), str(n)).stdout == big[off:off + n], off
    for i in range(23):
        cat("put", b, f"many/{i:03d}", data=b"x")
    listed = cat("list", b, "many/", env={"FSDP_S3_LIST_MAX_KEYS": "5"}).stdout.decode().split()
    assert sorted(listed[0::2]) == [f"many/{i:03d}" for i in range(23)], "continuation lost keys"
    cat("delete", b, *[f"many/{i:03d}" for i in range(23)])
    assert cat("list", b, "many/").stdout == b""
    assert cat("pia", b, "m/MANIFEST.json", data=b"first").returncode == 0
    p = cat("pia", b, "m/MANIFEST.json", data=b"second", check=False)
    assert p.returncode == 3 and b"already exists" in p.stderr, p.stderr
    assert cat("get", b, "m/MANIFEST.json").stdout == b"first"
    p = cat("get", b, "nothing/here", check=False)
    assert p.returncode == 1 and b"not found" in p.stderr, p.stderr


def delete_objects_carries_keys_full_of_xml_specials(tmp):
    """DeleteObjects bodies escape every key (& < > " ' and long runs of
    them) byte-exact; the server deletes exactly those objects."""
    b = bucket("specials")
    specials = "&<>\"'"
    keys = [f"odd/{specials}{i}" for i in range(5)] + \
        ["odd/" + "".join(specials[(i + j) % 5] for j in range(1000)) for i in range(5)]
    keep = "odd/plain-survivor"
    for k in keys + [keep]:
        cat("put", b, k, data=k.encode())
    listed = aws("s3api", "list-objects-v2", "--bucket", "specials", "--prefix", "odd/",
                 "--query", "Contents[].Key", "--output", "json").stdout
    assert sorted(json.loads(listed)) == sorted(keys + [keep]), listed
    cat("delete", b, *keys)
    left = cat("list", b, "odd/").stdout.decode().split()
    assert left[0::2] == [keep], f"left behind: {left}"
    assert cat("get", b, keep).stdout == keep.encode()


def dot_segments_never_leave_the_bucket(tmp):
    """s3://BUCKET/../other and keys with '.' or '..' parts are refused
    with one line naming them; nothing is read or written elsewhere."""
    victim = bucket("victim")
    bucket("attacker")
    cat("put", victim, "step-00000001/MANIFEST.json", data=b"committed")
    for uri in ("s3://attacker/../victim", "s3://attacker/./x", "s3://attacker//x"):
        p = cat("put", uri, "step-00000001/MANIFEST.json", data=b"evil", check=False)
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and uri in err and len(err.splitlines()) == 1, err
        p = run([CKPT, "ls", uri], check=False)
        assert p.returncode != 0 and uri in p.stderr, p.stderr
    for key in ("../victim/step-00000001/MANIFEST.json", "a/../../victim/x", "./x"):
        p = cat("put", "s3://attacker", key, data=b"evil", check=False)
        err = p.stderr.decode().strip()
        assert p.returncode == 1 and "invalid key" in err and key in err, err
        p = cat("delete", "s3://attacker", key, check=False)
        assert p.returncode == 1 and "invalid key" in p.stderr.decode(), p.stderr
    assert cat("get", victim, "step-00000001/MANIFEST.json").stdout == b"committed"
    assert cat("list", "s3://attacker", "").stdout == b"", "something was written"


def multipart_objects_cross_over_with_the_aws_cli(tmp):
    b = bucket("interop")
    ours = random_bytes(19 * MIB + 3, 3)
    cat("put", b, "ours.bin", data=ours)
    aws("s3", "cp", f"{b}/ours.bin", f"{tmp}/down.bin")
    assert open(f"{tmp}/down.bin", "rb").read() == ours, "the AWS CLI read other bytes"
    theirs = random_bytes(27 * MIB + 999, 4)
    open(f"{tmp}/up.bin", "wb").write(theirs)
    aws("s3", "cp", f"{tmp}/up.bin", f"{b}/theirs.bin")  # multipart: 8 MiB parts
    head = aws("s3api", "head-object", "--bucket", "interop", "--key", "theirs.bin").stdout
    assert '"ETag": "\\"' in head and '-4' in head, f"not a 4-part upload: {head}"
    assert cat("get", b, "theirs.bin").stdout == theirs
    for off, n in ((8 * MIB - 3, 6), (16 * MIB - 1, 3 * MIB), (24 * MIB, 64), (0, len(theirs))):
        got = cat("get", b, "theirs.bin", str(off), str(n)).stdout
        assert got == theirs[off:off + n], f"range {off}+{n}"


def credentials_come_from_a_profile(tmp):
    b = bucket("profile")
    os.makedirs(f"{tmp}/home/.aws")
    with open(f"{tmp}/home/.aws/credentials", "w") as f:
        f.write(f"[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n"
                f"[ckpt]\naws_access_key_id = {ENV['AWS_ACCESS_KEY_ID']}\n"
                f"aws_secret_access_key = {ENV['AWS_SECRET_ACCESS_KEY']}\n")
    env = {"HOME": f"{tmp}/home", "AWS_PROFILE": "ckpt", "AWS_ACCESS_KEY_ID": "",
           "AWS_SECRET_ACCESS_KEY": ""}
    cat("put", b, "k", data=b"from a profile", env=env)
    assert cat("get", b, "k", env=env).stdout == b"from a profile"
    p = cat("get", b, "k", "0", "1", check=False, env=dict(env, AWS_PROFILE="default"))
    assert p.returncode == 1 and b"InvalidAccessKeyId" in p.stderr, p.stderr
    p = cat("get", b, "k", "0", "1", check=False, env=dict(env, HOME=f"{tmp}/none"))
    assert p.returncode == 2 and b"no credentials" in p.stderr, p.stderr


def tls_peers_are_verified_and_ca_bundle_honoured(tmp):
    import ssl
    import threading
    key, cert = f"{tmp}/key.pem", f"{tmp}/cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def serve():  # answers every TLS request with S3's AccessDenied
        while True:
            try:
                c, _ = srv.accept()
                with ctx.wrap_socket(c, server_side=True) as t:
                    t.recv(65536)
                    body = b"<Error><Code>AccessDenied</Code><Message>tls ok</Message></Error>"
                    t.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: " +
                              str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            except (OSError, ssl.SSLError):
                continue

    threading.Thread(target=serve, daemon=True).start()
    env = {"AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}", "FSDP_S3_MAX_ATTEMPTS": "1"}
    p = cat("get", "s3://tls", "k", "0", "1", check=False, env=env)
    assert p.returncode == 1 and (b"certificate" in p.stderr or b"SSL" in p.stderr), p.stderr
    p = cat("get", "s3://tls", "k", "0", "1", check=False, env=dict(env, AWS_CA_BUNDLE=cert))
    assert p.returncode == 1 and b"HTTP 403 AccessDenied: tls ok" in p.stderr, p.stderr


def faults_are_ridden_through_and_permanent_ones_reported(tmp):
    b = bucket("faults")
    proxy = FaultProxy(server.port)
    via = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
    data = random_bytes(17 * MIB, 5)
    proxy.set_plan(["reset", "slowdown", "pass", "truncate", "pass", "stall:4", "slowdown"])
    cat("put", b, "obj", data=data, env=via)
    assert cat("get", b, "obj", env=via).stdout == data
    proxy.set_plan(["truncate", "reset", "slowdown", "stall:4"])
    assert cat("get", b, "obj", str(MIB), str(MIB), env=via).stdout == data[MIB:2 * MIB]
    assert [a for _, a in proxy.seen][:5] == ["truncate", "reset", "slowdown", "stall:4", "pass"]
    proxy.set_plan(["slowdown"] * 50)
    p = cat("stat", b, "obj", check=False, env=dict(via, FSDP_S3_MAX_ATTEMPTS="4"))
    err = p.stderr.decode()
    assert p.returncode == 1 and "HeadObject faults/obj" in err and "503" in err, err
    assert "after 4 attempts" in err, err
    # a multipart upload that fails is aborted: no parts are left behind
    proxy.set_plan(["pass", "pass", "forbid"])  # create, part 1, part 2 refused
    p = cat("put", b, "aborted", data=data, check=False, env=via)
    assert p.returncode == 1 and b"UploadPart" in p.stderr, p.stderr
    pending = aws("s3api", "list-multipart-uploads", "--bucket", "faults").stdout
    assert '"UploadId"' not in pending, f"an upload was left open: {pending}"
    assert cat("get", b, "aborted", "0", "1", check=False).returncode == 1
    proxy.set_plan(["forbid"] * 5)
    p = cat("get", b, "obj", "0", "10", check=False, env=via)
    err = p.stderr.decode()
    assert p.returncode == 1 and "GetObject faults/obj: HTTP 403 AccessDenied" in err, err
    assert len(proxy.seen) == 1, f"a 403 was retried: {proxy.seen}"


def a_lost_answer_to_a_conditional_put_is_told_apart(tmp):
    """The server acted on put-if-absent but its answer was lost: the retry
    meets 412. Our own bytes there mean the put succeeded; a rival's mean
    the key was taken."""
    b = bucket("lost")
    proxy = FaultProxy(server.port)
    via = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
    proxy.set_plan(["drop"])
    p = cat("pia", b, "step/MANIFEST.json", data=b"ours", check=False, env=via)
    assert p.returncode == 0, p.stderr
    assert [a for _, a in proxy.seen] == ["drop", "pass", "pass", "pass"], proxy.seen  # + HEAD, GET
    assert cat("get", b, "step/MANIFEST.json").stdout == b"ours"
    proxy.set_plan(["drop"])
    p = cat("pia", b, "step/MANIFEST.json", data=b"theirs", check=False, env=via)
    assert p.returncode == 3 and b"already exists" in p.stderr, p.stderr
    assert cat("get", b, "step/MANIFEST.json").stdout == b"ours"
    # a multipart upload whose CompleteMultipartUpload answer is lost: create
    # and three parts pass, the completion is carried out and its answer dropped
    data = random_bytes(17 * MIB, 6)
    proxy.set_plan(["pass"] * 4 + ["drop"])
    p = cat("put", b, "step/shard", data=data, check=False, env=via)
    assert p.returncode == 0, p.stderr
    done = [w for w, a in proxy.seen if a == "drop"]
    assert len(done) == 1 and done[0].startswith("POST") and "uploadId=" in done[0], proxy.seen
    assert cat("get", b, "step/shard").stdout == data
    # the same, on a server that answers the repeated completion NoSuchUpload:
    # the object's ETag is that of exactly our parts, so the upload succeeded
    data = random_bytes(17 * MIB, 7)
    proxy.set_plan(["pass"] * 4 + ["drop", "nosuchupload"])
    p = cat("put", b, "step/shard2", data=data, check=False, env=via)
    assert p.returncode == 0, p.stderr
    assert [a for _, a in proxy.seen][4:7] == ["drop", "nosuchupload", "pass"], proxy.seen
    assert proxy.seen[6][0].startswith("HEAD"), proxy.seen
    assert cat("get", b, "step/shard2").stdout == data


def fs_reference(tmp, data, common):
    ref = f"{tmp}/run-fs"
    if not os.path.exists(ref):
        mpirun(2, [TRAIN, "--ckpt", ref] + common)
    return digest(ref)


@slow  # the C paths it takes are covered quickly by the lost-answer and fault tests
def training_rides_through_ten_percent_transient_faults(tmp):
    """Every request has a 10% chance of a reset, a 503 SlowDown, a cut
    body, a lost answer or a stall; a run killed mid-way and resumed through
    that ends with the filesystem run's digest."""
    data, _ = prepare_corpus(tmp)
    common = ["--model", "tiny", "--global-batch", "8", "--steps", "9", "--ckpt-every", "3",
              "--log-every", "100", "--data", data, "--ckpt-chunk-kib", "256"]
    want = fs_reference(tmp, data, common)
    b = bucket("flaky")
    proxy = FaultProxy(server.port)
    via = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
    proxy.set_rate(0.10, 2026, ["reset", "slowdown", "truncate", "drop", "stall:3"])
    p = launch(2, [TRAIN, "--ckpt", f"{b}/run"] + common,
               dict(via, FSDP_TEST_STOP_AT="after-commit:2"))
    assert wait_stopped_or_exit(p)
    kill_job(p)
    p = mpirun(2, [TRAIN, "--ckpt", f"{b}/run"] + common, env=via)
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert run([CKPT, "verify", f"{b}/run"], env=via).returncode == 0
    faults, total = proxy.faults(), len(proxy.seen)
    print(f"  {len(faults)} faults in {total} requests: "
          f"{', '.join(sorted(set(faults)))}")
    assert total >= 100 and len(faults) >= 0.05 * total, (len(faults), total)
    assert digest(f"{b}/run") == want, "faults changed the result"


def a_server_gone_for_good_stops_training_and_keeps_the_checkpoint(tmp):
    data, _ = prepare_corpus(tmp)
    b = bucket("gone")
    argv = [TRAIN, "--ckpt", f"{b}/run", "--model", "tiny", "--global-batch", "8", "--steps",
            "30", "--ckpt-every", "3", "--log-every", "100", "--data", data]
    p = launch(2, argv, {"FSDP_TEST_STOP_AT": "after-commit:1"})
    assert wait_stopped_or_exit(p)
    server.stop_gateway()
    try:
        for pid, state in job_pids(p.pid):
            if state == "T":
                os.kill(pid, signal.SIGCONT)
        err = p.communicate(timeout=120)[1]
        ours = [l for l in err.splitlines() if l.startswith("fsdp-train")]
        print(f"  {ours[-1]}")
        assert p.returncode != 0, err
        # the first request after the commit of step 3 is retention's listing
        line = [l for l in ours if "Couldn't connect to server" in l]
        assert len(line) == 1, err
        assert "checkpoint step 3 is committed, but removing older checkpoints" in line[0], line
        assert f"127.0.0.1:{server.port}" in line[0] and "after 6 attempts" in line[0], line
    finally:
        server.start_gateway()
    assert committed_steps(f"{b}/run") == [3]
    assert run([CKPT, "verify", f"{b}/run"]).returncode == 0


def training_and_every_tool_work_on_s3(tmp):
    data, _ = prepare_corpus(tmp)
    b = bucket("training")
    run_s3, run_fs = f"{b}/run", f"{tmp}/run-fs"
    common = ["--model", "tiny", "--global-batch", "8", "--steps", "9", "--ckpt-every", "3",
              "--log-every", "100", "--data", data]
    mpirun(2, [TRAIN, "--ckpt", run_fs] + common)
    # on S3: stopped after the second commit, killed, resumed
    p = launch(2, [TRAIN, "--ckpt", run_s3] + common, {"FSDP_TEST_STOP_AT": "after-commit:2"})
    assert wait_stopped_or_exit(p)
    kill_job(p)
    assert committed_steps(run_s3) == [3, 6]
    p = mpirun(2, [TRAIN, "--ckpt", run_s3] + common)
    assert "resumed from checkpoint step 6 in s3://training/run" in p.stderr, p.stderr
    assert committed_steps(run_s3) == [3, 6, 9]
    want = digest(run_fs)
    assert digest(run_s3) == want, "S3 and filesystem runs differ"
    assert run([CKPT, "verify", run_s3]).returncode == 0
    assert "step 9, world size 2" in run([CKPT, "inspect", run_s3]).stdout
    run([CKPT, "reshard", run_s3, f"{b}/resharded", "--world-size", "3"])
    assert digest(f"{b}/resharded") == want
    run([CKPT, "export", run_s3, f"{tmp}/m.safetensors"])
    run([CKPT, "export", run_fs, f"{tmp}/f.safetensors"])
    assert open(f"{tmp}/m.safetensors", "rb").read() == open(f"{tmp}/f.safetensors", "rb").read()
    run([CKPT, "cp", run_s3, f"{tmp}/back"])
    assert committed_steps(f"{tmp}/back") == [3, 6, 9] and digest(f"{tmp}/back") == want
    run([CKPT, "import", f"{tmp}/m.safetensors", f"{b}/imported", "--model", "tiny",
         "--world-size", "3"])
    imported = digest(f"{b}/imported")
    assert all(imported[k] == want[k] for k in want if k[1] == "param")
    run([CKPT, "cp", f"{tmp}/back@6", f"{b}/again"])
    assert run([CKPT, "diff", f"{b}/again", f"{tmp}/back@6"]).returncode == 0
    assert run([CKPT, "diff", f"{b}/again", run_s3], check=False).returncode == 1
    # one rank loading on 2 threads, a connection each, proved by the digest
    p = run([TRAIN, "--ckpt", f"{b}/again", "--threads", "2", "--verify-load", "on"] + common)
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr
    assert "digest equal to the checkpoint's" in p.stderr, p.stderr
    run([CKPT, "prune", run_s3, "--keep", "1"])
    assert committed_steps(run_s3) == [9]
    objects = aws("s3", "ls", "--recursive", "s3://training/run/").stdout
    assert "step-00000003" not in objects and "step-00000009/MANIFEST.json" in objects, objects
    # the same commit twice is refused by the server's put-if-absent
    p = run([TRAIN, "--ckpt", f"{b}/resharded"] + common[:-2] + ["--data", data,
                                                                "--resume", "none"], check=False)
    assert p.returncode == 1 and "already holds committed checkpoints" in p.stderr, p.stderr


def token_shards(tmp, data, cuts):
    """data's tokens as one token file and as shards cut at `cuts` (written
    by the format's rules, not by our code); returns (file, shard paths)."""
    import struct
    raw = open(data, "rb").read()
    n = struct.unpack("<i", raw[8:12])[0]
    tokens = list(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]))[:cuts[-1]]
    whole = f"{tmp}/whole.bin"
    token_file(whole, tokens)
    os.makedirs(f"{tmp}/shards", exist_ok=True)
    paths, lo = [], 0
    for i, hi in enumerate(cuts):
        paths.append(f"{tmp}/shards/train_{i:03d}.bin")
        token_file(paths[-1], tokens[lo:hi])
        lo = hi
    return whole, paths


def losses(log):
    return [(r["step"], r["loss"]) for r in read_log(log) if "loss" in r]


def training_reads_token_shards_from_s3(tmp):
    """--data s3://BUCKET/PREFIX: the token files there, read with ranged
    GETs ahead of the step (samples span shards; one shard is empty), train
    to the same losses as the same tokens in one local file, on 2 ranks;
    every sample comes from the read-ahead; a run stopped and resumed on the
    S3 data ends with the uninterrupted run's digest; one object alone
    (the URI names it) has its local file's identity, so a checkpoint made
    from the file resumes on it; other data is refused."""
    data, _ = prepare_corpus(tmp)
    # shards of 120001, 0, 80000 and 199999 tokens: sample boundaries fall
    # inside shards and across them
    whole, shards = token_shards(tmp, data, [120001, 120001, 200001, 400000])
    b = bucket("tokens")
    aws("s3", "cp", "--recursive", f"{tmp}/shards/", f"{b}/fineweb/")
    aws("s3", "cp", whole, f"{b}/one/whole.bin")
    aws("s3", "cp", whole, f"{b}/fineweb/val_000.bin")  # not a train_ shard: left out
    common = ["--model", "tiny", "--global-batch", "8", "--steps", "12", "--ckpt-every", "4",
              "--log-every", "1"]
    mpirun(2, [TRAIN, "--data", whole, "--ckpt", f"{tmp}/ck-file", "--log", f"{tmp}/file.jsonl"]
           + common)
    want = losses(f"{tmp}/file.jsonl")
    s3data = f"{b}/fineweb/train_"
    p = mpirun(2, [TRAIN, "--data", s3data, "--ckpt", f"{tmp}/ck-s3", "--log", f"{tmp}/s3.jsonl"]
               + common)
    assert losses(f"{tmp}/s3.jsonl") == want, "the S3 shards trained otherwise"
    assert "400000 tokens in a store" in p.stderr, p.stderr
    line = [l for l in p.stderr.splitlines() if "fsdp-train: data: rank 0" in l]
    assert line and "took 48 samples from its read-ahead, read 0 when wanted" in line[0], line
    assert digest(f"{tmp}/ck-s3") == digest(f"{tmp}/ck-file")
    # stopped at step 6, resumed at the same cursor
    argv = [TRAIN, "--data", s3data, "--ckpt", f"{tmp}/ck-stop"] + common
    mpirun(2, argv + ["--stop-at-step", "6"])
    p = mpirun(2, argv)
    assert "resumed from checkpoint step" in p.stderr, p.stderr
    assert digest(f"{tmp}/ck-stop") == digest(f"{tmp}/ck-file")
    # the file's checkpoint goes on from its single object
    run(["cp", "-r", f"{tmp}/ck-file", f"{tmp}/ck-one"])
    p = mpirun(2, [TRAIN, "--data", f"{b}/one/whole.bin", "--ckpt", f"{tmp}/ck-one"] + common[:4]
               + ["--steps", "16"])
    assert "resumed from checkpoint step 12" in p.stderr, p.stderr
    # the shards are other bytes than the file: refused, one line
    p = mpirun(1, [TRAIN, "--data", s3data, "--ckpt", f"{tmp}/ck-one"] + common[:4]
               + ["--steps", "20", "--allow-changed", "lr"], check=False)
    assert p.returncode != 0 and "was trained on other data" in p.stderr, p.stderr


def bad_token_objects_are_refused_in_one_line(tmp):
    """A store's bad token data: no object under the prefix, an object that
    is no token file, a header whose count is not the object's size, uint32
    tokens beside uint16 ones, a token outside the vocabulary (found when
    its sample is read: the run stops naming the object and index), and
    --h5-dataset with a store."""
    b = bucket("badtokens")
    common = ["--model", "tiny", "--global-batch", "8", "--steps", "3", "--log-every", "100"]
    good = list(range(1, 200)) * 40
    token_file(f"{tmp}/good.bin", good)
    token_file(f"{tmp}/short.bin", good, count=len(good) + 5)
    token_file(f"{tmp}/wide.bin", [], magic=20240801, version=7)
    token_file(f"{tmp}/vocab.bin", good[:1000] + [300] + good[:24])  # 8 samples: one step's
    open(f"{tmp}/junk.bin", "wb").write(b"PK\x03\x04" + bytes(2000))
    for name in ("good", "short", "wide", "vocab", "junk"):
        aws("s3", "cp", f"{tmp}/{name}.bin", f"{b}/{name}/a.bin")
    aws("s3", "cp", f"{tmp}/good.bin", f"{b}/wide/0.bin")  # before the uint32 one
    cases = [(f"{b}/nothing/", "s3://badtokens/nothing/: no object there"),
             (f"{b}/junk/", "s3://badtokens/junk/a.bin: not a token file: magic 67324752"),
             (f"{b}/short/", "s3://badtokens/short/a.bin: the header says 7965 tokens"),
             (f"{b}/wide/", "s3://badtokens/wide/a.bin: uint32 tokens, the objects before it "
                            "hold uint16"),
             (f"{b}/vocab/a.bin", "s3://badtokens/vocab/a.bin: token 300 at index 1000 is "
                                  "outside the model's vocabulary of 256")]
    for uri, want in cases:
        p = mpirun(1, [TRAIN, "--data", uri] + common, check=False)
        assert p.returncode != 0 and p.stderr.count(want) == 1, (uri, p.stderr[-2000:])
        assert "Traceback" not in p.stderr and "Segmentation" not in p.stderr, p.stderr
    p = mpirun(1, [TRAIN, "--data", f"{b}/good/", "--h5-dataset", "tokens"] + common, check=False)
    assert p.returncode != 0 and "whose data are token files" in p.stderr, p.stderr
    p = mpirun(1, [TRAIN, "--data", f"{b}/good/"] + common)
    assert "done: 3 steps" in p.stderr, p.stderr


def run_all():
    global server
    server = Server()
    try:
        main([a_wrong_secret_is_refused_and_never_printed,
              put_get_list_delete_and_put_if_absent,
              delete_objects_carries_keys_full_of_xml_specials,
              dot_segments_never_leave_the_bucket,
              multipart_objects_cross_over_with_the_aws_cli,
              credentials_come_from_a_profile,
              tls_peers_are_verified_and_ca_bundle_honoured,
              faults_are_ridden_through_and_permanent_ones_reported,
              a_lost_answer_to_a_conditional_put_is_told_apart,
              training_rides_through_ten_percent_transient_faults,
              a_server_gone_for_good_stops_training_and_keeps_the_checkpoint,
              training_and_every_tool_work_on_s3,
              training_reads_token_shards_from_s3,
              bad_token_objects_are_refused_in_one_line])
    finally:
        server.stop()


if __name__ == "__main__":
    run_all()
