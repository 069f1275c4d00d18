"""The llama family in Hugging Face's layout, checked by a Llama forward
written here in numpy from modeling_llama's conventions alone (the
model.layers.N names, nn.Linear weights (out, in), RMSNorm in float32 with
its weight after, rotate_half RoPE with inv_freq = theta^(-2i/d) and
Llama 3.1's frequency scaling, repeat_kv for grouped-query attention,
silu(gate) * up, an untied or tied lm_head, every size from config.json):
- export: the numpy loss of the exported directory equals the trainer's
  validation loss (f32 within 1e-5 relative, bf16 1e-2, f16 1e-3);
- import: a Qwen2 directory written here (q/k/v biases, tied head, llama3
  RoPE scaling, bf16, sharded with an index, reached through a symlinked
  snapshot as Hugging Face's cache lays it out) trains, with learning rate
  0, to the numpy loss of its weights, and exports back the same values;
- config.json options the family does not compute are refused by name,
  nothing written; a truncated file, one bad data_offsets entry, pickled
  weights only and index entries no file holds are each named."""

import json
import os

import numpy as np

from harness import CKPT, TRAIN, main, mpirun, prepare_corpus, read_log, run
from test_formats import load_hf

SIZES = ["--arch", "llama", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2",
         "--ffn-dim", "96", "--seq", "64", "--vocab", "300"]  # 300 -> 320 padded rows


def inv_freq(cfg, hd):
    f = cfg.get("rope_theta", 10000.0) ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.get("rope_scaling")
    if not rs or rs.get("rope_type", rs.get("type")) == "default":
        return f
    assert rs["rope_type"] == "llama3", rs
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * np.pi / f
    scaled = np.where(wavelen > old / lo, f / factor, f)
    smooth = (old / wavelen - lo) / (hi - lo)
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def llama_loss(cfg, w, tokens):
    """Mean cross-entropy of LlamaForCausalLM (Qwen2ForCausalLM) over tokens
    (B, T+1), float64."""
    assert cfg.get("hidden_act", "silu") == "silu"
    nh, kvh = cfg["num_attention_heads"], cfg.get("num_key_value_heads",
                                                  cfg["num_attention_heads"])
    C, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    hd = C // nh
    ids, y = tokens[:, :-1], tokens[:, 1:]
    B, T = ids.shape
    x = w["model.embed_tokens.weight"][ids]
    ang = np.arange(T)[:, None] * inv_freq(cfg, hd)[None, :]
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb), np.sin(emb)
    future = np.triu(np.ones((T, T), bool), 1)

    def lin(h, name):
        out = h @ w[name + ".weight"].T
        return out + w[name + ".bias"] if name + ".bias" in w else out

    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj").reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
        k = lin(h, p + "self_attn.k_proj").reshape(B, T, kvh, hd).transpose(0, 2, 1, 3)
        v = lin(h, p + "self_attn.v_proj").reshape(B, T, kvh, hd).transpose(0, 2, 1, 3)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, nh // kvh, axis=1), np.repeat(v, nh // kvh, axis=1)  # repeat_kv
        att = np.where(future, -np.inf, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd))
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, nh * hd)
        x = x + lin(o, p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = lin(h, p + "mlp.gate_proj")
        x = x + lin(g / (1 + np.exp(-g)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    logits = x @ head.T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], -1).mean())


def windows(path, T, n):
    raw = open(path, "rb").read()
    count = np.frombuffer(raw[:12], "<i4")[2]
    toks = np.frombuffer(raw[1024:1024 + 2 * count], "<u2").astype(np.int64)
    return np.stack([toks[i * T:i * T + T + 1] for i in range(n)])


