/*
 * shard.c - writing a shard as a chunk stream, and reading any byte range
 * of one back with every chunk verified.
 *
 * A chunk is encoded on its own: raw, zstd (level from the options, with
 * zstd's content checksum so decoding also checks the raw bytes), or zstd
 * after a byte-plane shuffle (all first bytes of the floats, then all
 * second bytes, ...), which groups the slowly varying exponent bytes and
 * typically compresses float32 state better. A chunk that does not shrink
 * is stored raw. The SHA-256 of each stored chunk is checked before it is
 * decoded; the shard's SHA-256 covers the stored stream in order.
 */
#include "ckpt.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

struct ckpt_codec {
    size_t chunk_bytes;
    unsigned char *raw, *shuf, *stored;
    size_t stored_cap;
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
};

struct ckpt_codec *ckpt_codec_new(size_t chunk_bytes)
{
    struct ckpt_codec *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->chunk_bytes = chunk_bytes;
    c->stored_cap = ZSTD_compressBound(chunk_bytes);
    c->raw = malloc(chunk_bytes);
    c->shuf = malloc(chunk_bytes);
    c->stored = malloc(c->stored_cap);
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    if (!c->raw || !c->shuf || !c->stored || !c->cctx || !c->dctx) {
        ckpt_codec_free(c);
        return NULL;
    }
    /* touch the buffers once now: first-touch pages are slow here */
    memset(c->raw, 0, chunk_bytes);
    memset(c->shuf, 0, chunk_bytes);
    memset(c->stored, 0, c->stored_cap);
    return c;
}

void ckpt_codec_free(struct ckpt_codec *c)
{
    if (!c)
        return;
    free(c->raw);
    free(c->shuf);
    free(c->stored);
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c);
}

int ckpt_parse_compress(const char *s, struct ckpt_write_opts *o, char *err)
{
    const char *rest = NULL;
    if (strcmp(s, "none") == 0) {
        o->codec = CKPT_CODEC_RAW;
        return 0;
    }
    if (strncmp(s, "zstd+shuffle", 12) == 0) {
        o->codec = CKPT_CODEC_ZSTD_SHUFFLE4;
        rest = s + 12;
    } else if (strncmp(s, "zstd", 4) == 0) {
        o->codec = CKPT_CODEC_ZSTD;
        rest = s + 4;
    }
    if (rest && *rest == 0) {
        o->level = 3;
        return 0;
    }
    if (rest && *rest == ':') {
        char *end;
        long lv = strtol(rest + 1, &end, 10);
        if (!*end && end != rest + 1 && lv >= ZSTD_minCLevel() && lv <= ZSTD_maxCLevel()) {
            o->level = (int)lv;
            return 0;
        }
    }
    snprintf(err, CKPT_ERR_LEN,
             "--compress '%s' is not none, zstd[:LEVEL] or zstd+shuffle[:LEVEL] (levels %d..%d)",
             s, ZSTD_minCLevel(), ZSTD_maxCLevel());
    return -1;
}

static void sha256(const void *p, size_t n, unsigned char out[32])
{
    unsigned int len = 32;
    EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

static void shuffle4(unsigned char *dst, const unsigned char *src, size_t n)
{
    size_t nf = n / 4;
    for (size_t i = 0; i < nf; i++)
        for (int b = 0; b < 4; b++)
            dst[(size_t)b * nf + i] = src[i * 4 + (size_t)b];
}

static void unshuffle4(unsigned char *dst, const unsigned char *src, size_t n)
{
    size_t nf = n / 4;
    for (int b = 0; b < 4; b++)
        for (size_t i = 0; i < nf; i++)
            dst[i * 4 + (size_t)b] = src[(size_t)b * nf + i];
}

/* Encodes codec->raw[0..len) into (out, out_len); returns the codec used. */
static int encode(struct ckpt_codec *c, const struct ckpt_write_opts *o, size_t len,
                  const unsigned char **out, size_t *out_len)
{
    if (o->codec != CKPT_CODEC_RAW) {
        const unsigned char *in = c->raw;
        if (o->codec == CKPT_CODEC_ZSTD_SHUFFLE4) {
            shuffle4(c->shuf, c->raw, len);
            in = c->shuf;
        }
        ZSTD_CCtx_reset(c->cctx, ZSTD_reset_session_and_parameters);
        ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, o->level);
        ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 1);
        size_t z = ZSTD_compress2(c->cctx, c->stored, c->stored_cap, in, len);
        if (!ZSTD_isError(z) && z < len) {
            *out = c->stored;
            *out_len = z;
            return o->codec;
        }
    }
    *out = c->raw;
    *out_len = len;
    return CKPT_CODEC_RAW;
}

