"""Other layouts. fsdp-ckpt export --layout hf, read back by a GPT-2 forward
written here in numpy from Hugging Face's conventions alone (the "transformer." names,
Conv1D weights stored (in, out), gelu_new, a head tied to wte, the epsilon
and sizes from config.json): it must give the trainer's validation loss
(f32 within 1e-5 relative, bf16 within 1e-2, f16 within 1e-3), a sharded
export's index must list every tensor once, and bad requests are refused
without writing. fsdp-ckpt export --layout llmc, read back by a reader
written here from llm.c's header and parameter-order rules: every tensor
hashes to fsdp-ckpt digest's. Both import back to the same bytes."""

import hashlib
import json
import os
import shutil
import struct

import numpy as np

from harness import CKPT, TRAIN, digest, main, mpirun, prepare_corpus, read_log, run

# a padded vocabulary (300 -> 320 rows in the trainer), so the export's cut shows
MODEL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64", "--vocab", "300"]


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out, end = {}, 0
    for name, e in head.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        buf = raw[8 + n + b:8 + n + en]
        if e["dtype"] == "F32":
            a = np.frombuffer(buf, "<f4")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            assert e["dtype"] == "F16", e
            a = np.frombuffer(buf, "<f2")
        out[name] = a.astype(np.float64).reshape(e["shape"])
        end = max(end, en)
    assert 8 + n + end == len(raw), f"{path}: bytes after the last tensor"
    return out


def load_hf(d):
    cfg = json.load(open(f"{d}/config.json"))
    if os.path.exists(f"{d}/model.safetensors"):
        files = ["model.safetensors"]
    else:
        index = json.load(open(f"{d}/model.safetensors.index.json"))
        files = sorted(set(index["weight_map"].values()))
    w = {}
    for f in files:
        part = read_safetensors(f"{d}/{f}")
        assert not set(part) & set(w), f"{f}: a tensor in two files"
        w.update(part)
    return cfg, w


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def hf_loss(cfg, w, tokens):
    """Mean cross-entropy of GPT2LMHeadModel over tokens (B, T+1), float64."""
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new"
    assert cfg["tie_word_embeddings"]
    p, nh, eps = "transformer.", cfg["n_head"], cfg["layer_norm_epsilon"]
    ids, y = tokens[:, :-1], tokens[:, 1:]
    B, T = ids.shape
    x = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][:T]
    C = x.shape[-1]
    hd = C // nh
    future = np.triu(np.ones((T, T), bool), 1)
    for l in range(cfg["n_layer"]):
        q = f"{p}h.{l}."
        h = layer_norm(x, w[q + "ln_1.weight"], w[q + "ln_1.bias"], eps)
        qkv = h @ w[q + "attn.c_attn.weight"] + w[q + "attn.c_attn.bias"]  # Conv1D: x @ W
        a, k, v = (t.reshape(B, T, nh, hd).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
        att = np.where(future, -np.inf, a @ k.transpose(0, 1, 3, 2) / np.sqrt(hd))
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + o @ w[q + "attn.c_proj.weight"] + w[q + "attn.c_proj.bias"]
        h = layer_norm(x, w[q + "ln_2.weight"], w[q + "ln_2.bias"], eps)
        h = gelu_new(h @ w[q + "mlp.c_fc.weight"] + w[q + "mlp.c_fc.bias"])
        x = x + h @ w[q + "mlp.c_proj.weight"] + w[q + "mlp.c_proj.bias"]
    x = layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    logits = x @ w[p + "wte.weight"].T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], -1).mean())


