/*
 * reader.c - verified reads of any byte range of a checkpoint, the reshard
 * planner, shard verification and logical digests.
 *
 * Every chunk is checked against its digest (XXH3-128 or SHA-256, as the
 * shard's index says) before it is decoded and before any of its bytes are
 * used; a mismatch is an error naming the shard, the chunk and its offsets.
 * Decoded chunks are kept in a small LRU cache so that neighbouring ranges
 * do not fetch a chunk twice.
 */
#include "codec.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckpt_reader_init(struct ckpt_reader *r, struct storage *st, const struct ckpt_manifest *m,
                     char *err)
{
    memset(r, 0, sizeof *r);
    size_t max = m->chunk_bytes > 4 ? (size_t)m->chunk_bytes : 4;
    r->codec = ckpt_codec_new(max);
    r->sec_off = ckpt_section_offsets(m);
    r->tables = calloc((size_t)m->nshards + 1, sizeof *r->tables);
    int ok = r->codec && r->sec_off && r->tables;
    for (int i = 0; ok && i < CKPT_READER_CACHE; i++) {
        r->cache[i].shard = r->cache[i].chunk = -1;
        ok = (r->cache[i].raw = malloc(max)) != NULL;
    }
    if (!ok) {
        r->m = m;
        ckpt_reader_free(r);
        fsdp_err(err, "reader: out of memory for %zu-byte chunks", max);
        return -1;
    }
    r->st = st;
    r->m = m;
    r->threads = 1;
    ckpt_step_dir(m->step, r->dir, sizeof r->dir);
    return 0;
}

void ckpt_reader_free(struct ckpt_reader *r)
{
    ckpt_codec_free(r->codec);
    r->codec = NULL;
    for (int i = 0; i < CKPT_READER_CACHE; i++) {
        free(r->cache[i].raw);
        r->cache[i].raw = NULL;
    }
    for (int i = 0; r->tables && i < r->m->nshards; i++)
        if (r->tables[i] != r->m->shards[i].chunks)
            free(r->tables[i]);
    free(r->tables);
    free(r->sec_off);
    r->tables = NULL;
    r->sec_off = NULL;
}

int ckpt_fetch_index(struct ckpt_reader *r, int shard, unsigned char **buf, char *err)
{
    const struct ckpt_shard *s = &r->m->shards[shard];
    char key[128];
    snprintf(key, sizeof key, "%s/%s", r->dir, s->file);
    *buf = NULL;
    if (r->m->version < 2) {
        fsdp_err(err, "%s: format %d has no chunk index", key, r->m->version);
        return -1;
    }
    /* the manifest check bounds index_len by the chunk count */
    unsigned char *b = malloc((size_t)s->index_len);
    if (!b) {
        fsdp_err(err, "%s: out of memory for its chunk index", key);
        return -1;
    }
    if (storage_get_range(r->st, key, s->index_off, (size_t)s->index_len, b, err)) {
        free(b);
        return -1;
    }
    r->bytes_fetched += s->index_len;
    r->index_bytes_fetched += s->index_len;
    unsigned char got[32];
    ckpt_sha256(b, (size_t)s->index_len, got);
    if (memcmp(got, s->digest, 32) != 0) {
        fsdp_err(err, "%s: chunk index (stored bytes %llu..%llu): sha256 mismatch", key,
                 (unsigned long long)s->index_off,
                 (unsigned long long)(s->index_off + s->index_len));
        free(b);
        return -1;
    }
    *buf = b;
    return 0;
}

int ckpt_shard_chunks(struct ckpt_reader *r, int shard, const struct ckpt_chunk **tab, char *err)
{
    if (!r->tables[shard] && r->m->shards[shard].chunks)
        r->tables[shard] = r->m->shards[shard].chunks;
    if (!r->tables[shard]) {
        unsigned char *b;
        if (ckpt_fetch_index(r, shard, &b, err))
            return -1;
        char sub[FSDP_ERR_LEN];
        int rc = ckpt_index_decode(b, (size_t)r->m->shards[shard].index_len, &r->m->shards[shard],
                                   r->m->chunk_bytes, &r->tables[shard], sub);
        free(b);
        if (rc) {
            fsdp_err(err, "%s/%.400s", r->dir, sub);
            return -1;
        }
    }
    *tab = r->tables[shard];
    return 0;
}

