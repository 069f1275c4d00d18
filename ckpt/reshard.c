/*
 * reshard.c - rewriting a committed checkpoint for another world size,
 * offline, in bounded memory.
 *
 * New rank r's shard holds, for every unit and kind, the elements
 * [r * n'/M, (r+1) * n'/M) of the unit padded for M ranks. They are read
 * through the planner in pieces of PIECE elements and streamed into a
 * shard writer, so memory is the reader's chunk cache, one chunk for the
 * writer and one piece - never the model. The new manifest is committed
 * only after every new shard is durable; on any failure this writer's own
 * shards are removed (ckpt_discard_own) and nothing else in the destination
 * is touched - a step the destination already holds is refused up front,
 * and one committed there meanwhile by someone else stays as it is.
 */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIECE (1u << 16)

static int copy_units(struct ckpt_manifest *dst, const struct ckpt_manifest *src, int world)
{
    dst->nunits = src->nunits;
    dst->units = calloc((size_t)src->nunits, sizeof *dst->units);
    if (!dst->units)
        return -1;
    for (int u = 0; u < src->nunits; u++) {
        dst->units[u] = src->units[u];
        dst->units[u].padded =
            (src->units[u].numel + (uint64_t)world - 1) / (uint64_t)world * (uint64_t)world;
        dst->units[u].tensors = malloc((size_t)src->units[u].ntensors * sizeof(struct ckpt_tensor));
        if (!dst->units[u].tensors)
            return -1;
        memcpy(dst->units[u].tensors, src->units[u].tensors,
               (size_t)src->units[u].ntensors * sizeof(struct ckpt_tensor));
    }
    return 0;
}

int ckpt_reshard(struct storage *src, const struct ckpt_manifest *m, struct storage *dst, int world,
                 const struct ckpt_write_opts *o, char *err)
{
    if (world < 1 || world > 65536) {
        fsdp_err(err, "reshard: world size %d is out of range 1..65536", world);
        return -1;
    }
    char dir[32], key[128], file[64], tag[CKPT_TAG_LEN];
    ckpt_step_dir(m->step, dir, sizeof dir);
    if (ckpt_new_step_in(dst, m->step, tag, sizeof tag, err))
        return -1;
    struct ckpt_manifest out = {0};
    out.version = CKPT_FORMAT_VERSION;
    out.chunk_bytes = o->chunk_bytes;
    out.chunk_hash = o->hash;
    out.step = m->step;
    ckpt_tag_generation(tag, &out.generation); /* this writer's, in dst */
    out.world = world;
    snprintf(out.sharding, sizeof out.sharding, "%s", m->sharding);
    out.model = json_incref(m->model);
    out.trainer = json_incref(m->trainer);
    struct ckpt_reader r;
    struct ckpt_codec *codec = ckpt_codec_new(o->chunk_bytes);
    struct ckpt_section *secs = calloc((size_t)m->nunits * CKPT_NKINDS, sizeof *secs);
    float *buf = malloc(PIECE * sizeof *buf);
    out.shards = calloc((size_t)world, sizeof *out.shards);
    int rc = 0, reader = 0;
    if (!codec || !secs || !buf || !out.shards || copy_units(&out, m, world)) {
        fsdp_err(err, "reshard: out of memory");
        rc = -1;
    }
    if (!rc && !(rc = ckpt_reader_init(&r, src, m, err)))
        reader = 1;
    for (int nr = 0; !rc && nr < world; nr++) {
        for (int u = 0; u < m->nunits; u++) {
            uint64_t per = out.units[u].padded / (uint64_t)world;
            for (int k = 0; k < CKPT_NKINDS; k++)
                secs[u * CKPT_NKINDS + k] = (struct ckpt_section){u, k, nr * per, per, 0};
        }
        ckpt_shard_file(nr, world, tag, file, sizeof file);
        snprintf(key, sizeof key, "%s/%s", dir, file);
        struct ckpt_shard_writer *w;
        if ((rc = ckpt_writer_begin(dst, key, file, o, codec, nr, secs, m->nunits * CKPT_NKINDS,
                                    NULL, &w, err)))
            break;
        for (int s = 0; !rc && s < m->nunits * CKPT_NKINDS; s++) {
            for (uint64_t x = 0; !rc && x < secs[s].n; x += PIECE) {
                uint64_t n = secs[s].n - x < PIECE ? secs[s].n - x : PIECE;
                rc = ckpt_read_unit(&r, secs[s].unit, secs[s].kind, secs[s].lo + x, n, buf, err);
                if (!rc)
                    rc = ckpt_writer_append(w, buf, (size_t)n * 4, err);
            }
        }
        if (rc) {
            ckpt_writer_abort(w);
            break;
        }
        if ((rc = ckpt_writer_finish(w, &out.shards[nr], err)))
            break;
        out.nshards = nr + 1;
    }
    if (!rc) { /* settles the outcome, removing this writer's shards unless committed */
        struct ckpt_commit_result res;
        rc = ckpt_commit_step(dst, &out, tag, &res, err);
        ckpt_commit_result_free(&res);
    } else {
        char sub[FSDP_ERR_LEN];
        ckpt_discard_own(dst, m->step, world, tag, sub); /* nothing half-made stays behind */
    }
    if (reader)
        ckpt_reader_free(&r);
    ckpt_codec_free(codec);
    free(secs);
    free(buf);
    out.nshards = out.shards ? world : 0;
    ckpt_manifest_free(&out);
    return rc ? -1 : 0;
}

