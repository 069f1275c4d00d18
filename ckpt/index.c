/*
 * index.c - a shard's chunk index (format 2): the last bytes of the shard
 * object, so that the manifest does not grow with the number of chunks.
 *
 * The manifest holds the index's place and SHA-256, so the bytes are
 * checked before they are decoded; decoding still trusts nothing: every
 * length is checked against the shard entry and the manifest's chunk size
 * (every chunk holds chunk_bytes raw bytes, the last one what is left), so
 * a table that decodes can be indexed without further checks.
 */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char magic[8] = {'F', 'S', 'D', 'P', 'C', 'I', 'X', '1'};

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const unsigned char *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

unsigned char *ckpt_index_encode(const struct ckpt_chunk *chunks, int n, size_t *len)
{
    *len = CKPT_INDEX_HEADER + (size_t)n * CKPT_INDEX_ENTRY;
    unsigned char *b = malloc(*len);
    if (!b)
        return NULL;
    unsigned char *p = b + CKPT_INDEX_HEADER;
    memcpy(b, magic, 8);
    put32(b + 8, 1);
    put32(b + 12, (uint32_t)n);
    for (int i = 0; i < n; i++, p += CKPT_INDEX_ENTRY) {
        put64(p, chunks[i].stored_len);
        put32(p + 8, (uint32_t)chunks[i].raw_len);
        put32(p + 12, (uint32_t)chunks[i].codec);
        memcpy(p + 16, chunks[i].digest, 32);
    }
    return b;
}

int ckpt_index_decode(const unsigned char *buf, size_t len, const struct ckpt_shard *s,
                      uint64_t chunk_bytes, struct ckpt_chunk **out, char *err)
{
    *out = NULL;
    if (len < CKPT_INDEX_HEADER || memcmp(buf, magic, 8) != 0 || get32(buf + 8) != 1) {
        fsdp_err(err, "%s: the chunk index does not start with FSDPCIX1, version 1", s->file);
        return -1;
    }
    uint32_t n = get32(buf + 12);
    if (n != (uint32_t)s->nchunks || len != CKPT_INDEX_HEADER + (size_t)n * CKPT_INDEX_ENTRY) {
        fsdp_err(err,
                 "%s: the chunk index holds %u chunks in %zu bytes, the "
                 "manifest says %d",
                 s->file, n, len, s->nchunks);
        return -1;
    }
    struct ckpt_chunk *t = calloc(n ? n : 1, sizeof *t);
    if (!t) {
        fsdp_err(err, "%s: out of memory for %u chunk entries", s->file, n);
        return -1;
    }
    uint64_t raw = 0, stored = 0;
    const unsigned char *p = buf + CKPT_INDEX_HEADER;
    for (uint32_t i = 0; i < n; i++, p += CKPT_INDEX_ENTRY) {
        struct ckpt_chunk *c = &t[i];
        uint64_t want = s->raw_size - raw < chunk_bytes ? s->raw_size - raw : chunk_bytes;
        c->stored_len = get64(p);
        c->raw_len = get32(p + 8);
        uint32_t codec = get32(p + 12);
        c->codec = (int)codec;
        memcpy(c->digest, p + 16, 32);
        c->raw_off = raw;
        c->stored_off = stored;
        if (raw >= s->raw_size || c->raw_len != want || codec > CKPT_CODEC_ZSTD_SHUFFLE4 ||
            c->stored_len == 0 || c->stored_len > 2ULL * CKPT_MAX_CHUNK_BYTES ||
            (codec == CKPT_CODEC_RAW && c->stored_len != c->raw_len) ||
            c->stored_len > s->index_off - stored) {
            fsdp_err(err,
                     "%s: chunk index entry %u (raw offset %llu) is "
                     "malformed",
                     s->file, i, (unsigned long long)raw);
            free(t);
            return -1;
        }
        raw += c->raw_len;
        stored += c->stored_len;
    }
    if (raw != s->raw_size || stored != s->index_off) {
        fsdp_err(err,
                 "%s: the chunk index covers %llu raw and %llu stored bytes, "
                 "the manifest says %llu and %llu",
                 s->file, (unsigned long long)raw, (unsigned long long)stored,
                 (unsigned long long)s->raw_size, (unsigned long long)s->index_off);
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}