/* Fetches the stored bytes of a chunk into codec->stored and checks them. */
static int fetch_verified(struct ckpt_reader *r, int shard, int ci, char *err)
{
    const struct ckpt_shard *s = &r->m->shards[shard];
    const struct ckpt_chunk *c = &r->tables[shard][ci];
    struct ckpt_codec *k = r->codec;
    char key[128];
    snprintf(key, sizeof key, "%s/%s", r->dir, s->file);
    if (c->stored_len > k->stored_cap) {
        fsdp_err(err, "%s: chunk %d: stored length %llu exceeds its bound", key, ci,
                 (unsigned long long)c->stored_len);
        return -1;
    }
    if (storage_get_range(r->st, key, c->stored_off, (size_t)c->stored_len, k->stored, err))
        return -1;
    r->bytes_fetched += c->stored_len;
    r->chunks_fetched++;
    if (r->on_chunk)
        r->on_chunk();
    unsigned char got[32];
    ckpt_digest_bytes(r->m->chunk_hash, k->stored, (size_t)c->stored_len, got);
    if (memcmp(got, c->digest, 32) != 0) {
        fsdp_err(err, "%s: chunk %d (stored bytes %llu..%llu, raw offset %llu): %s mismatch", key,
                 ci, (unsigned long long)c->stored_off,
                 (unsigned long long)(c->stored_off + c->stored_len),
                 (unsigned long long)c->raw_off, ckpt_hash_name(r->m->chunk_hash));
        return -1;
    }
    return 0;
}

static int decode_into(struct ckpt_reader *r, int shard, int ci, unsigned char *dst, char *err)
{
    const struct ckpt_chunk *c = &r->tables[shard][ci];
    const char *why = "";
    if (ckpt_decode(r->codec, c->codec, (size_t)c->stored_len, dst, (size_t)c->raw_len, &why)) {
        fsdp_err(err, "%s/%s: chunk %d (raw offset %llu): cannot decode: %s", r->dir,
                 r->m->shards[shard].file, ci, (unsigned long long)c->raw_off, why);
        return -1;
    }
    return 0;
}

/* The decoded bytes of a chunk, from the cache or freshly fetched. */
static const unsigned char *chunk_bytes(struct ckpt_reader *r, int shard, int ci, char *err)
{
    int victim = 0;
    for (int i = 0; i < CKPT_READER_CACHE; i++) {
        if (r->cache[i].shard == shard && r->cache[i].chunk == ci) {
            r->cache[i].used = ++r->tick;
            return r->cache[i].raw;
        }
        if (r->cache[i].used < r->cache[victim].used)
            victim = i;
    }
    r->cache[victim].shard = r->cache[victim].chunk = -1;
    if (fetch_verified(r, shard, ci, err) || decode_into(r, shard, ci, r->cache[victim].raw, err))
        return NULL;
    r->cache[victim].shard = shard;
    r->cache[victim].chunk = ci;
    r->cache[victim].used = ++r->tick;
    return r->cache[victim].raw;
}

int ckpt_verify_chunk(struct ckpt_reader *r, int shard, int chunk, char *err)
{
    const struct ckpt_chunk *tab;
    if (ckpt_shard_chunks(r, shard, &tab, err))
        return -1;
    if (chunk < 0 || chunk >= r->m->shards[shard].nchunks) {
        fsdp_err(err, "%s/%s: no chunk %d", r->dir, r->m->shards[shard].file, chunk);
        return -1;
    }
    if (fetch_verified(r, shard, chunk, err))
        return -1;
    /* decode too (into the codec's raw buffer, not the cache): a chunk
     * that hashes right but does not decode is damaged as well */
    return decode_into(r, shard, chunk, r->codec->raw, err);
}

