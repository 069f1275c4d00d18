/*
 * hf.c - export to and import from Hugging Face's GPT-2 and Llama layouts
 * (see hf.h).
 *
 * Each tensor is read whole through the checkpoint reader (verified
 * chunks, any world size), put in the layout (transposed, the vocabulary
 * cut), converted to the dtype and written; the largest is GPT-2 124M's
 * embedding, 154 MB. Narrowing rounds to nearest, ties to even, as
 * PyTorch's .to(torch.bfloat16) and .to(torch.float16) do.
 */
#include "hf.h"

#include "model_ckpt.h"
#include "safetensors.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name, *st, *torch;
    int size;
} dtypes[] = {[HF_F32] = {"f32", "F32", "float32", 4},
              [HF_BF16] = {"bf16", "BF16", "bfloat16", 2},
              [HF_F16] = {"f16", "F16", "float16", 2}};

int hf_parse_dtype(const char *s, int *dtype)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, dtypes[i].name) == 0) {
            *dtype = i;
            return 0;
        }
    return -1;
}

/* One tensor of the layout: where it comes from and what it becomes. */
struct hf_tensor {
    char name[96];
    int unit;
    uint64_t offset;     /* in the unit's parameters */
    uint64_t rows, cols; /* what is read (rows x cols, row-major); cols 0: 1-D */
    int transpose;       /* a Conv1D weight: stored (cols, rows) */
    uint64_t bytes;
    int shard;
};

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

static int is_conv1d(const char *name)
{
    return ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_proj.weight") ||
           ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_proj.weight");
}

/* Our tensor's name in the layout: GPT-2's get "transformer.", Llama's are
 * Hugging Face's already. */
static const char *hf_prefix(const struct model_config *c)
{
    return c->arch == MODEL_GPT2 ? "transformer." : "";
}

/* Stored (in, out), the transpose of ours: GPT-2's Conv1D weights, by name. */
static int hf_transposed(const struct model_config *c, const struct model_tensor *t)
{
    return c->arch == MODEL_GPT2 && t->ndim == 2 && is_conv1d(t->name);
}

/* The rows the layout holds: the real vocabulary's for the embedding and
 * an untied head (the padded rows stay behind), all of them elsewhere. */
static uint64_t hf_rows(const struct model_tensor *t)
{
    return t->init_numel < t->numel ? t->init_numel / t->shape[1] : t->shape[0];
}

static int write_json(const char *dir, const char *name, json_t *doc, char *err)
{
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    char path[4096];
    struct fsdp_outfile o;
    if (!text) {
        fsdp_err(err, "%s: out of memory", name);
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = fsdp_outfile_open(&o, path, 0, err);
    if (!rc)
        rc = fsdp_outfile_close(&o,
                                fsdp_outfile_write(&o, text, strlen(text), err) == 0 &&
                                    fsdp_outfile_write(&o, "\n", 1, err) == 0,
                                err);
    free(text);
    return rc;
}

/* The tensor in the layout's order and dtype, into dst. */
static int convert(struct ckpt_reader *r, const struct hf_tensor *t, int dtype, float *src,
                   float *tr, unsigned char *dst, char *err)
{
    uint64_t n = t->rows * (t->cols ? t->cols : 1);
    if (ckpt_read_unit(r, t->unit, CKPT_PARAM, t->offset, n, src, err))
        return -1;
    const float *v = src;
    if (t->transpose) {
        for (uint64_t i = 0; i < t->rows; i++)
            for (uint64_t j = 0; j < t->cols; j++)
                tr[j * t->rows + i] = src[i * t->cols + j];
        v = tr;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (dtype == HF_F32) {
            memcpy(dst + 4 * i, &v[i], 4); /* little-endian hosts only, as the checkpoints */
        } else {
            uint16_t h = dtype == HF_BF16 ? fsdp_bf16_round(v[i]) : fsdp_fp16_round(v[i]);
            dst[2 * i] = (unsigned char)h;
            dst[2 * i + 1] = (unsigned char)(h >> 8);
        }
    }
    return 0;
}

static int write_shard(struct ckpt_reader *r, const char *dir, const char *file,
                       const struct hf_tensor *ts, int nt, int shard, int dtype, float *src,
                       float *tr, unsigned char *bytes, char *err)
{
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        const struct hf_tensor *t = &ts[i];
        if (t->shard != shard)
            continue;
        json_t *shape = t->cols
                            ? json_pack("[I, I]", (json_int_t)(t->transpose ? t->cols : t->rows),
                                        (json_int_t)(t->transpose ? t->rows : t->cols))
                            : json_pack("[I]", (json_int_t)t->rows);
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtypes[dtype].st, "shape",
                                      shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t->bytes)));
        off += t->bytes;
    }
    size_t hlen;
    char *head = st_header_bytes(h, &hlen);
    json_decref(h);
    if (!head) {
        fsdp_err(err, "%s: out of memory for its header", file);
        return -1;
    }
    char path[4096];
    struct fsdp_outfile o;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = fsdp_outfile_open(&o, path, 0, err);
    if (rc) {
        free(head);
        return -1;
    }
    rc = fsdp_outfile_write(&o, head, hlen, err);
    free(head);
    for (int i = 0; !rc && i < nt; i++)
        if (ts[i].shard == shard)
            rc = convert(r, &ts[i], dtype, src, tr, bytes, err) ||
                 fsdp_outfile_write(&o, bytes, (size_t)ts[i].bytes, err);
    return fsdp_outfile_close(&o, !rc, err);
}

