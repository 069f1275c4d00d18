"""Bad input, as a careless user or an attacker would give it, to every
program: fsdp-train, fsdp-data, every fsdp-ckpt subcommand, fsdp-super and
the S3 backend (with servers that answer wrong: hostile_s3.py). Each case
must end with exactly one error line on stderr that names the problem, a
non-zero exit, and every checkpoint committed before it byte for byte as
it was (and still verifying). Secrets given in the environment never
appear in any output."""

import glob
import hashlib
import json
import os
import shutil
import stat
import subprocess

from harness import BUILD, CKPT, DATA, TRAIN, main, prepare_corpus, run
from hostile_s3 import HostileS3

SUPER = os.path.join(BUILD, "recovery", "fsdp-super")
MODEL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64"]
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
S3_ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET,
          "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "FSDP_S3_MAX_ATTEMPTS": "1",
          "AWS_REGION": "us-east-1"}
# informational lines a failing fsdp-train may print before its error (a
# case that fails at its first checkpoint has trained and logged steps)
INFO = ("fsdp-train: model ", "fsdp-train: per rank:", "fsdp-train: global batch ", "step ")


def train(data, ck=None, steps=3, extra=()):
    a = [TRAIN, "--data", data] + MODEL + ["--global-batch", "4", "--steps", str(steps),
                                           "--log-every", "1000"]
    if ck:
        a += ["--ckpt", ck, "--ckpt-every", "3"]
    return a + list(extra)


def snapshot(stores):
    out = {}
    for s in stores:
        for f in sorted(glob.glob(f"{s}/step-*/**", recursive=True)):
            if os.path.isfile(f) and not os.path.islink(f):
                out[f] = hashlib.sha256(open(f, "rb").read()).hexdigest()
    return out


def error_lines(stderr):
    return [l for l in stderr.strip().splitlines() if l and not l.startswith(INFO)]


class Fixture:
    def __init__(self, tmp):
        self.tmp = tmp
        self.data, self.val = prepare_corpus(tmp)
        self.ck = f"{tmp}/ck"  # two committed steps, generation 1
        run(train(self.data, self.ck, steps=6))
        self.other = f"{tmp}/other"  # another model's checkpoint
        run([TRAIN, "--data", self.data, "--layers", "1", "--dim", "32", "--heads", "2",
             "--seq", "32", "--global-batch", "4", "--steps", "3", "--ckpt", self.other,
             "--ckpt-every", "3"])
        self.st = f"{tmp}/w.safetensors"
        run([CKPT, "export", self.ck, self.st])
        self.stores = [self.ck, self.other]

    def copy(self, name):
        dst = f"{self.tmp}/{name}"
        shutil.copytree(self.ck, dst, symlinks=True)
        self.stores.append(dst)
        return dst

    def path(self, name):
        return f"{self.tmp}/{name}"


