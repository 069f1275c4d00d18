/*
 * manifest.c - MANIFEST.json: building, serialising, parsing, validating.
 *
 * The manifest is the only thing that says how to interpret a shard, and it
 * comes from disk: every count, offset and length in it is checked before
 * it sizes an allocation or indexes anything (ckpt_manifest_check).
 */
#include "ckpt.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static const char *kinds[CKPT_NKINDS] = {"param", "exp_avg", "exp_avg_sq"};
static const char *codecs[] = {"none", "zstd", "zstd+shuffle4"};

const char *ckpt_kind_name(int k) { return k >= 0 && k < CKPT_NKINDS ? kinds[k] : "?"; }
const char *ckpt_codec_name(int c) { return c >= 0 && c < 3 ? codecs[c] : "?"; }

void ckpt_step_dir(uint64_t step, char *out, size_t n)
{
    snprintf(out, n, "step-%08" PRIu64, step);
}

void ckpt_shard_file(int rank, int world, const char *tag, char *out, size_t n)
{
    snprintf(out, n, "shard-%05d-of-%05d%s%s", rank, world, tag && *tag ? "." : "", tag ? tag : "");
}

int ckpt_writer_tag(uint64_t generation, char *out, size_t n)
{
    uint64_t nonce;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
        return -1;
    snprintf(out, n, "g%" PRIu64 "-%016" PRIx64, generation, nonce);
    return 0;
}

/* "g<digits>-<16 hex>", digits without a leading zero unless "0", < 2^63. */
static int parse_tag(const char *s, uint64_t *gen)
{
    if (s[0] != 'g' || !isdigit((unsigned char)s[1]) || (s[1] == '0' && s[2] != '-'))
        return -1;
    uint64_t g = 0;
    const char *p = s + 1;
    for (; isdigit((unsigned char)*p); p++) {
        if (g > (UINT64_MAX >> 1) / 10)
            return -1;
        g = g * 10 + (uint64_t)(*p - '0');
    }
    if (*p++ != '-' || strlen(p) != 16)
        return -1;
    for (int i = 0; i < 16; i++)
        if (!strchr("0123456789abcdef", p[i]))
            return -1;
    *gen = g;
    return 0;
}

/* n decimal digits at s, exactly */
static int digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int ckpt_parse_shard_name(const char *name, int *rank, int *world, uint64_t *gen)
{
    int r, w; /* "shard-RRRRR-of-WWWWW[.TAG]" */
    if (strncmp(name, "shard-", 6) != 0 || digits(name + 6, 5, &r) ||
        strncmp(name + 11, "-of-", 4) != 0 || digits(name + 15, 5, &w) || w < 1 || r >= w)
        return -1;
    *rank = r;
    *world = w;
    *gen = 0; /* untagged: written before tags existed */
    if (name[20] == 0)
        return 0;
    return name[20] == '.' ? parse_tag(name + 21, gen) : -1;
}

int ckpt_tag_generation(const char *tag, uint64_t *gen) { return tag ? parse_tag(tag, gen) : -1; }

void ckpt_hex(const unsigned char sha[32], char out[65]) { fsdp_hex(sha, 32, out); }

void ckpt_shard_free(struct ckpt_shard *s)
{
    free(s->chunks);
    memset(s, 0, sizeof *s);
}

void ckpt_manifest_free(struct ckpt_manifest *m)
{
    for (int i = 0; i < m->nunits && m->units; i++)
        free(m->units[i].tensors);
    for (int i = 0; i < m->nshards && m->shards; i++)
        ckpt_shard_free(&m->shards[i]);
    free(m->units);
    free(m->shards);
    json_decref(m->model);
    json_decref(m->trainer);
    memset(m, 0, sizeof *m);
}

/* ---- to JSON --------------------------------------------------------------- */