int ckpt_shard_write(struct storage *st, const char *key, const char *file,
                     const struct ckpt_write_opts *o, struct ckpt_codec *codec,
                     const struct ckpt_src *src, int nsrc, int rank, struct ckpt_shard *out,
                     void (*hook)(int chunk), char *err)
{
    memset(out, 0, sizeof *out);
    snprintf(out->file, sizeof out->file, "%s", file);
    out->rank = rank;
    const size_t cb = codec->chunk_bytes;
    uint64_t raw = 0;
    for (int i = 0; i < nsrc; i++)
        raw += src[i].n * 4;
    size_t nchunks = (size_t)((raw + cb - 1) / cb);
    out->sections = calloc((size_t)nsrc, sizeof *out->sections);
    out->chunks = calloc(nchunks ? nchunks : 1, sizeof *out->chunks);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    struct storage_writer *w = NULL;
    if (!out->sections || !out->chunks || !md) {
        snprintf(err, CKPT_ERR_LEN, "%s: out of memory", key);
        goto fail;
    }
    out->nsections = nsrc;
    out->raw_size = raw;
    uint64_t off = 0;
    for (int i = 0; i < nsrc; i++) {
        out->sections[i] = (struct ckpt_section){src[i].unit, src[i].kind, src[i].lo, src[i].n,
                                                 off};
        off += src[i].n * 4;
    }
    if (storage_put_begin(st, key, &w, err))
        goto fail;
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    int s = 0;
    uint64_t s_done = 0; /* bytes of src[s] already consumed */
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t len = raw - ci * cb < cb ? (size_t)(raw - ci * cb) : cb, fill = 0;
        while (fill < len) {
            size_t avail = (size_t)(src[s].n * 4 - s_done), take = len - fill;
            take = take < avail ? take : avail;
            memcpy(codec->raw + fill, (const unsigned char *)src[s].data + s_done, take);
            fill += take;
            s_done += take;
            if (s_done == src[s].n * 4) {
                s++;
                s_done = 0;
            }
        }
        const unsigned char *p;
        size_t plen;
        struct ckpt_chunk *c = &out->chunks[ci];
        c->codec = encode(codec, o, len, &p, &plen);
        c->raw_off = ci * cb;
        c->raw_len = len;
        c->stored_off = out->stored_size;
        c->stored_len = plen;
        sha256(p, plen, c->sha256);
        EVP_DigestUpdate(md, p, plen);
        if (storage_write(w, p, plen, err))
            goto fail;
        out->stored_size += plen;
        out->nchunks = (int)ci + 1;
        if (hook)
            hook((int)ci);
    }
    unsigned int dl = 32;
    EVP_DigestFinal_ex(md, out->sha256, &dl);
    EVP_MD_CTX_free(md);
    md = NULL;
    struct storage_writer *wc = w;
    w = NULL;
    if (storage_writer_commit(wc, err))
        goto fail;
    return 0;
fail:
    storage_writer_abort(w);
    EVP_MD_CTX_free(md);
    ckpt_shard_free(out);
    return -1;
}

