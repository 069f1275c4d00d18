"""Token datasets in HDF5 files (issue 36): a file h5py writes (any integer
type, chunked and compressed) trains exactly as the token file of the same
tokens does, on one rank and on two, and resumes at the same cursor;
fsdp-data prepare --format hdf5 writes a file h5py reads back token for
token; a bad HDF5 file or dataset is refused with one line naming the file
and what is wrong. h5py is Debian's python3-h5py; nothing here uses our
code to write what our code reads."""

import os

import h5py
import numpy as np

from harness import (CKPT, DATA, TRAIN, digest, fortune_files, main, mpirun, prepare_corpus,
                     read_log, run, token_file)
from test_data import read_tokens, refused

ARGS = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64", "--global-batch", "4",
        "--threads", "1"]


def h5(path, data, name="tokens", dtype=None, chunks=True, compression="gzip"):
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=np.asarray(data, dtype=dtype), chunks=chunks,
                         compression=compression)


def losses(log):
    return [(r["step"], r["loss"]) for r in read_log(log) if "loss" in r]


def an_hdf5_dataset_trains_as_its_token_file(tmp):
    train, _ = prepare_corpus(tmp)
    _, toks = read_tokens(train)
    ds = f"{tmp}/train.h5"
    h5(ds, toks, name="corpus/ids", dtype=np.int32)  # a group, another type, gzip chunks
    for np_ in (1, 2):
        logs = []
        for data in (train, ds):
            log = f"{tmp}/log-{np_}-{os.path.basename(data)}.jsonl"
            args = ARGS + ["--data", data, "--steps", "12", "--log", log, "--log-every", "1"]
            if data == ds:
                args += ["--h5-dataset", "corpus/ids"]
            mpirun(np_, [TRAIN] + args) if np_ > 1 else run([TRAIN] + args)
            logs.append(losses(log))
        assert logs[0] == logs[1] and len(logs[0]) == 12, (np_, logs)
    # resumed at the same cursor: 6 steps, then on to 12, equals 12 at once
    whole, split = f"{tmp}/whole", f"{tmp}/split"
    common = ARGS + ["--data", ds, "--h5-dataset", "corpus/ids", "--ckpt-every", "6"]
    mpirun(2, [TRAIN] + common + ["--steps", "12", "--ckpt", whole])
    mpirun(2, [TRAIN] + common + ["--steps", "12", "--ckpt", split, "--stop-at-step", "6"])
    p = mpirun(2, [TRAIN] + common + ["--steps", "12", "--ckpt", split])
    assert "resumed from checkpoint step 6" in p.stderr, p.stderr[-2000:]
    assert digest(whole) == digest(split), "a resume on an HDF5 dataset changed the bits"
    print(f"  int32 gzip-chunked dataset in a group: the token file's {len(logs[0])} losses "
          f"on 1 and 2 ranks; a resume at step 6 gives the uninterrupted digest")


def prepare_writes_an_hdf5_file_h5py_reads(tmp):
    for dtype in ("uint16", "uint32"):
        b, h = f"{tmp}/t-{dtype}.bin", f"{tmp}/t-{dtype}.h5"
        common = ["--doc-sep", "%", "--token-dtype", dtype] + fortune_files()[:2]
        run([DATA, "prepare", "--out", b] + common)
        run([DATA, "prepare", "--out", h, "--format", "hdf5", "--h5-dataset", "toks"] + common)
        with h5py.File(h) as f:
            d = f["toks"]
            assert d.ndim == 1 and d.dtype == np.dtype(dtype) and d.chunks, (d, d.chunks)
            got = d[:]
        want = np.fromfile(b, dtype=np.dtype(dtype), offset=1024)
        assert np.array_equal(got, want), dtype
    p = run([DATA, "prepare", "--out", f"{tmp}/x.bin", "--h5-dataset", "a"] + fortune_files()[:1],
            check=False)
    assert p.returncode != 0 and "--format hdf5" in p.stderr, p.stderr
    os.mkfifo(f"{tmp}/fifo.h5")
    p = run([DATA, "prepare", "--out", f"{tmp}/fifo.h5", "--format", "hdf5"] +
            fortune_files()[:1], check=False)
    assert p.returncode != 0 and "FIFO" in p.stderr, p.stderr
    print(f"  uint16 and uint32 datasets, chunked, equal to the token files' tokens; a FIFO "
          f"as --out refused")


def bad_hdf5_files_are_one_line(tmp):
    good = list(range(256)) * 20
    h5(f"{tmp}/float.h5", np.array(good, dtype=np.float32))
    refused(tmp, f"{tmp}/float.h5", "dataset 'tokens'", "integers")
    h5(f"{tmp}/2d.h5", np.array(good, dtype=np.int32).reshape(-1, 2))
    refused(tmp, f"{tmp}/2d.h5", "2 dimensions")
    h5(f"{tmp}/name.h5", good, name="ids", dtype=np.int16)
    refused(tmp, f"{tmp}/name.h5", "no dataset 'tokens'", "--h5-dataset")
    refused(tmp, f"{tmp}/name.h5", "no dataset 'nope'", extra=["--h5-dataset", "nope"])
    h5(f"{tmp}/neg.h5", good[:700] + [-3] + good, dtype=np.int64)
    refused(tmp, f"{tmp}/neg.h5", "token -3", "index 700")
    h5(f"{tmp}/vocab.h5", good[:1000] + [300] + good, dtype=np.uint32, compression=None)
    refused(tmp, f"{tmp}/vocab.h5", "token 300", "index 1000", "vocabulary of 256")
    with open(f"{tmp}/float.h5", "rb") as f:
        head = f.read(600)
    with open(f"{tmp}/trunc.h5", "wb") as f:  # the signature and a cut superblock
        f.write(head)
    refused(tmp, f"{tmp}/trunc.h5", "not a readable HDF5 file")
    os.mkfifo(f"{tmp}/fifo.h5")  # never opened for reading: open() would hang
    refused(tmp, f"{tmp}/fifo.h5", "FIFO")
    h5(f"{tmp}/tiny.h5", [0, 1, 2], dtype=np.uint8)
    refused(tmp, f"{tmp}/tiny.h5", "hold no sample")
    print("  float, 2-D, misnamed, negative, out-of-vocabulary, truncated, a FIFO and too "
          "short: one line each")


if __name__ == "__main__":
    main([an_hdf5_dataset_trains_as_its_token_file,
          prepare_writes_an_hdf5_file_h5py_reads,
          bad_hdf5_files_are_one_line])