json_t *ckpt_shard_to_json(const struct ckpt_shard *s)
{
    char hex[65];
    ckpt_hex(s->digest, hex);
    return json_pack("{s:i, s:s, s:I, s:I, s:s, s:i, s:{s:I, s:I}}", "rank", s->rank, "file",
                     s->file, "raw_size", (json_int_t)s->raw_size, "stored_size",
                     (json_int_t)s->stored_size, "sha256", hex, "chunks", s->nchunks, "index",
                     "offset", (json_int_t)s->index_off, "length", (json_int_t)s->index_len);
}

/* Format 1 kept each shard's sections and chunk table in the manifest. */
static json_t *shard_to_json_v1(const struct ckpt_manifest *m, const uint64_t *sec_off, int r)
{
    const struct ckpt_shard *s = &m->shards[r];
    char hex[65];
    json_t *secs = json_array(), *chunks = json_array();
    for (int u = 0; u < m->nunits; u++) {
        uint64_t per = m->units[u].padded / (uint64_t)m->world;
        for (int k = 0; k < CKPT_NKINDS; k++)
            json_array_append_new(secs, json_pack("{s:i, s:s, s:I, s:I, s:I}", "unit", u, "kind",
                                                  ckpt_kind_name(k), "lo", (json_int_t)(r * per),
                                                  "n", (json_int_t)per, "raw_offset",
                                                  (json_int_t)sec_off[u * CKPT_NKINDS + k]));
    }
    for (int i = 0; i < s->nchunks; i++) {
        const struct ckpt_chunk *c = &s->chunks[i];
        ckpt_hex(c->digest, hex);
        json_array_append_new(chunks, json_pack("{s:I, s:I, s:I, s:I, s:s, s:s}", "raw_offset",
                                                (json_int_t)c->raw_off, "raw_length",
                                                (json_int_t)c->raw_len, "stored_offset",
                                                (json_int_t)c->stored_off, "stored_length",
                                                (json_int_t)c->stored_len, "codec",
                                                ckpt_codec_name(c->codec), "sha256", hex));
    }
    ckpt_hex(s->digest, hex);
    return json_pack("{s:i, s:s, s:I, s:I, s:s, s:o, s:o}", "rank", s->rank, "file", s->file,
                     "raw_size", (json_int_t)s->raw_size, "stored_size", (json_int_t)s->stored_size,
                     "sha256", hex, "sections", secs, "chunks", chunks);
}

uint64_t *ckpt_section_offsets(const struct ckpt_manifest *m)
{
    uint64_t *off = malloc(((size_t)m->nunits * CKPT_NKINDS + 1) * sizeof *off), raw = 0;
    for (int u = 0; off && u < m->nunits; u++)
        for (int k = 0; k < CKPT_NKINDS; k++) {
            off[u * CKPT_NKINDS + k] = raw;
            raw += m->units[u].padded / (uint64_t)m->world * 4;
        }
    if (off)
        off[m->nunits * CKPT_NKINDS] = raw; /* the shard's raw size */
    return off;
}

/* The manifest carries the SHA-256 of its own canonical form (sorted keys,
 * compact, without the "digest" member), so a damaged byte anywhere in it -
 * a data cursor, a learning rate - is caught, not only in the shards. */
static int canonical_digest(json_t *j, char hex[65])
{
    json_t *copy = json_deep_copy(j);
    if (!copy)
        return -1;
    json_object_del(copy, "digest");
    char *doc = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(copy);
    if (!doc)
        return -1;
    int rc = fsdp_sha256_hex(doc, strlen(doc), hex);
    free(doc);
    return rc;
}

static int seal(json_t *j)
{
    char hex[65];
    if (canonical_digest(j, hex))
        return -1;
    return json_object_set_new(j, "digest", json_string(hex));
}