/* config.json: what from_pretrained needs to build the same model. */
static json_t *hf_config(const struct model_config *c, int dtype)
{
    if (c->arch == MODEL_GPT2)
        return json_pack(
            "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:b, s:s, s:f, s:f, s:f, s:f}",
            "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "n_layer", c->layers,
            "n_head", c->heads, "n_embd", c->dim, "n_positions", c->seq, "n_ctx", c->seq,
            "vocab_size", c->vocab, "layer_norm_epsilon", 1e-5, "activation_function", "gelu_new",
            "tie_word_embeddings", 1, "torch_dtype", dtypes[dtype].torch, "initializer_range", 0.02,
            "attn_pdrop", 0.0, "embd_pdrop", 0.0, "resid_pdrop", 0.0);
    /* q/k/v biases are Qwen2's (Llama's attention_bias would bias o_proj too) */
    const int qwen = c->attn_bias;
    json_t *j = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:s, s:f, "
        "s:f}",
        "architectures", qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM", "model_type",
        qwen ? "qwen2" : "llama", "num_hidden_layers", c->layers, "hidden_size", c->dim,
        "num_attention_heads", c->heads, "num_key_value_heads", c->kv_heads, "head_dim",
        c->dim / c->heads, "intermediate_size", c->ffn_dim, "max_position_embeddings", c->seq,
        "vocab_size", c->vocab, "rms_norm_eps", c->norm_eps, "rope_theta", c->rope_theta,
        "tie_word_embeddings", c->tie_embeddings, "hidden_act", "silu", "torch_dtype",
        dtypes[dtype].torch, "initializer_range", 0.02, "attention_dropout", 0.0);
    if (!j)
        return NULL;
    if (qwen)
        json_object_set_new(j, "use_sliding_window", json_false());
    else
        json_object_set_new(j, "attention_bias", json_false()),
            json_object_set_new(j, "mlp_bias", json_false());
    json_object_set_new(j, "rope_scaling",
                        c->rope_factor
                            ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3",
                                        "factor", c->rope_factor, "low_freq_factor",
                                        c->rope_low_freq, "high_freq_factor", c->rope_high_freq,
                                        "original_max_position_embeddings", c->rope_orig_ctx)
                            : json_null());
    return j;
}

/* dir, created if missing, as a new empty directory: nothing is
 * overwritten, no stale shard left beside new ones. */
