/*
 * model.c - the families' registry, the presets, the checks every family
 * shares, and the layout's allocation (the families add the tensors:
 * model_gpt2.c, model_llama.c).
 */
#include "model.h"

#include "util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct model_family model_gpt2, model_llama;

/* Adding a family: its struct here, in enum model_arch's order. */
static const struct model_family *const families[MODEL_NARCH] = {
    [MODEL_GPT2] = &model_gpt2,
    [MODEL_LLAMA] = &model_llama,
};

const struct model_family *model_family_of(int arch)
{
    return arch >= 0 && arch < MODEL_NARCH ? families[arch] : NULL;
}

int model_arch_parse(const char *name)
{
    for (int a = 0; a < MODEL_NARCH; a++)
        if (strcmp(name, families[a]->name) == 0)
            return a;
    return -1;
}

const char *model_arch_name(int arch)
{
    const struct model_family *f = model_family_of(arch);
    return f ? f->name : "?";
}

#define FIELD(name, real)                                                                          \
    {                                                                                              \
#name, real, offsetof(struct model_config, name)                                           \
    }
const struct model_field model_common_fields[] = {
    FIELD(layers, 0), FIELD(dim, 0),   FIELD(heads, 0),
    FIELD(seq, 0),    FIELD(vocab, 0), FIELD(vocab_pad, 0),
};
const int model_ncommon_fields = sizeof model_common_fields / sizeof model_common_fields[0];

static const struct {
    const char *name;
    struct model_config cfg;
} presets[] = {
    {"tiny", {.layers = 4, .dim = 128, .heads = 4, .seq = 128, .vocab = 256, .vocab_pad = 256}},
    {"small", {.layers = 6, .dim = 384, .heads = 6, .seq = 256, .vocab = 256, .vocab_pad = 256}},
    {"gpt2-124m",
     {.layers = 12, .dim = 768, .heads = 12, .seq = 1024, .vocab = 50257, .vocab_pad = 50304}},
    /* for the CPU tests: grouped-query attention (2 query heads per K/V
     * head) and an untied head */
    {"llama-tiny",
     {.arch = MODEL_LLAMA,
      .layers = 4,
      .dim = 128,
      .heads = 4,
      .kv_heads = 2,
      .ffn_dim = 384,
      .seq = 128,
      .vocab = 256,
      .vocab_pad = 256,
      .rope_theta = 10000,
      .norm_eps = 1e-5}},
    /* HuggingFaceTB/SmolLM-135M's shapes */
    {"smollm-135m",
     {.arch = MODEL_LLAMA,
      .layers = 30,
      .dim = 576,
      .heads = 9,
      .kv_heads = 3,
      .ffn_dim = 1536,
      .seq = 2048,
      .vocab = 49152,
      .vocab_pad = 49152,
      .tie_embeddings = 1,
      .rope_theta = 10000,
      .norm_eps = 1e-5}},
    /* meta-llama/Llama-3.2-1B's shapes, its RoPE scaling included */
    {"llama-1b",
     {.arch = MODEL_LLAMA,
      .layers = 16,
      .dim = 2048,
      .heads = 32,
      .kv_heads = 8,
      .ffn_dim = 8192,
      .seq = 2048,
      .vocab = 128256,
      .vocab_pad = 128256,
      .tie_embeddings = 1,
      .rope_theta = 500000,
      .norm_eps = 1e-5,
      .rope_factor = 32,
      .rope_low_freq = 1,
      .rope_high_freq = 4,
      .rope_orig_ctx = 8192}},
};
enum { NPRESETS = sizeof presets / sizeof presets[0] };

int model_preset(const char *name, struct model_config *cfg)
{
    for (int i = 0; i < NPRESETS; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            *cfg = presets[i].cfg;
            return 0;
        }
    }
    return -1;
}

const char *model_preset_names(void)
{
    static char list[256];
    if (!list[0])
        for (int i = 0; i < NPRESETS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     presets[i].name);
    return list;
}

int model_vocab_pad(int vocab) { return vocab <= 256 ? vocab : (vocab + 63) / 64 * 64; }

#define MODEL_MAX_VOCAB (1 << 24)

int model_config_check(const struct model_config *c, char *err)
{
    const struct model_family *f = model_family_of(c->arch);
    if (!f)
        return fsdp_err(err, "model: unknown family %d", c->arch);
    if (c->layers < 1 || c->layers > 256)
        return fsdp_err(err, "model: --layers %d is out of range 1..256", c->layers);
    if (c->dim < 1 || c->dim > 16384)
        return fsdp_err(err, "model: --dim %d is out of range 1..16384", c->dim);
    if (c->heads < 1 || c->dim % c->heads)
        return fsdp_err(err, "model: --heads %d must divide --dim %d", c->heads, c->dim);
    if (c->seq < 1 || c->seq > 65536)
        return fsdp_err(err, "model: --seq %d is out of range 1..65536", c->seq);
    if (c->vocab < 2 || c->vocab > MODEL_MAX_VOCAB)
        return fsdp_err(err, "model: vocabulary %d is out of range 2..%d", c->vocab,
                        MODEL_MAX_VOCAB);
    if (c->vocab_pad < c->vocab || c->vocab_pad > MODEL_MAX_VOCAB + 64)
        return fsdp_err(err, "model: padded vocabulary %d is below vocabulary %d", c->vocab_pad,
                        c->vocab);
    return f->check(c, err);
}

static int field_equal(const struct model_config *a, const struct model_config *b,
                       const struct model_field *f)
{
    const char *pa = (const char *)a + f->offset, *pb = (const char *)b + f->offset;
    if (f->real)
        return *(const double *)(const void *)pa == *(const double *)(const void *)pb;
    return *(const int *)(const void *)pa == *(const int *)(const void *)pb;
}

int model_config_equal(const struct model_config *a, const struct model_config *b)
{
    const struct model_family *f = model_family_of(a->arch);
    if (a->arch != b->arch || !f)
        return 0;
    for (int i = 0; i < model_ncommon_fields; i++)
        if (!field_equal(a, b, &model_common_fields[i]))
            return 0;
    for (int i = 0; i < f->nfields; i++)
        if (!field_equal(a, b, &f->fields[i]))
            return 0;
    return 1;
}

const char *model_config_describe(const struct model_config *c, char *buf, size_t len)
{
    const struct model_family *f = model_family_of(c->arch);
    if (!f) {
        snprintf(buf, len, "unknown family %d", c->arch);
        return buf;
    }
    int n = snprintf(buf, len, "%s ", f->name);
    if (n >= 0 && (size_t)n < len)
        f->describe(c, buf + n, len - (size_t)n);
    return buf;
}

void model_add_tensor(struct model_layout *m, int unit, const char *name, size_t rows, size_t cols,
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

int model_layout_init(struct model_layout *m, const struct model_config *cfg, char *err)
{
    memset(m, 0, sizeof *m);
    if (model_config_check(cfg, err))
        return -1;
    const struct model_family *f = model_family_of(cfg->arch);
    m->cfg = *cfg;
    const int L = cfg->layers;
    m->nunits = L + 2;
    m->units = calloc((size_t)m->nunits, sizeof *m->units);
    m->tensors = calloc((size_t)(L * f->tensors_per_block + f->other_tensors), sizeof *m->tensors);
    if (!m->units || !m->tensors) {
        model_layout_free(m);
        return fsdp_err(err, "model: out of memory for the layout");
    }
    f->layout(m);
    return 0;
}

void model_layout_free(struct model_layout *m)
{
    free(m->tensors);
    free(m->units);
    m->tensors = NULL;
    m->units = NULL;
}
