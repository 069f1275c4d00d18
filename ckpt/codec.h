/*
 * codec.h - private to ckpt/: encoding and decoding one chunk, and the
 * reusable buffers and zstd contexts that go with it.
 */
#ifndef FSDP_CKPT_CODEC_H
#define FSDP_CKPT_CODEC_H

#include "ckpt.h"

#include <zstd.h>

struct ckpt_codec {
    size_t chunk_bytes;        /* largest raw chunk */
    unsigned char *raw, *shuf; /* chunk_bytes each */
    unsigned char *stored;     /* stored_cap */
    size_t stored_cap;
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
};

/* Encodes c->raw[0..len) with the options' codec; *out points into c's
 * buffers. Returns the codec actually used (raw if compression did not
 * shrink the chunk). */
int ckpt_encode(struct ckpt_codec *c, const struct ckpt_write_opts *o, size_t len,
                const unsigned char **out, size_t *out_len);

/* Decodes a stored chunk held in c->stored into dst (raw_len bytes). */
int ckpt_decode(struct ckpt_codec *c, int codec, size_t stored_len, unsigned char *dst,
                size_t raw_len, const char **why);

#endif