char *ckpt_manifest_dump(const struct ckpt_manifest *m)
{
    if (m->version != 1 && m->version != CKPT_FORMAT_VERSION)
        return NULL;
    json_t *units = json_array(), *shards = json_array(), *kl = json_array();
    for (int k = 0; k < CKPT_NKINDS; k++)
        json_array_append_new(kl, json_string(kinds[k]));
    for (int u = 0; u < m->nunits; u++) {
        const struct ckpt_unit *U = &m->units[u];
        json_t *ts = json_array();
        for (int i = 0; i < U->ntensors; i++) {
            const struct ckpt_tensor *t = &U->tensors[i];
            json_t *shape = json_array();
            for (int d = 0; d < t->ndim; d++)
                json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
            json_array_append_new(ts, json_pack("{s:s, s:s, s:o, s:I}", "name", t->name, "dtype",
                                                "float32", "shape", shape, "offset",
                                                (json_int_t)t->offset));
        }
        json_array_append_new(units, json_pack("{s:s, s:I, s:I, s:o}", "name", U->name, "numel",
                                               (json_int_t)U->numel, "padded",
                                               (json_int_t)U->padded, "tensors", ts));
    }
    uint64_t *sec_off = m->version == 1 ? ckpt_section_offsets(m) : NULL;
    for (int i = 0; i < m->nshards; i++) {
        if (m->version == 1 && (!sec_off || !m->shards[i].chunks))
            break;
        json_array_append_new(shards, m->version == 1 ? shard_to_json_v1(m, sec_off, i)
                                                      : ckpt_shard_to_json(&m->shards[i]));
    }
    free(sec_off);
    if (json_array_size(shards) != (size_t)m->nshards) {
        json_decref(units);
        json_decref(shards);
        json_decref(kl);
        return NULL;
    }
    json_t *j = json_pack(
        "{s:s, s:i, s:I, s:I, s:i, s:s, s:s, s:o, s:O, s:O, s:o, s:o}", "format", "fsdp-ckpt",
        "version", m->version, "step", (json_int_t)m->step, "generation", (json_int_t)m->generation,
        "world_size", m->world, "sharding", m->sharding, "dtype", "float32", "kinds", kl, "model",
        m->model ? m->model : json_object(), "trainer", m->trainer ? m->trainer : json_object(),
        "units", units, "shards", shards);
    if (j && m->version >= 2) {
        json_object_set_new(j, "chunk_bytes", json_integer((json_int_t)m->chunk_bytes));
        json_object_set_new(j, "chunk_hash", json_string(ckpt_hash_name(m->chunk_hash)));
    }
    char *s = NULL;
    if (j && seal(j) == 0)
        s = json_dumps(j, JSON_INDENT(1));
    json_decref(j);
    return s;
}

/* ---- from JSON ------------------------------------------------------------- */

#define LIMIT_UNITS   65536
#define LIMIT_TENSORS 65536
#define LIMIT_CHUNKS  CKPT_MAX_CHUNKS
#define LIMIT_WORLD   65536
#define LIMIT_NUMEL   (1ULL << 40)

static int bad(char *err, const char *what)
{
    fsdp_err(err, "manifest: %s", what);
    return -1;
}

/* A non-negative integer member within [0, max]. */
static int get_u64(json_t *o, const char *key, uint64_t max, uint64_t *out, char *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max) {
        fsdp_err(err, "manifest: '%s' is missing or out of range", key);
        return -1;
    }
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* A string member of printable ASCII without blanks (names: they reach
 * messages and the terminal, where a newline could forge a line), shorter
 * than n. */
static int get_str(json_t *o, const char *key, char *out, size_t n, char *err)
{
    const char *s = json_string_value(json_object_get(o, key));
    size_t len = s ? strlen(s) : 0;
    int printable = len > 0 && len == json_string_length(json_object_get(o, key));
    for (size_t i = 0; printable && i < len; i++)
        printable = s[i] > ' ' && s[i] < 0x7f;
    if (!s || len >= n || !printable) {
        fsdp_err(err, "manifest: '%s' is missing, too long or not printable", key);
        return -1;
    }
    snprintf(out, n, "%s", s);
    return 0;
}

