"""PyTorch baseline for tools/bench/bench_train.py's llama rows, written from
Hugging Face's modeling_llama conventions: RMSNorm (fp32 statistics, weight
only), rotary embedding with the half-split rotation (rotate_half),
grouped-query attention (K/V heads repeated, repeat_kv), SwiGLU MLP (down(silu(
gate(x)) * up(x))), no biases, a final RMSNorm, tied or untied head. Trained
with torch_gpt2.py's harness (same data, batch, AdamW, clipping, timing)."""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import add_harness_args, train  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(C)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, C, NH, KV, F_, eps):
        super().__init__()
        self.NH, self.KV, self.D = NH, KV, C // NH
        self.input_layernorm = RMSNorm(C, eps)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.q_proj = nn.Linear(C, NH * self.D, bias=False)
        self.k_proj = nn.Linear(C, KV * self.D, bias=False)
        self.v_proj = nn.Linear(C, KV * self.D, bias=False)
        self.o_proj = nn.Linear(NH * self.D, C, bias=False)
        self.gate_proj = nn.Linear(C, F_, bias=False)
        self.up_proj = nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.NH, self.D).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.KV, self.D).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.KV, self.D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.NH // self.KV  # repeat_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.D))
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, C, NH, KV, F_, T, V, tie, theta, eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, NH, KV, F_, eps) for _ in range(L))
        self.norm = RMSNorm(C, eps)
        self.lm_head = None if tie else nn.Linear(C, V, bias=False)
        D = C // NH
        inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D))
        freqs = torch.outer(torch.arange(T).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos()[None, None])
        self.register_buffer("sin", emb.sin()[None, None])
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        for name, p in self.named_parameters():  # LlamaPreTrainedModel: N(0, 0.02)
            if "norm" not in name:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        for b in self.layers:
            x = b(x, cos, sin, self.mask)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = x @ w.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    add_harness_args(ap)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--ffn-dim", type=int, required=True)
    ap.add_argument("--tie", action="store_true", help="tie the head to the embedding")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    train(Llama(a.layers, a.dim, a.heads, a.kv_heads, a.ffn_dim, a.seq, a.vocab, a.tie,
                a.rope_theta, a.norm_eps), a)


if __name__ == "__main__":
    main()
