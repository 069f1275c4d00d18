"""Resharding: a checkpoint written by N ranks loads on any M (offline with
fsdp-ckpt reshard, or by resuming on M ranks) with the same digest and the
same next losses; the sample stream goes on without repeats or gaps; each
rank reads about its own share; safetensors export passes a reader written
here from the format's rules and round-trips through import."""

import hashlib
import glob
import json
import os
import shutil
import struct

from harness import (CKPT, TRAIN, committed_steps, digest, kill_job, launch, main, mpirun,
                     prepare_corpus, read_log, run, slow, wait_stopped_or_exit)

G = 12  # divisible by 1, 2, 3 and 4
TOL = 1e-4


def args(data, ck, log, steps=20, every=10, extra=()):
    return [TRAIN, "--data", data, "--model", "tiny", "--global-batch", str(G), "--steps",
            str(steps), "--ckpt", ck, "--ckpt-every", str(every), "--log", log,
            "--log-every", "1000"] + list(extra)


def stop_after_commit(np, argv, nth=1):
    p = launch(np, argv, {"FSDP_TEST_STOP_AT": f"after-commit:{nth}"})
    assert wait_stopped_or_exit(p), "the run did not reach the commit"
    kill_job(p)


def losses(log, first, last):
    by_step = {s["step"]: s["loss"] for s in read_log(log)}
    return [by_step[i] for i in range(first, last + 1)]


@slow
def any_n_to_any_m_keeps_digest_and_next_losses(tmp):
    data, _ = prepare_corpus(tmp)
    worlds = (1, 2, 3, 4)
    for n in worlds:
        ref_log = f"{tmp}/ref{n}.jsonl"
        mpirun(n, args(data, f"{tmp}/ref{n}", ref_log))
        cont = losses(ref_log, 11, 20)
        src = f"{tmp}/src{n}"
        stop_after_commit(n, args(data, src, f"{tmp}/src{n}.jsonl"))
        assert committed_steps(src) == [10]
        want = digest(src)
        for m in worlds:
            off = f"{tmp}/off{n}{m}"
            run([CKPT, "reshard", src, off, "--world-size", str(m)])
            assert digest(off) == want, f"offline {n}->{m}: digest changed"
            res, log = f"{tmp}/res{n}{m}", f"{tmp}/res{n}{m}.jsonl"
            shutil.copytree(src, res)
            p = mpirun(m, args(data, res, log))
            if m != n:
                assert f"resharding step 10 from {n} to {m} ranks" in p.stderr, p.stderr
            got = losses(log, 11, 20)
            rel = max(abs(a - b) / abs(b) for a, b in zip(got, cont))
            print(f"  {n} -> {m} ranks: digest equal, next 10 losses within {rel:.1e}")
            assert rel <= TOL, f"{n}->{m}: {rel:.2e}"
            if (n, m) in ((3, 2), (1, 4)):  # the offline copy trains identically
                log2 = f"{tmp}/off{n}{m}.jsonl"
                mpirun(m, args(data, off, log2))
                assert losses(log2, 11, 20) == got, f"{n}->{m}: offline and online differ"


def another_strategy_resumes_the_same_training(tmp):
    data, _ = prepare_corpus(tmp)
    mpirun(2, args(data, f"{tmp}/ref", f"{tmp}/ref.jsonl"))
    cont = losses(f"{tmp}/ref.jsonl", 11, 20)
    src = f"{tmp}/src"
    stop_after_commit(2, args(data, src, f"{tmp}/src.jsonl"))
    for shard, np in (("none", 2), ("grad-op", 3)):
        res, log = f"{tmp}/{shard}", f"{tmp}/{shard}.jsonl"
        shutil.copytree(src, res)
        mpirun(np, args(data, res, log, extra=["--shard", shard]))
        got = losses(log, 11, 20)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, cont))
        print(f"  full on 2 ranks -> {shard} on {np}: next 10 losses within {rel:.1e}")
        assert rel <= TOL
    # a no-shard checkpoint is written once (world 1), whatever the ranks
    last = run([CKPT, "ls", f"{tmp}/none"]).stdout.splitlines()[-1].split()
    assert last[1] == "committed" and last[2] == "1", last