static int lookup(const char *s, const char **names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* The members every shard entry has ("sha256": format 1 of the whole
 * object, format 2 of its chunk index). */
static int shard_common(json_t *j, struct ckpt_shard *s, char *err)
{
    uint64_t v;
    char hex[80];
    if (!json_is_object(j))
        return bad(err, "a shard entry is not an object");
    if (get_u64(j, "rank", LIMIT_WORLD, &v, err))
        return -1;
    s->rank = (int)v;
    if (get_str(j, "file", s->file, sizeof s->file, err) ||
        get_u64(j, "raw_size", UINT64_MAX >> 1, &s->raw_size, err) ||
        get_u64(j, "stored_size", UINT64_MAX >> 1, &s->stored_size, err) ||
        get_str(j, "sha256", hex, sizeof hex, err))
        return -1;
    if (fsdp_unhex(hex, 32, s->digest))
        return bad(err, "a shard's sha256 is not 64 hex digits");
    return 0;
}

int ckpt_shard_from_json(json_t *j, struct ckpt_shard *s, char *err)
{
    memset(s, 0, sizeof *s);
    uint64_t v;
    json_t *idx = json_object_get(j, "index");
    if (shard_common(j, s, err))
        return -1;
    if (get_u64(j, "chunks", LIMIT_CHUNKS, &v, err))
        return -1;
    s->nchunks = (int)v;
    if (!json_is_object(idx))
        return bad(err, "a shard entry lacks its chunk index");
    if (get_u64(idx, "offset", UINT64_MAX >> 1, &s->index_off, err) ||
        get_u64(idx, "length", UINT64_MAX >> 1, &s->index_len, err))
        return -1;
    return 0;
}

/* A format-1 shard entry: its sections must be the layout's (they are then
 * dropped: ckpt_section_offsets gives the same), its chunk table is kept. */
static int shard_from_json_v1(json_t *j, const struct ckpt_manifest *m, int r,
                              const uint64_t *sec_off, struct ckpt_shard *s, char *err)
{
    memset(s, 0, sizeof *s);
    uint64_t v, lo, n, raw_off;
    char hex[80];
    json_t *secs = json_object_get(j, "sections"), *chunks = json_object_get(j, "chunks");
    if (!json_is_object(j) || !json_is_array(secs) || !json_is_array(chunks))
        return bad(err, "a shard entry lacks sections or chunks");
    if (shard_common(j, s, err))
        return -1;
    if (json_array_size(secs) != (size_t)m->nunits * CKPT_NKINDS)
        return bad(err, "a shard does not hold every unit and kind");
    for (size_t i = 0; i < json_array_size(secs); i++) {
        json_t *x = json_array_get(secs, i);
        int unit = (int)(i / CKPT_NKINDS), kind = (int)(i % CKPT_NKINDS);
        if (lookup(json_string_value(json_object_get(x, "kind")), kinds, CKPT_NKINDS) < 0)
            return bad(err, "a section has an unknown kind");
        if (get_u64(x, "unit", LIMIT_UNITS, &v, err) || get_u64(x, "lo", LIMIT_NUMEL, &lo, err) ||
            get_u64(x, "n", LIMIT_NUMEL, &n, err) ||
            get_u64(x, "raw_offset", UINT64_MAX >> 1, &raw_off, err))
            return -1;
        uint64_t per = m->units[unit].padded / (uint64_t)m->world;
        if ((int)v != unit ||
            lookup(json_string_value(json_object_get(x, "kind")), kinds, CKPT_NKINDS) != kind)
            return bad(err, "a shard's sections are not in unit, kind order");
        if (lo != (uint64_t)r * per || n != per || raw_off != sec_off[i]) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s: section %s/%s does not match the layout", s->file,
                     m->units[unit].name, ckpt_kind_name(kind));
            return bad(err, msg);
        }
    }
    size_t nc = json_array_size(chunks);
    if (nc > LIMIT_CHUNKS)
        return bad(err, "too many chunks");
    s->chunks = calloc(nc ? nc : 1, sizeof *s->chunks);
    if (!s->chunks)
        return bad(err, "out of memory");
    s->nchunks = (int)nc;
    for (size_t i = 0; i < nc; i++) {
        json_t *x = json_array_get(chunks, i);
        struct ckpt_chunk *c = &s->chunks[i];
        c->codec = lookup(json_string_value(json_object_get(x, "codec")), codecs, 3);
        if (c->codec < 0)
            return bad(err, "a chunk has an unknown codec");
        if (get_u64(x, "raw_offset", UINT64_MAX >> 1, &c->raw_off, err) ||
            get_u64(x, "raw_length", CKPT_MAX_CHUNK_BYTES, &c->raw_len, err) ||
            get_u64(x, "stored_offset", UINT64_MAX >> 1, &c->stored_off, err) ||
            get_u64(x, "stored_length", 2ULL * CKPT_MAX_CHUNK_BYTES, &c->stored_len, err) ||
            get_str(x, "sha256", hex, sizeof hex, err) || fsdp_unhex(hex, 32, c->digest))
            return bad(err, "a chunk entry is malformed");
    }
    return 0;
}

