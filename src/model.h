/*
 * model.h - the model's shape: configuration, presets, model families, and
 * the layout of the parameters as named tensors grouped into FSDP units.
 *
 * A model family (GPT-2, Llama) is a set of files: model_FAMILY.c says its
 * configuration's checks, its tensors and their initialisation (this
 * header's struct model_family, registered in model.c), and
 * model_FAMILY_pass.c its forward and backward passes (fsdp_family.h,
 * registered in model_passes.c). The FSDP engine, the checkpoints and the
 * supervisor know nothing of families: they see units of named tensors.
 *
 * Every family lays its units out the same way: unit 0 holds the token
 * embedding (and whatever else the input needs: GPT-2's position
 * embedding), units 1..L one transformer block each, unit L+1 the final
 * norm (and an untied output head). Inside a unit the tensors lie back to
 * back in one flat buffer, in the order the family adds them, so a tensor is
 * (unit, offset, numel). Every block has the same tensors, in the same order.
 *
 * Matrices are stored (out_features, in_features), row-major: y = x W^T + b.
 */
#ifndef FSDP_MODEL_H
#define FSDP_MODEL_H

#include <stddef.h>

/* The registered families (model.c's table, in this order). */
enum model_arch { MODEL_GPT2, MODEL_LLAMA, MODEL_NARCH };

struct model_config {
    int arch;      /* enum model_arch: 0 (GPT-2) where nothing says otherwise */
    int layers;    /* L */
    int dim;       /* C */
    int heads;     /* NH */
    int seq;       /* T: maximum (and training) sequence length */
    int vocab;     /* V: tokens the data may hold */
    int vocab_pad; /* Vp: rows of the embedding (and head), V rounded up (64 for large V) */
    /* Llama family (0 elsewhere) */
    int kv_heads;       /* KVH: heads of K and V (grouped-query attention); heads: MHA */
    int ffn_dim;        /* F: SwiGLU's hidden width */
    int tie_embeddings; /* the output head is the token embedding */
    int attn_bias;      /* q, k and v projections have biases (Qwen2) */
    double rope_theta;  /* RoPE's base */
    double norm_eps;    /* RMSNorm's epsilon */
    /* RoPE's "llama3" frequency scaling (Llama 3.1+); factor 0: none */
    double rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx; /* original_max_position_embeddings */
};

/* Fills cfg from a preset name; -1 if unknown. */
int model_preset(const char *name, struct model_config *cfg);
/* The preset names, ", "-separated, for messages and --help. */
const char *model_preset_names(void);

/* Checks a configuration (its family's rules: heads divide dim, sizes
 * positive and bounded, ...); the message names the flag at fault. */
int model_config_check(const struct model_config *cfg, char *err);
/* wte's rows for a vocabulary: V itself up to 256, else V rounded up to 64. */
int model_vocab_pad(int vocab);
/* A one-line description, "gpt2 L4 C128 H4 T128 V256" or "llama L4 C128 H4
 * KV2 F384 T128 V256 untied theta 10000 eps 1e-05": what banners and
 * refusals print. */
const char *model_config_describe(const struct model_config *cfg, char *buf, size_t len);
/* Two configurations describe the same model (every field that family
 * reads is equal). */
int model_config_equal(const struct model_config *a, const struct model_config *b);

/* --arch's names: "gpt2", "llama"; -1 if unknown. */
int model_arch_parse(const char *name);
const char *model_arch_name(int arch);

#define MODEL_MAX_NAME 64

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
    /* bf16: the passes read it only through its bf16 twin (fsdp_twin16: a
     * product's weight), so a gather need not widen it to fp32 */
    int twin_only;
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
    size_t numel;      /* all parameters */
    int head_tensor;   /* the output head: its first Vp rows are the logits' weights */
    size_t widest_row; /* the widest output row of a block's products (bf16 scratch) */
};

int model_layout_init(struct model_layout *m, const struct model_config *cfg, char *err);
void model_layout_free(struct model_layout *m);

/* Unit indices. */
static inline int model_unit_embed(void) { return 0; }
static inline int model_unit_block(int l) { return 1 + l; }
static inline int model_unit_lnf(const struct model_layout *m) { return m->nunits - 1; }

/* Tensor i of unit u. */
static inline const struct model_tensor *model_unit_tensor(const struct model_layout *m, int u,
                                                           int i)
{
    return &m->tensors[m->units[u].first_tensor + i];
}

/* ---- families ------------------------------------------------------------------ */

/* A field of struct model_config as the manifest's "model" object holds it
 * (model_ckpt.c), compared on resume (model_config_equal). */
struct model_field {
    const char *key;
    int real; /* double, else int */
    size_t offset;
};

/* What a family says of itself (model_gpt2.c, model_llama.c). */
struct model_family {
    const char *name; /* --arch, and the manifest's "arch" */
    /* The family's rules for a configuration (model_config_check calls it
     * after the common ones). */
    int (*check)(const struct model_config *c, char *err);
    /* Adds the tensors, unit by unit, with model_add_tensor; sets
     * head_tensor and widest_row. Units and tensors are allocated for
     * model_family_counts' numbers. */
    void (*layout)(struct model_layout *m);
    /* Tensors per block and outside them, for the allocation. */
    int tensors_per_block, other_tensors;
    /* The configuration's description after "NAME " (model_config_describe). */
    void (*describe)(const struct model_config *c, char *buf, size_t len);
    /* Its fields beyond the common ones (layers, dim, heads, seq, vocab,
     * vocab_pad): what the manifest records and a resume compares. */
    const struct model_field *fields;
    int nfields;
};

/* The fields every family has. */
extern const struct model_field model_common_fields[];
extern const int model_ncommon_fields;

const struct model_family *model_family_of(int arch);

/* For the families' layouts: a tensor appended to unit u. */
void model_add_tensor(struct model_layout *m, int unit, const char *name, size_t rows, size_t cols,
                      int decay, float std, float value);

#endif
