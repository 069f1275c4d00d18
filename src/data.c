/*
 * data.c - reading, validating and writing token files; the sample stream.
 *
 * Token files are regular files, read and written: a FIFO, device node,
 * socket or directory named as one is refused with one line naming it.
 * Reading opens through fsdp_open_regular (util.h: a FIFO must never hang
 * the trainer in open()); writing never replaces anything but a regular
 * file (rename() would turn /dev/null into a token file). An HDF5 file
 * (told by its signature) is data_h5.c's.
 */
#include "data.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int token_file_open(struct token_file *f, const char *path, int vocab, char *err)
{
    return token_file_open_ds(f, path, NULL, vocab, err);
}

int token_file_open_ds(struct token_file *f, const char *path, const char *dataset, int vocab,
                       char *err)
{
    memset(f, 0, sizeof *f);
    int fd;
    uint64_t size;
    if (fsdp_open_regular(path, "a token file", &fd, &size, err))
        return -1;
    unsigned char head[8];
    if (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
        token_file_is_hdf5(head, sizeof head)) {
        int rc = token_file_open_hdf5(f, fd, path, dataset, vocab, err);
        close(fd);
        return rc;
    }
    const size_t hdr = DATA_HEADER_INTS * 4, len = (size_t)size;
    if (len < hdr) {
        close(fd);
        return fsdp_err(err, "%s: not a token file: %zu bytes, shorter than the %zu-byte header",
                        path, len, hdr);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return fsdp_err(err, "%s: cannot map: %s", path, strerror(e));
    const unsigned char *b = map;
    uint32_t magic = le32(b), version = le32(b + 4), count = le32(b + 8);
    int rc = 0;
    const size_t w = magic == DATA_MAGIC_U32 ? 4 : 2;
    if (magic != DATA_MAGIC && magic != DATA_MAGIC_U32)
        rc = fsdp_err(err,
                      "%s: not a token file: magic %u, expected %d (uint16 tokens) or %d "
                      "(uint32 tokens)",
                      path, magic, DATA_MAGIC, DATA_MAGIC_U32);
    else if (version != (w == 4 ? DATA_VERSION_U32 : DATA_VERSION))
        rc = fsdp_err(err,
                      "%s: unsupported token file version %u for magic %u (expected %d: %s "
                      "tokens)",
                      path, version, magic, w == 4 ? DATA_VERSION_U32 : DATA_VERSION,
                      w == 4 ? "uint32" : "uint16");
    else if (count > INT32_MAX)
        rc = fsdp_err(err, "%s: corrupt header: token count %u is negative as int32", path, count);
    else if ((len - hdr) / w < (size_t)count)
        rc = fsdp_err(err, "%s: truncated: header says %u tokens, file holds %zu", path, count,
                      (len - hdr) / w);
    else if (len - hdr > (size_t)count * w)
        rc = fsdp_err(err, "%s: %zu bytes after the %u tokens the header declares", path,
                      len - hdr - (size_t)count * w, count);
    if (rc) {
        munmap(map, len);
        return rc;
    }
    f->tokens = b + hdr;
    f->width = (int)w;
    for (size_t i = 0; i < count; i++) {
        const uint32_t t = token_file_at(f, i);
        if (t >= (uint32_t)vocab) {
            munmap(map, len);
            memset(f, 0, sizeof *f);
            return fsdp_err(err,
                            "%s: token %u at index %zu is outside the model's vocabulary of %d "
                            "(use --vocab or a model whose vocabulary covers it)",
                            path, t, i, vocab);
        }
    }
    f->ntokens = count;
    f->map = map;
    f->map_len = len;
    return 0;
}

void token_file_close(struct token_file *f)
{
    if (f->remote)
        token_file_close_store(f);
    else if (f->heap)
        free(f->map);
    else if (f->map)
        munmap(f->map, f->map_len);
    memset(f, 0, sizeof *f);
}

int token_file_check_output(const char *path, char *err)
{
    return fsdp_outfile_check(path, 1, err); /* a token file is made again from its text */
}

int token_file_write(const char *path, const uint16_t *tokens, size_t n, int width, char *err)
{
    if (n > INT32_MAX)
        return fsdp_err(err, "%s: %zu tokens do not fit the format's int32 count", path, n);
    struct fsdp_outfile o;
    if (fsdp_outfile_open(&o, path, 1, err))
        return -1;
    int32_t header[DATA_HEADER_INTS] = {width == 4 ? DATA_MAGIC_U32 : DATA_MAGIC,
                                        width == 4 ? DATA_VERSION_U32 : DATA_VERSION, (int32_t)n};
    /* The format is little-endian; so is every machine this builds for. */
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian host");
    int bad = fsdp_outfile_write(&o, header, sizeof header, err);
    if (width == 4) { /* widened a block at a time */
        uint32_t wide[4096];
        for (size_t i = 0; i < n && !bad; i += 4096) {
            size_t k = n - i < 4096 ? n - i : 4096;
            for (size_t j = 0; j < k; j++)
                wide[j] = tokens[i + j];
            bad = fsdp_outfile_write(&o, wide, k * sizeof *wide, err);
        }
    } else if (!bad) {
        bad = fsdp_outfile_write(&o, tokens, n * sizeof *tokens, err);
    }
    return fsdp_outfile_close(&o, !bad, err);
}

int sample_stream_init(struct sample_stream *s, const struct token_file *f, int T, uint64_t seed,
                       char *err)
{
    memset(s, 0, sizeof *s);
    s->file = f;
    s->T = T;
    s->seed = seed;
    s->nsamples = f->ntokens > 0 ? (f->ntokens - 1) / (size_t)T : 0;
    if (s->nsamples == 0)
        return fsdp_err(err, "%zu tokens hold no sample of %d+1 tokens", f->ntokens, T);
    s->perm = malloc(s->nsamples * sizeof *s->perm);
    if (!s->perm)
        return fsdp_err(err, "data: out of memory for %llu sample indices",
                        (unsigned long long)s->nsamples);
    s->epoch = UINT64_MAX;
    return 0;
}

void sample_stream_free(struct sample_stream *s)
{
    free(s->perm);
    s->perm = NULL;
}

static void make_permutation(struct sample_stream *s, uint64_t epoch)
{
    /* Fisher-Yates with a generator keyed by (seed, epoch). */
    struct fsdp_rng r = {fsdp_mix64(s->seed ^ 0x5eedda7a) ^ fsdp_mix64(epoch + 1)};
    for (uint64_t i = 0; i < s->nsamples; i++)
        s->perm[i] = i;
    for (uint64_t i = s->nsamples - 1; i > 0; i--) {
        uint64_t j = fsdp_rng_below(&r, i + 1);
        uint64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->epoch = epoch;
}

uint64_t sample_stream_index(struct sample_stream *s, uint64_t k)
{
    uint64_t epoch = k / s->nsamples;
    if (epoch != s->epoch)
        make_permutation(s, epoch);
    return s->perm[k % s->nsamples];
}

int token_file_identity_parts(uint64_t len, uint64_t at[TOKEN_ID_BLOCKS + 1],
                              size_t n[TOKEN_ID_BLOCKS + 1])
{
    enum { BLOCK = 4096, HEAD = 1024 };
    if (len <= (uint64_t)TOKEN_ID_BLOCKS * BLOCK + HEAD) {
        at[0] = 0;
        n[0] = (size_t)len;
        return 1;
    }
    at[0] = 0;
    n[0] = HEAD;
    for (int i = 0; i < TOKEN_ID_BLOCKS; i++) {
        at[i + 1] = HEAD + (len - HEAD - BLOCK) / (TOKEN_ID_BLOCKS - 1) * (uint64_t)i;
        n[i + 1] = BLOCK;
    }
    return TOKEN_ID_BLOCKS + 1;
}

int sample_stream_fetch(const struct sample_stream *s, uint64_t i, int32_t *inputs,
                        int32_t *targets, char *err)
{
    if (s->file->remote) {
        uint32_t *tok = malloc(((size_t)s->T + 1) * sizeof *tok);
        if (!tok)
            return fsdp_err(err, "data: out of memory for a sample");
        int rc = token_file_sample(s->file, i, tok, err);
        for (int t = 0; t < s->T && !rc; t++) {
            inputs[t] = (int32_t)tok[t];
            targets[t] = (int32_t)tok[t + 1];
        }
        free(tok);
        return rc;
    }
    const size_t first = i * (uint64_t)s->T;
    for (int t = 0; t < s->T; t++) {
        inputs[t] = (int32_t)token_file_at(s->file, first + (size_t)t);
        targets[t] = (int32_t)token_file_at(s->file, first + (size_t)t + 1);
    }
    return 0;
}
