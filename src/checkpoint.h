/*
 * checkpoint.h - the trainer's side of checkpoints: saving the engine's
 * shards with the commit protocol, and resuming (with fallback) from the
 * newest committed step that loads and verifies.
 *
 * Every function here is collective: all ranks call it, in the same order,
 * and all ranks return the same status (failures are agreed on, so no rank
 * is left waiting in a collective).
 */
#ifndef FSDP_CHECKPOINT_H
#define FSDP_CHECKPOINT_H

#include "ckpt.h"
#include "comm.h"
#include "fsdp.h"
#include "model.h"

struct ckptr_opts {
    const char *uri;
    long long every, keep;
    int resume; /* 1: auto, 0: none */
    int verify_load; /* after loading, compare the state's digest with the checkpoint's */
    struct ckpt_write_opts write;
};

struct ckptr {
    struct ckptr_opts o;
    struct storage *st;
    struct ckpt_codec *codec;
    struct fsdp_engine *e;
    struct fsdp_comm *comm;
    const struct model_layout *m;
    json_t *model_json;
    int world;   /* ranks whose shards form a checkpoint (1 for NO_SHARD) */
    int saves;   /* checkpoints written by this process */
    uint64_t newest_committed; /* 0 if none */
    uint64_t generation;       /* of this launch (fsdp-super), 0 unsupervised */
};

/* Result codes beyond 0 / -1. */
#define CKPTR_REFUSED -2 /* the checkpoint belongs to another model: do not fall back */

int ckptr_open(struct ckptr *c, const struct ckptr_opts *o, struct fsdp_engine *e,
               struct fsdp_comm *comm, const struct model_layout *m, char *err);
void ckptr_close(struct ckptr *c);

/* Writes and commits step `step`; trainer is the trainer-state object to
 * store (borrowed). Then applies retention (rank 0). */
int ckptr_save(struct ckptr *c, uint64_t step, json_t *trainer, char *err);

/* With --resume auto, loads the newest committed step that verifies into
 * the engine; *trainer receives its trainer state (new reference) or NULL
 * when starting fresh. Steps newer than the one loaded, and incomplete
 * steps, are removed. */
int ckptr_resume(struct ckptr *c, json_t **trainer, uint64_t *step, char *err);

/* The loaded state's digest against the checkpoint's (--verify-load). */
int ckptr_verify_loaded(struct ckptr *c, const struct ckpt_manifest *man, char *err);

#endif
