/*
 * model_llama.c - the Llama family: its configuration's rules and its
 * parameters' layout and initialisation (model_llama.h; the passes are
 * model_llama_pass.c).
 */
#include "model_llama.h"

#include "util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>

static int llama_check(const struct model_config *c, char *err)
{
    if (c->kv_heads < 1 || c->kv_heads > c->heads || c->heads % c->kv_heads)
        return fsdp_err(err, "model: --kv-heads %d must divide --heads %d", c->kv_heads, c->heads);
    if ((c->dim / c->heads) % 2)
        return fsdp_err(err,
                        "model: a head of %d channels (--dim %d / --heads %d) is odd; RoPE "
                        "rotates channel pairs",
                        c->dim / c->heads, c->dim, c->heads);
    if (c->ffn_dim < 1 || c->ffn_dim > (1 << 18))
        return fsdp_err(err, "model: --ffn-dim %d is out of range 1..%d", c->ffn_dim, 1 << 18);
    if (!(c->rope_theta >= 1 && c->rope_theta <= 1e12))
        return fsdp_err(err, "model: --rope-theta %g is out of range 1..1e12", c->rope_theta);
    if (!(c->norm_eps > 0 && c->norm_eps <= 0.1))
        return fsdp_err(err, "model: --norm-eps %g is out of range (0, 0.1]", c->norm_eps);
    if ((c->tie_embeddings != 0 && c->tie_embeddings != 1) ||
        (c->attn_bias != 0 && c->attn_bias != 1))
        return fsdp_err(err, "model: tie_embeddings and attn_bias are 0 or 1");
    if (c->rope_factor != 0 &&
        !(c->rope_factor >= 1 && c->rope_factor <= 1024 && c->rope_low_freq > 0 &&
          c->rope_high_freq > c->rope_low_freq && c->rope_high_freq <= 1024 &&
          c->rope_orig_ctx >= 1 && c->rope_orig_ctx <= (1 << 24)))
        return fsdp_err(err, "model: llama3 RoPE scaling needs factor in 1..1024, 0 < "
                             "low_freq_factor < high_freq_factor <= 1024 and an original "
                             "context of 1..2^24");
    if (c->rope_factor == 0 && (c->rope_low_freq || c->rope_high_freq || c->rope_orig_ctx))
        return fsdp_err(err, "model: llama3 RoPE scaling's settings without its factor");
    return 0;
}

static void add_block_tensor(struct model_layout *m, int layer, const char *suffix, size_t rows,
                             size_t cols, int decay, float std, float value)
{
    char name[MODEL_MAX_NAME];
    snprintf(name, sizeof name, "model.layers.%d.%s", layer, suffix);
    model_add_tensor(m, model_unit_block(layer), name, rows, cols, decay, std, value);
    m->tensors[m->ntensors - 1].twin_only = cols > 0; /* the matrices: products' weights */
}

