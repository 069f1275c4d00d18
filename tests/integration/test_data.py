"""fsdp-data writes llm.c's token format; the trainer refuses files that are
not in it, are truncated, or hold tokens beyond the model's vocabulary, with
one line naming the file and the problem; llm.c's GPT-2 token files (vocab
50257) train unchanged."""

import os
import random
import struct

from harness import DATA, TRAIN, main, mpirun, read_log, run, token_file


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    header = struct.unpack("<256i", raw[:1024])
    return header, list(struct.unpack(f"<{(len(raw) - 1024) // 2}H", raw[1024:]))


def prepare_writes_llmc_format_with_end_of_text_between_documents(tmp):
    a, b = f"{tmp}/a.txt", f"{tmp}/b.txt"
    with open(a, "w") as f:
        f.write("first doc\n%\nsecond, caf\u00e9\n")
    with open(b, "w") as f:
        f.write("third")
    out = f"{tmp}/out.bin"
    run([DATA, "prepare", "--out", out, "--doc-sep", "%", a, b])
    header, toks = read_tokens(out)
    assert header[:3] == (20240520, 1, len(toks)), header[:3]
    want = [0] + list(b"first doc\n") + [0] + list("second, caf\u00e9\n".encode()) + [0] + \
        list(b"third")
    assert toks == want, toks


def validation_split_is_deterministic_and_disjoint(tmp):
    src = f"{tmp}/docs.txt"
    docs = [f"document number {i} " * 3 for i in range(400)]
    with open(src, "w") as f:
        f.write("\n%\n".join(docs))
    outs = []
    for k in range(2):
        tr, va = f"{tmp}/t{k}.bin", f"{tmp}/v{k}.bin"
        run([DATA, "prepare", "--out", tr, "--val-out", va, "--val-fraction", "0.1",
             "--doc-sep", "%", src])
        outs.append((open(tr, "rb").read(), open(va, "rb").read()))
    assert outs[0] == outs[1], "two runs gave different files"
    _, tr = read_tokens(f"{tmp}/t0.bin")
    _, va = read_tokens(f"{tmp}/v0.bin")
    split = lambda toks: [bytes(d).decode() for d in bytes(toks).split(b"\0")[1:]]
    tdocs, vdocs = split(tr), split(va)
    assert len(tdocs) + len(vdocs) == 400
    assert 20 <= len(vdocs) <= 60, f"{len(vdocs)} validation documents for a 0.1 split"
    assert not set(tdocs) & set(vdocs)