static int parse_units(json_t *ju, struct ckpt_manifest *m, char *err)
{
    size_t nu = json_array_size(ju);
    if (!json_is_array(ju) || nu == 0 || nu > LIMIT_UNITS)
        return bad(err, "'units' is missing, empty or too long");
    m->units = calloc(nu, sizeof *m->units);
    if (!m->units)
        return bad(err, "out of memory");
    m->nunits = (int)nu;
    for (size_t u = 0; u < nu; u++) {
        json_t *x = json_array_get(ju, u), *ts = json_object_get(x, "tensors");
        struct ckpt_unit *U = &m->units[u];
        if (get_str(x, "name", U->name, sizeof U->name, err) ||
            get_u64(x, "numel", LIMIT_NUMEL, &U->numel, err) ||
            get_u64(x, "padded", LIMIT_NUMEL, &U->padded, err))
            return -1;
        size_t nt = json_array_size(ts);
        if (!json_is_array(ts) || nt == 0 || nt > LIMIT_TENSORS)
            return bad(err, "a unit's 'tensors' is missing, empty or too long");
        U->tensors = calloc(nt, sizeof *U->tensors);
        if (!U->tensors)
            return bad(err, "out of memory");
        U->ntensors = (int)nt;
        for (size_t i = 0; i < nt; i++) {
            json_t *t = json_array_get(ts, i), *shape = json_object_get(t, "shape");
            struct ckpt_tensor *ct = &U->tensors[i];
            const char *dtype = json_string_value(json_object_get(t, "dtype"));
            if (get_str(t, "name", ct->name, sizeof ct->name, err) ||
                get_u64(t, "offset", LIMIT_NUMEL, &ct->offset, err))
                return -1;
            if (!dtype || strcmp(dtype, "float32") != 0)
                return bad(err, "a tensor's dtype is not float32");
            size_t nd = json_array_size(shape);
            if (!json_is_array(shape) || nd < 1 || nd > 4)
                return bad(err, "a tensor's shape is not 1 to 4 dimensions");
            ct->ndim = (int)nd;
            ct->numel = 1;
            for (size_t d = 0; d < nd; d++) {
                json_t *dim = json_array_get(shape, d);
                if (!json_is_integer(dim) || json_integer_value(dim) < 1 ||
                    (uint64_t)json_integer_value(dim) > LIMIT_NUMEL)
                    return bad(err, "a tensor dimension is out of range");
                ct->shape[d] = (uint64_t)json_integer_value(dim);
                if (ct->numel > LIMIT_NUMEL / ct->shape[d])
                    return bad(err, "a tensor is too large");
                ct->numel *= ct->shape[d];
            }
        }
    }
    return 0;
}