static int new_dir(const char *dir, char *err)
{
    if (mkdir(dir, 0755) && errno != EEXIST) {
        fsdp_err(err, "%s: cannot create: %s", dir, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (lstat(dir, &sb) || !S_ISDIR(sb.st_mode)) {
        fsdp_err(err, "%s: not a directory", dir);
        return -1;
    }
    DIR *d = opendir(dir); /* nothing is overwritten, no stale shard left beside new ones */
    struct dirent *e;
    int empty = d != NULL;
    while (d && (e = readdir(d)))
        empty &= strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    if (d)
        closedir(d);
    if (!empty) {
        fsdp_err(err,
                 "%s: exists and is not empty (export --layout hf writes a "
                 "new directory)",
                 dir);
        return -1;
    }
    return 0;
}

int hf_export(struct ckpt_reader *r, const char *dir, int dtype, uint64_t max_shard, char *err)
{
    const struct ckpt_manifest *m = r->m;
    struct model_config cfg;
    struct model_layout lay;
    char sub[FSDP_ERR_LEN];
    if (model_ckpt_parse(m->model, &cfg, sub)) {
        fsdp_err(err, "export --layout hf: the manifest's model: %s", sub);
        return -1;
    }
    if (new_dir(dir, err))
        return -1;
    if (model_layout_init(&lay, &cfg, err))
        return -1;
    int same = lay.nunits == m->nunits;
    for (int u = 0; same && u < m->nunits; u++)
        same = lay.units[u].numel == m->units[u].numel;
    if (!same) {
        model_layout_free(&lay);
        fsdp_err(err, "export --layout hf: the manifest's units are not its model's");
        return -1;
    }
    int nt = 0, nshards = 1;
    struct hf_tensor *ts = calloc((size_t)lay.ntensors + 1, sizeof *ts);
    if (!ts) {
        model_layout_free(&lay);
        fsdp_err(err, "export: out of memory");
        return -1;
    }
    uint64_t largest = 0, in_shard = 0, total = 0;
    for (int i = 0; i < lay.ntensors; i++) {
        const struct model_tensor *mt = &lay.tensors[i];
        struct hf_tensor *t = &ts[nt++];
        snprintf(t->name, sizeof t->name, "%s%s", hf_prefix(&cfg), mt->name);
        t->unit = mt->unit;
        t->offset = mt->offset;
        t->rows = hf_rows(mt);
        t->cols = mt->ndim == 2 ? mt->shape[1] : 0;
        t->transpose = hf_transposed(&cfg, mt);
        uint64_t n = t->rows * (t->cols ? t->cols : 1);
        t->bytes = n * (uint64_t)dtypes[dtype].size;
        largest = n > largest ? n : largest;
        if (in_shard > 0 && in_shard + t->bytes > max_shard) {
            nshards++;
            in_shard = 0;
        }
        t->shard = nshards - 1;
        in_shard += t->bytes;
        total += t->bytes;
    }
    model_layout_free(&lay);
    float *src = malloc((size_t)largest * 4 + 4), *tr = malloc((size_t)largest * 4 + 4);
    unsigned char *bytes = malloc((size_t)largest * 4 + 4);
    int rc = src && tr && bytes ? 0 : -1;
    if (rc)
        fsdp_err(err, "export: out of memory for a tensor of %llu elements",
                 (unsigned long long)largest);
    json_t *map = json_object(); /* every tensor's file, as written */
    int index_written = 0;
    for (int s = 0; !rc && s < nshards; s++) {
        char file[64];
        if (nshards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        rc = write_shard(r, dir, file, ts, nt, s, dtype, src, tr, bytes, err);
        for (int i = 0; !rc && i < nt; i++)
            if (ts[i].shard == s)
                json_object_set_new(map, ts[i].name, json_string(file));
    }
    if (!rc && nshards > 1) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", map);
        rc = write_json(dir, "model.safetensors.index.json", index, err);
        index_written = rc == 0;
        json_decref(index);
    }
    if (!rc) {
        json_t *doc = hf_config(&cfg, dtype);
        rc =
            doc ? write_json(dir, "config.json", doc, err) : fsdp_err(err, "export: out of memory");
        json_decref(doc);
    }
    if (rc) { /* a failed export leaves the directory as it found it: empty */
        const char *k;
        json_t *v;
        json_object_foreach(map, k, v)
        {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
            unlink(path);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (index_written) /* only what this export wrote */
            unlink(path);
    }
    json_decref(map);
    if (!rc) { /* the directory's entries are durable too */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    free(src);
    free(tr);
    free(bytes);
    free(ts);
    return rc;
}

/* ---- import ---------------------------------------------------------------- */

/* dir/name as a regular file (no FIFO or device; a symlink is the user's, as
 * in Hugging Face's cache, whose snapshots link to blobs), read-only. */
static int open_in(int dfd, const char *dir, const char *name, uint64_t *size, char *err)
{
    int fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        fsdp_err(err, "%s/%s: %s", dir, name, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *size = (uint64_t)sb.st_size;
    return fd;
}

static json_t *read_json(int dfd, const char *dir, const char *name, char *err)
{
    uint64_t size;
    int fd = open_in(dfd, dir, name, &size, err);
    if (fd < 0)
        return NULL;
    char *text = size <= (64u << 20) ? malloc((size_t)size + 1) : NULL;
    json_t *doc = NULL;
    if (!text)
        fsdp_err(err, "%s/%s: %llu bytes, more than the 64 MiB allowed", dir, name,
                 (unsigned long long)size);
    else if (pread(fd, text, (size_t)size, 0) != (ssize_t)size)
        fsdp_err(err, "%s/%s: cannot read", dir, name);
    else {
        json_error_t je;
        doc = json_loadb(text, (size_t)size, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(doc)) {
            fsdp_err(err, "%s/%s: not a JSON object: %s", dir, name, je.text);
            json_decref(doc);
            doc = NULL;
        }
    }
    free(text);
    close(fd);
    return doc;
}

/* GPT2Config's keys. */
static int read_gpt2_config(const char *dir, json_t *c, struct model_config *cfg, char *err)
{
    static const char *keys[] = {"n_layer", "n_embd", "n_head", "n_positions", "vocab_size"};
    static const long long hi[] = {256, 16384, 1024, 65536, 65536};
    long long v[5];
    int rc = 0;
    for (int i = 0; !rc && i < 5; i++) {
        json_t *x = json_object_get(c, keys[i]);
        v[i] = json_is_integer(x) ? (long long)json_integer_value(x) : -1;
        if (v[i] < 1 || v[i] > hi[i])
            rc = -1,
            fsdp_err(err, "%s/config.json: %s must be an integer in 1..%lld", dir, keys[i], hi[i]);
    }
    const char *act = json_string_value(json_object_get(c, "activation_function"));
    json_t *eps = json_object_get(c, "layer_norm_epsilon"),
           *tie = json_object_get(c, "tie_word_embeddings");
    if (!rc && act && strcmp(act, "gelu_new") != 0) /* absent: GPT2Config's gelu_new */
        rc = -1, fsdp_err(err,
                          "%s/config.json: activation_function '%.40s'; this "
                          "trainer's GELU is gelu_new (tanh)",
                          dir, act);
    if (!rc && eps && (!json_is_number(eps) || fabs(json_number_value(eps) - 1e-5) > 1e-12))
        rc = -1, fsdp_err(err,
                          "%s/config.json: layer_norm_epsilon must be 1e-5 "
                          "(this trainer's LayerNorm)",
                          dir);
    static const struct {
        const char *key;
        int want;
    } flags[] = {{"scale_attn_weights", 1},
                 {"scale_attn_by_inverse_layer_idx", 0},
                 {"reorder_and_upcast_attn", 0}};
    for (int i = 0; !rc && i < 3; i++) {
        json_t *x = json_object_get(c, flags[i].key);
        if (x && (!json_is_boolean(x) || json_is_true(x) != flags[i].want))
            rc = -1, fsdp_err(err,
                              "%s/config.json: %s must be %s (this "
                              "trainer's attention)",
                              dir, flags[i].key, flags[i].want ? "true" : "false");
    }
    if (!rc && tie && !json_is_true(tie))
        rc = -1, fsdp_err(err,
                          "%s/config.json: tie_word_embeddings false; this "
                          "trainer's head is tied to wte",
                          dir);
    if (rc)
        return -1;
    *cfg = (struct model_config){.layers = (int)v[0],
                                 .dim = (int)v[1],
                                 .heads = (int)v[2],
                                 .seq = (int)v[3],
                                 .vocab = (int)v[4],
                                 .vocab_pad = model_vocab_pad((int)v[4])};
    return 0;
}

/* An optional number in [lo, hi] (absent: def). */
static int cfg_number(const char *dir, json_t *c, const char *key, double def, double lo, double hi,
                      double *out, char *err)
{
    json_t *x = json_object_get(c, key);
    *out = x ? json_number_value(x) : def;
    if (x && (!json_is_number(x) || !(*out >= lo && *out <= hi)))
        return fsdp_err(err, "%s/config.json: %s must be a number in %g..%g", dir, key, lo, hi);
    return 0;
}

/* An integer in 1..hi; absent: def (0: required). */
static int cfg_count(const char *dir, json_t *c, const char *key, long long def, long long hi,
                     int *out, char *err)
{
    json_t *x = json_object_get(c, key);
    long long v = x && json_is_integer(x) ? (long long)json_integer_value(x) : x ? -1 : def;
    if (v < 1 || v > hi)
        return fsdp_err(err, "%s/config.json: %s must be an integer in 1..%lld%s", dir, key, hi,
                        x ? "" : " (it is missing)");
    *out = (int)v;
    return 0;
}

/* The "rope_scaling" object: none, "default", or Llama 3.1's "llama3". */
static int read_rope_scaling(const char *dir, json_t *c, struct model_config *cfg, char *err)
{
    json_t *rs = json_object_get(c, "rope_scaling");
    if (!rs || json_is_null(rs))
        return 0;
    json_t *t = json_object_get(rs, "rope_type");
    t = t ? t : json_object_get(rs, "type"); /* the older spelling */
    const char *type = json_string_value(t);
    if (!json_is_object(rs) || !type)
        return fsdp_err(err,
                        "%s/config.json: rope_scaling must be null or an object with a "
                        "rope_type",
                        dir);
    if (strcmp(type, "default") == 0)
        return 0;
    if (strcmp(type, "llama3") != 0)
        return fsdp_err(err,
                        "%s/config.json: rope_scaling type '%.40s' is not supported (only "
                        "llama3 and default)",
                        dir, type);
    if (cfg_number(dir, rs, "factor", -1, 1, 1024, &cfg->rope_factor, err) ||
        cfg_number(dir, rs, "low_freq_factor", -1, 1e-6, 1024, &cfg->rope_low_freq, err) ||
        cfg_number(dir, rs, "high_freq_factor", -1, 1e-6, 1024, &cfg->rope_high_freq, err) ||
        cfg_count(dir, rs, "original_max_position_embeddings", 0, 1 << 24, &cfg->rope_orig_ctx,
                  err))
        return -1;
    return 0;
}

/* LlamaConfig's keys (Qwen2Config's and MistralConfig's are the same with
 * their own defaults); what this trainer's llama family does not compute is
 * refused by name. */
static int read_llama_config(const char *dir, json_t *c, const char *type, int seq,
                             struct model_config *cfg, char *err)
{
    const int qwen = strcmp(type, "qwen2") == 0, mistral = strcmp(type, "mistral") == 0;
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = MODEL_LLAMA;
    cfg->attn_bias = qwen; /* Qwen2's q, k and v projections always have biases */
    if (cfg_count(dir, c, "num_hidden_layers", 0, 256, &cfg->layers, err) ||
        cfg_count(dir, c, "hidden_size", 0, 16384, &cfg->dim, err) ||
        cfg_count(dir, c, "num_attention_heads", 0, 1024, &cfg->heads, err) ||
        cfg_count(dir, c, "num_key_value_heads", cfg->heads, 1024, &cfg->kv_heads, err) ||
        cfg_count(dir, c, "intermediate_size", 0, 1 << 18, &cfg->ffn_dim, err) ||
        cfg_count(dir, c, "vocab_size", 0, 1 << 24, &cfg->vocab, err) ||
        cfg_count(dir, c, "max_position_embeddings", mistral ? 32768 : 2048, 1 << 24, &cfg->seq,
                  err) ||
        cfg_number(dir, c, "rms_norm_eps", 1e-6, 1e-12, 0.1, &cfg->norm_eps, err) ||
        cfg_number(dir, c, "rope_theta", mistral ? 1e6 : 1e4, 1, 1e12, &cfg->rope_theta, err) ||
        read_rope_scaling(dir, c, cfg, err))
        return -1;
    json_t *tie = json_object_get(c, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie))
        return fsdp_err(err, "%s/config.json: tie_word_embeddings must be true or false", dir);
    cfg->tie_embeddings = tie ? json_is_true(tie) : 0; /* Llama's, Qwen2's, Mistral's default */
    const char *act = json_string_value(json_object_get(c, "hidden_act"));
    if (act && strcmp(act, "silu") != 0)
        return fsdp_err(err,
                        "%s/config.json: hidden_act '%.40s'; this trainer's SwiGLU gates "
                        "with silu",
                        dir, act);
    json_t *hd = json_object_get(c, "head_dim");
    if (hd && !json_is_null(hd) &&
        (!json_is_integer(hd) || json_integer_value(hd) * cfg->heads != cfg->dim))
        return fsdp_err(err,
                        "%s/config.json: head_dim must be hidden_size / num_attention_heads "
                        "(%d), as this trainer's heads are",
                        dir, cfg->dim / cfg->heads);
    static const char *const off[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
    static const char *const why[] = {
        "biases on o_proj as well as q, k and v (qwen2's q/k/v biases are supported)", "MLP biases",
        "sliding-window attention"};
    for (int i = 0; i < 3; i++) {
        json_t *x = json_object_get(c, off[i]);
        if (x && !json_is_false(x))
            return fsdp_err(err, "%s/config.json: %s is not false: %s are not supported", dir,
                            off[i], why[i]);
    }
    json_t *sw = json_object_get(c, "sliding_window");
    if (mistral && sw && !json_is_null(sw))
        return fsdp_err(err,
                        "%s/config.json: sliding_window %s: sliding-window attention is not "
                        "supported (null is full attention)",
                        dir, json_is_integer(sw) ? "is set" : "is not null");
    json_t *prf = json_object_get(c, "partial_rotary_factor");
    if (prf && !(json_is_number(prf) && json_number_value(prf) == 1.0))
        return fsdp_err(err,
                        "%s/config.json: partial_rotary_factor is not 1: RoPE on part of "
                        "a head is not supported",
                        dir);
    if (seq)
        cfg->seq = seq; /* the length the user will train at */
    else if (cfg->seq > 65536)
        return fsdp_err(err,
                        "%s/config.json: max_position_embeddings %d is over this trainer's "
                        "65536: give import --seq N, the length you will train at",
                        dir, cfg->seq);
    cfg->vocab_pad = model_vocab_pad(cfg->vocab);
    return 0;
}

int hf_read_config(const char *dir, int seq, struct model_config *cfg, char *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        fsdp_err(err, "%s: not a directory: %s", dir, strerror(errno));
        return -1;
    }
    json_t *c = read_json(dfd, dir, "config.json", err);
    close(dfd);
    if (!c)
        return -1;
    json_t *t = json_object_get(c, "model_type");
    const char *type = t ? json_string_value(t) : "gpt2"; /* absent: GPT2Config's own files */
    int rc;
    if (!type)
        rc = fsdp_err(err, "%s/config.json: model_type is not a string", dir);
    else if (strcmp(type, "gpt2") == 0)
        rc = read_gpt2_config(dir, c, cfg, err);
    else if (strcmp(type, "llama") == 0 || strcmp(type, "qwen2") == 0 ||
             strcmp(type, "mistral") == 0)
        rc = read_llama_config(dir, c, type, seq, cfg, err);
    else
        rc = fsdp_err(err,
                      "%s/config.json: model_type '%.40s' is not one this trainer reads (gpt2, "
                      "llama, qwen2, mistral)",
                      dir, type);
    json_decref(c);
    if (!rc && seq && cfg->arch == MODEL_GPT2 && seq != cfg->seq)
        rc = fsdp_err(err, "import --seq: GPT-2's positions are parameters (n_positions %d)",
                      cfg->seq);
    return rc ? -1 : model_config_check(cfg, err);
}

/* Names Hugging Face stores that are not parameters of this layout: GPT-2's
 * causal-mask buffers of older checkpoints and its head tied to wte; the
 * rotary inverse frequencies older Llama checkpoints kept, and a tied
 * model's copy of its head. */
static int ignorable(const struct model_config *c, const char *name)
{
    if (c->arch != MODEL_GPT2)
        return ends_with(name, ".self_attn.rotary_emb.inv_freq") ||
               (c->tie_embeddings && strcmp(name, "lm_head.weight") == 0);
    return strcmp(name, "lm_head.weight") == 0 ||
           (ends_with(name, ".attn.bias") && !ends_with(name, ".c_attn.bias")) ||
           ends_with(name, ".attn.masked_bias");
}

static int plain_file_name(const char *s)
{
    if (!*s || *s == '.' || strlen(s) > 200)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '-' || *s == '_'))
            return 0;
    return 1;
}

#define HF_MAX_FILES 10000

struct hf_file {
    char name[208];
    int fd;
    struct st_header h;
};

/* The files to read: model.safetensors, or those model.safetensors.index.json
 * lists (plain names in dir, each once). */
static int list_files(int dfd, const char *dir, struct hf_file **out, int *n, json_t **index,
                      char *err)
{
    *index = NULL;
    *n = 0;
    struct stat sb;
    int single = fstatat(dfd, "model.safetensors", &sb, AT_SYMLINK_NOFOLLOW) == 0;
    json_t *map = NULL;
    if (!single && fstatat(dfd, "model.safetensors.index.json", &sb, AT_SYMLINK_NOFOLLOW) != 0 &&
        (fstatat(dfd, "pytorch_model.bin", &sb, 0) == 0 ||
         fstatat(dfd, "pytorch_model.bin.index.json", &sb, 0) == 0)) {
        fsdp_err(err,
                 "%s: holds pickled PyTorch weights (pytorch_model.bin), which are not read "
                 "(unpickling runs code): save with save_pretrained(..., "
                 "safe_serialization=True) for model.safetensors",
                 dir);
        return -1;
    }
    if (!single) {
        if (!(*index = read_json(dfd, dir, "model.safetensors.index.json", err)))
            return -1;
        map = json_object_get(*index, "weight_map");
        if (!json_is_object(map) || json_object_size(map) == 0) {
            fsdp_err(err, "%s/model.safetensors.index.json: no weight_map", dir);
            return -1;
        }
    }
    size_t cap = single ? 1 : json_object_size(map);
    struct hf_file *f = calloc(cap, sizeof *f);
    if (!f) {
        fsdp_err(err, "%s: out of memory", dir);
        return -1;
    }
    const char *key;
    json_t *v, *seen = json_object(); /* the distinct files, as a set */
    if (single)
        snprintf(f[(*n)++].name, sizeof f->name, "model.safetensors");
    else
        json_object_foreach(map, key, v)
        {
            const char *file = json_string_value(v);
            if (!file || !plain_file_name(file)) {
                fsdp_err(err,
                         "%s/model.safetensors.index.json: %.80s: file "
                         "'%.80s' is not a plain file name in the directory",
                         dir, key, file ? file : "(not a string)");
                break;
            }
            if (json_object_get(seen, file))
                continue;
            if (*n >= HF_MAX_FILES) {
                fsdp_err(err, "%s/model.safetensors.index.json: more than %d files", dir,
                         HF_MAX_FILES);
                break;
            }
            json_object_set_new(seen, file, json_true());
            snprintf(f[(*n)++].name, sizeof f->name, "%s", file);
        }
    int bad = !single && key != NULL; /* the loop stopped early */
    json_decref(seen);
    if (bad) {
        free(f);
        *n = 0;
        return -1;
    }
    *out = f;
    return 0;
}

static float widen(const unsigned char *p, int size, int f16)
{
    if (size == 4) {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return f16 ? fsdp_fp16_widen(h) : fsdp_bf16_widen(h);
}

int hf_to_native(const char *dir, const struct model_layout *m, int out_fd, char *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        fsdp_err(err, "%s: not a directory: %s", dir, strerror(errno));
        return -1;
    }
    struct hf_file *f = NULL;
    int nf = 0, problems = 0, rc = 0;
    json_t *index = NULL;
    rc = list_files(dfd, dir, &f, &nf, &index, err);
    char path[4096];
    for (int i = 0; !rc && i < nf; i++) {
        uint64_t size;
        snprintf(path, sizeof path, "%s/%s", dir, f[i].name);
        f[i].fd = open_in(dfd, dir, f[i].name, &size, err);
        if (f[i].fd < 0 || st_header_parse(path, f[i].fd, size, &f[i].h, &problems, err))
            rc = -1, nf = f[i].fd < 0 ? i : i + 1;
    }
    /* where each of the model's tensors is, checked against the layout */
    int nt = m->ntensors;
    const struct st_entry **at = calloc((size_t)nt + 1, sizeof *at);
    int *in = calloc((size_t)nt + 1, sizeof *in);
    if (!rc && (!at || !in))
        rc = -1, fsdp_err(err, "%s: out of memory", dir);
    for (int i = 0; !rc && i < nf; i++)
        for (int j = 0; j < f[i].h.n; j++) {
            const struct st_entry *e = &f[i].h.e[j];
            snprintf(path, sizeof path, "%s/%s", dir, f[i].name);
            /* GPT-2's "transformer." is optional: GPT2LMHeadModel writes it,
             * GPT2Model (and the Hub's gpt2 file) does not; both spellings
             * of one tensor are "a second copy" below */
            const char *bare =
                m->cfg.arch == MODEL_GPT2 && strncmp(e->name, "transformer.", 12) == 0
                    ? e->name + 12
                    : e->name;
            int ti = -1;
            for (int t = 0; ti < 0 && t < nt; t++)
                if (strcmp(bare, m->tensors[t].name) == 0)
                    ti = t;
            const char *listed = index ? json_string_value(json_object_get(
                                             json_object_get(index, "weight_map"), e->name))
                                       : NULL;
            if (index && (!listed || strcmp(listed, f[i].name) != 0)) {
                fprintf(stderr, "fsdp-ckpt: %s: %s: the index puts it in %s\n", path, e->name,
                        listed ? listed : "no file");
                problems++;
            }
            if (ti < 0) {
                if (!ignorable(&m->cfg, e->name)) {
                    fprintf(stderr, "fsdp-ckpt: %s: %s: not a tensor of the %s layout%s\n", path,
                            e->name, model_arch_name(m->cfg.arch),
                            strcmp(e->name, "lm_head.weight") == 0
                                ? " (config.json ties the head to the embedding)"
                                : "");
                    problems++;
                }
                continue;
            }
            if (at[ti]) {
                fprintf(stderr, "fsdp-ckpt: %s: %s: a second copy\n", path, e->name);
                problems++;
                continue;
            }
            const struct model_tensor *t = &m->tensors[ti];
            uint64_t shape[2] = {hf_rows(t), t->ndim > 1 ? t->shape[1] : 0}; /* real vocab */
            if (hf_transposed(&m->cfg, t)) {                                 /* Conv1D: (in, out) */
                uint64_t x = shape[0];
                shape[0] = shape[1];
                shape[1] = x;
            }
            problems += st_check_entry(path, e, e->name, t->ndim, shape, ST_F32 | ST_BF16 | ST_F16,
                                       "config.json");
            at[ti] = e;
            in[ti] = i;
        }
    /* every name the index lists must be in the file it names */
    const char *iname;
    json_t *ifile;
    json_object_foreach(rc || !index ? NULL : json_object_get(index, "weight_map"), iname, ifile)
    {
        int held = 0;
        for (int i = 0; !held && i < nf; i++)
            if (strcmp(f[i].name, json_string_value(ifile)) == 0)
                for (int j = 0; !held && j < f[i].h.n; j++)
                    held = strcmp(f[i].h.e[j].name, iname) == 0;
        if (!held) {
            fprintf(stderr, "fsdp-ckpt: %s/%s: %s: the index lists it, the file does not hold it\n",
                    dir, json_string_value(ifile), iname);
            problems++;
        }
    }
    for (int t = 0; !rc && t < nt; t++)
        if (!at[t]) {
            fprintf(stderr, "fsdp-ckpt: %s: %s%s: missing (config.json's model has it)\n", dir,
                    hf_prefix(&m->cfg), m->tensors[t].name);
            problems++;
        }
    if (!rc && problems)
        rc = -1,
        fsdp_err(err, "%s: %d problem%s; nothing imported", dir, problems, problems > 1 ? "s" : "");
    /* the native file: our names, F32, (out, in), the padded rows zero */
    /* sized only once every tensor was found in a file at its checked shape:
     * the files then hold at least half of it, so a config.json alone (a
     * vocab_size of 9 million, no tensors) cannot make us allocate */
    uint64_t largest = 0;
    for (int t = 0; !rc && t < nt; t++)
        largest = m->tensors[t].numel > largest ? m->tensors[t].numel : largest;
    float *dst = rc ? NULL : malloc((size_t)largest * 4 + 4),
          *tmp = rc ? NULL : malloc((size_t)largest * 4 + 4);
    unsigned char *raw = rc ? NULL : malloc((size_t)largest * 4 + 4);
    if (!rc && (!dst || !tmp || !raw))
        rc = -1, fsdp_err(err, "%s: out of memory", dir);
    if (!rc)
        rc = st_write_native_header(out_fd, m, err);
    for (int t = 0; !rc && t < nt; t++) {
        const struct model_tensor *mt = &m->tensors[t];
        const struct st_entry *e = at[t];
        size_t bytes = (size_t)(e->end - e->begin);
        int size = strcmp(e->dtype, "F32") == 0 ? 4 : 2, f16 = strcmp(e->dtype, "F16") == 0;
        if (fsdp_pread_all(f[in[t]].fd, raw, bytes, e->begin)) {
            rc = -1, fsdp_err(err, "%s/%s: %s: cannot read", dir, f[in[t]].name, e->name);
            break;
        }
        uint64_t n = bytes / (size_t)size;
        for (uint64_t i = 0; i < n; i++)
            tmp[i] = widen(raw + i * (uint64_t)size, size, f16);
        memset(dst, 0, (size_t)mt->numel * 4); /* the embedding's padded rows */
        if (hf_transposed(&m->cfg, mt)) {
            uint64_t rows = mt->shape[0],
                     cols = mt->shape[1]; /* ours (out, in); stored (in, out) */
            for (uint64_t i = 0; i < rows; i++)
                for (uint64_t j = 0; j < cols; j++)
                    dst[i * cols + j] = tmp[j * rows + i];
        } else {
            memcpy(dst, tmp, (size_t)n * 4);
        }
        if (fsdp_write_all(out_fd, dst, (size_t)mt->numel * 4))
            rc = -1, fsdp_err(err, "import: cannot write a temporary file: %s", strerror(errno));
    }
    free(dst);
    free(tmp);
    free(raw);
    free(at);
    free(in);
    for (int i = 0; i < nf; i++) {
        st_header_free(&f[i].h);
        close(f[i].fd);
    }
    free(f);
    json_decref(index);
    close(dfd);
    return rc;
}
