/*
 * model_llama.h - the Llama family's block, as its layout (model_llama.c)
 * lays it out and its passes (model_llama_pass.c) read it.
 *
 * Llama (Llama 2/3, Mistral, SmolLM; Qwen2 with attention biases): a token
 * embedding (no position embedding), pre-norm blocks with RMSNorm, rotary
 * position embedding on q and k (HF's half-split rotation), grouped-query
 * attention (kv_heads K/V heads, each shared by heads/kv_heads query heads),
 * a SwiGLU MLP (down(silu(gate x) * up x)), a final RMSNorm, an output head
 * tied to the embedding or not. Names are Hugging Face's LlamaForCausalLM's,
 * so an hf export or import renames nothing.
 *
 * The projections that read the same input lie back to back, so each group
 * is one product: q, k and v (and their biases) are one (NH+2KVH)hs x C
 * matrix whose output row is [q | k | v]; gate and up one 2F x C matrix
 * whose output row is [gate | up].
 */
#ifndef FSDP_MODEL_LLAMA_H
#define FSDP_MODEL_LLAMA_H

#include "model.h"

/* The tensors of one block, in unit order; the biases only with
 * attn_bias (else NULL in struct llama_block). */
enum llama_block_tensor {
    BL_IN_NORM,
    BL_Q,
    BL_K,
    BL_V,
    BL_Q_BIAS,
    BL_K_BIAS,
    BL_V_BIAS,
    BL_O,
    BL_POST_NORM,
    BL_GATE,
    BL_UP,
    BL_DOWN,
    BL_COUNT
};

/* Where block tensors lie in a unit's flat buffer: BL_COUNT offsets, or
 * (size_t)-1 for the biases a model without attn_bias has not. */
void llama_block_offsets(const struct model_layout *m, size_t off[BL_COUNT]);

#endif
