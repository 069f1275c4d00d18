/*
 * model.h - the GPT-2 style decoder's shape: configuration, presets, and the
 * layout of its parameters as named tensors grouped into FSDP units.
 *
 * Units are the granularity of sharding: unit 0 holds the embeddings (wte,
 * wpe; the output head is tied to wte), units 1..L hold one transformer block
 * each, unit L+1 holds the final LayerNorm. Inside a unit the tensors lie
 * back to back in one flat buffer, in the order listed here, so a tensor is
 * (unit, offset, numel). Names follow GPT-2 / Hugging Face conventions.
 *
 * Matrices are stored (out_features, in_features), row-major: y = x W^T + b.
 */
#ifndef FSDP_MODEL_H
#define FSDP_MODEL_H

#include <stddef.h>

struct model_config {
    int layers;    /* L */
    int dim;       /* C */
    int heads;     /* NH */
    int seq;       /* T: maximum (and training) sequence length */
    int vocab;     /* V: tokens the data may hold */
    int vocab_pad; /* Vp: rows of wte, V rounded up (64 for large vocabularies) */
};

/* Fills cfg from a preset name (tiny, small, gpt2-124m); -1 if unknown. */
int model_preset(const char *name, struct model_config *cfg);

/* Checks a configuration (heads divide dim, sizes positive and bounded). */
int model_config_check(const struct model_config *cfg, char *err);
/* wte's rows for a vocabulary: V itself up to 256, else V rounded up to 64. */
int model_vocab_pad(int vocab);

/* The tensors of one block, in unit order. */
enum block_tensor {
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

#define MODEL_MAX_NAME 48

struct model_tensor {
    char name[MODEL_MAX_NAME];
    int ndim;
    size_t shape[2];
    size_t numel;
    int unit;
    size_t offset;  /* in elements, within the unit's flat buffer */
    int decay;      /* weight decay applies (matrices and embeddings) */
    float init_std; /* 0 with init_value for norms and biases */
    float init_value;
    size_t init_numel; /* elements initialised so; the rest start at zero (wte's padded
                          rows: never looked up, no gradient, so they stay zero) */
};

struct model_unit {
    char name[MODEL_MAX_NAME];
    int first_tensor;
    int ntensors;
    size_t numel; /* logical elements, before padding */
};

struct model_layout {
    struct model_config cfg;
    int ntensors;
    struct model_tensor *tensors;
    int nunits; /* L + 2 */
    struct model_unit *units;
    size_t numel; /* all parameters */
};

int model_layout_init(struct model_layout *m, const struct model_config *cfg, char *err);
void model_layout_free(struct model_layout *m);

/* Unit indices. */
static inline int model_unit_embed(void) { return 0; }
static inline int model_unit_block(int l) { return 1 + l; }
static inline int model_unit_lnf(const struct model_layout *m) { return m->nunits - 1; }

/* Pointers to a block's tensors inside its gathered flat buffer. */
struct block_params {
    float *t[BT_COUNT];
};
void model_block_params(const struct model_layout *m, float *unit_base, struct block_params *p);

#endif
