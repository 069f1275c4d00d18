/*
 * model.c - presets and the parameter layout (names, shapes, units, init).
 */
#include "model.h"

#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int model_preset(const char *name, struct model_config *cfg)
{
    static const struct {
        const char *name;
        struct model_config cfg;
    } presets[] = {
        {"tiny", {4, 128, 4, 128, 256, 256}},
        {"small", {6, 384, 6, 256, 256, 256}},
        {"gpt2-124m", {12, 768, 12, 1024, 50257, 50304}},
    };
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            *cfg = presets[i].cfg;
            return 0;
        }
    }
    return -1;
}

int model_vocab_pad(int vocab) { return vocab <= 256 ? vocab : (vocab + 63) / 64 * 64; }

int model_config_check(const struct model_config *c, char *err)
{
    if (c->layers < 1 || c->layers > 256)
        return fsdp_err(err, "model: --layers %d is out of range 1..256", c->layers);
    if (c->dim < 1 || c->dim > 16384)
        return fsdp_err(err, "model: --dim %d is out of range 1..16384", c->dim);
    if (c->heads < 1 || c->dim % c->heads)
        return fsdp_err(err, "model: --heads %d must divide --dim %d", c->heads, c->dim);
    if (c->seq < 1 || c->seq > 65536)
        return fsdp_err(err, "model: --seq %d is out of range 1..65536", c->seq);
    if (c->vocab < 2 || c->vocab > 65536)
        return fsdp_err(err, "model: vocabulary %d is out of range 2..65536", c->vocab);
    if (c->vocab_pad < c->vocab)
        return fsdp_err(err, "model: padded vocabulary %d is below vocabulary %d", c->vocab_pad,
                        c->vocab);
    return 0;
}

static void add_tensor(struct model_layout *m, int unit, const char *name, size_t rows, size_t cols,
                       int decay, float std, float value)
{
    struct model_tensor *t = &m->tensors[m->ntensors++];
    struct model_unit *u = &m->units[unit];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = cols ? rows * cols : rows;
    t->unit = unit;
    t->offset = u->numel;
    t->decay = decay;
    t->init_std = std;
    t->init_value = value;
    t->init_numel = t->numel;
    if (u->ntensors == 0)
        u->first_tensor = m->ntensors - 1;
    u->ntensors++;
    u->numel += t->numel;
    m->numel += t->numel;
}

/* A tensor of block `layer`, named "h.LAYER.SUFFIX" as GPT-2's are. */
static void add_block_tensor(struct model_layout *m, int layer, const char *suffix, size_t rows,
                             size_t cols, int decay, float std, float value)
{
    char name[MODEL_MAX_NAME];
    snprintf(name, sizeof name, "h.%d.%s", layer, suffix);
    add_tensor(m, model_unit_block(layer), name, rows, cols, decay, std, value);
}

int model_layout_init(struct model_layout *m, const struct model_config *cfg, char *err)
{
    memset(m, 0, sizeof *m);
    if (model_config_check(cfg, err))
        return -1;
    m->cfg = *cfg;
    const int L = cfg->layers;
    const size_t C = (size_t)cfg->dim;
    m->nunits = L + 2;
    m->units = calloc((size_t)m->nunits, sizeof *m->units);
    m->tensors = calloc((size_t)(2 + L * BT_COUNT + 2), sizeof *m->tensors);
    if (!m->units || !m->tensors) {
        model_layout_free(m);
        return fsdp_err(err, "model: out of memory for the layout");
    }
    /* GPT-2 initialisation: N(0, 0.02), residual projections scaled by
     * 1/sqrt(2L), biases 0, LayerNorm gains 1. */
    const float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)L);
    snprintf(m->units[0].name, MODEL_MAX_NAME, "embed");
    add_tensor(m, 0, "wte.weight", (size_t)cfg->vocab_pad, C, 1, std, 0);
    m->tensors[0].init_numel = (size_t)cfg->vocab * C; /* the padded rows: zero */
    add_tensor(m, 0, "wpe.weight", (size_t)cfg->seq, C, 1, std, 0);
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
    add_tensor(m, lnf, "ln_f.weight", C, 0, 0, 0, 1);
    add_tensor(m, lnf, "ln_f.bias", C, 0, 0, 0, 0);
    return 0;
}

void model_layout_free(struct model_layout *m)
{
    free(m->tensors);
    free(m->units);
    m->tensors = NULL;
    m->units = NULL;
}

void model_block_params(const struct model_layout *m, float *unit_base, struct block_params *p)
{
    /* Every block has the same layout, so block 0's offsets serve all. */
    const struct model_unit *u = &m->units[model_unit_block(0)];
    for (int i = 0; i < BT_COUNT; i++)
        p->t[i] = unit_base + m->tensors[u->first_tensor + i].offset;
}
