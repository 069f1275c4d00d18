/*
 * safetensors.c - the safetensors format, exactly: see safetensors.h.
 *
 * Export streams every tensor through the checkpoint reader (any world
 * size, verified chunks) into a temporary file that is fsynced and renamed
 * into place. Import trusts nothing in the file: the header length is
 * bounded by the file size, every entry's dtype, shape and offsets are
 * checked against the model and against each other (no overlaps, no gaps,
 * nothing outside the data) before a byte of tensor data is used.
 */
#include "safetensors.h"

#include "model_ckpt.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER (100u << 20)
#define PIECE      (1u << 16)

static const char *prefix[CKPT_NKINDS] = {"", "optim.exp_avg.", "optim.exp_avg_sq."};

int st_export(struct ckpt_reader *r, const char *path, int all, int replace, char *err)
{
    const struct ckpt_manifest *m = r->m;
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int k = 0; k < (all ? CKPT_NKINDS : 1); k++)
        for (int u = 0; u < m->nunits; u++)
            for (int t = 0; t < m->units[u].ntensors; t++) {
                const struct ckpt_tensor *ct = &m->units[u].tensors[t];
                json_t *shape = json_array();
                for (int d = 0; d < ct->ndim; d++)
                    json_array_append_new(shape, json_integer((json_int_t)ct->shape[d]));
                char name[128];
                snprintf(name, sizeof name, "%s%s", prefix[k], ct->name);
                json_object_set_new(h, name,
                                    json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape",
                                              shape, "data_offsets", (json_int_t)off,
                                              (json_int_t)(off + ct->numel * 4)));
                off += ct->numel * 4;
            }
    size_t hlen;
    char *head = st_header_bytes(h, &hlen);
    json_decref(h);
    float *buf = malloc(PIECE * sizeof *buf);
    struct fsdp_outfile o;
    if (!head || !buf) {
        free(head);
        free(buf);
        fsdp_err(err, "export: out of memory");
        return -1;
    }
    int rc =
        fsdp_outfile_open(&o, path, replace, err) ? -1 : fsdp_outfile_write(&o, head, hlen, err);
    free(head);
    for (int k = 0; !rc && k < (all ? CKPT_NKINDS : 1); k++)
        for (int u = 0; !rc && u < m->nunits; u++)
            for (int t = 0; !rc && t < m->units[u].ntensors; t++) {
                const struct ckpt_tensor *ct = &m->units[u].tensors[t];
                for (uint64_t x = 0; !rc && x < ct->numel; x += PIECE) {
                    uint64_t c = ct->numel - x < PIECE ? ct->numel - x : PIECE;
                    rc = ckpt_read_unit(r, u, k, ct->offset + x, c, buf, err) ||
                         fsdp_outfile_write(&o, buf, (size_t)c * 4, err);
                }
            }
    free(buf);
    if (fsdp_outfile_close(&o, !rc, err) && !rc)
        rc = -1;
    if (rc) {
        char sub[FSDP_ERR_LEN];
        snprintf(sub, sizeof sub, "%s", err);
        fsdp_err(err, "export to %s: %s", path, sub);
    }
    return rc ? -1 : 0;
}

int st_write_native_header(int fd, const struct model_layout *m, char *err)
{
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int t = 0; t < m->ntensors; t++) {
        const struct model_tensor *mt = &m->tensors[t];
        json_t *shape =
            mt->ndim == 2 ? json_pack("[I, I]", (json_int_t)mt->shape[0], (json_int_t)mt->shape[1])
                          : json_pack("[I]", (json_int_t)mt->shape[0]);
        json_object_set_new(h, mt->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + mt->numel * 4)));
        off += mt->numel * 4;
    }
    size_t len;
    char *b = st_header_bytes(h, &len);
    json_decref(h);
    int rc = !b || fsdp_write_all(fd, b, len) ? -1 : 0;
    if (rc)
        fsdp_err(err, "import: cannot write a temporary file: %s",
                 b ? strerror(errno) : "out of memory");
    free(b);
    return rc;
}

