/*
 * codec.c - one chunk in, one chunk out.
 *
 * A chunk is stored raw, as zstd (with zstd's content checksum, so decoding
 * also checks the raw bytes), or as zstd after a byte-plane shuffle: all
 * first bytes of the floats, then all second bytes, and so on, which puts
 * the slowly varying sign/exponent bytes together and usually helps float32
 * state compress. A chunk that does not shrink is stored raw.
 */
#include "codec.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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
    /* touch the buffers once now: first-touch pages are slow on these VMs */
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
    fsdp_err(err,
             "--compress '%s' is not none, zstd[:LEVEL] or zstd+shuffle[:LEVEL] (levels %d..%d)", s,
             ZSTD_minCLevel(), ZSTD_maxCLevel());
    return -1;
}

void ckpt_sha256(const void *p, size_t n, unsigned char out[32])
{
    unsigned int len = 32;
    EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

static const char *hashes[] = {"sha256", "xxh3-128"};

const char *ckpt_hash_name(int h) { return h >= 0 && h < 2 ? hashes[h] : "?"; }

int ckpt_parse_hash(const char *s, int *hash)
{
    if (strcmp(s, "sha256") == 0)
        *hash = CKPT_HASH_SHA256;
    else if (strcmp(s, "xxh3") == 0 || strcmp(s, "xxh3-128") == 0)
        *hash = CKPT_HASH_XXH3;
    else
        return -1;
    return 0;
}

static void xxh3_out(XXH128_hash_t h, unsigned char out[32])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
    memset(out + 16, 0, 16);
}

void ckpt_digest_bytes(int hash, const void *p, size_t n, unsigned char out[32])
{
    if (hash == CKPT_HASH_XXH3)
        xxh3_out(XXH3_128bits(p, n), out);
    else
        ckpt_sha256(p, n, out);
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

int ckpt_encode(struct ckpt_codec *c, const struct ckpt_write_opts *o, size_t len,
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

int ckpt_decode(struct ckpt_codec *c, int codec, size_t stored_len, unsigned char *dst,
                size_t raw_len, const char **why)
{
    if (codec == CKPT_CODEC_RAW) {
        if (stored_len != raw_len) {
            *why = "raw chunk of the wrong length";
            return -1;
        }
        memcpy(dst, c->stored, raw_len);
        return 0;
    }
    if (raw_len > c->chunk_bytes) {
        *why = "chunk larger than the reader's buffers";
        return -1;
    }
    unsigned char *to = codec == CKPT_CODEC_ZSTD_SHUFFLE4 ? c->shuf : dst;
    size_t z = ZSTD_decompressDCtx(c->dctx, to, raw_len, c->stored, stored_len);
    if (ZSTD_isError(z) || z != raw_len) {
        *why = ZSTD_isError(z) ? ZSTD_getErrorName(z) : "wrong decoded length";
        return -1;
    }
    if (codec == CKPT_CODEC_ZSTD_SHUFFLE4)
        unshuffle4(dst, c->shuf, raw_len);
    return 0;
}