int ckpt_manifest_check(const struct ckpt_manifest *m, char *err)
{
    char msg[256];
    if (m->world < 1 || m->world > LIMIT_WORLD || m->nshards != m->world)
        return bad(err, "world size and shard count disagree");
    if (m->version < 1 || m->version > CKPT_FORMAT_VERSION)
        return bad(err, "unknown format version");
    if (m->chunk_bytes < 4 || m->chunk_bytes > CKPT_MAX_CHUNK_BYTES || m->chunk_bytes % 4)
        return bad(err, "'chunk_bytes' is out of range");
    if (m->chunk_hash != CKPT_HASH_SHA256 && (m->version < 2 || m->chunk_hash != CKPT_HASH_XXH3))
        return bad(err, "unknown chunk hash");
    uint64_t raw = 0; /* every shard's raw size */
    for (int u = 0; u < m->nunits; u++) {
        const struct ckpt_unit *U = &m->units[u];
        if (U->numel == 0 || U->padded < U->numel || U->padded % (uint64_t)m->world ||
            U->padded - U->numel >= (uint64_t)m->world) {
            snprintf(msg, sizeof msg, "unit %s: numel %llu and padded %llu do not fit world %d",
                     U->name, (unsigned long long)U->numel, (unsigned long long)U->padded,
                     m->world);
            return bad(err, msg);
        }
        raw += U->padded / (uint64_t)m->world * 4 * CKPT_NKINDS;
        uint64_t end = 0;
        for (int i = 0; i < U->ntensors; i++) {
            const struct ckpt_tensor *ct = &U->tensors[i];
            if (ct->offset < end || ct->offset + ct->numel > U->numel) {
                snprintf(msg, sizeof msg, "tensor %s overlaps or lies outside unit %s", ct->name,
                         U->name);
                return bad(err, msg);
            }
            end = ct->offset + ct->numel;
        }
    }
    for (int r = 0; r < m->nshards; r++) {
        const struct ckpt_shard *s = &m->shards[r];
        int name_rank, name_world;
        uint64_t gen;
        if (s->rank != r || ckpt_parse_shard_name(s->file, &name_rank, &name_world, &gen) ||
            name_rank != r || name_world != m->world) {
            snprintf(msg, sizeof msg,
                     "shard %d is named '%.64s', expected shard-%05d-of-%05d[.TAG]", r, s->file, r,
                     m->world);
            return bad(err, msg);
        }
        if (s->raw_size != raw) {
            snprintf(msg, sizeof msg, "%s: raw size %llu, the layout gives %llu", s->file,
                     (unsigned long long)s->raw_size, (unsigned long long)raw);
            return bad(err, msg);
        }
        if (m->version >= 2) {
            uint64_t n = (raw + m->chunk_bytes - 1) / m->chunk_bytes;
            if (n > LIMIT_CHUNKS || (uint64_t)s->nchunks != n ||
                s->index_len != CKPT_INDEX_HEADER + n * CKPT_INDEX_ENTRY || s->index_off < n ||
                s->index_off > s->stored_size || s->stored_size - s->index_off != s->index_len) {
                snprintf(msg, sizeof msg, "%s: chunk count, index and sizes disagree", s->file);
                return bad(err, msg);
            }
        }
        if (!s->chunks) { /* format 2 as stored: the index is checked when fetched */
            if (m->version < 2)
                return bad(err, "a shard lacks its chunk table");
            continue;
        }
        uint64_t ro = 0, so = 0;
        for (int i = 0; i < s->nchunks; i++) {
            const struct ckpt_chunk *c = &s->chunks[i];
            if (c->raw_off != ro || c->stored_off != so || c->raw_len == 0 || c->raw_len % 4 ||
                c->raw_len > m->chunk_bytes ||
                (c->codec == CKPT_CODEC_RAW && c->stored_len != c->raw_len)) {
                snprintf(msg, sizeof msg, "%s: chunk %d breaks the chunk table", s->file, i);
                return bad(err, msg);
            }
            ro += c->raw_len;
            so += c->stored_len;
        }
        if (ro != s->raw_size || so != (m->version >= 2 ? s->index_off : s->stored_size)) {
            snprintf(msg, sizeof msg, "%s: chunks do not add up to the shard's sizes", s->file);
            return bad(err, msg);
        }
    }
    return 0;
}