char *st_header_bytes(json_t *h, size_t *len)
{
    char *doc = json_dumps(h, JSON_COMPACT);
    if (!doc)
        return NULL;
    size_t n = strlen(doc), padded = (n + 7) / 8 * 8;
    char *b = malloc(8 + padded);
    if (b) {
        for (int i = 0; i < 8; i++)
            b[i] = (char)(unsigned char)((uint64_t)padded >> (8 * i));
        memcpy(b + 8, doc, n);
        memset(b + 8 + n, ' ', padded - n);
        *len = 8 + padded;
    }
    free(doc);
    return b;
}

/* ---- reading ------------------------------------------------------------- */

static int by_begin(const void *a, const void *b)
{
    const struct st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

void st_header_free(struct st_header *h)
{
    free(h->e);
    json_decref(h->doc);
    memset(h, 0, sizeof *h);
}

/* Bytes per element of a safetensors dtype; 0 for one this file does not know. */
static int dtype_size(const char *d)
{
    static const struct {
        const char *name;
        int size;
    } t[] = {{"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
             {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},      {"U16", 2},
             {"U32", 4}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(d, t[i].name) == 0)
            return t[i].size;
    return 0;
}

int st_header_parse(const char *path, int fd, uint64_t fsize, struct st_header *out, int *problems,
                    char *err)
{
    memset(out, 0, sizeof *out);
    unsigned char lenb[8];
    if (fsize < 8 || pread(fd, lenb, 8, 0) != 8) {
        fsdp_err(err, "%s: not a safetensors file (shorter than 8 bytes)", path);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | lenb[i];
    if (n > MAX_HEADER || n > fsize - 8) {
        fsdp_err(err, "%s: header length %llu does not fit the %llu-byte file", path,
                 (unsigned long long)n, (unsigned long long)fsize);
        return -1;
    }
    char *doc = malloc((size_t)n + 1);
    if (!doc || pread(fd, doc, (size_t)n, 8) != (ssize_t)n) {
        free(doc);
        fsdp_err(err, "%s: cannot read the header", path);
        return -1;
    }
    json_error_t je;
    json_t *h = json_loadb(doc, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    free(doc);
    if (!json_is_object(h)) {
        json_decref(h);
        fsdp_err(err, "%s: header is not a JSON object: %s", path, je.text);
        return -1;
    }
    const uint64_t data = 8 + n, dsize = fsize - data;
    size_t cap = json_object_size(h);
    struct st_entry *e = calloc(cap ? cap : 1, sizeof *e);
    if (!e) {
        json_decref(h);
        fsdp_err(err, "%s: out of memory for %zu header entries", path, cap);
        return -1;
    }
    int ne = 0, mine = 0; /* mine: this file's problems */
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        json_t *off = json_object_get(v, "data_offsets"), *shape = json_object_get(v, "shape");
        json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
        const char *dtype = json_string_value(json_object_get(v, "dtype"));
        int ok = json_is_object(v) && json_array_size(off) == 2 && json_is_integer(b) &&
                 json_is_integer(en) && json_integer_value(b) >= 0 &&
                 json_integer_value(en) >= json_integer_value(b) && dtype && json_is_array(shape) &&
                 json_array_size(shape) <= 4;
        if (ok && (uint64_t)json_integer_value(en) > dsize) {
            fprintf(stderr,
                    "fsdp-ckpt: %s: %s: truncated: its data ends at byte %llu of the data, the "
                    "file holds %llu\n",
                    path, key, (unsigned long long)json_integer_value(en),
                    (unsigned long long)dsize);
            mine++;
            continue;
        }
        struct st_entry *x = &e[ne];
        for (size_t d = 0; ok && d < json_array_size(shape); d++) {
            json_t *dim = json_array_get(shape, d);
            ok = json_is_integer(dim) && json_integer_value(dim) >= 0 &&
                 json_integer_value(dim) <= (json_int_t)1 << 40;
            x->shape[d] = ok ? (uint64_t)json_integer_value(dim) : 0;
        }
        if (!ok) {
            fprintf(stderr, "fsdp-ckpt: %s: %s: malformed entry (dtype, shape, data_offsets)\n",
                    path, key);
            mine++;
            continue;
        }
        x->name = key;
        x->dtype = dtype;
        x->ndim = (int)json_array_size(shape);
        x->begin = data + (uint64_t)json_integer_value(b);
        x->end = data + (uint64_t)json_integer_value(en);
        uint64_t want = (uint64_t)dtype_size(dtype);
        for (int d = 0; d < x->ndim; d++)
            want = x->shape[d] && want > UINT64_MAX / x->shape[d] ? UINT64_MAX : want * x->shape[d];
        if (dtype_size(dtype) && want != x->end - x->begin) {
            fprintf(stderr,
                    "fsdp-ckpt: %s: %s: data_offsets span %llu bytes; its dtype %s and shape need "
                    "%llu\n",
                    path, key, (unsigned long long)(x->end - x->begin), dtype,
                    (unsigned long long)want);
            mine++;
        }
        ne++;
    }
    /* the data must be exactly the tensors, back to back */
    struct st_entry *sorted = malloc(sizeof *e * (size_t)(ne ? ne : 1));
    if (!sorted) {
        free(e);
        json_decref(h);
        fsdp_err(err, "%s: out of memory", path);
        return -1;
    }
    memcpy(sorted, e, sizeof *e * (size_t)ne);
    qsort(sorted, (size_t)ne, sizeof *sorted, by_begin);
    uint64_t at = data;
    for (int i = 0; i < ne; i++) {
        if (sorted[i].begin != at && !mine) { /* a wrong span is named above already */
            if (i == 0)
                fprintf(stderr, "fsdp-ckpt: %s: %s: the data begins at byte %llu, not 0\n", path,
                        sorted[i].name, (unsigned long long)(sorted[i].begin - data));
            else
                fprintf(stderr,
                        "fsdp-ckpt: %s: %s and %s: data_offsets %s between bytes %llu and %llu\n",
                        path, sorted[i - 1].name, sorted[i].name,
                        sorted[i].begin > at ? "leave a gap" : "overlap",
                        (unsigned long long)(at - data),
                        (unsigned long long)(sorted[i].begin - data));
            mine++;
        }
        at = sorted[i].end > at ? sorted[i].end : at;
    }
    free(sorted);
    if (!mine && at != fsize) {
        fprintf(stderr, "fsdp-ckpt: %s: %llu bytes of data after the last tensor\n", path,
                (unsigned long long)(fsize - at));
        mine++;
    }
    *problems += mine;
    out->doc = h;
    out->e = e;
    out->n = ne;
    return 0;
}

static void shape_str(const uint64_t *shape, int ndim, char *out, size_t n)
{
    snprintf(out, n, "[");
    for (int i = 0; i < ndim; i++)
        snprintf(out + strlen(out), n - strlen(out), "%s%llu", i ? ", " : "",
                 (unsigned long long)shape[i]);
    snprintf(out + strlen(out), n - strlen(out), "]");
}

int st_check_entry(const char *path, const struct st_entry *e, const char *want_name, int ndim,
                   const uint64_t *shape, int dtypes, const char *model_name)
{
    char got[96], want[96];
    int problems = 0, same = e->ndim == ndim, size = 0;
    for (int d = 0; same && d < ndim; d++)
        same = e->shape[d] == shape[d];
    if (!same) {
        shape_str(e->shape, e->ndim, got, sizeof got);
        shape_str(shape, ndim, want, sizeof want);
        fprintf(stderr, "fsdp-ckpt: %s: %s: shape %s, model %s expects %s\n", path, want_name, got,
                model_name, want);
        problems++;
    }
    if (strcmp(e->dtype, "F32") == 0 && (dtypes & ST_F32))
        size = 4;
    else if ((strcmp(e->dtype, "BF16") == 0 && (dtypes & ST_BF16)) ||
             (strcmp(e->dtype, "F16") == 0 && (dtypes & ST_F16)))
        size = 2;
    if (!size) {
        fprintf(stderr, "fsdp-ckpt: %s: %s: dtype %s, model %s expects %s\n", path, want_name,
                e->dtype, model_name, dtypes == ST_F32 ? "F32" : "F32, BF16 or F16");
        problems++;
    }
    /* a span that disagrees with the entry's own dtype and shape:
     * st_header_parse names it */
    return problems;
}

/* Checks the header against the model; fills offsets[ti] (absolute file
 * offsets) for every tensor of the model. Prints one line per problem. */
static int read_header(const char *path, int fd, uint64_t fsize, const struct model_layout *m,
                       const char *model_name, uint64_t *offsets, char *err)
{
    struct st_header h;
    int problems = 0, ignored = 0;
    if (st_header_parse(path, fd, fsize, &h, &problems, err))
        return -1;
    char *found = calloc((size_t)m->ntensors + 1, 1);
    if (!found) {
        st_header_free(&h);
        fsdp_err(err, "%s: out of memory", path);
        return -1;
    }
    for (int i = 0; i < h.n; i++) {
        const struct st_entry *e = &h.e[i];
        if (strncmp(e->name, "optim.", 6) == 0) {
            ignored++;
            continue;
        }
        int ti;
        for (ti = 0; ti < m->ntensors && strcmp(m->tensors[ti].name, e->name) != 0; ti++)
            ;
        if (ti == m->ntensors) {
            fprintf(stderr, "fsdp-ckpt: %s: %s: not a tensor of model %s\n", path, e->name,
                    model_name);
            problems++;
            continue;
        }
        const struct model_tensor *t = &m->tensors[ti];
        uint64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
        problems += st_check_entry(path, e, e->name, t->ndim, shape, ST_F32, model_name);
        found[ti] = 1;
        offsets[ti] = e->begin;
    }
    for (int ti = 0; ti < m->ntensors; ti++)
        if (!found[ti] && !json_object_get(h.doc, m->tensors[ti].name)) {
            fprintf(stderr, "fsdp-ckpt: %s: %s: missing (model %s has it)\n", path,
                    m->tensors[ti].name, model_name);
            problems++;
        }
    if (ignored)
        fprintf(stderr,
                "fsdp-ckpt: %s: ignoring %d optimizer tensors (import starts fresh "
                "optimizer state)\n",
                path, ignored);
    free(found);
    st_header_free(&h);
    if (problems) {
        fsdp_err(err, "%s: %d problem%s; nothing imported", path, problems,
                 problems > 1 ? "s" : "");
        return -1;
    }
    return 0;
}

int st_read_header(const char *path, int fd, uint64_t fsize, const struct model_layout *m,
                   const char *model_name, uint64_t *offsets, char *err)
{
    return read_header(path, fd, fsize, m, model_name, offsets, err);
}

/* Elements [x, x + n) of a unit's parameters from the file (zeros past
 * the unit's tensors). */
static int read_params(int fd, const struct model_layout *m, const uint64_t *offsets, int unit,
                       uint64_t x, uint64_t n, float *dst)
{
    const struct model_unit *U = &m->units[unit];
    memset(dst, 0, (size_t)n * sizeof *dst);
    for (int i = 0; i < U->ntensors; i++) {
        int ti = U->first_tensor + i;
        const struct model_tensor *t = &m->tensors[ti];
        uint64_t lo = t->offset > x ? t->offset : x;
        uint64_t hi = t->offset + t->numel < x + n ? t->offset + t->numel : x + n;
        if (lo >= hi)
            continue;
        size_t bytes = (size_t)(hi - lo) * 4;
        if (pread(fd, dst + (lo - x), bytes, (off_t)(offsets[ti] + (lo - t->offset) * 4)) !=
            (ssize_t)bytes)
            return -1;
    }
    return 0;
}

int st_import(const char *path, const char *source, const struct model_layout *m,
              const char *model_name, struct storage *dst, int world,
              const struct ckpt_write_opts *o, char *err)
{
    char tag[CKPT_TAG_LEN];
    if (ckpt_new_step_in(dst, 0, tag, sizeof tag, err))
        return -1;
    /* O_NONBLOCK: a FIFO must not hang the open; anything but a regular
     * file is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        fsdp_err(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    uint64_t *offsets = calloc((size_t)m->ntensors, sizeof *offsets);
    int rc = fstat(fd, &sb) || !offsets ? -1 : 0;
    if (rc)
        fsdp_err(err, "%s: cannot stat", path);
    else if (!S_ISREG(sb.st_mode))
        rc = -1, fsdp_err(err, "%s: not a regular file", path);
    if (!rc)
        rc = read_header(path, fd, (uint64_t)sb.st_size, m, model_name, offsets, err);
    struct ckpt_manifest out = {0};
    out.version = CKPT_FORMAT_VERSION;
    out.chunk_bytes = o->chunk_bytes;
    out.chunk_hash = o->hash;
    ckpt_tag_generation(tag, &out.generation); /* this writer's in dst: fencing judges by it */
    out.world = world;
    snprintf(out.sharding, sizeof out.sharding, "full");
    out.model = model_ckpt_config(&m->cfg);
    out.trainer = json_pack("{s:i, s:i, s:i, s:s, s:s}", "step", 0, "tokens_seen", 0, "data_cursor",
                            0, "rng_state", "0000000000000000", "imported_from", source);
    out.shards = calloc((size_t)world, sizeof *out.shards);
    struct ckpt_section *secs = calloc((size_t)m->nunits * CKPT_NKINDS, sizeof *secs);
    struct ckpt_codec *codec = ckpt_codec_new(o->chunk_bytes);
    float *buf = malloc(PIECE * sizeof *buf);
    if (!rc && (model_ckpt_units(m, world, &out) || !out.shards || !secs || !codec || !buf)) {
        fsdp_err(err, "import: out of memory");
        rc = -1;
    }
    for (int r = 0; !rc && r < world; r++) {
        for (int u = 0; u < m->nunits; u++) {
            uint64_t per = out.units[u].padded / (uint64_t)world;
            for (int k = 0; k < CKPT_NKINDS; k++)
                secs[u * CKPT_NKINDS + k] = (struct ckpt_section){u, k, r * per, per, 0};
        }
        char file[64], key[128];
        ckpt_shard_file(r, world, tag, file, sizeof file);
        snprintf(key, sizeof key, "step-%08d/%s", 0, file);
        struct ckpt_shard_writer *w;
        if ((rc = ckpt_writer_begin(dst, key, file, o, codec, r, secs, m->nunits * CKPT_NKINDS,
                                    NULL, &w, err)))
            break;
        for (int s = 0; !rc && s < m->nunits * CKPT_NKINDS; s++) {
            for (uint64_t x = 0; !rc && x < secs[s].n; x += PIECE) {
                uint64_t n = secs[s].n - x < PIECE ? secs[s].n - x : PIECE;
                if (secs[s].kind != CKPT_PARAM)
                    memset(buf, 0, (size_t)n * sizeof *buf); /* fresh optimizer state */
                else if (read_params(fd, m, offsets, secs[s].unit, secs[s].lo + x, n, buf)) {
                    fsdp_err(err, "%s: read failed: %s", path, strerror(errno));
                    rc = -1;
                    break;
                }
                rc = ckpt_writer_append(w, buf, (size_t)n * 4, err);
            }
        }
        if (rc) {
            ckpt_writer_abort(w);
            break;
        }
        if ((rc = ckpt_writer_finish(w, &out.shards[r], err)))
            break;
        out.nshards = r + 1;
    }
    if (!rc) { /* settles the outcome; a step 0 someone else committed meanwhile stays */
        struct ckpt_commit_result res;
        rc = ckpt_commit_step(dst, &out, tag, &res, err);
        ckpt_commit_result_free(&res);
    } else { /* this writer's own shards, nothing else */
        char sub[FSDP_ERR_LEN];
        ckpt_discard_own(dst, 0, world, tag, sub);
    }
    out.nshards = out.shards ? world : 0;
    ckpt_manifest_free(&out);
    ckpt_codec_free(codec);
    free(secs);
    free(buf);
    free(offsets);
    close(fd);
    return rc ? -1 : 0;
}
