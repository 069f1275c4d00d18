/*
 * hf.c - export to Hugging Face's GPT-2 layout (see hf.h).
 *
 * Each tensor is read whole through the checkpoint reader (verified
 * chunks, any world size), put in the layout (transposed, the vocabulary
 * cut), converted to the dtype and written; the largest is GPT-2 124M's
 * embedding, 154 MB. Narrowing rounds to nearest, ties to even, as
 * PyTorch's .to(torch.bfloat16) and .to(torch.float16) do.
 */
#include "hf.h"

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

static uint16_t f16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN stays NaN */
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* 65520 and up round to infinity */
        return sign | 0x7c00u;
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 */
        float x;
        memcpy(&x, &a, 4);
        return sign | (uint16_t)lrintf(x * 16777216.0f);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

/* One tensor of the layout: where it comes from and what it becomes. */
struct hf_tensor {
    char name[96];
    int unit;
    uint64_t offset;   /* in the unit's parameters */
    uint64_t rows, cols; /* what is read (rows x cols, row-major); cols 0: 1-D */
    int transpose;     /* a Conv1D weight: stored (cols, rows) */
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

static long long cfg_int(const struct ckpt_manifest *m, const char *key)
{
    json_t *v = json_object_get(m->model, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* A file in dir written under a temporary name and renamed when finished. */
struct out {
    char path[4096], tmp[4200];
    int fd;
};

static int out_open(struct out *o, const char *dir, const char *name, char *err)
{
    snprintf(o->path, sizeof o->path, "%s/%s", dir, name);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%d", o->path, (int)getpid());
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (o->fd < 0) {
        snprintf(err, CKPT_ERR_LEN, "%s: cannot create: %s", o->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

static int out_write(struct out *o, const void *p, size_t n, char *err)
{
    if (fsdp_write_all(o->fd, p, n) == 0)
        return 0;
    snprintf(err, CKPT_ERR_LEN, "%s: write failed: %s", o->tmp, strerror(errno));
    return -1;
}

/* ok: fsync, close, rename into place; else remove the temporary. */
static int out_close(struct out *o, int ok, char *err)
{
    if (ok && (fsync(o->fd) || close(o->fd) || rename(o->tmp, o->path))) {
        snprintf(err, CKPT_ERR_LEN, "%s: cannot finish: %s", o->path, strerror(errno));
        unlink(o->tmp);
        return -1;
    }
    if (!ok) {
        close(o->fd);
        unlink(o->tmp);
    }
    return ok ? 0 : -1;
}

static int write_json(const char *dir, const char *name, json_t *doc, char *err)
{
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    struct out o;
    if (!text) {
        snprintf(err, CKPT_ERR_LEN, "%s: out of memory", name);
        return -1;
    }
    int rc = out_open(&o, dir, name, err);
    if (!rc)
        rc = out_close(&o, out_write(&o, text, strlen(text), err) == 0 &&
                               out_write(&o, "\n", 1, err) == 0,
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
            uint16_t h = dtype == HF_BF16 ? fsdp_bf16_round(v[i]) : f16_round(v[i]);
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
        json_t *shape = t->cols ? json_pack("[I, I]", (json_int_t)(t->transpose ? t->cols : t->rows),
                                            (json_int_t)(t->transpose ? t->rows : t->cols))
                                : json_pack("[I]", (json_int_t)t->rows);
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtypes[dtype].st, "shape",
                                      shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t->bytes)));
        off += t->bytes;
    }
    char *doc = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (!doc) {
        snprintf(err, CKPT_ERR_LEN, "%s: out of memory for its header", file);
        return -1;
    }
    size_t n = strlen(doc), padded = (n + 7) / 8 * 8;
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    struct out o;
    int rc = out_open(&o, dir, file, err);
    if (rc) {
        free(doc);
        return -1;
    }
    rc = out_write(&o, len, 8, err) || out_write(&o, doc, n, err) ||
         out_write(&o, "        ", padded - n, err);
    free(doc);
    for (int i = 0; !rc && i < nt; i++)
        if (ts[i].shard == shard)
            rc = convert(r, &ts[i], dtype, src, tr, bytes, err) ||
                 out_write(&o, bytes, (size_t)ts[i].bytes, err);
    return out_close(&o, !rc, err);
}

int hf_export(struct ckpt_reader *r, const char *dir, int dtype, uint64_t max_shard, char *err)
{
    const struct ckpt_manifest *m = r->m;
    long long layers = cfg_int(m, "layers"), dim = cfg_int(m, "dim"), heads = cfg_int(m, "heads"),
              seq = cfg_int(m, "seq"), vocab = cfg_int(m, "vocab");
    if (layers < 1 || dim < 1 || heads < 1 || seq < 1 || vocab < 1) {
        snprintf(err, CKPT_ERR_LEN, "export --layout hf: the manifest's model lacks layers, dim, "
                                    "heads, seq or vocab");
        return -1;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        snprintf(err, CKPT_ERR_LEN, "%s: cannot create: %s", dir, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (lstat(dir, &sb) || !S_ISDIR(sb.st_mode)) {
        snprintf(err, CKPT_ERR_LEN, "%s: not a directory", dir);
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
        snprintf(err, CKPT_ERR_LEN, "%s: exists and is not empty (export --layout hf writes a "
                                    "new directory)", dir);
        return -1;
    }
    int nt = 0, nshards = 1;
    for (int u = 0; u < m->nunits; u++)
        nt += m->units[u].ntensors;
    struct hf_tensor *ts = calloc((size_t)nt + 1, sizeof *ts);
    if (!ts) {
        snprintf(err, CKPT_ERR_LEN, "export: out of memory");
        return -1;
    }
    uint64_t largest = 0, in_shard = 0, total = 0;
    nt = 0;
    for (int u = 0; u < m->nunits; u++)
        for (int i = 0; i < m->units[u].ntensors; i++) {
            const struct ckpt_tensor *T = &m->units[u].tensors[i];
            struct hf_tensor *t = &ts[nt++];
            snprintf(t->name, sizeof t->name, "transformer.%s", T->name);
            t->unit = u;
            t->offset = T->offset;
            t->rows = T->shape[0];
            t->cols = T->ndim == 2 ? T->shape[1] : 0;
            if (strcmp(T->name, "wte.weight") == 0 && (uint64_t)vocab < t->rows)
                t->rows = (uint64_t)vocab; /* the padded rows stay behind */
            t->transpose = T->ndim == 2 && is_conv1d(T->name);
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
    float *src = malloc((size_t)largest * 4 + 4), *tr = malloc((size_t)largest * 4 + 4);
    unsigned char *bytes = malloc((size_t)largest * 4 + 4);
    int rc = src && tr && bytes ? 0 : -1;
    if (rc)
        snprintf(err, CKPT_ERR_LEN, "export: out of memory for a tensor of %llu elements",
                 (unsigned long long)largest);
    json_t *map = json_object();
    for (int s = 0; !rc && s < nshards; s++) {
        char file[64];
        if (nshards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        rc = write_shard(r, dir, file, ts, nt, s, dtype, src, tr, bytes, err);
        for (int i = 0; !rc && nshards > 1 && i < nt; i++)
            if (ts[i].shard == s)
                json_object_set_new(map, ts[i].name, json_string(file));
    }
    if (!rc && nshards > 1) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", map);
        rc = write_json(dir, "model.safetensors.index.json", index, err);
        json_decref(index);
    }
    json_decref(map);
    if (!rc) {
        json_t *cfg = json_pack(
            "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:s, s:b, s:s, s:f, s:f, s:f, "
            "s:f}",
            "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "n_layer",
            (json_int_t)layers, "n_head", (json_int_t)heads, "n_embd", (json_int_t)dim,
            "n_positions", (json_int_t)seq, "n_ctx", (json_int_t)seq, "vocab_size",
            (json_int_t)vocab, "layer_norm_epsilon", 1e-5, "activation_function", "gelu_new",
            "tie_word_embeddings", 1, "torch_dtype", dtypes[dtype].torch, "initializer_range",
            0.02, "attn_pdrop", 0.0, "embd_pdrop", 0.0, "resid_pdrop", 0.0);
        rc = cfg ? write_json(dir, "config.json", cfg, err) : -1;
        json_decref(cfg);
    }
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
