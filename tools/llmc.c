/*
 * llmc.c - llm.c's model file (see llmc.h).
 *
 * The order of the parameters is one table (order[] below): wte, wpe, then
 * each per-layer group over all layers, then ln_f. Export reads each tensor
 * whole through the checkpoint reader and writes it in that order; import
 * checks the header against the file's length before reading a byte of
 * data, then writes the tensors in this trainer's layout for import.
 */
#include "llmc.h"

#include "model_ckpt.h"

#include "safetensors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240326
#define LLMC_FP32  3
#define LLMC_BF16  5

/* llm.c's order; per_layer: "h.N." + name for N in 0..L-1 */
static const struct {
    const char *name;
    int per_layer;
} order[] = {{"wte.weight", 0},         {"wpe.weight", 0},         {"ln_1.weight", 1},
             {"ln_1.bias", 1},          {"attn.c_attn.weight", 1}, {"attn.c_attn.bias", 1},
             {"attn.c_proj.weight", 1}, {"attn.c_proj.bias", 1},   {"ln_2.weight", 1},
             {"ln_2.bias", 1},          {"mlp.c_fc.weight", 1},    {"mlp.c_fc.bias", 1},
             {"mlp.c_proj.weight", 1},  {"mlp.c_proj.bias", 1},    {"ln_f.weight", 0},
             {"ln_f.bias", 0}};
#define NORDER ((int)(sizeof order / sizeof *order))

static void name_of(int g, int layer, char *out, size_t n)
{
    if (order[g].per_layer)
        snprintf(out, n, "h.%d.%s", layer, order[g].name);
    else
        snprintf(out, n, "%s", order[g].name);
}

