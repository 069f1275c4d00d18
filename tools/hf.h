/*
 * hf.h - a checkpoint as the directory Hugging Face's GPT2LMHeadModel
 * .from_pretrained(DIR) loads: config.json, model.safetensors (or shards
 * model-0000K-of-0000N.safetensors with model.safetensors.index.json).
 *
 * The layout's rules, against this trainer's own names (model.c):
 * - every name gets the "transformer." prefix (the tied lm_head is not
 *   stored: tie_word_embeddings);
 * - attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are GPT-2's
 *   Conv1D, stored (in, out): the transpose of ours (out, in), chosen by
 *   name, never by whether a shape happens to fit;
 * - wte keeps the real vocabulary's rows (config vocab_size), not the
 *   padded ones;
 * - LayerNorm epsilon 1e-5, activation gelu_new (GELU, tanh form).
 */
#ifndef FSDP_HF_H
#define FSDP_HF_H

#include "ckpt.h"

enum hf_dtype { HF_F32, HF_BF16, HF_F16 };

/* "f32" | "bf16" | "f16"; -1 if none. */
int hf_parse_dtype(const char *s, int *dtype);

/* Writes the parameters of the step r reads into dir (created if missing;
 * every file written to a temporary name, fsynced, renamed), in shards of
 * at most max_shard bytes (a larger tensor gets a shard of its own). */
int hf_export(struct ckpt_reader *r, const char *dir, int dtype, uint64_t max_shard, char *err);

#endif