/* ---- copying between stores ---------------------------------------------- */

int ckpt_copy_step(struct storage *src, const struct ckpt_manifest *m, struct storage *dst,
                   const struct ckpt_write_opts *o, char *err)
{
    if (m->version < CKPT_FORMAT_VERSION) /* what a format-1 step is: re-chunked, indexed */
        return ckpt_reshard(src, m, dst, m->world, o, err);
    char dir[32], key[128], tag[CKPT_TAG_LEN];
    ckpt_step_dir(m->step, dir, sizeof dir);
    if (ckpt_new_step_in(dst, m->step, tag, sizeof tag, err))
        return -1;
    /* the same manifest with this writer's shard names: the stored bytes
     * go across unchanged, each chunk verified on the way, so every digest
     * in it stays valid */
    struct ckpt_manifest out = *m;
    ckpt_tag_generation(tag, &out.generation); /* this writer's, in dst */
    out.shards = calloc((size_t)m->nshards + 1, sizeof *out.shards);
    if (!out.shards) {
        fsdp_err(err, "copy: out of memory");
        return -1;
    }
    for (int s = 0; s < m->nshards; s++) {
        out.shards[s] = m->shards[s];
        ckpt_shard_file(s, m->world, tag, out.shards[s].file, sizeof out.shards[s].file);
    }
    struct ckpt_reader r;
    int rc = ckpt_reader_init(&r, src, m, err), reader = rc == 0;
    for (int s = 0; !rc && s < m->nshards; s++) {
        const struct ckpt_shard *sh = &m->shards[s];
        snprintf(key, sizeof key, "%s/%s", dir, out.shards[s].file);
        struct storage_writer *w;
        if ((rc = storage_put_begin(dst, key, &w, err)))
            break;
        const struct ckpt_chunk *tab;
        rc = ckpt_shard_chunks(&r, s, &tab, err);
        for (int c = 0; !rc && c < sh->nchunks; c++) {
            rc = ckpt_verify_chunk(&r, s, c, err);
            if (!rc)
                rc = storage_write(w, ckpt_reader_stored(&r), (size_t)tab[c].stored_len, err);
        }
        unsigned char *index = NULL;
        if (!rc && !(rc = ckpt_fetch_index(&r, s, &index, err)))
            rc = storage_write(w, index, (size_t)sh->index_len, err);
        free(index);
        if (rc)
            storage_writer_abort(w);
        else
            rc = storage_writer_commit(w, err);
    }
    if (!rc) {
        struct ckpt_commit_result res;
        rc = ckpt_commit_step(dst, &out, tag, &res, err);
        ckpt_commit_result_free(&res);
    } else {
        char sub[FSDP_ERR_LEN];
        ckpt_discard_own(dst, m->step, m->world, tag, sub);
    }
    if (reader)
        ckpt_reader_free(&r);
    free(out.shards); /* the shards' tables belong to m */
    return rc ? -1 : 0;
}