def sample_stream_survives_two_reshards(tmp):
    data, _ = prepare_corpus(tmp)
    steps = 12
    ref_log = f"{tmp}/ref.jsonl"
    mpirun(2, args(data, f"{tmp}/ref", ref_log, steps, 4, ["--log-samples", "on"]))
    want = {s["step"]: s["samples"] for s in read_log(ref_log)}
    ck, log = f"{tmp}/ck", f"{tmp}/ck.jsonl"
    a = args(data, ck, log, steps, 4, ["--log-samples", "on"])
    stop_after_commit(2, a)       # steps 1-4 on 2 ranks
    stop_after_commit(3, a)       # steps 5-8 on 3 ranks
    mpirun(4, a)                  # steps 9-12 on 4 ranks
    got = {}
    for s in read_log(log):
        got.setdefault(s["step"], s["samples"])
    assert sorted(got) == list(range(1, steps + 1)), sorted(got)
    assert got == want, [i for i in want if want[i] != got[i]]
    flat = [x for i in sorted(got) for x in got[i]]
    assert len(flat) == len(set(flat)) == steps * G, "a sample repeated"


def each_rank_reads_about_its_share(tmp):
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    chunk = 16 * 1024
    extra = ["--compress", "none", "--ckpt-chunk-kib", str(chunk // 1024)]
    stop_after_commit(2, args(data, ck, f"{tmp}/a.jsonl", extra=extra))
    for m in (3, 4, 1):
        res = f"{tmp}/res{m}"
        shutil.copytree(ck, res)
        p = mpirun(m, args(data, res, f"{tmp}/b{m}.jsonl", extra=extra))
        line = [l for l in p.stderr.splitlines() if "loading step 10 read" in l][0]
        words = line.split()
        per_rank = [int(x) for x in words[words.index("read") + 1:words.index("bytes")]]
        stored = int(words[words.index("of") + 1])
        sections = 6 * 3  # tiny: 6 units x 3 state kinds
        for r, got in enumerate(per_rank):
            share = stored / m
            print(f"  {m} ranks: rank {r} read {got} bytes, its share is {share:.0f}")
            # at most one partial chunk at each end of each (unit, kind) range
            assert got <= share + 2 * sections * chunk, f"rank {r} read {got}"
            assert got >= share - 2 * sections * 4 * 64, f"rank {r} read too little: {got}"


def read_safetensors(path):
    """A reader written from the format's rules, independent of fsdp-ckpt."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header not padded to a multiple of 8"
    text = raw[8:8 + n].decode("utf-8")
    assert text == text.rstrip(" ") + " " * (len(text) - len(text.rstrip(" "))), "bad padding"
    header = json.loads(text)
    meta = header.pop("__metadata__")
    assert meta.get("format") == "pt", meta
    assert all(isinstance(v, str) for v in meta.values()), "metadata values must be strings"
    data = raw[8 + n:]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    at = 0
    for b, e, k in spans:
        assert b == at, f"{k}: gap or overlap at {at}"
        info = header[k]
        assert info["dtype"] == "F32", k
        count = 1
        for d in info["shape"]:
            count *= d
        assert e - b == 4 * count, f"{k}: {e - b} bytes for shape {info['shape']}"
        at = e
    assert at == len(data), "data beyond the last tensor"
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()}


def safetensors_export_reads_back_and_round_trips(tmp):
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    mpirun(3, args(data, ck, f"{tmp}/a.jsonl", steps=4, every=4))
    dig = digest(ck)
    out, out_all = f"{tmp}/model.safetensors", f"{tmp}/all.safetensors"
    run([CKPT, "export", ck, out])
    run([CKPT, "export", ck, out_all, "--all"])
    tensors = read_safetensors(out)
    params = {name for name, kind in dig if kind == "param"}
    assert set(tensors) == params, set(tensors) ^ params
    for name, blob in tensors.items():
        assert hashlib.sha256(blob).hexdigest() == dig[(name, "param")], name
    every = read_safetensors(out_all)
    for (name, kind), sha in dig.items():
        key = name if kind == "param" else f"optim.{kind}.{name}"
        assert hashlib.sha256(every[key]).hexdigest() == sha, key
    imp = f"{tmp}/imported"
    run([CKPT, "import", out, imp, "--model", "tiny", "--world-size", "2"])
    again = f"{tmp}/again.safetensors"
    run([CKPT, "export", imp, again])
    assert open(again, "rb").read() == open(out, "rb").read(), "import + export changed bytes"
    zero = {k: v for k, v in digest(imp).items() if k[1] != "param"}
    zeros = {name: hashlib.sha256(bytes(len(tensors[name]))).hexdigest() for name in tensors}
    assert all(sha == zeros[name] for (name, _), sha in zero.items()), "optimizer not fresh"
    # and training starts from it
    p = mpirun(2, args(data, imp, f"{tmp}/b.jsonl", steps=2, every=2))
    assert "resumed from checkpoint step 0" in p.stderr, p.stderr


def import_reports_every_mismatch(tmp):
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    mpirun(1, args(data, ck, f"{tmp}/a.jsonl", steps=2, every=2))
    out = f"{tmp}/m.safetensors"
    run([CKPT, "export", ck, out])
    dst = f"{tmp}/dst"
    p = run([CKPT, "import", out, dst, "--model", "small", "--world-size", "2"], check=False)
    lines = p.stderr.strip().splitlines()
    shape_lines = [l for l in lines if ": shape [" in l and "small expects" in l]
    assert p.returncode == 1, p.returncode
    assert len(shape_lines) == 2 + 4 * 12 + 2, len(shape_lines)  # every tiny tensor differs
    assert any("missing (model small has it)" in l for l in lines), lines[-5:]
    assert lines[-1].endswith("nothing imported"), lines[-1]
    assert not os.path.exists(dst) or committed_steps(dst) == []
    raw = bytearray(open(out, "rb").read())
    raw[0:8] = struct.pack("<Q", len(raw))  # header length beyond the file
    bad = f"{tmp}/bad.safetensors"
    open(bad, "wb").write(raw)
    p = run([CKPT, "import", bad, dst, "--model", "tiny", "--world-size", "1"], check=False)
    assert p.returncode == 1 and "does not fit" in p.stderr, p.stderr


def reshard_of_a_damaged_checkpoint_fails_and_commits_nothing(tmp):
    data, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    mpirun(2, args(data, ck, f"{tmp}/a.jsonl", steps=2, every=2, extra=["--ckpt-chunk-kib",
                                                                        "64"]))
    shard, = glob.glob(f"{ck}/step-00000002/shard-00000-of-00002.*")
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x80]))
    dst = f"{tmp}/dst"
    p = run([CKPT, "reshard", ck, dst, "--world-size", "3"], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert f"{os.path.basename(shard)}: chunk" in lines[0] and "xxh3-128 mismatch" in lines[0], lines
    assert not os.path.exists(dst) or not [f for _, _, fs in os.walk(dst) for f in fs], \
        "files left in the destination"


if __name__ == "__main__":
    main([sample_stream_survives_two_reshards,
          another_strategy_resumes_the_same_training,
          each_rank_reads_about_its_share,
          safetensors_export_reads_back_and_round_trips,
          import_reports_every_mismatch,
          reshard_of_a_damaged_checkpoint_fails_and_commits_nothing,
          any_n_to_any_m_keeps_digest_and_next_losses])
