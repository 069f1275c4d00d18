/*
 * model_gpt2.h - the GPT-2 family's block, as its layout (model_gpt2.c)
 * lays it out and its passes (model_gpt2_pass.c) read it.
 *
 * GPT-2: token + position embeddings, pre-LN blocks with causal multi-head
 * self-attention and a GELU MLP, a final LayerNorm, the output head tied to
 * the token embedding. Names follow GPT-2 / Hugging Face conventions.
 */
#ifndef FSDP_MODEL_GPT2_H
#define FSDP_MODEL_GPT2_H

/* The tensors of one block, in unit order. */
enum gpt2_block_tensor {
    BT_LN1_W,
    BT_LN1_B,
    BT_QKV_W,
    BT_QKV_B,
    BT_ATTPROJ_W,
    BT_ATTPROJ_B,
    BT_LN2_W,
    BT_LN2_B,
    BT_FC_W,
    BT_FC_B,
    BT_FCPROJ_W,
    BT_FCPROJ_B,
    BT_COUNT
};

#endif