const void *ckpt_reader_stored(const struct ckpt_reader *r) { return r->codec->stored; }

int ckpt_verify_shard(struct ckpt_reader *r, int shard, void (*bad)(void *arg, const char *msg),
                      void *arg)
{
    const struct ckpt_shard *s = &r->m->shards[shard];
    char key[128], err[FSDP_ERR_LEN], msg[FSDP_ERR_LEN + 64];
    int problems = 0;
    snprintf(key, sizeof key, "%s/%s", r->dir, s->file);
    uint64_t size;
    if (storage_stat(r->st, key, &size, err)) {
        bad(arg, err);
        return 1;
    }
    if (size != s->stored_size) {
        snprintf(msg, sizeof msg, "%s: %llu bytes, the manifest says %llu", key,
                 (unsigned long long)size, (unsigned long long)s->stored_size);
        bad(arg, msg);
        problems++;
    }
    /* format 2: the index (its SHA-256 is the shard's digest), then every
     * chunk against it; format 1: every chunk, and the whole object's SHA-256 */
    const struct ckpt_chunk *tab;
    if (ckpt_shard_chunks(r, shard, &tab, err)) { /* a bad index: no chunk can be found */
        bad(arg, err);
        return problems + 1;
    }
    EVP_MD_CTX *md = r->m->version < 2 ? EVP_MD_CTX_new() : NULL;
    if (r->m->version < 2 && !md) {
        bad(arg, "out of memory for a digest context");
        return problems + 1;
    }
    if (md)
        EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    int pooled = !md && r->threads > 1 && r->st->ops->concurrent_reads;
    if (pooled)
        problems += ckpt_verify_chunks_parallel(r, shard, r->threads, bad, arg);
    for (int c = 0; !pooled && c < s->nchunks; c++) {
        if (fetch_verified(r, shard, c, err) || decode_into(r, shard, c, r->codec->raw, err)) {
            bad(arg, err);
            problems++;
            continue;
        }
        if (md)
            EVP_DigestUpdate(md, r->codec->stored, (size_t)tab[c].stored_len);
    }
    if (md) {
        unsigned char sha[32];
        unsigned int dl = 32;
        EVP_DigestFinal_ex(md, sha, &dl);
        EVP_MD_CTX_free(md);
        if (!problems && memcmp(sha, s->digest, 32) != 0) {
            snprintf(msg, sizeof msg, "%s: shard sha256 mismatch", key);
            bad(arg, msg);
            problems++;
        }
    }
    if (r->tables[shard] != s->chunks) { /* a fetched index: verify holds one at a time */
        free(r->tables[shard]);
        r->tables[shard] = NULL;
    }
    return problems;
}

int ckpt_read_shard(struct ckpt_reader *r, int shard, uint64_t off, uint64_t len, void *dst,
                    char *err)
{
    const struct ckpt_shard *s = &r->m->shards[shard];
    if (off > s->raw_size || len > s->raw_size - off) {
        fsdp_err(err, "%s: read of %llu bytes at %llu is beyond its %llu bytes", s->file,
                 (unsigned long long)len, (unsigned long long)off, (unsigned long long)s->raw_size);
        return -1;
    }
    const struct ckpt_chunk *tab;
    if (len == 0)
        return 0;
    if (ckpt_shard_chunks(r, shard, &tab, err))
        return -1;
    int lo = 0, hi = s->nchunks - 1; /* the chunk holding off */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tab[mid].raw_off <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    unsigned char *out = dst;
    for (int ci = lo; len > 0; ci++) {
        const unsigned char *raw = chunk_bytes(r, shard, ci, err);
        if (!raw)
            return -1;
        const struct ckpt_chunk *c = &tab[ci];
        uint64_t in = off - c->raw_off, take = c->raw_len - in;
        take = take < len ? take : len;
        memcpy(out, raw + in, (size_t)take);
        out += take;
        off += take;
        len -= take;
    }
    return 0;
}