def cases(f):
    """(name, argv, needles, env, exit codes, setup) for every case."""
    t, d = f.tmp, f.data
    fifo = f.path("fifo")
    os.mkfifo(fifo)
    dev = f.path("null-device")  # a device node of our own, never /dev/null
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        dev = None
    trunc = f.path("trunc.bin")
    open(trunc, "wb").write(open(d, "rb").read()[:700])
    bad_magic = f.path("magic.bin")
    raw = bytearray(open(d, "rb").read())
    raw[0:4] = (12345).to_bytes(4, "little")
    open(bad_magic, "wb").write(bytes(raw))
    notafile = f.path("regular-file")
    open(notafile, "w").write("I am not a directory\n")
    st_trunc = f.path("trunc.safetensors")
    open(st_trunc, "wb").write(open(f.st, "rb").read()[:64])
    st_junk = f.path("junk.safetensors")
    open(st_junk, "wb").write((16).to_bytes(8, "little") + b"{not json at all" + bytes(64))
    st_hdr = f.path("hdr.safetensors")
    open(st_hdr, "wb").write((10 ** 12).to_bytes(8, "little") + b"{}")
    junk_gen = f.copy("junkgen")
    os.makedirs(f"{junk_gen}/generations", exist_ok=True)
    open(f"{junk_gen}/generations/99999999999999999999999", "w").write("x")
    linked = f.copy("linked")
    os.symlink(f"{f.ck}/step-00000006", f"{linked}/step-00000009")
    hosts_big = f.path("hosts-big")
    open(hosts_big, "w").write("a 2147483647\nb 2147483647\n")
    hosts_bad = f.path("hosts-bad")
    open(hosts_bad, "w").write("localhost many\n")
    hosts_dir = f.path("hosts-dir")
    os.mkdir(hosts_dir)
    # host names the launch agent must never see: an option, a control or
    # shell character (each line names the file, the line and the name)
    bad_names = {}
    for key, text in (("dash", "-Fevil 2\n"), ("dash-line-2", "localhost 1\n-J 1\n"),
                      ("proxy", "-oProxyCommand=sh 1\n"), ("escape", "node\x1b[31m 1\n"),
                      ("vtab", "node\x0b1 2\n"), ("shell", "node;reboot 1\n"),
                      ("nbsp", "node\u00a0x 1\n")):
        bad_names[key] = f.path(f"hosts-{key}")
        open(bad_names[key], "w", encoding="utf-8").write(text)
    flipped = f.copy("flipped")
    shard = sorted(glob.glob(f"{flipped}/step-00000006/shard-*"))[0]
    with open(shard, "r+b") as fh:
        fh.seek(os.path.getsize(shard) // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 1]))
    f.stores.remove(flipped)  # damaged on purpose; compared byte for byte below
    dmg = f.copy("damaged")
    man = f"{dmg}/step-00000006/MANIFEST.json"
    text = open(man).read()
    assert '"world_size": 1,' in text
    open(man, "w").write(text.replace('"world_size": 1,', '"world_size": 7,'))
    f.stores.remove(dmg)
    dst_ckpt = f.copy("holds-step-6")
    f.hostile = HostileS3()
    hs3 = dict(S3_ENV, AWS_ENDPOINT_URL=f.hostile.endpoint)
    creds = f.path("credentials")
    open(creds, "w").write("[default]\naws_access_key_id = AKID\naws_secret_access_key = "
                           f"{SECRET}\naws_session_token = tok\x1b[2Jen\n")
    big_json = f.path("huge-manifest")
    os.makedirs(f"{big_json}/step-00000003")
    with open(f"{big_json}/step-00000003/MANIFEST.json", "w") as fh:
        fh.write("[" * 100000)
    open(f.path("in.txt"), "w").write("a document of text\n%\nanother\n")
    os.link(f.path("in.txt"), f.path("in-link.txt"))
    sup = [SUPER, "--np", "1", "--events", f.path("ev.jsonl")]
    return [
        # ---- fsdp-train
        ("train: data missing", train(f.path("nope.bin")), ["nope.bin", "No such file"]),
        ("train: data is a FIFO", train(fifo), [fifo, "FIFO"]),
        ("train: data is a directory", train(t), [t, "directory"]),
        ("train: data truncated", train(trunc), [trunc]),
        ("train: data with a bad magic", train(bad_magic), [bad_magic, "magic"]),
        ("train: val-data is a FIFO", train(d, extra=["--val-data", fifo]), [fifo, "FIFO"]),
        ("train: ckpt is a regular file", train(d, notafile), [notafile, "not a directory"]),
        ("train: ckpt of another model", train(d, f.other), ["refusing to resume"], {}, (2,)),
        ("train: ckpt with a junk generation", train(d, junk_gen),
         ["99999999999999999999999", "not a generation claim"]),
        ("train: ckpt with a symlinked step", train(d, linked, steps=9),
         ["step-00000009", "symbolic link"]),
        ("train: malformed FSDP_GENERATION", train(d, f.copy("gen-env")),
         ["FSDP_GENERATION"], {"FSDP_GENERATION": "12abc"}),
        ("train: resume with another --seed", train(d, f.copy("seed"), 9, ["--seed", "7"]),
         ["--seed 1337", "--seed 7", "--allow-changed seed"], {}, (2,)),
        ("train: resume with another --global-batch",
         train(d, f.copy("gb"), 9, ["--global-batch", "8"]),
         ["--global-batch 4", "--global-batch 8"], {}, (2,)),
        ("train: resume with another --lr", train(d, f.copy("lr"), 9, ["--lr", "1e-4"]),
         ["--lr 0.003", "--lr 0.0001", "--allow-changed lr"], {}, (2,)),
        ("train: resume with another --weight-decay",
         train(d, f.copy("wd"), 9, ["--weight-decay", "0"]),
         ["--weight-decay 0.1", "--allow-changed optimizer"], {}, (2,)),
        ("train: resume on other data", train(f.val, f.copy("otherdata"), 9),
         ["other data", f.val, "--allow-changed data"], {}, (2,)),
        ("train: resume with --steps below the checkpoint", train(d, f.copy("fewer"), 3),
         ["step 6", "past --steps 3"], {}, (2,)),
        ("train: --allow-changed junk", train(d, extra=["--allow-changed", "seed,junk"]),
         ["--allow-changed"], {}, (2,)),
        ("train: log to /dev/full", train(d, extra=["--log", "/dev/full"]),
         ["/dev/full", "No space left on device"]),
        ("train: log to a FIFO without a reader", train(d, extra=["--log", fifo]),
         [fifo, "no reader"]),
        ("train: keep 0", train(d, f.path("k0"), extra=["--keep", "0"]), ["--keep"], {}, (2,)),
        ("train: chunk size 0", train(d, f.path("c0"), extra=["--ckpt-chunk-kib", "0"]),
         ["--ckpt-chunk-kib"], {}, (2,)),
        ("train: zstd level 99", train(d, f.path("z"), extra=["--compress", "zstd:99"]),
         ["--compress"], {}, (2,)),
        ("train: s3 prefix with ..", train(d, "s3://bucket/../escape"), [".."], S3_ENV),
        ("train: s3 endpoint down", train(d, "s3://bucket/run"), ["127.0.0.1:9"], S3_ENV),
        # ---- fsdp-data
        ("data: out is a device node", [DATA, "prepare", "--out", dev or f.path("x"), d],
         [dev or "", "not a regular file"]) if dev else None,
        ("data: out is a directory", [DATA, "prepare", "--out", t, "/etc/hostname"], [t]),
        ("data: out is a FIFO", [DATA, "prepare", "--out", fifo, "/etc/hostname"], [fifo]),
        ("data: input missing", [DATA, "prepare", "--out", f.path("o.bin"), f.path("nope")],
         ["nope"]),
        ("data: input is a directory", [DATA, "prepare", "--out", f.path("o2.bin"), t],
         [t, "Is a directory"]),
        ("data: out is the input", [DATA, "prepare", "--out", f.path("in.txt"),
                                    f.path("in.txt")], ["in.txt", "is the input"]),
        ("data: val-out is the input, spelled otherwise", [DATA, "prepare", "--out",
                                                           f.path("o4.bin"), "--val-out",
                                                           f"{t}/./in.txt", f.path("in.txt")],
         ["--val-out", "is the input"]),
        ("data: out is a hard link to the input", [DATA, "prepare", "--out",
                                                   f.path("in-link.txt"), f.path("in.txt")],
         ["in-link.txt", "is the input"]),
        ("data: out and val-out one file", [DATA, "prepare", "--out", f.path("same.bin"),
                                            "--val-out", f"{t}/./same.bin", "/etc/hostname"],
         ["same.bin", "the same file"]),
        ("data: val fraction 2", [DATA, "prepare", "--out", f.path("o3.bin"), "--val-out",
                                  f.path("v3.bin"), "--val-fraction", "2", "/etc/hostname"],
         ["--val-fraction"], {}, (2,)),
        # ---- fsdp-ckpt, every subcommand
        ("ckpt ls: a symlinked step", [CKPT, "ls", linked], ["step-00000009", "symbolic link"]),
        ("ckpt inspect: missing step", [CKPT, "inspect", f"{f.ck}@42"], ["step-00000042"]),
        ("ckpt inspect: damaged manifest", [CKPT, "inspect", dmg], ["MANIFEST.json"]),
        ("ckpt inspect: a manifest of 100k brackets", [CKPT, "inspect", f"{big_json}@3"],
         ["MANIFEST.json"]),
        ("ckpt verify: a flipped byte", [CKPT, "verify", flipped], ["problem"]),
        ("ckpt digest: damaged manifest", [CKPT, "digest", dmg], ["MANIFEST.json"]),
        ("ckpt reshard: world size 0", [CKPT, "reshard", f.ck, f.path("r0"), "--world-size",
                                        "0"], ["--world-size"], {}, (2,)),
        ("ckpt reshard: into a step it holds", [CKPT, "reshard", f.ck, dst_ckpt,
                                                "--world-size", "2"],
         ["already holds a committed step 6"]),
        ("ckpt export: into a directory", [CKPT, "export", f.ck, t], [t]),
        ("ckpt export: into a FIFO", [CKPT, "export", f.ck, fifo], [fifo, "is a FIFO"]),
        ("ckpt export: into a device node", [CKPT, "export", f.ck, dev or f.path("x")],
         [dev or "", "character device"]) if dev else None,
        ("ckpt export: over an existing file", [CKPT, "export", f.ck, notafile],
         [notafile, "exists", "--force"]),
        ("ckpt export: llmc into a FIFO", [CKPT, "export", f.ck, fifo, "--layout", "llmc"],
         [fifo, "is a FIFO"]),
        ("ckpt export: llmc over an existing file", [CKPT, "export", f.ck, notafile, "--layout",
                                                      "llmc"], [notafile, "--force"]),
        ("ckpt verify: step 10^20", [CKPT, "verify", f"{f.ck}@99999999999999999999"],
         ["99999999999999999999", "not a step number"]),
        ("ckpt verify: step -1", [CKPT, "verify", f"{f.ck}@-1"], ["'-1'", "not a step number"]),
        # step 0 is an imported checkpoint's: a store without one says so
        ("ckpt inspect: step 0 not there", [CKPT, "inspect", f"{f.ck}@0"],
         ["step-00000000/MANIFEST.json", "not found"]),
        ("ckpt ls: a path that does not exist", [CKPT, "ls", f.path("nothing-here")],
         ["nothing-here", "no such checkpoint store"]),
        ("ckpt prune: a path that does not exist", [CKPT, "prune", f.path("nothing-here"),
                                                     "--keep", "1"],
         ["nothing-here", "no such checkpoint store"]),
        ("ckpt ls: a regular file", [CKPT, "ls", notafile], [notafile, "not a directory"]),
        ("ckpt export: a damaged source", [CKPT, "export", flipped, f.path("e.safetensors"),
                                           "--all"], ["xxh3-128 mismatch"]),
        ("ckpt import: a FIFO", [CKPT, "import", fifo, f.path("i1"), "--model", "tiny",
                                 "--world-size", "1"], [fifo, "not a regular file"]),
        ("ckpt import: truncated file", [CKPT, "import", st_trunc, f.path("i2"), "--model",
                                         "tiny", "--world-size", "1"], [st_trunc]),
        ("ckpt import: header length 10^12", [CKPT, "import", st_hdr, f.path("i3"), "--model",
                                              "tiny", "--world-size", "1"],
         [st_hdr, "header length"]),
        ("ckpt import: unknown preset", [CKPT, "import", f.st, f.path("i4"), "--model",
                                         "huge", "--world-size", "1"], ["huge"], {}, (2,)),
        ("ckpt import: header not JSON", [CKPT, "import", st_junk, f.path("i5"), "--model",
                                          "tiny", "--world-size", "1"], [st_junk, "JSON"]),
        ("ckpt cp: missing step", [CKPT, "cp", f"{f.ck}@42", f.path("cp1")], ["42"]),
        ("ckpt cp: into a store holding it", [CKPT, "cp", f"{f.ck}@6", dst_ckpt],
         ["already holds a committed step 6"]),
        ("ckpt diff: one side missing", [CKPT, "diff", f.ck, f.path("nothing")],
         ["no committed checkpoint"]),
        ("ckpt prune: keep 0", [CKPT, "prune", f.ck, "--keep", "0"], ["--keep 0"], {}, (2,)),
        ("ckpt prune: keep -1", [CKPT, "prune", f.ck, "--keep", "-1"], ["--keep"], {}, (2,)),
        ("ckpt prune: a junk generation", [CKPT, "prune", junk_gen, "--keep", "1"],
         ["not a generation claim"]),
        ("ckpt ls: s3 prefix with ..", [CKPT, "ls", "s3://bucket/a/../../x"], [".."], S3_ENV),
        ("ckpt ls: s3 without credentials", [CKPT, "ls", "s3://bucket/x"], ["credentials"],
         {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": "",
          "AWS_SHARED_CREDENTIALS_FILE": f.path("none"), "HOME": t}),
        ("ckpt verify: s3 endpoint down", [CKPT, "verify", "s3://bucket/run"], ["127.0.0.1:9"],
         S3_ENV),
        # ---- S3 servers that answer wrong (hostile_s3.py: the bucket names the fault)
        ("ckpt ls: s3 listing repeats its token", [CKPT, "ls", "s3://sametoken/run"],
         ["continuation token of page 1"], hs3),
        ("ckpt verify: s3 listing tokens in a loop", [CKPT, "verify", "s3://cycle/run"],
         ["page 3", "continuation token of page 1"], hs3),
        ("ckpt prune: s3 listing tokens in a loop", [CKPT, "prune", "s3://cycle/run", "--keep", "1"],
         ["continuation token"], hs3),
        ("train: s3 listing repeats its token", train(d, "s3://sametoken/run"),
         ["continuation token"], hs3),
        ("train: s3 listing without end", train(d, "s3://endless/run"),
         ["past 20 pages", "FSDP_S3_LIST_MAX_PAGES"], dict(hs3, FSDP_S3_LIST_MAX_PAGES="20")),
        ("ckpt ls: s3 page of 1,001 keys", [CKPT, "ls", "s3://manykeys/run"],
         ["more than the 1000 keys"], hs3),
        ("ckpt ls: s3 keys out of order", [CKPT, "ls", "s3://unsorted/run"],
         ["ascending order"], hs3),
        ("ckpt ls: s3 answer of 20 MiB", [CKPT, "ls", "s3://huge/run"],
         ["larger than the 8 MiB"], hs3),
        ("ckpt ls: s3 answer nested 20,000 deep", [CKPT, "ls", "s3://nested/run"],
         ["nests deeper than 16"], hs3),
        ("train: s3 server that keeps nothing it acknowledged", train(d, "s3://blackhole/run"),
         ["vanished after the storage acknowledged", "no newer launch"], hs3),
        ("ckpt ls: AWS_SESSION_TOKEN with CR LF", [CKPT, "ls", "s3://bucket/run"],
         ["AWS_SESSION_TOKEN", "control character"],
         dict(hs3, AWS_SESSION_TOKEN="FwoGZX\r\nx-amz-evil: 1")),
        ("ckpt ls: AWS_ACCESS_KEY_ID with LF", [CKPT, "ls", "s3://bucket/run"],
         ["AWS_ACCESS_KEY_ID", "byte 4"], dict(hs3, AWS_ACCESS_KEY_ID="AKID\nHost: x")),
        ("ckpt ls: credentials file token with ESC", [CKPT, "ls", "s3://bucket/run"],
         ["aws_session_token in the credentials file"],
         dict(hs3, AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="", AWS_PROFILE="",
              AWS_SHARED_CREDENTIALS_FILE=creds)),
        ("ckpt ls: a password in the endpoint", [CKPT, "ls", "s3://bucket/run"],
         ["http://***@127.0.0.1", "user information"],
         dict(hs3, AWS_ENDPOINT_URL=hs3["AWS_ENDPOINT_URL"].replace("//", f"//admin:{SECRET}@"))),
        ("ckpt ls: a password in a bad endpoint", [CKPT, "ls", "s3://bucket/run"],
         ["ftp://***@host"], dict(hs3, AWS_ENDPOINT_URL=f"ftp://admin:{SECRET}@host")),
        ("train: a password in --s3-endpoint", train(d, "s3://bucket/run", extra=[
            "--s3-endpoint", f"http://admin:{SECRET}@127.0.0.1:9"]), ["http://***@127.0.0.1:9"],
         hs3),
        ("ckpt ls: endpoint with a space", [CKPT, "ls", "s3://bucket/run"],
         ["AWS_ENDPOINT_URL", "space"], dict(hs3, AWS_ENDPOINT_URL="http://127.0.0.1:9 /x")),
        # ---- fsdp-super
        ("super: np 0", sup[:1] + ["--np", "0", "--"] + train(d), ["--np"], {}, (2,)),
        ("super: no trainer", sup, ["-- fsdp-train"], {}, (2,)),
        ("super: hosts file missing", [SUPER, "--hosts", f.path("nohosts"), "--"] + train(d),
         ["nohosts"]),
        ("super: hosts with 2^31 slots", [SUPER, "--hosts", hosts_big, "--"] + train(d),
         [hosts_big]),
        ("super: hosts line without a number", [SUPER, "--hosts", hosts_bad, "--"] + train(d),
         [hosts_bad]),
        ("super: hosts file is a FIFO", [SUPER, "--hosts", fifo, "--"] + train(d),
         [fifo, "a FIFO", "not a regular file"]),
        ("super: hosts file is a directory", [SUPER, "--hosts", hosts_dir, "--"] + train(d),
         [hosts_dir, "a directory", "not a regular file"]),
        ("super: hosts file is a device node", [SUPER, "--hosts", dev, "--"] + train(d),
         [dev, "a character device", "not a regular file"]) if dev else None,
        ("super: host name that is an ssh option", [SUPER, "--hosts", bad_names["dash"], "--"] +
         train(d), [bad_names["dash"] + ":1:", "'-Fevil'", "begins with '-'"]),
        ("super: host name that is an option, on line 2",
         [SUPER, "--hosts", bad_names["dash-line-2"], "--"] + train(d),
         [bad_names["dash-line-2"] + ":2:", "'-J'", "begins with '-'"]),
        ("super: host name that is ssh's ProxyCommand",
         [SUPER, "--hosts", bad_names["proxy"], "--"] + train(d),
         [bad_names["proxy"] + ":1:", "'-oProxyCommand=sh'"]),
        ("super: host name with an escape sequence",
         [SUPER, "--hosts", bad_names["escape"], "--"] + train(d),
         [bad_names["escape"] + ":1:", "'node\\x1b[31m'", "letters, digits"]),
        ("super: host name with a vertical tab", [SUPER, "--hosts", bad_names["vtab"], "--"] +
         train(d), [bad_names["vtab"] + ":1:", "'node\\x0b1'", "letters, digits"]),
        ("super: host name with a shell character",
         [SUPER, "--hosts", bad_names["shell"], "--"] + train(d),
         [bad_names["shell"] + ":1:", "'node;reboot'", "letters, digits"]),
        ("super: host name with a no-break space", [SUPER, "--hosts", bad_names["nbsp"], "--"] +
         train(d), [bad_names["nbsp"] + ":1:", "'node\\xc2\\xa0x'", "letters, digits"]),
        ("super: chaos spec", sup + ["--chaos", "kill=x", "--"] + train(d), ["--chaos"], {},
         (2,)),
        ("super: junk generation in the store", sup + ["--"] + train(d, junk_gen),
         ["not a generation claim"]),
    ]


def linked(f):
    return f.path("linked")


def every_bad_input_gives_one_line_and_keeps_every_commit(tmp):
    f = Fixture(tmp)
    table = [c for c in cases(f) if c]
    before = snapshot(f.stores)
    assert before, "the fixture committed nothing"
    failed = []
    for case in table:
        name, argv, needles = case[:3]
        env = case[3] if len(case) > 3 else {}
        codes = case[4] if len(case) > 4 else None
        try:
            p = run(argv, check=False, env=env, timeout=120)
        except subprocess.TimeoutExpired:
            failed.append(f"{name}: hung for 120 s")
            continue
        lines = error_lines(p.stderr)
        why = []
        if p.returncode == 0 or (codes and p.returncode not in codes):
            why.append(f"exit {p.returncode}")
        if len(lines) != 1:
            why.append(f"{len(lines)} lines")
        elif not all(n in lines[0] for n in needles):
            why.append(f"missing {[n for n in needles if n not in lines[0]]}")
        if SECRET in p.stdout + p.stderr:
            why.append("the secret key was printed")
        now = snapshot(f.stores)
        if {k: v for k, v in now.items() if k in before} != before:
            why.append("a committed checkpoint changed")
        print(f"  {'ok ' if not why else 'BAD'} {name}: {lines[-1] if lines else ''}"[:200])
        if why:
            failed.append(f"{name}: {', '.join(why)}\n    {p.stderr.strip()[-600:]}")
    for s in f.stores:  # (a store with a symlinked step is refused, by design)
        if s != linked(f):
            assert run([CKPT, "verify", s], check=False).returncode == 0, f"{s} fails verify"
    print(f"  {len(table)} cases, {len(failed)} failed")
    assert len(table) >= 100
    assert not failed, "\n".join(failed)


if __name__ == "__main__":
    main([every_bad_input_gives_one_line_and_keeps_every_commit])
