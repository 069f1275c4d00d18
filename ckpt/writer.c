/*
 * writer.c - a shard as a stream of chunks, and the manifest commit.
 *
 * The writer takes the shard's sections up front and their bytes in order,
 * in pieces of any size; it fills one chunk at a time, encodes it, hashes
 * the stored bytes, and streams them to storage. Memory is one chunk, so a
 * shard of any size is written (or resharded) in bounded memory. Nothing
 * is visible under the shard's key until the storage commit succeeds.
 *
 * Every chunk holds chunk_bytes raw bytes (the last one what is left),
 * across section boundaries (format 2). Format 1 started a chunk at every
 * section, so a shard had at least units x kinds chunks however small its
 * sections: 294 index entries per shard for a 96-block model. Now a shard
 * has ceil(raw / chunk_bytes), its index shrinks to match, and the reader
 * finds a chunk by division. The price is that a reader of part of one
 * section (a rank of another world size) may fetch a neighbouring
 * section's bytes in the chunk at each end of its range: at most two
 * chunks per range, and neighbouring ranges share them through the
 * reader's cache.
 *
 * finish appends the chunk index (index.c) to the object, so the shard is
 * self-describing and the manifest records only where the index is.
 */
#include "codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ckpt_shard_writer {
    const struct ckpt_write_opts *o;
    struct ckpt_codec *codec;
    struct storage_writer *w;
    struct ckpt_shard shard;
    size_t fill; /* bytes of the current chunk in codec->raw */
    uint64_t appended, chunk_start;
    int chunk_cap;
    void (*hook)(int chunk);
    char key[160];
};

void ckpt_writer_abort(struct ckpt_shard_writer *w)
{
    if (!w)
        return;
    storage_writer_abort(w->w);
    ckpt_shard_free(&w->shard);
    free(w);
}

int ckpt_writer_begin(struct storage *st, const char *key, const char *file,
                      const struct ckpt_write_opts *o, struct ckpt_codec *codec, int rank,
                      const struct ckpt_section *secs, int nsec, void (*hook)(int chunk),
                      struct ckpt_shard_writer **out, char *err)
{
    *out = NULL;
    struct ckpt_shard_writer *w = calloc(1, sizeof *w);
    if (!w) {
        fsdp_err(err, "%s: out of memory", key);
        return -1;
    }
    w->o = o;
    w->codec = codec;
    w->hook = hook;
    snprintf(w->key, sizeof w->key, "%s", key);
    snprintf(w->shard.file, sizeof w->shard.file, "%s", file);
    w->shard.rank = rank;
    uint64_t raw = 0;
    for (int i = 0; i < nsec; i++)
        raw += secs[i].n * 4;
    w->shard.raw_size = raw;
    uint64_t nchunks = (raw + codec->chunk_bytes - 1) / codec->chunk_bytes;
    if (nchunks > CKPT_MAX_CHUNKS) {
        fsdp_err(err,
                 "%s: %llu raw bytes in %zu-byte chunks make %llu chunks, over the format's %d: "
                 "use larger chunks (--ckpt-chunk-kib)",
                 key, (unsigned long long)raw, codec->chunk_bytes, (unsigned long long)nchunks,
                 CKPT_MAX_CHUNKS);
        free(w);
        return -1;
    }
    w->chunk_cap = (int)nchunks;
    w->shard.chunks =
        calloc((size_t)(w->chunk_cap > 0 ? w->chunk_cap : 1), sizeof *w->shard.chunks);
    if (!w->shard.chunks) {
        ckpt_writer_abort(w);
        fsdp_err(err, "%s: out of memory", key);
        return -1;
    }
    if (storage_put_begin(st, key, &w->w, err)) {
        w->w = NULL;
        ckpt_writer_abort(w);
        return -1;
    }
    *out = w;
    return 0;
}

/* The next chunk: the len bytes filled into the codec's buffer (raw is
 * NULL), or len bytes of the caller's stored as they are (raw). */
static int flush_chunk(struct ckpt_shard_writer *w, const unsigned char *raw, size_t len, char *err)
{
    const unsigned char *p = raw;
    size_t plen = len;
    int ci = w->shard.nchunks;
    if (ci >= w->chunk_cap) {
        fsdp_err(err, "%s: more bytes than its sections declare", w->key);
        return -1;
    }
    struct ckpt_chunk *c = &w->shard.chunks[ci];
    c->codec = raw ? CKPT_CODEC_RAW : ckpt_encode(w->codec, w->o, len, &p, &plen);
    c->raw_off = w->chunk_start;
    c->raw_len = len;
    w->chunk_start += len;
    c->stored_off = w->shard.stored_size;
    c->stored_len = plen;
    ckpt_digest_bytes(w->o->hash, p, plen, c->digest);
    if (storage_write(w->w, p, plen, err))
        return -1;
    w->shard.stored_size += plen;
    w->shard.nchunks = ci + 1;
    w->fill = 0;
    if (w->hook)
        w->hook(ci);
    return 0;
}