/* ---- the reshard planner ------------------------------------------------- */

static int by_place(const void *a, const void *b)
{
    const struct ckpt_piece *x = a, *y = b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Splits one want into pieces (at most one per old shard it crosses, and
 * one of padding). */
static void plan_want(const struct ckpt_reader *r, const struct ckpt_want *w,
                      struct ckpt_piece *out, int *n)
{
    const struct ckpt_manifest *m = r->m;
    const uint64_t sec = r->sec_off[w->unit * CKPT_NKINDS + w->kind];
    const struct ckpt_unit *U = &m->units[w->unit];
    const uint64_t per = U->padded / (uint64_t)m->world;
    uint64_t x = w->lo, end = w->lo + w->n;
    while (x < end) {
        if (x >= U->numel) { /* padding: no tensor lives there */
            out[(*n)++] = (struct ckpt_piece){-1, 0, (end - x) * 4, w->dst + (x - w->lo)};
            break;
        }
        int rank = (int)(x / per);
        uint64_t stop = (uint64_t)(rank + 1) * per;
        stop = stop < end ? stop : end;
        stop = stop < U->numel ? stop : U->numel;
        out[(*n)++] = (struct ckpt_piece){rank, sec + (x - (uint64_t)rank * per) * 4,
                                          (stop - x) * 4, w->dst + (x - w->lo)};
        x = stop;
    }
}

static int want_ok(const struct ckpt_manifest *m, const struct ckpt_want *w, char *err)
{
    if (w->unit < 0 || w->unit >= m->nunits || w->kind < 0 || w->kind >= CKPT_NKINDS ||
        w->lo + w->n < w->lo) {
        fsdp_err(err, "load: bad request for unit %d kind %d", w->unit, w->kind);
        return -1;
    }
    return 0;
}

int ckpt_plan_load(const struct ckpt_reader *r, const struct ckpt_want *w, int nw,
                   struct ckpt_plan *p, char *err)
{
    memset(p, 0, sizeof *p);
    size_t cap = 0;
    for (int i = 0; i < nw; i++) {
        if (want_ok(r->m, &w[i], err))
            return -1;
        const struct ckpt_unit *U = &r->m->units[w[i].unit];
        uint64_t per = U->padded / (uint64_t)r->m->world;
        cap += (size_t)(w[i].n / per) + 3;
    }
    p->pieces = calloc(cap ? cap : 1, sizeof *p->pieces);
    if (!p->pieces) {
        fsdp_err(err, "load: out of memory for the plan");
        return -1;
    }
    for (int i = 0; i < nw; i++)
        plan_want(r, &w[i], p->pieces, &p->npieces);
    qsort(p->pieces, (size_t)p->npieces, sizeof *p->pieces, by_place);
    return 0;
}

void ckpt_plan_free(struct ckpt_plan *p)
{
    free(p->pieces);
    memset(p, 0, sizeof *p);
}

int ckpt_plan_indexes(struct ckpt_reader *r, const struct ckpt_plan *p, char *err)
{
    const struct ckpt_chunk *tab;
    for (int i = 0; i < p->npieces; i++)
        if (p->pieces[i].shard >= 0 && (i == 0 || p->pieces[i - 1].shard != p->pieces[i].shard) &&
            ckpt_shard_chunks(r, p->pieces[i].shard, &tab, err))
            return -1;
    return 0;
}

int ckpt_plan_run(struct ckpt_reader *r, const struct ckpt_plan *p, char *err)
{
    /* A plan of a few chunks (the tools read tensors 256 KiB at a time) goes
     * through the reader's cache, so the next small read finds its chunk
     * there; the pool fetches every chunk it is given, so it takes only plans
     * larger than two chunks (a rank's load). */
    uint64_t bytes = 0;
    for (int i = 0; i < p->npieces; i++)
        bytes += p->pieces[i].shard >= 0 ? p->pieces[i].len : 0;
    if (r->st->ops->concurrent_reads && bytes > 2 * (uint64_t)r->m->chunk_bytes)
        return ckpt_plan_run_parallel(r, p, r->threads, err);
    for (int i = 0; i < p->npieces; i++) {
        const struct ckpt_piece *x = &p->pieces[i];
        if (x->shard < 0)
            memset(x->dst, 0, (size_t)x->len);
        else if (ckpt_read_shard(r, x->shard, x->off, x->len, x->dst, err))
            return -1;
    }
    return 0;
}

int ckpt_load(struct ckpt_reader *r, const struct ckpt_want *w, int nw, char *err)
{
    struct ckpt_plan p;
    if (ckpt_plan_load(r, w, nw, &p, err))
        return -1;
    int rc = ckpt_plan_run(r, &p, err);
    ckpt_plan_free(&p);
    return rc;
}

int ckpt_read_unit(struct ckpt_reader *r, int unit, int kind, uint64_t lo, uint64_t n, float *dst,
                   char *err)
{
    struct ckpt_want w = {unit, kind, lo, n, dst};
    return ckpt_load(r, &w, 1, err);
}

int ckpt_tensor_digest(uint64_t numel,
                       const float *(*piece)(void *arg, uint64_t off, uint64_t n, char *err),
                       void *arg, char hex[65], char *err)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md)
        return fsdp_err(err, "digest: out of memory");
    int rc = 0;
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    for (uint64_t x = 0; !rc && x < numel; x += CKPT_DIGEST_PIECE) {
        uint64_t n = numel - x < CKPT_DIGEST_PIECE ? numel - x : CKPT_DIGEST_PIECE;
        const float *v = piece(arg, x, n, err);
        if (v)
            EVP_DigestUpdate(md, v, (size_t)n * sizeof *v);
        else
            rc = -1;
    }
    unsigned char sha[32];
    unsigned int dl = 32;
    EVP_DigestFinal_ex(md, sha, &dl);
    EVP_MD_CTX_free(md);
    if (!rc)
        ckpt_hex(sha, hex);
    return rc;
}