int ckpt_commit(struct storage *st, const struct ckpt_manifest *m, char *err)
{
    char key[96], dir[32];
    if (ckpt_manifest_check(m, err))
        return -1;
    char *doc = ckpt_manifest_dump(m);
    if (!doc) {
        snprintf(err, CKPT_ERR_LEN, "manifest: cannot serialise");
        return -1;
    }
    ckpt_step_dir(m->step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    int rc = storage_put_if_absent(st, key, doc, strlen(doc), err);
    free(doc);
    return rc;
}

/* ---- reading ----------------------------------------------------------------- */

int ckpt_reader_init(struct ckpt_reader *r, struct storage *st, const struct ckpt_manifest *m,
                     char *err)
{
    memset(r, 0, sizeof *r);
    size_t max = 4;
    for (int i = 0; i < m->nshards; i++)
        for (int c = 0; c < m->shards[i].nchunks; c++)
            if (m->shards[i].chunks[c].raw_len > max)
                max = (size_t)m->shards[i].chunks[c].raw_len;
    r->codec = ckpt_codec_new(max);
    if (!r->codec) {
        snprintf(err, CKPT_ERR_LEN, "reader: out of memory for %zu-byte chunks", max);
        return -1;
    }
    r->st = st;
    r->m = m;
    ckpt_step_dir(m->step, r->dir, sizeof r->dir);
    r->cached_shard = r->cached_chunk = -1;
    return 0;
}

void ckpt_reader_free(struct ckpt_reader *r)
{
    ckpt_codec_free(r->codec);
    r->codec = NULL;
}

/* Fetches, verifies and decodes one chunk into r->codec->raw. */
static int load_chunk(struct ckpt_reader *r, int shard, int ci, char *err)
{
    if (r->cached_shard == shard && r->cached_chunk == ci)
        return 0;
    r->cached_shard = r->cached_chunk = -1;
    const struct ckpt_shard *s = &r->m->shards[shard];
    const struct ckpt_chunk *c = &s->chunks[ci];
    struct ckpt_codec *k = r->codec;
    char key[128];
    snprintf(key, sizeof key, "%s/%s", r->dir, s->file);
    if (c->stored_len > k->stored_cap) {
        snprintf(err, CKPT_ERR_LEN, "%s: chunk %d: stored length %llu exceeds its bound", key, ci,
                 (unsigned long long)c->stored_len);
        return -1;
    }
    if (storage_get_range(r->st, key, c->stored_off, (size_t)c->stored_len, k->stored, err))
        return -1;
    r->bytes_fetched += c->stored_len;
    unsigned char got[32];
    sha256(k->stored, (size_t)c->stored_len, got);
    if (memcmp(got, c->sha256, 32) != 0) {
        snprintf(err, CKPT_ERR_LEN,
                 "%s: chunk %d (stored bytes %llu..%llu, raw offset %llu): sha256 mismatch", key,
                 ci, (unsigned long long)c->stored_off,
                 (unsigned long long)(c->stored_off + c->stored_len),
                 (unsigned long long)c->raw_off);
        return -1;
    }
    if (c->codec == CKPT_CODEC_RAW) {
        memcpy(k->raw, k->stored, (size_t)c->raw_len);
    } else {
        unsigned char *dst = c->codec == CKPT_CODEC_ZSTD_SHUFFLE4 ? k->shuf : k->raw;
        size_t z = ZSTD_decompressDCtx(k->dctx, dst, (size_t)c->raw_len, k->stored,
                                       (size_t)c->stored_len);
        if (ZSTD_isError(z) || z != c->raw_len) {
            snprintf(err, CKPT_ERR_LEN, "%s: chunk %d (raw offset %llu): cannot decode: %s", key,
                     ci, (unsigned long long)c->raw_off,
                     ZSTD_isError(z) ? ZSTD_getErrorName(z) : "wrong length");
            return -1;
        }
        if (c->codec == CKPT_CODEC_ZSTD_SHUFFLE4)
            unshuffle4(k->raw, k->shuf, (size_t)c->raw_len);
    }
    r->cached_shard = shard;
    r->cached_chunk = ci;
    return 0;
}

int ckpt_verify_chunk(struct ckpt_reader *r, int shard, int chunk, char *err)
{
    r->cached_shard = r->cached_chunk = -1;
    return load_chunk(r, shard, chunk, err);
}

int ckpt_verify_shard(struct ckpt_reader *r, int shard, void (*bad)(void *arg, const char *msg),
                      void *arg)
{
    const struct ckpt_shard *s = &r->m->shards[shard];
    char key[128], err[CKPT_ERR_LEN], msg[CKPT_ERR_LEN + 64];
    int problems = 0;
    snprintf(key, sizeof key, "%s/%s", r->dir, s->file);
    uint64_t size;
    int rc = storage_stat(r->st, key, &size, err);
    if (rc) {
        bad(arg, err);
        return 1;
    }
    if (size != s->stored_size) {
        snprintf(msg, sizeof msg, "%s: %llu bytes, the manifest says %llu", key,
                 (unsigned long long)size, (unsigned long long)s->stored_size);
        bad(arg, msg);
        problems++;
    }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    for (int c = 0; c < s->nchunks; c++) {
        if (ckpt_verify_chunk(r, shard, c, err)) {
            bad(arg, err);
            problems++;
            continue;
        }
        EVP_DigestUpdate(md, r->codec->stored, (size_t)s->chunks[c].stored_len);
    }
    unsigned char sha[32];
    unsigned int dl = 32;
    EVP_DigestFinal_ex(md, sha, &dl);
    EVP_MD_CTX_free(md);
    if (!problems && memcmp(sha, s->sha256, 32) != 0) {
        snprintf(msg, sizeof msg, "%s: shard sha256 mismatch", key);
        bad(arg, msg);
        problems++;
    }
    return problems;
}

int ckpt_read_shard(struct ckpt_reader *r, int shard, uint64_t off, uint64_t len, void *dst,
                    char *err)
{
    const struct ckpt_shard *s = &r->m->shards[shard];
    if (off > s->raw_size || len > s->raw_size - off) {
        snprintf(err, CKPT_ERR_LEN, "%s: read of %llu bytes at %llu is beyond its %llu bytes",
                 s->file, (unsigned long long)len, (unsigned long long)off,
                 (unsigned long long)s->raw_size);
        return -1;
    }
    /* binary search for the chunk holding off */
    int lo = 0, hi = s->nchunks - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->chunks[mid].raw_off <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    unsigned char *out = dst;
    for (int ci = lo; len > 0; ci++) {
        if (load_chunk(r, shard, ci, err))
            return -1;
        const struct ckpt_chunk *c = &s->chunks[ci];
        uint64_t in = off - c->raw_off, take = c->raw_len - in;
        take = take < len ? take : len;
        memcpy(out, r->codec->raw + in, (size_t)take);
        out += take;
        off += take;
        len -= take;
    }
    return 0;
}

int ckpt_read_unit(struct ckpt_reader *r, int unit, int kind, uint64_t lo, uint64_t n,
                   float *dst, char *err)
{
    const struct ckpt_manifest *m = r->m;
    const struct ckpt_unit *U = &m->units[unit];
    const uint64_t per = U->padded / (uint64_t)m->world;
    uint64_t x = lo, end = lo + n;
    while (x < end) {
        if (x >= U->numel) { /* padding: no tensor lives there */
            memset(dst + (x - lo), 0, (size_t)(end - x) * sizeof *dst);
            break;
        }
        int rank = (int)(x / per);
        uint64_t stop = (uint64_t)(rank + 1) * per;
        stop = stop < end ? stop : end;
        stop = stop < U->numel ? stop : U->numel;
        const struct ckpt_section *sec = &m->shards[rank].sections[unit * CKPT_NKINDS + kind];
        if (ckpt_read_shard(r, rank, sec->raw_off + (x - sec->lo) * 4, (stop - x) * 4,
                            dst + (x - lo), err))
            return -1;
        x = stop;
    }
    return 0;
}

int ckpt_digest(struct ckpt_reader *r,
                int (*fn)(void *arg, const char *tensor, const char *kind, const char *hex),
                void *arg, char *err)
{
    enum { PIECE = 1 << 16 };
    float *buf = malloc(PIECE * sizeof *buf);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = 0;
    if (!buf || !md) {
        snprintf(err, CKPT_ERR_LEN, "digest: out of memory");
        rc = -1;
    }
    for (int u = 0; !rc && u < r->m->nunits; u++) {
        const struct ckpt_unit *U = &r->m->units[u];
        for (int t = 0; !rc && t < U->ntensors; t++) {
            const struct ckpt_tensor *T = &U->tensors[t];
            for (int k = 0; !rc && k < CKPT_NKINDS; k++) {
                EVP_DigestInit_ex(md, EVP_sha256(), NULL);
                for (uint64_t x = 0; !rc && x < T->numel; x += PIECE) {
                    uint64_t n = T->numel - x < PIECE ? T->numel - x : PIECE;
                    rc = ckpt_read_unit(r, u, k, T->offset + x, n, buf, err);
                    if (!rc)
                        EVP_DigestUpdate(md, buf, (size_t)n * 4);
                }
                unsigned char sha[32];
                unsigned int dl = 32;
                char hex[65];
                EVP_DigestFinal_ex(md, sha, &dl);
                ckpt_hex(sha, hex);
                if (!rc)
                    rc = fn(arg, T->name, ckpt_kind_name(k), hex);
            }
        }
    }
    EVP_MD_CTX_free(md);
    free(buf);
    return rc;
}