def torch_loss(cfg, w, tokens):
    """The same model in PyTorch, float32, written from Hugging Face's
    modeling_gpt2 conventions: Conv1D is addmm(bias, x, weight) with weight
    (in, out), gelu_new, LayerNorm(eps), a causal mask, lm_head = wte."""
    import torch
    import torch.nn.functional as F
    t = {k: torch.tensor(v, dtype=torch.float32) for k, v in w.items()}
    p, nh, eps = "transformer.", cfg["n_head"], cfg["layer_norm_epsilon"]

    def conv1d(x, name):
        return torch.addmm(t[name + ".bias"], x.reshape(-1, x.shape[-1]),
                           t[name + ".weight"]).reshape(*x.shape[:-1], -1)

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], t[name + ".weight"], t[name + ".bias"], eps)

    ids = torch.tensor(tokens[:, :-1])
    y = torch.tensor(tokens[:, 1:])
    B, T = ids.shape
    x = t[p + "wte.weight"][ids] + t[p + "wpe.weight"][:T]
    C = x.shape[-1]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg["n_layer"]):
        q = f"{p}h.{l}."
        a, k, v = conv1d(ln(x, q + "ln_1"), q + "attn.c_attn").split(C, dim=2)
        a, k, v = (z.view(B, T, nh, C // nh).transpose(1, 2) for z in (a, k, v))
        att = (a @ k.transpose(-1, -2)) / (C // nh) ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + conv1d((att @ v).transpose(1, 2).reshape(B, T, C), q + "attn.c_proj")
        h = F.gelu(conv1d(ln(x, q + "ln_2"), q + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(h, q + "mlp.c_proj")
    logits = ln(x, p + "ln_f") @ t[p + "wte.weight"].T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def windows(path, T, n):
    """The trainer's validation sequences on one rank: windows 0..n-1."""
    raw = open(path, "rb").read()
    count = struct.unpack("<256i", raw[:1024])[2]
    toks = np.frombuffer(raw[1024:1024 + 2 * count], "<u2").astype(np.int64)
    return np.stack([toks[i * T:i * T + T + 1] for i in range(n)])


def hf_export_gives_the_trainers_validation_loss(tmp):
    train, val = prepare_corpus(tmp)
    ck, log = f"{tmp}/ck", f"{tmp}/log.jsonl"
    run([TRAIN, "--data", train, "--val-data", val, "--val-samples", "8", "--global-batch", "8",
         "--steps", "20", "--ckpt", ck, "--log", log, "--log-every", "100"] + MODEL)
    want = [e["val_loss"] for e in read_log(log) if "val_loss" in e][-1]
    tokens = windows(val, 64, 8)
    losses = {}
    for dtype, tol in (("f32", 1e-5), ("bf16", 1e-2), ("f16", 1e-3)):
        out = f"{tmp}/hf-{dtype}"
        run([CKPT, "export", ck, out, "--layout", "hf", "--dtype", dtype])
        cfg, w = load_hf(out)
        assert cfg["vocab_size"] == 300 and cfg["n_positions"] == 64, cfg
        assert w["transformer.wte.weight"].shape == (300, 64)  # the real vocabulary's rows
        assert w["transformer.h.1.mlp.c_fc.weight"].shape == (64, 256)  # Conv1D: (in, out)
        assert "lm_head.weight" not in w and len(w) == 2 + 12 * 2 + 2
        losses[dtype] = hf_loss(cfg, w, tokens)
        rel = abs(losses[dtype] - want) / want
        print(f"  {dtype}: loss {losses[dtype]:.7f} against the trainer's {want:.7f} "
              f"(relative {rel:.1e}, bound {tol:g})")
        assert rel <= tol, (dtype, losses[dtype], want)
        try:  # the same in PyTorch where it is installed (tools/setup.sh --bench)
            import torch  # noqa: F401
        except ImportError:
            if dtype == "f32":
                print("  PyTorch: not installed here, its check skipped (numpy's above)")
            continue
        got = torch_loss(cfg, w, tokens)
        print(f"  {dtype}, PyTorch (float32): loss {got:.7f} (relative "
              f"{abs(got - want) / want:.1e})")
        assert abs(got - want) / want <= tol, (dtype, got, want)
    # in shards of at most 40 kB: an index listing every tensor once, the same loss
    out = f"{tmp}/hf-sharded"
    run([CKPT, "export", ck, out, "--layout", "hf", "--max-shard-size", "40KB"])
    index = json.load(open(f"{out}/model.safetensors.index.json"))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and not os.path.exists(f"{out}/model.safetensors"), files
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors", files
    named = [n for f in files for n in read_safetensors(f"{out}/{f}")]
    assert sorted(named) == sorted(index["weight_map"]) and len(set(named)) == len(named)
    assert all(read_safetensors(f"{out}/{index['weight_map'][n]}").get(n) is not None
               for n in named[:3])
    assert index["metadata"]["total_size"] == sum(4 * a.size for a in load_hf(out)[1].values())
    cfg, w = load_hf(out)
    assert hf_loss(cfg, w, tokens) == losses["f32"], "sharding changed a value"
    # refused, nothing written: a directory that holds something, options of the other layout
    p = run([CKPT, "export", ck, f"{tmp}/hf-f32", "--layout", "hf"], check=False)
    assert p.returncode == 1 and "not empty" in p.stderr, p.stderr
    for bad in (["--dtype", "bf16"], ["--layout", "hf", "--all"], ["--layout", "hf", "--dtype",
                                                                    "f8"]):
        p = run([CKPT, "export", ck, f"{tmp}/never"] + bad, check=False)
        assert p.returncode == 2 and not os.path.exists(f"{tmp}/never"), (bad, p.stderr)


def files_of(d):
    return {f: open(f"{d}/{f}", "rb").read() for f in sorted(os.listdir(d))}


def hf_import_and_export_again_reproduce_the_directory(tmp):
    """import --layout hf (the model from config.json) then export --layout hf
    give the same bytes, for f32 and bf16 and for a sharded directory; the
    imported step trains on; hostile directories are refused, naming the
    problem, with nothing committed."""
    train, val = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run([TRAIN, "--data", train, "--global-batch", "8", "--steps", "4", "--ckpt", ck,
         "--log-every", "100"] + MODEL)
    for dtype, extra in (("f32", []), ("bf16", []), ("f32", ["--max-shard-size", "40KB"])):
        src, again, imp = f"{tmp}/src-{dtype}{len(extra)}", f"{tmp}/again-{dtype}{len(extra)}", \
            f"{tmp}/imp-{dtype}{len(extra)}"
        run([CKPT, "export", ck, src, "--layout", "hf", "--dtype", dtype] + extra)
        p = run([CKPT, "convert", src, imp, "--layout", "hf", "--world-size", "2"])
        assert "gpt2 L2 C64 H2 T64 V300" in p.stdout, p.stdout
        run([CKPT, "export", imp, again, "--layout", "hf", "--dtype", dtype] + extra)
        assert files_of(src) == files_of(again), f"{dtype} {extra}: the re-export differs"
    # the imported model trains on (2 ranks, the padded vocabulary rows zero)
    p = mpirun(2, [TRAIN, "--data", train, "--global-batch", "8", "--steps", "6", "--ckpt",
                   f"{tmp}/imp-f320", "--log-every", "100"] + MODEL)
    assert "resumed from checkpoint step 0" in p.stderr and "done: 6 steps" in p.stderr, p.stderr
    # hostile directories: each refused with its own line, nothing committed
    good = f"{tmp}/src-f322"
    cases = []

    def case(name, edit, want):
        d = f"{tmp}/bad-{name}"
        shutil.copytree(good, d, symlinks=True)
        edit(d)
        cases.append((name, d, want))

    def index_edit(fn):
        def edit(d):
            path = f"{d}/model.safetensors.index.json"
            index = json.load(open(path))
            fn(index)
            json.dump(index, open(path, "w"))
        return edit

    names = list(json.load(open(f"{good}/model.safetensors.index.json"))["weight_map"])
    first, last = names[0], names[-1]  # last: after other files were counted
    case("escaping-index", index_edit(lambda i: i["weight_map"].update({last: "../x"})),
         "not a plain file name")
    case("misplaced", index_edit(lambda i: i["weight_map"].update(
        {first: "model-00002-of-%05d.safetensors" % len(set(i["weight_map"].values()))})),
        "the index puts it in")
    case("relu", lambda d: json.dump(dict(json.load(open(f"{d}/config.json")),
                                          activation_function="relu"),
                                     open(f"{d}/config.json", "w")), "activation_function")
    case("fifo", lambda d: (os.unlink(f"{d}/config.json"), os.mkfifo(f"{d}/config.json")),
         "config.json: not a regular file")
    def renamed(d, fn):  # every tensor name of a single-file directory through fn
        path = f"{d}/model.safetensors"
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.loads(raw[8:8 + n])
        doc = json.dumps({fn(k): v for k, v in head.items()}).encode()
        doc += b" " * (-len(doc) % 8)
        open(path, "wb").write(struct.pack("<Q", len(doc)) + doc + raw[8 + n:])

    def both(d):
        path = f"{d}/model.safetensors"
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.loads(raw[8:8 + n])
        head["wpe.weight"] = head["transformer.wpe.weight"]  # the same bytes twice
        doc = json.dumps(head).encode()
        doc += b" " * (-len(doc) % 8)
        open(path, "wb").write(struct.pack("<Q", len(doc)) + doc + raw[8 + n:])

    single = f"{tmp}/src-f320"
    # Hugging Face's cache: the snapshot's files are symlinks to blobs
    cache = f"{tmp}/cache"
    os.makedirs(f"{cache}/blobs")
    os.makedirs(f"{cache}/snapshot")
    for f in os.listdir(single):
        shutil.copy(f"{single}/{f}", f"{cache}/blobs/{f}.blob")
        os.symlink(f"../blobs/{f}.blob", f"{cache}/snapshot/{f}")
    run([CKPT, "import", f"{cache}/snapshot", f"{tmp}/imp-cache", "--layout", "hf",
         "--world-size", "1"])
    run([CKPT, "export", f"{tmp}/imp-cache", f"{tmp}/again-cache", "--layout", "hf"])
    assert files_of(single) == files_of(f"{tmp}/again-cache"), "a cache snapshot's import"
    bare = f"{tmp}/bare"  # as GPT2Model (and the Hub's gpt2) writes: no "transformer."
    shutil.copytree(single, bare)
    renamed(bare, lambda k: k.replace("transformer.", "", 1))
    run([CKPT, "import", bare, f"{tmp}/imp-bare", "--layout", "hf", "--world-size", "1"])
    run([CKPT, "export", f"{tmp}/imp-bare", f"{tmp}/again-bare", "--layout", "hf"])
    assert files_of(single) == files_of(f"{tmp}/again-bare"), "a bare-named import differs"
    good = single
    case("both-spellings", both, "a second copy")
    for name, d, want in cases:
        p = run([CKPT, "import", d, f"{tmp}/dst-{name}", "--layout", "hf", "--world-size", "1"],
                check=False)
        assert p.returncode == 1 and want in p.stderr, (name, p.stderr)
        assert not os.path.exists(f"{tmp}/dst-{name}/step-00000000/MANIFEST.json"), name
    p = run([CKPT, "import", good, f"{tmp}/dst", "--layout", "hf", "--model", "tiny",
             "--world-size", "1"], check=False)
    assert p.returncode == 2 and "--model" in p.stderr, p.stderr
    print(f"  re-export byte for byte: f32, bf16, 3 shards; {len(cases)} hostile directories "
          "refused")


LLMC_ORDER = ["wte.weight", "wpe.weight", "ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
              "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",
              "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
              "mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"]


def read_llmc(path):
    """llm.c's gpt2 model file: {name: raw bytes} in this trainer's names."""
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    assert h[0] == 20240326 and h[1] in (3, 5), h[:2]
    maxT, V, L, NH, C, Vp = h[2:8]
    n = {"wte.weight": Vp * C, "wpe.weight": maxT * C, "ln_1.weight": C, "ln_1.bias": C,
         "attn.c_attn.weight": 3 * C * C, "attn.c_attn.bias": 3 * C, "attn.c_proj.weight": C * C,
         "attn.c_proj.bias": C, "ln_2.weight": C, "ln_2.bias": C, "mlp.c_fc.weight": 4 * C * C,
         "mlp.c_fc.bias": 4 * C, "mlp.c_proj.weight": 4 * C * C, "mlp.c_proj.bias": C,
         "ln_f.weight": C, "ln_f.bias": C}
    es, at, out = 4 if h[1] == 3 else 2, 1024, {}
    for name in LLMC_ORDER:
        layers = 1 if name in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias") else L
        for l in range(layers):
            out[name if layers == 1 else f"h.{l}.{name}"] = raw[at:at + n[name] * es]
            at += n[name] * es
    assert at == len(raw), f"{path}: {len(raw) - at} bytes after the parameters"
    return h, out


def llmc_export_hashes_to_the_digest_and_imports_back(tmp):
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run([TRAIN, "--data", train, "--global-batch", "8", "--steps", "3", "--ckpt", ck,
         "--log-every", "100"] + MODEL)
    digests = {k[0]: v for k, v in digest(ck).items() if k[1] == "param"}
    run([CKPT, "export", ck, f"{tmp}/m.bin", "--layout", "llmc"])
    h, t = read_llmc(f"{tmp}/m.bin")
    assert h[1:8] == (3, 64, 300, 2, 2, 64, 320), h[1:8]  # version, maxT, V, L, NH, C, Vp
    assert sorted(t) == sorted(digests), sorted(set(t) ^ set(digests))
    bad = [k for k in t if hashlib.sha256(t[k]).hexdigest() != digests[k]]
    assert not bad, f"tensors whose bytes differ from the digest's: {bad}"
    # the padded vocabulary rows start at zero and stay zero, moments too
    assert t["wte.weight"][300 * 64 * 4:] == bytes(20 * 64 * 4), "padded wte rows moved"
    run([CKPT, "export", ck, f"{tmp}/all.safetensors", "--all"])
    every = read_safetensors(f"{tmp}/all.safetensors")
    for name in ("wte.weight", "optim.exp_avg.wte.weight", "optim.exp_avg_sq.wte.weight"):
        assert every[name].shape == (320, 64) and not every[name][300:].any(), name
        assert every[name][:300].any(), name
    run([CKPT, "convert", ck, f"{tmp}/h.bin", "--layout", "llmc", "--dtype", "bf16"])
    hb, tb = read_llmc(f"{tmp}/h.bin")
    assert hb[1] == 5 and hb[2:8] == h[2:8]
    for k in t:  # bf16: f32 rounded to nearest even
        u = np.frombuffer(t[k], "<u4").astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        assert (np.frombuffer(tb[k], "<u2") == want).all(), k
    for name in ("m.bin", "h.bin"):
        imp, again = f"{tmp}/imp-{name}", f"{tmp}/again-{name}"
        p = run([CKPT, "import", f"{tmp}/{name}", imp, "--layout", "llmc", "--world-size", "3"])
        assert "gpt2 L2 C64 H2 T64 V300" in p.stdout, p.stdout
        run([CKPT, "export", imp, again, "--layout", "llmc"] +
            (["--dtype", "bf16"] if name == "h.bin" else []))
        assert open(f"{tmp}/{name}", "rb").read() == open(again, "rb").read(), name
    # refused: a cut file, another magic, a header past the bounds, f16
    raw = open(f"{tmp}/m.bin", "rb").read()
    hdr = list(struct.unpack("<256i", raw[:1024]))
    cases = {"cut": raw[:-4], "magic": struct.pack("<256i", *([1] + hdr[1:])) + raw[1024:],
             "layers": struct.pack("<256i", *(hdr[:4] + [1 << 20] + hdr[5:])) + raw[1024:]}
    for name, blob in cases.items():
        open(f"{tmp}/{name}.bin", "wb").write(blob)
        p = run([CKPT, "import", f"{tmp}/{name}.bin", f"{tmp}/dst-{name}", "--layout", "llmc",
                 "--world-size", "1"], check=False)
        assert p.returncode == 1 and f"{name}.bin" in p.stderr, (name, p.stderr)
        assert not os.path.exists(f"{tmp}/dst-{name}"), name
    p = run([CKPT, "export", ck, f"{tmp}/f16.bin", "--layout", "llmc", "--dtype", "f16"],
            check=False)
    assert p.returncode == 2 and not os.path.exists(f"{tmp}/f16.bin"), p.stderr


def native_import_takes_any_model_shape(tmp):
    """import of this trainer's own safetensors for a model no preset has:
    its sizes given as fsdp-train takes them; a wrong size is named."""
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run([TRAIN, "--data", train, "--global-batch", "8", "--steps", "2", "--ckpt", ck,
         "--log-every", "100"] + MODEL)
    run([CKPT, "export", ck, f"{tmp}/m.safetensors"])
    p = run([CKPT, "convert", f"{tmp}/m.safetensors", f"{tmp}/imp", "--world-size", "2"] +
            MODEL)
    assert "model custom (gpt2 L2 C64 H2 T64 V300)" in p.stdout, p.stdout
    want, got = digest(ck), digest(f"{tmp}/imp")
    assert all(got[k] == want[k] for k in want if k[1] == "param")
    p = run([CKPT, "import", f"{tmp}/m.safetensors", f"{tmp}/bad", "--world-size", "1"] +
            MODEL[:-1] + ["256"], check=False)
    assert p.returncode == 1 and "wte.weight: shape [320, 64], model custom expects [256, 64]" \
        in p.stderr, p.stderr


if __name__ == "__main__":
    main([hf_export_gives_the_trainers_validation_loss,
          hf_import_and_export_again_reproduce_the_directory,
          llmc_export_hashes_to_the_digest_and_imports_back,
          native_import_takes_any_model_shape])