/* ckpt_digest's source of values: one tensor of one kind, read through the
 * reader into buf (CKPT_DIGEST_PIECE floats). */
struct tensor_source {
    struct ckpt_reader *r;
    int unit, kind;
    uint64_t offset; /* the tensor's, in its unit */
    float *buf;
};

static const float *read_piece(void *arg, uint64_t off, uint64_t n, char *err)
{
    struct tensor_source *s = arg;
    if (ckpt_read_unit(s->r, s->unit, s->kind, s->offset + off, n, s->buf, err))
        return NULL;
    return s->buf;
}

int ckpt_digest(struct ckpt_reader *r,
                int (*fn)(void *arg, const char *tensor, const char *kind, const char *hex),
                void *arg, char *err)
{
    float *buf = malloc(CKPT_DIGEST_PIECE * sizeof *buf);
    if (!buf)
        return fsdp_err(err, "digest: out of memory");
    int rc = 0;
    for (int u = 0; !rc && u < r->m->nunits; u++) {
        const struct ckpt_unit *U = &r->m->units[u];
        for (int t = 0; !rc && t < U->ntensors; t++) {
            const struct ckpt_tensor *ct = &U->tensors[t];
            for (int k = 0; !rc && k < CKPT_NKINDS; k++) {
                struct tensor_source src = {r, u, k, ct->offset, buf};
                char hex[65];
                rc = ckpt_tensor_digest(ct->numel, read_piece, &src, hex, err);
                if (!rc)
                    rc = fn(arg, ct->name, ckpt_kind_name(k), hex);
            }
        }
    }
    free(buf);
    return rc;
}
