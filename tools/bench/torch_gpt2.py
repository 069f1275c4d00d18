"""PyTorch baseline for tools/bench/bench_train.py: the same GPT-2 model
(pre-LN blocks, causal attention, GELU (tanh) MLP, tied head, AdamW, global
norm clipping) trained on the same token file with the same batch, on the
CPU with a given number of threads. Prints one JSON line with the median
tokens/s over the measured steps. The harness (flags, data, optimizer, loop)
is shared with torch_llama.py."""

import argparse
import json
import math
import statistics
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        for name, p in self.named_parameters():  # GPT-2 initialisation, as fsdp-train
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def add_harness_args(ap):
    """The flags every baseline takes: data, batch, steps, threads, bf16."""
    ap.add_argument("--data", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="forward under CPU bf16 autocast")


def train(model, a):
    """fsdp-train's loop for one model: AdamW (lr 1e-3, betas .9/.95, weight
    decay .1), global-norm clipping at 1.0, random windows of the token file;
    prints the JSON line bench_train.py reads."""
    raw = open(a.data, "rb").read()
    hdr = struct.unpack("<256i", raw[:1024])
    n = hdr[2]
    if hdr[0] == 20240801:  # uint32 tokens
        toks = torch.frombuffer(bytearray(raw[1024:1024 + 4 * n]), dtype=torch.int32).long()
    else:
        toks = torch.frombuffer(bytearray(raw[1024:1024 + 2 * n]),
                                dtype=torch.int16).long() & 0xFFFF
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    nseq = (n - 1) // a.seq
    g = torch.Generator().manual_seed(1)
    rates = []
    for step in range(a.steps):
        idx = torch.randint(nseq, (a.batch,), generator=g) * a.seq
        x = torch.stack([toks[i:i + a.seq] for i in idx])
        y = torch.stack([toks[i + 1:i + 1 + a.seq] for i in idx])
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup_steps:
            rates.append(a.batch * a.seq / dt)
    print(json.dumps({"tokens_per_s": statistics.median(rates), "torch": torch.__version__,
                      "threads": a.threads, "last_loss": loss.item(), "bf16": a.bf16}))


def main():
    ap = argparse.ArgumentParser()
    add_harness_args(ap)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    train(GPT(a.layers, a.dim, a.heads, a.seq, a.vocab), a)


if __name__ == "__main__":
    main()