def prepare_refuses_invalid_utf8_and_nul(tmp):
    for name, data, what in (("latin1.txt", b"caf\xe9 au lait", "not valid UTF-8"),
                             ("nul.txt", b"abc\0def", "NUL byte")):
        path = f"{tmp}/{name}"
        with open(path, "wb") as f:
            f.write(data)
        p = run([DATA, "prepare", "--out", f"{tmp}/x.bin", path], check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and len(lines) == 1, p.stderr
        assert path in lines[0] and what in lines[0] and "byte 3" in lines[0], lines[0]
        assert not os.path.exists(f"{tmp}/x.bin")


def refused(tmp, path, *needles, extra=()):
    p = run([TRAIN, "--data", path, "--steps", "1"] + list(extra), check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0, f"exit {p.returncode}"
    assert len(lines) == 1, f"expected one line, got:\n{p.stderr}"
    for n in (path,) + needles:
        assert n in lines[0], f"'{n}' not in: {lines[0]}"


def trainer_refuses_bad_token_files(tmp):
    good = list(range(256)) * 20
    token_file(f"{tmp}/magic.bin", good, magic=12345)
    refused(tmp, f"{tmp}/magic.bin", "magic")
    token_file(f"{tmp}/version.bin", good, version=7)
    refused(tmp, f"{tmp}/version.bin", "version 7")
    token_file(f"{tmp}/trunc.bin", good, count=len(good) + 100)
    refused(tmp, f"{tmp}/trunc.bin", "truncated", str(len(good) + 100))
    with open(f"{tmp}/short.bin", "wb") as f:
        f.write(b"\x01\x02\x03")
    refused(tmp, f"{tmp}/short.bin", "not a token file")
    token_file(f"{tmp}/vocab.bin", good[:1000] + [300] + good)
    refused(tmp, f"{tmp}/vocab.bin", "token 300", "index 1000", "vocabulary of 256")
    refused(tmp, f"{tmp}/missing.bin", "cannot open")


def trains_on_gpt2_token_files(tmp):
    rng = random.Random(3)
    path = f"{tmp}/gpt2.bin"
    token_file(path, [rng.randrange(50257) for _ in range(20000)] + [50256])
    p = run([TRAIN, "--data", path, "--vocab", "50257", "--layers", "1", "--dim", "32",
             "--heads", "2", "--seq", "32", "--steps", "2", "--global-batch", "4",
             "--log", f"{tmp}/log.jsonl"])
    assert "V50257" in p.stderr, p.stderr
    first = [l for l in open(f"{tmp}/log.jsonl")][0]
    import json, math
    assert abs(json.loads(first)["loss"] - math.log(50257)) < 0.2
    refused(tmp, path, "outside the model's vocabulary of 256")


def token_files_in_a_store_train_as_one_file(tmp):
    """--data file://DIR/PREFIX: the token files there whose names start
    with PREFIX, back to back in name order (one empty, samples spanning
    two), read with ranged reads by the read-ahead's threads, train on 2
    ranks to the losses of one file of the same tokens; every sample comes
    from the read-ahead; the fault store (reads on one thread) reads each
    sample when it is wanted, to the same losses; ranks that found other
    data there are refused at start, and so is a store URI without a
    scheme."""
    rng = random.Random(5)
    tokens = [rng.randrange(256) for _ in range(40000)]
    token_file(f"{tmp}/whole.bin", tokens)
    os.makedirs(f"{tmp}/shards")
    for name, lo, hi in (("tr_a.bin", 0, 10001), ("tr_b.bin", 10001, 10001),
                         ("tr_c.bin", 10001, 25000), ("tr_d.bin", 25000, 40000)):
        token_file(f"{tmp}/shards/{name}", tokens[lo:hi])
    token_file(f"{tmp}/shards/val.bin", tokens[:5000])  # another prefix: left out
    common = ["--model", "tiny", "--global-batch", "8", "--steps", "10", "--log-every", "100"]

    def losses(data, log, np=2):
        p = mpirun(np, [TRAIN, "--data", data, "--log", f"{tmp}/{log}"] + common)
        return [r["loss"] for r in read_log(f"{tmp}/{log}")], p.stderr

    want, _ = losses(f"{tmp}/whole.bin", "file.jsonl")
    got, err = losses(f"file://{tmp}/shards/tr_", "store.jsonl")
    assert got == want, (got, want)
    assert "40000 tokens in a store" in err, err
    assert "took 40 samples from its read-ahead, read 0 when wanted" in err, err
    got, err = losses(f"fault:seed=1;file://{tmp}/shards/tr_", "fault.jsonl", np=1)
    want1, _ = losses(f"{tmp}/whole.bin", "file1.jsonl", np=1)
    assert got == want1 and "took 0 samples from its read-ahead, read 80 when wanted" in err, err
    # ranks that list other objects (a store changing while they start:
    # here each rank is given its own directory) are refused at start
    os.makedirs(f"{tmp}/other")
    token_file(f"{tmp}/other/tr_a.bin", tokens[:30000])
    p = run(["mpirun", "--oversubscribe", "-np", "1", TRAIN, "--data", f"file://{tmp}/shards/tr_"]
            + common + [":", "-np", "1", TRAIN, "--data", f"file://{tmp}/other/tr_"] + common,
            check=False)
    line = "rank 1 found 30000 tokens, rank 0 40000, or other bytes"
    assert p.returncode != 0 and p.stderr.count(line) == 1, p.stderr
    # a link under the prefix is named, never followed; one deeper down, or
    # under another name, is none of the data's business
    os.makedirs(f"{tmp}/shards/tr_deeper")
    os.symlink("/etc/passwd", f"{tmp}/shards/tr_deeper/x.bin")
    os.symlink("/etc/passwd", f"{tmp}/shards/zz.bin")
    got, _ = losses(f"file://{tmp}/shards/tr_", "store2.jsonl")
    assert got == want
    os.symlink(f"{tmp}/whole.bin", f"{tmp}/shards/tr_e.bin")
    p = run([TRAIN, "--data", f"file://{tmp}/shards/tr_"] + common, check=False)
    assert p.returncode != 0 and "tr_e.bin is a symbolic link, not a token file" in p.stderr, \
        p.stderr
    for uri in (f"fault:seed=1;{tmp}/shards/tr_", "fault:x"):  # no scheme inside
        p = run([TRAIN, "--data", uri] + common, check=False)
        assert p.returncode != 0 and "a store's URI is s3://BUCKET/PREFIX" in p.stderr, p.stderr


if __name__ == "__main__":
    main([prepare_writes_llmc_format_with_end_of_text_between_documents,
          validation_split_is_deterministic_and_disjoint,
          prepare_refuses_invalid_utf8_and_nul,
          trainer_refuses_bad_token_files,
          trains_on_gpt2_token_files,
          token_files_in_a_store_train_as_one_file])