int ckpt_manifest_parse(const char *buf, size_t len, struct ckpt_manifest *m, char *err)
{
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        /* jansson quotes the input near the error: keep it to one printable line */
        for (char *c = je.text; *c; c++)
            if ((unsigned char)*c < ' ' || (unsigned char)*c >= 0x7f)
                *c = '?';
        fsdp_err(err, "manifest: not JSON: %s at line %d", je.text, je.line);
        return -1;
    }
    int rc = -1;
    uint64_t v;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    json_t *shards = json_object_get(j, "shards");
    if (!fmt || strcmp(fmt, "fsdp-ckpt") != 0) {
        bad(err, "'format' is not fsdp-ckpt");
        goto out;
    }
    if (get_u64(j, "version", 1000, &v, err))
        goto out;
    if (v < 1 || v > CKPT_FORMAT_VERSION) {
        fsdp_err(err, "manifest: format version %llu, this build reads 1 to %d",
                 (unsigned long long)v, CKPT_FORMAT_VERSION);
        goto out;
    }
    m->version = (int)v;
    char want[65];
    const char *digest = json_string_value(json_object_get(j, "digest"));
    if (!digest || canonical_digest(j, want) || strcmp(digest, want) != 0) {
        bad(err, "its own digest does not match: the manifest is damaged");
        goto out;
    }
    if (get_u64(j, "step", UINT64_MAX >> 1, &m->step, err) ||
        get_u64(j, "generation", UINT64_MAX >> 1, &m->generation, err) ||
        get_u64(j, "world_size", LIMIT_WORLD, &v, err) ||
        get_str(j, "sharding", m->sharding, sizeof m->sharding, err))
        goto out;
    m->world = (int)v;
    if (m->world < 1) {
        bad(err, "'world_size' is 0");
        goto out;
    }
    if (m->version >= 2 && get_u64(j, "chunk_bytes", CKPT_MAX_CHUNK_BYTES, &m->chunk_bytes, err))
        goto out;
    const char *hash = json_string_value(json_object_get(j, "chunk_hash"));
    if (m->version >= 2 && (!hash || ckpt_parse_hash(hash, &m->chunk_hash) ||
                            strcmp(hash, ckpt_hash_name(m->chunk_hash)) != 0)) {
        bad(err, "'chunk_hash' is not sha256 or xxh3-128");
        goto out;
    }
    const char *dtype = json_string_value(json_object_get(j, "dtype"));
    if (!dtype || strcmp(dtype, "float32") != 0) {
        bad(err, "'dtype' is not float32");
        goto out;
    }
    m->model = json_incref(json_object_get(j, "model"));
    m->trainer = json_incref(json_object_get(j, "trainer"));
    if (!json_is_object(m->model) || !json_is_object(m->trainer)) {
        bad(err, "'model' or 'trainer' is not an object");
        goto out;
    }
    if (parse_units(json_object_get(j, "units"), m, err))
        goto out;
    size_t ns = json_array_size(shards);
    if (!json_is_array(shards) || ns != (size_t)m->world) {
        bad(err, "'shards' does not have one entry per rank");
        goto out;
    }
    m->shards = calloc(ns, sizeof *m->shards);
    if (!m->shards) {
        bad(err, "out of memory");
        goto out;
    }
    uint64_t *sec_off = m->version == 1 ? ckpt_section_offsets(m) : NULL;
    if (m->version == 1 && !sec_off) {
        bad(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < ns; i++) {
        m->nshards = (int)i + 1; /* freed with m, also when half parsed */
        json_t *x = json_array_get(shards, i);
        if (m->version == 1 ? shard_from_json_v1(x, m, (int)i, sec_off, &m->shards[i], err)
                            : ckpt_shard_from_json(x, &m->shards[i], err)) {
            free(sec_off);
            goto out;
        }
        for (int c = 0; m->version == 1 && c < m->shards[i].nchunks; c++)
            if (m->shards[i].chunks[c].raw_len > m->chunk_bytes)
                m->chunk_bytes = m->shards[i].chunks[c].raw_len;
    }
    free(sec_off);
    if (m->version == 1 && m->chunk_bytes < 4)
        m->chunk_bytes = 4; /* no chunk at all: the check below refuses it anyway */
    rc = ckpt_manifest_check(m, err);
out:
    json_decref(j);
    if (rc)
        ckpt_manifest_free(m);
    return rc;
}