static void llama_layout(struct model_layout *m)
{
    const struct model_config *c = &m->cfg;
    const size_t C = (size_t)c->dim, hs = C / (size_t)c->heads, F = (size_t)c->ffn_dim;
    const size_t Q = (size_t)c->heads * hs, KV = (size_t)c->kv_heads * hs;
    const size_t V = (size_t)c->vocab, Vp = (size_t)c->vocab_pad;
    /* Hugging Face's LlamaPreTrainedModel: N(0, initializer_range 0.02)
     * for every matrix and the embedding, norms' weights 1, biases 0 */
    const float std = 0.02f;
    snprintf(m->units[0].name, MODEL_MAX_NAME, "embed");
    model_add_tensor(m, 0, "model.embed_tokens.weight", Vp, C, 1, std, 0);
    m->tensors[0].init_numel = V * C; /* the padded rows: zero */
    for (int l = 0; l < c->layers; l++) {
        snprintf(m->units[model_unit_block(l)].name, MODEL_MAX_NAME, "layers.%d", l);
        add_block_tensor(m, l, "input_layernorm.weight", C, 0, 0, 0, 1);
        add_block_tensor(m, l, "self_attn.q_proj.weight", Q, C, 1, std, 0);
        add_block_tensor(m, l, "self_attn.k_proj.weight", KV, C, 1, std, 0);
        add_block_tensor(m, l, "self_attn.v_proj.weight", KV, C, 1, std, 0);
        if (c->attn_bias) {
            add_block_tensor(m, l, "self_attn.q_proj.bias", Q, 0, 0, 0, 0);
            add_block_tensor(m, l, "self_attn.k_proj.bias", KV, 0, 0, 0, 0);
            add_block_tensor(m, l, "self_attn.v_proj.bias", KV, 0, 0, 0, 0);
        }
        add_block_tensor(m, l, "self_attn.o_proj.weight", C, Q, 1, std, 0);
        add_block_tensor(m, l, "post_attention_layernorm.weight", C, 0, 0, 0, 1);
        add_block_tensor(m, l, "mlp.gate_proj.weight", F, C, 1, std, 0);
        add_block_tensor(m, l, "mlp.up_proj.weight", F, C, 1, std, 0);
        add_block_tensor(m, l, "mlp.down_proj.weight", C, F, 1, std, 0);
    }
    const int fin = model_unit_lnf(m);
    snprintf(m->units[fin].name, MODEL_MAX_NAME, "norm");
    model_add_tensor(m, fin, "model.norm.weight", C, 0, 0, 0, 1);
    m->head_tensor = 0;
    if (!c->tie_embeddings) {
        model_add_tensor(m, fin, "lm_head.weight", Vp, C, 1, std, 0);
        m->head_tensor = m->ntensors - 1;
        m->tensors[m->head_tensor].init_numel = V * C;
        m->tensors[m->head_tensor].twin_only = 1; /* untied: the head's product alone reads it */
    }
    size_t wide = Q + 2 * KV > 2 * F ? Q + 2 * KV : 2 * F;
    m->widest_row = wide > C ? wide : C;
}

void llama_block_offsets(const struct model_layout *m, size_t off[BL_COUNT])
{
    const int bias = m->cfg.attn_bias;
    for (int i = 0, t = 0; i < BL_COUNT; i++) {
        const int is_bias = i == BL_Q_BIAS || i == BL_K_BIAS || i == BL_V_BIAS;
        off[i] =
            is_bias && !bias ? (size_t)-1 : model_unit_tensor(m, model_unit_block(0), t++)->offset;
    }
}

static void llama_describe(const struct model_config *c, char *buf, size_t len)
{
    int n = snprintf(buf, len, "L%d C%d H%d KV%d F%d T%d V%d %s theta %g eps %g", c->layers, c->dim,
                     c->heads, c->kv_heads, c->ffn_dim, c->seq, c->vocab,
                     c->tie_embeddings ? "tied" : "untied", c->rope_theta, c->norm_eps);
    if (n > 0 && (size_t)n < len && c->attn_bias)
        n += snprintf(buf + n, len - (size_t)n, " qkv-bias");
    if (n > 0 && (size_t)n < len && c->rope_factor)
        snprintf(buf + n, len - (size_t)n, " rope-llama3 x%g", c->rope_factor);
}

#define FIELD(name, real)                                                                          \
    {                                                                                              \
#name, real, offsetof(struct model_config, name)                                           \
    }
static const struct model_field llama_fields[] = {
    FIELD(kv_heads, 0),      FIELD(ffn_dim, 0),       FIELD(tie_embeddings, 0),
    FIELD(attn_bias, 0),     FIELD(rope_theta, 1),    FIELD(norm_eps, 1),
    FIELD(rope_factor, 1),   FIELD(rope_low_freq, 1), FIELD(rope_high_freq, 1),
    FIELD(rope_orig_ctx, 0),
};

const struct model_family model_llama = {
    .name = "llama",
    .check = llama_check,
    .layout = llama_layout,
    .tensors_per_block = BL_COUNT,
    .other_tensors = 3,
    .describe = llama_describe,
    .fields = llama_fields,
    .nfields = sizeof llama_fields / sizeof llama_fields[0],
};
