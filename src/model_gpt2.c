/*
 * model_gpt2.c - the GPT-2 family: its configuration's rules and its
 * parameters' layout and initialisation (model_gpt2.h; the passes are
 * model_gpt2_pass.c).
 */
#include "model_gpt2.h"
#include "model.h"

#include "util.h"

#include <math.h>
#include <stdio.h>

static int gpt2_check(const struct model_config *c, char *err)
{
    if (c->kv_heads || c->ffn_dim || c->tie_embeddings || c->attn_bias || c->rope_theta ||
        c->norm_eps || c->rope_factor)
        return fsdp_err(err, "model: the gpt2 family has no kv-heads, ffn-dim, rope or RMSNorm "
                             "settings (they are the llama family's: --arch llama)");
    return 0;
}

/* A tensor of block `layer`, named "h.LAYER.SUFFIX" as GPT-2's are. */
static void add_block_tensor(struct model_layout *m, int layer, const char *suffix, size_t rows,
                             size_t cols, int decay, float std, float value)
{
    char name[MODEL_MAX_NAME];
    snprintf(name, sizeof name, "h.%d.%s", layer, suffix);
    model_add_tensor(m, model_unit_block(layer), name, rows, cols, decay, std, value);
    m->tensors[m->ntensors - 1].twin_only = cols > 0; /* the matrices: products' weights */
}

static void gpt2_layout(struct model_layout *m)
{
    const struct model_config *cfg = &m->cfg;
    const int L = cfg->layers;
    const size_t C = (size_t)cfg->dim;
    /* GPT-2 initialisation: N(0, 0.02), residual projections scaled by
     * 1/sqrt(2L), biases 0, LayerNorm gains 1. */
    const float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)L);
    snprintf(m->units[0].name, MODEL_MAX_NAME, "embed");
    model_add_tensor(m, 0, "wte.weight", (size_t)cfg->vocab_pad, C, 1, std, 0);
    m->tensors[0].init_numel = (size_t)cfg->vocab * C; /* the padded rows: zero */
    model_add_tensor(m, 0, "wpe.weight", (size_t)cfg->seq, C, 1, std, 0);
    for (int l = 0; l < L; l++) {
        snprintf(m->units[model_unit_block(l)].name, MODEL_MAX_NAME, "h.%d", l);
        add_block_tensor(m, l, "ln_1.weight", C, 0, 0, 0, 1);
        add_block_tensor(m, l, "ln_1.bias", C, 0, 0, 0, 0);
        add_block_tensor(m, l, "attn.c_attn.weight", 3 * C, C, 1, std, 0);
        add_block_tensor(m, l, "attn.c_attn.bias", 3 * C, 0, 0, 0, 0);
        add_block_tensor(m, l, "attn.c_proj.weight", C, C, 1, res_std, 0);
        add_block_tensor(m, l, "attn.c_proj.bias", C, 0, 0, 0, 0);
        add_block_tensor(m, l, "ln_2.weight", C, 0, 0, 0, 1);
        add_block_tensor(m, l, "ln_2.bias", C, 0, 0, 0, 0);
        add_block_tensor(m, l, "mlp.c_fc.weight", 4 * C, C, 1, std, 0);
        add_block_tensor(m, l, "mlp.c_fc.bias", 4 * C, 0, 0, 0, 0);
        add_block_tensor(m, l, "mlp.c_proj.weight", C, 4 * C, 1, res_std, 0);
        add_block_tensor(m, l, "mlp.c_proj.bias", C, 0, 0, 0, 0);
    }
    int lnf = model_unit_lnf(m);
    snprintf(m->units[lnf].name, MODEL_MAX_NAME, "ln_f");
    model_add_tensor(m, lnf, "ln_f.weight", C, 0, 0, 0, 1);
    model_add_tensor(m, lnf, "ln_f.bias", C, 0, 0, 0, 0);
    m->head_tensor = 0; /* tied: wte */
    m->widest_row = 4 * C;
}

static void gpt2_describe(const struct model_config *c, char *buf, size_t len)
{
    snprintf(buf, len, "L%d C%d H%d T%d V%d", c->layers, c->dim, c->heads, c->seq, c->vocab);
}

const struct model_family model_gpt2 = {
    .name = "gpt2",
    .check = gpt2_check,
    .layout = gpt2_layout,
    .tensors_per_block = BT_COUNT,
    .other_tensors = 4,
    .describe = gpt2_describe,
};