int ckpt_writer_append(struct ckpt_shard_writer *w, const void *data, size_t bytes, char *err)
{
    const unsigned char *p = data;
    if (w->appended + bytes > w->shard.raw_size) {
        fsdp_err(err, "%s: more bytes than its sections declare", w->key);
        return -1;
    }
    const size_t chunk = w->codec->chunk_bytes;
    while (bytes) {
        size_t take = chunk - w->fill;
        take = take < bytes ? take : bytes;
        if (w->o->codec == CKPT_CODEC_RAW && take == chunk) { /* stored as it is: no copy */
            if (flush_chunk(w, p, chunk, err))
                return -1;
        } else {
            memcpy(w->codec->raw + w->fill, p, take);
            w->fill += take;
            if (w->fill == chunk && flush_chunk(w, NULL, chunk, err))
                return -1;
        }
        w->appended += take;
        p += take;
        bytes -= take;
    }
    return 0;
}

/* The chunk index, last in the object; its SHA-256 is the shard's digest. */
static int write_index(struct ckpt_shard_writer *w, char *err)
{
    size_t len;
    unsigned char *b = ckpt_index_encode(w->shard.chunks, w->shard.nchunks, &len);
    if (!b) {
        fsdp_err(err, "%s: out of memory for the chunk index", w->key);
        return -1;
    }
    w->shard.index_off = w->shard.stored_size;
    w->shard.index_len = len;
    ckpt_sha256(b, len, w->shard.digest);
    int rc = storage_write(w->w, b, len, err);
    free(b);
    w->shard.stored_size += len;
    return rc;
}

int ckpt_writer_finish(struct ckpt_shard_writer *w, struct ckpt_shard *out, char *err)
{
    int rc = 0;
    if (w->appended != w->shard.raw_size) {
        fsdp_err(err, "%s: %llu of %llu bytes written", w->key, (unsigned long long)w->appended,
                 (unsigned long long)w->shard.raw_size);
        rc = -1;
    }
    if (!rc && w->fill && flush_chunk(w, NULL, w->fill, err))
        rc = -1;
    if (!rc && write_index(w, err))
        rc = -1;
    if (rc) {
        ckpt_writer_abort(w);
        return -1;
    }
    struct storage_writer *sw = w->w;
    w->w = NULL;
    if (storage_writer_commit(sw, err)) {
        ckpt_writer_abort(w);
        return -1;
    }
    *out = w->shard;
    memset(&w->shard, 0, sizeof w->shard);
    ckpt_writer_abort(w); /* frees what is left */
    return 0;
}

int ckpt_shard_write(struct storage *st, const char *key, const char *file,
                     const struct ckpt_write_opts *o, struct ckpt_codec *codec,
                     const struct ckpt_src *src, int nsrc, int rank, struct ckpt_shard *out,
                     void (*hook)(int chunk), char *err)
{
    memset(out, 0, sizeof *out);
    struct ckpt_section *secs = calloc((size_t)(nsrc > 0 ? nsrc : 1), sizeof *secs);
    if (!secs) {
        fsdp_err(err, "%s: out of memory", key);
        return -1;
    }
    for (int i = 0; i < nsrc; i++)
        secs[i] = (struct ckpt_section){src[i].unit, src[i].kind, src[i].lo, src[i].n, 0};
    struct ckpt_shard_writer *w;
    int rc = ckpt_writer_begin(st, key, file, o, codec, rank, secs, nsrc, hook, &w, err);
    free(secs);
    for (int i = 0; !rc && i < nsrc; i++)
        if (ckpt_writer_append(w, src[i].data, (size_t)src[i].n * 4, err)) {
            ckpt_writer_abort(w);
            return -1;
        }
    return rc ? -1 : ckpt_writer_finish(w, out, err);
}

int ckpt_commit(struct storage *st, const struct ckpt_manifest *m, char *err)
{
    char key[96], dir[32];
    if (ckpt_manifest_check(m, err))
        return -1;
    char *doc = ckpt_manifest_dump(m);
    if (!doc) {
        fsdp_err(err, "manifest: cannot serialise");
        return -1;
    }
    ckpt_step_dir(m->step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    int rc = storage_put_if_absent(st, key, doc, strlen(doc), err);
    free(doc);
    return rc;
}

int ckpt_new_step_in(struct storage *st, uint64_t step, char *tag, size_t n, char *err)
{
    int committed;
    if (ckpt_step_committed(st, step, &committed, err))
        return -1;
    if (committed) {
        fsdp_err(err,
                 "%s already holds a committed step %llu: left as it is (write elsewhere, or "
                 "remove it first)",
                 st->uri, (unsigned long long)step);
        return -1;
    }
    return ckpt_new_writer_tag(st, 0, tag, n, err);
}