static long long cfg_int(const struct ckpt_manifest *m, const char *key)
{
    json_t *v = json_object_get(m->model, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static const struct ckpt_tensor *find(const struct ckpt_manifest *m, const char *name, int *unit)
{
    for (int u = 0; u < m->nunits; u++)
        for (int t = 0; t < m->units[u].ntensors; t++)
            if (strcmp(m->units[u].tensors[t].name, name) == 0) {
                *unit = u;
                return &m->units[u].tensors[t];
            }
    return NULL;
}

int llmc_export(struct ckpt_reader *r, const char *path, int bf16, int replace, char *err)
{
    const struct ckpt_manifest *m = r->m;
    struct model_config cfg;
    char sub[FSDP_ERR_LEN], desc[256];
    if (model_ckpt_parse(m->model, &cfg, sub)) {
        fsdp_err(err, "export --layout llmc: the manifest's model: %s", sub);
        return -1;
    }
    if (cfg.arch != MODEL_GPT2) {
        fsdp_err(err,
                 "export --layout llmc: llm.c's model file holds GPT-2 models; this checkpoint "
                 "is %s (--layout hf writes it)",
                 model_config_describe(&cfg, desc, sizeof desc));
        return -1;
    }
    long long L = cfg_int(m, "layers"), C = cfg_int(m, "dim"), NH = cfg_int(m, "heads"),
              T = cfg_int(m, "seq"), V = cfg_int(m, "vocab"), Vp = cfg_int(m, "vocab_pad");
    if (L < 1 || C < 1 || NH < 1 || T < 1 || V < 1 || Vp < V || Vp > INT32_MAX) {
        fsdp_err(err, "export --layout llmc: the manifest's model lacks layers, "
                      "dim, heads, seq, vocab or vocab_pad");
        return -1;
    }
    int32_t head[256] = {LLMC_MAGIC, bf16 ? LLMC_BF16 : LLMC_FP32,
                         (int32_t)T, (int32_t)V,
                         (int32_t)L, (int32_t)NH,
                         (int32_t)C, (int32_t)Vp};
    uint64_t largest = 0;
    for (int u = 0; u < m->nunits; u++)
        for (int t = 0; t < m->units[u].ntensors; t++)
            largest =
                m->units[u].tensors[t].numel > largest ? m->units[u].tensors[t].numel : largest;
    float *buf = malloc((size_t)largest * 4 + 4);
    uint16_t *half = malloc((size_t)largest * 2 + 2);
    struct fsdp_outfile o;
    int rc = buf && half ? 0 : -1, opened = 0;
    if (rc)
        fsdp_err(err, "export: out of memory");
    if (!rc && (rc = fsdp_outfile_open(&o, path, replace, err)) == 0) {
        opened = 1;
        rc = fsdp_outfile_write(&o, head, sizeof head, err);
    }
    for (int g = 0; !rc && g < NORDER; g++)
        for (int l = 0; !rc && l < (order[g].per_layer ? L : 1); l++) {
            char name[96];
            int unit;
            name_of(g, l, name, sizeof name);
            const struct ckpt_tensor *t = find(m, name, &unit);
            if (!t) {
                fsdp_err(err, "export --layout llmc: the checkpoint has no %s", name);
                rc = -1;
                break;
            }
            rc = ckpt_read_unit(r, unit, CKPT_PARAM, t->offset, t->numel, buf, err);
            if (!rc && bf16) {
                for (uint64_t i = 0; i < t->numel; i++)
                    half[i] = fsdp_bf16_round(buf[i]);
                rc = fsdp_outfile_write(&o, half, (size_t)t->numel * 2, err);
            } else if (!rc) {
                rc = fsdp_outfile_write(&o, buf, (size_t)t->numel * 4, err);
            }
        }
    if (opened && fsdp_outfile_close(&o, !rc, err) && !rc)
        rc = -1;
    free(buf);
    free(half);
    return rc ? -1 : 0;
}

/* ---- import ---------------------------------------------------------------- */

struct llmc_file {
    int fd;
    int32_t h[256];
    uint64_t size;
};

/* Opens path (a regular file) and checks its header and length. */
static int open_file(const char *path, struct llmc_file *f, struct model_config *cfg, char *err)
{
    memset(f->h, 0, sizeof f->h);
    /* a symlink is the user's (a model cache's blobs); a FIFO or device is refused */
    f->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (f->fd < 0 || fstat(f->fd, &sb) || !S_ISREG(sb.st_mode)) {
        fsdp_err(err, "%s: %s", path, f->fd < 0 ? strerror(errno) : "not a regular file");
        return -1;
    }
    f->size = (uint64_t)sb.st_size;
    if (f->size < sizeof f->h || pread(f->fd, f->h, sizeof f->h, 0) != (ssize_t)sizeof f->h) {
        fsdp_err(err, "%s: shorter than llm.c's 1024-byte header", path);
        return -1;
    }
    const int32_t *h = f->h;
    if (h[0] != LLMC_MAGIC || (h[1] != LLMC_FP32 && h[1] != LLMC_BF16)) {
        fsdp_err(err,
                 "%s: not an llm.c model file (magic %d, version %d; want "
                 "%d and 3 or 5)",
                 path, h[0], h[1], LLMC_MAGIC);
        return -1;
    }
    /* maxT, V, L, NH, C within this trainer's bounds; Vp at least V */
    if (h[2] < 1 || h[2] > 65536 || h[3] < 2 || h[3] > 65536 || h[4] < 1 || h[4] > 256 ||
        h[5] < 1 || h[5] > 1024 || h[6] < 1 || h[6] > 16384 || h[7] < h[3] ||
        h[7] > (h[3] + 127) / 128 * 128) { /* llm.c pads V to a multiple of 128 */
        fsdp_err(err,
                 "%s: header sizes out of bounds (maxT %d, V %d, L %d, NH %d, "
                 "C %d, Vp %d)",
                 path, h[2], h[3], h[4], h[5], h[6], h[7]);
        return -1;
    }
    *cfg = (struct model_config){.layers = h[4],
                                 .dim = h[6],
                                 .heads = h[5],
                                 .seq = h[2],
                                 .vocab = h[3],
                                 .vocab_pad = model_vocab_pad(h[3])};
    if (model_config_check(cfg, err))
        return -1;
    uint64_t C = (uint64_t)h[6], L = (uint64_t)h[4],
             n = (uint64_t)h[7] * C + (uint64_t)h[2] * C + 2 * C + L * (12 * C * C + 13 * C);
    uint64_t want = sizeof f->h + n * (h[1] == LLMC_BF16 ? 2 : 4);
    if (f->size != want) {
        fsdp_err(err, "%s: %llu bytes; its header describes %llu", path,
                 (unsigned long long)f->size, (unsigned long long)want);
        return -1;
    }
    return 0;
}

int llmc_read_config(const char *path, struct model_config *cfg, char *err)
{
    struct llmc_file f;
    int rc = open_file(path, &f, cfg, err);
    if (f.fd >= 0)
        close(f.fd);
    return rc;
}

int llmc_to_native(const char *path, const struct model_layout *m, int out_fd, char *err)
{
    struct llmc_file f;
    struct model_config cfg = {0};
    int rc = open_file(path, &f, &cfg, err);
    if (!rc && (cfg.layers != m->cfg.layers || cfg.dim != m->cfg.dim || cfg.heads != m->cfg.heads ||
                cfg.seq != m->cfg.seq || cfg.vocab != m->cfg.vocab))
        rc = -1, fsdp_err(err, "%s: changed since its header was read", path);
    int size = f.h[1] == LLMC_BF16 ? 2 : 4;
    uint64_t C = (uint64_t)cfg.dim, Vp_file = rc ? 0 : (uint64_t)f.h[7];
    /* where each group starts in the file, and one layer's share of it */
    uint64_t start[NORDER], per[NORDER], at = sizeof f.h;
    for (int g = 0; !rc && g < NORDER; g++) {
        char name[96];
        name_of(g, 0, name, sizeof name);
        const struct model_tensor *t = NULL;
        for (int i = 0; i < m->ntensors && !t; i++)
            t = strcmp(m->tensors[i].name, name) == 0 ? &m->tensors[i] : NULL;
        if (!t) {
            rc = -1, fsdp_err(err, "import: the model has no %s", name);
            break;
        }
        per[g] = g == 0 ? Vp_file * C : t->numel;
        start[g] = at;
        at += per[g] * (order[g].per_layer ? (uint64_t)cfg.layers : 1) * (uint64_t)size;
    }
    uint64_t largest = 0; /* reads are cut to the model's tensors (wte: the rows both have) */
    for (int i = 0; i < m->ntensors; i++)
        largest = m->tensors[i].numel > largest ? m->tensors[i].numel : largest;
    float *dst = malloc((size_t)largest * 4 + 4);
    unsigned char *raw = malloc((size_t)largest * 4 + 4);
    if (!rc && (!dst || !raw))
        rc = -1, fsdp_err(err, "import: out of memory");
    if (!rc)
        rc = st_write_native_header(out_fd, m, err);
    for (int i = 0; !rc && i < m->ntensors; i++) { /* our layout's order */
        const struct model_tensor *t = &m->tensors[i];
        int g = -1, layer = 0, skip = 0;
        const char *rest = t->name; /* "h.N.rest" for a block's tensors */
        if (sscanf(t->name, "h.%d.%n", &layer, &skip) == 1 && skip > 0)
            rest = t->name + skip;
        for (int k = 0; g < 0 && k < NORDER; k++)
            if (order[k].per_layer == (rest != t->name) && strcmp(order[k].name, rest) == 0 &&
                layer >= 0 && layer < cfg.layers)
                g = k;
        if (g < 0) {
            rc = -1, fsdp_err(err, "import: %s has no place in llm.c's file", t->name);
            break;
        }
        uint64_t n = per[g] < t->numel ? per[g] : t->numel; /* wte: the rows both have */
        uint64_t off = start[g] + (uint64_t)layer * per[g] * (uint64_t)size;
        if (fsdp_pread_all(f.fd, raw, (size_t)(n * (uint64_t)size), off)) {
            rc = -1, fsdp_err(err, "%s: %s: cannot read", path, t->name);
            break;
        }
        memset(dst, 0, (size_t)t->numel * 4);
        for (uint64_t k = 0; k < n; k++) {
            if (size == 4)
                memcpy(&dst[k], raw + 4 * k, 4);
            else
                dst[k] = fsdp_bf16_widen((uint16_t)(raw[2 * k] | raw[2 * k + 1] << 8));
        }
        if (fsdp_write_all(out_fd, dst, (size_t)t->numel * 4))
            rc = -1, fsdp_err(err, "import: cannot write a temporary file: %s", strerror(errno));
    }
    free(dst);
    free(raw);
    if (f.fd >= 0)
        close(f.fd);
    return rc;
}