def export_gives_the_trainers_validation_loss(tmp):
    train, val = prepare_corpus(tmp)
    ck, log = f"{tmp}/ck", f"{tmp}/log.jsonl"
    run([TRAIN, "--data", train, "--val-data", val, "--val-samples", "8", "--global-batch", "8",
         "--steps", "20", "--ckpt", ck, "--log", log, "--log-every", "100"] + SIZES)
    want = [e["val_loss"] for e in read_log(log) if "val_loss" in e][-1]
    tokens = windows(val, 64, 8)
    for dtype, tol in (("f32", 1e-5), ("bf16", 1e-2), ("f16", 1e-3)):
        out = f"{tmp}/hf-{dtype}"
        run([CKPT, "export", ck, out, "--layout", "hf", "--dtype", dtype])
        cfg, w = load_hf(out)
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
        assert cfg["num_key_value_heads"] == 2 and cfg["vocab_size"] == 300, cfg
        assert w["model.embed_tokens.weight"].shape == (300, 64)  # the real vocabulary's rows
        assert w["lm_head.weight"].shape == (300, 64)
        assert w["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)  # (out, in)
        assert w["model.layers.0.mlp.down_proj.weight"].shape == (64, 96)
        assert len(w) == 3 + 9 * 2, sorted(w)
        got = llama_loss(cfg, w, tokens)
        rel = abs(got - want) / want
        print(f"  {dtype}: loss {got:.7f} against the trainer's {want:.7f} (relative {rel:.1e},"
              f" bound {tol:g})")
        assert rel <= tol, (dtype, got, want)


def bf16_bytes(a):
    u = np.asarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()  # nearest even


def write_safetensors(path, tensors):
    head, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        b = bf16_bytes(a)
        head[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
        "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "vocab_size": 256, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "tie_word_embeddings": True,
        "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 4096,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "torch_dtype": "bfloat16"}


def qwen_weights(cfg):
    rng = np.random.default_rng(5)
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = C // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C)),
         "model.norm.weight": 1 + rng.normal(0, 0.1, C)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for name, shape in (("self_attn.q_proj.weight", (C, C)), ("self_attn.k_proj.weight",
                            (kv, C)), ("self_attn.v_proj.weight", (kv, C)),
                            ("self_attn.q_proj.bias", (C,)), ("self_attn.k_proj.bias", (kv,)),
                            ("self_attn.v_proj.bias", (kv,)), ("self_attn.o_proj.weight", (C, C)),
                            ("mlp.gate_proj.weight", (F, C)), ("mlp.up_proj.weight", (F, C)),
                            ("mlp.down_proj.weight", (C, F))):
            w[p + name] = rng.normal(0, 0.3 if "bias" not in name else 0.5, shape)
        w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
    # the values as bf16 holds them: what the file says exactly
    return {k: np.frombuffer(bf16_bytes(v), "<u2").astype(np.uint32).__lshift__(16)
            .view(np.float32).astype(np.float64).reshape(v.shape) for k, v in w.items()}


def hub_snapshot(tmp, cfg, w):
    """A directory as huggingface_hub's cache lays it out: snapshots/REV/
    holds symlinks to blobs/; two shards and an index."""
    blobs, snap = f"{tmp}/hub/blobs", f"{tmp}/hub/snapshots/abc123"
    os.makedirs(blobs)
    os.makedirs(snap)
    names = sorted(w)
    half = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for i, (file, part) in enumerate(half.items()):
        write_safetensors(f"{blobs}/blob{i}", {n: w[n] for n in part})
        os.symlink(f"../../blobs/blob{i}", f"{snap}/{file}")
    json.dump({"metadata": {}, "weight_map": {n: f for f, part in half.items() for n in part}},
              open(f"{blobs}/index", "w"))
    os.symlink("../../blobs/index", f"{snap}/model.safetensors.index.json")
    json.dump(cfg, open(f"{blobs}/config", "w"))
    os.symlink("../../blobs/config", f"{snap}/config.json")
    return snap


def import_trains_from_the_imported_weights(tmp):
    train, val = prepare_corpus(tmp)
    w = qwen_weights(QWEN)
    snap = hub_snapshot(tmp, QWEN, w)
    ck = f"{tmp}/ck"
    p = run([CKPT, "import", snap, ck, "--layout", "hf", "--seq", "64", "--world-size", "2"])
    assert "llama L2 C64 H4 KV1 F80 T64 V256 tied theta 500000 eps 1e-06 qkv-bias rope-llama3 x8" \
        in p.stdout, p.stdout
    log = f"{tmp}/log.jsonl"
    flags = ["--arch", "llama", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "1",
             "--ffn-dim", "80", "--seq", "64", "--vocab", "256", "--rope-theta", "500000",
             "--norm-eps", "1e-6", "--tie-embeddings", "on", "--attn-bias", "on",
             "--rope-scaling", "llama3:8,1,4,64"]
    # learning rate 0: the step leaves the weights as imported; the
    # validation loss after it is theirs
    mpirun(2, [TRAIN, "--data", train, "--val-data", val, "--val-samples", "8", "--steps", "1",
               "--lr", "0", "--ckpt", ck, "--log", log, "--global-batch", "2"] + flags)
    got = [e["val_loss"] for e in read_log(log) if "val_loss" in e][-1]
    want = llama_loss(QWEN, w, windows(val, 64, 8))
    rel = abs(got - want) / want
    print(f"  imported Qwen2 (bf16, tied, q/k/v biases, llama3 RoPE): trainer {got:.7f}, numpy "
          f"{want:.7f} (relative {rel:.1e})")
    assert rel <= 1e-5, (got, want)
    out = f"{tmp}/again"
    run([CKPT, "export", ck, out, "--layout", "hf", "--dtype", "bf16"])
    cfg, w2 = load_hf(out)
    assert cfg["model_type"] == "qwen2" and cfg["rope_scaling"]["factor"] == 8, cfg
    assert sorted(w2) == sorted(w) and all(np.array_equal(w2[k], w[k]) for k in w), \
        [k for k in w if not np.array_equal(w2[k], w[k])][:3]


def unsupported_options_are_refused_by_name(tmp):
    w = qwen_weights(QWEN)
    base = dict(QWEN, model_type="llama", architectures=["LlamaForCausalLM"])
    base.pop("use_sliding_window")
    cases = [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
        ({"attention_bias": True}, "attention_bias is not false"),
        ({"mlp_bias": True}, "mlp_bias is not false"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"head_dim": 32}, "head_dim must be hidden_size / num_attention_heads (16)"),
        ({"num_key_value_heads": 3}, "--kv-heads 3 must divide --heads 4"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window is not false"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window is set"),
        ({"model_type": "gemma"}, "model_type 'gemma' is not one this trainer reads"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor is not 1"),
        ({"max_position_embeddings": 131072}, "give import --seq N"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be an integer"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be a number"),
    ]
    for i, (change, needle) in enumerate(cases):
        d = f"{tmp}/bad{i}"
        os.makedirs(d)
        write_safetensors(f"{d}/model.safetensors", w)
        json.dump(dict(base, **change), open(f"{d}/config.json", "w"))
        seq = [] if "max_position_embeddings" in change else ["--seq", "64"]
        p = run([CKPT, "import", d, f"{tmp}/never{i}", "--layout", "hf", "--world-size", "1"]
                + seq, check=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert p.returncode != 0 and needle in p.stderr and len(lines) == 1, (change, p.stderr)
        assert not os.path.exists(f"{tmp}/never{i}"), change
    # the head a tied config.json does not have, and an untied one's missing head
    d = f"{tmp}/untied"
    os.makedirs(d)
    write_safetensors(f"{d}/model.safetensors", w)
    json.dump(dict(base, tie_word_embeddings=False), open(f"{d}/config.json", "w"))
    p = run([CKPT, "import", d, f"{tmp}/never", "--layout", "hf", "--seq", "64", "--world-size",
             "1"], check=False)
    assert p.returncode != 0 and "lm_head.weight: missing" in p.stderr, p.stderr
    assert "q_proj.bias: not a tensor of the llama layout" in p.stderr, p.stderr


def import_names_what_is_wrong(tmp):
    """One line per problem, naming the entry at fault; nothing imported."""
    w = qwen_weights(QWEN)

    def attempt(d):
        p = run([CKPT, "import", d, f"{tmp}/never", "--layout", "hf", "--seq", "64",
                 "--world-size", "1"], check=False)
        assert p.returncode != 0 and not os.path.exists(f"{tmp}/never"), p.stderr
        return p.stderr

    def fresh(name):
        d = f"{tmp}/{name}"
        os.makedirs(d)
        json.dump(QWEN, open(f"{d}/config.json", "w"))
        write_safetensors(f"{d}/model.safetensors", w)
        return d

    d = fresh("truncated")
    size = os.path.getsize(f"{d}/model.safetensors")
    os.truncate(f"{d}/model.safetensors", size - 100)
    err = attempt(d)
    assert "truncated: its data ends at byte" in err, err
    # one entry's span is 2 bytes long: it, not its neighbour, is named
    d = fresh("offset")
    raw = open(f"{d}/model.safetensors", "rb").read()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + n])
    victim = sorted((k for k in head if k != "__metadata__"),
                    key=lambda k: head[k]["data_offsets"][0])[3]
    head[victim]["data_offsets"][1] += 2
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    open(f"{d}/model.safetensors", "wb").write(len(h).to_bytes(8, "little") + h + raw[8 + n:])
    err = attempt(d)
    named = [l for l in err.splitlines() if "data_offsets span" in l]
    others = [l for l in err.splitlines() if victim not in l and "problem" not in l]
    assert len(named) == 1 and victim in named[0] and not others, (victim, err)
    # pickled weights only
    d = f"{tmp}/pickled"
    os.makedirs(d)
    json.dump(QWEN, open(f"{d}/config.json", "w"))
    open(f"{d}/pytorch_model.bin", "wb").write(b"PK\x03\x04")
    err = attempt(d)
    assert "pickled PyTorch weights (pytorch_model.bin)" in err and "safetensors" in err, err
    # an index entry no file holds
    d = f"{tmp}/index"
    os.makedirs(d)
    json.dump(QWEN, open(f"{d}/config.json", "w"))
    write_safetensors(f"{d}/a.safetensors", w)
    wm = {k: "a.safetensors" for k in w}
    wm["model.layers.9.mlp.up_proj.weight"] = "a.safetensors"
    json.dump({"weight_map": wm}, open(f"{d}/model.safetensors.index.json", "w"))
    err = attempt(d)
    assert "model.layers.9.mlp.up_proj.weight: the index lists it, the file does not hold it" \
        in err, err


if __name__ == "__main__":
    main([export_gives_the_trainers_validation_loss, import_trains_from_the_imported_weights,
          unsupported_options_are_refused_by_name, import_names_what_is_wrong])
