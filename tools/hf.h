/*
 * hf.h - a checkpoint as the directory Hugging Face's
 * AutoModelForCausalLM.from_pretrained(DIR) loads: config.json,
 * model.safetensors (or shards model-0000K-of-0000N.safetensors with
 * model.safetensors.index.json). GPT-2 is GPT2LMHeadModel; the llama family
 * is LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases; MistralConfig
 * directories without a sliding window are read too).
 *
 * The llama layout's names are this trainer's own (model_llama.c), stored
 * (out, in) as nn.Linear's; the untied lm_head is stored, a tied one not.
 * q_proj and k_proj are not permuted: this trainer's RoPE is Hugging
 * Face's half-split rotate_half, so its q/k rows are HF's as they are
 * (Meta's original checkpoints interleave pairs; HF's conversion script
 * permutes those once, and so would anyone converting them for us).
 *
 * GPT-2's rules, against this trainer's own names (model_gpt2.c):
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
#include "model.h"

enum hf_dtype { HF_F32, HF_BF16, HF_F16 };

/* "f32" | "bf16" | "f16"; -1 if none. */
int hf_parse_dtype(const char *s, int *dtype);

/* Writes the parameters of the step r reads into dir (created if missing;
 * every file written to a temporary name, fsynced, renamed), in shards of
 * at most max_shard bytes (a larger tensor gets a shard of its own). */
int hf_export(struct ckpt_reader *r, const char *dir, int dtype, uint64_t max_shard, char *err);

/* The model of dir/config.json: GPT2Config's n_layer, n_embd, n_head,
 * n_positions, vocab_size (gelu_new, epsilon 1e-5 and tied embeddings or
 * refused), or LlamaConfig's (Qwen2Config's, MistralConfig's) sizes, RoPE
 * (default or llama3 scaling) and RMSNorm epsilon; every option the llama
 * family does not compute is refused by name. seq (0: none) is the length
 * to train at, in place of a llama config's max_position_embeddings. */
int hf_read_config(const char *dir, int seq, struct model_config *cfg, char *err);

/* Writes dir's parameters to out_fd as a safetensors file in this trainer's
 * layout (import's input): F32, (out, in), wte's padded rows zero. Reads
 * model.safetensors or every file model.safetensors.index.json lists; F32,
 * BF16 and F16 are widened; Conv1D weights are transposed by name. Every
 * problem (a missing, unknown, misplaced or misshapen tensor) is printed to
 * stderr as its own line before failing; nothing is written then. */
int hf_to_native(const char *dir, const struct model_layout *m, int out_fd, char *err);

#endif
