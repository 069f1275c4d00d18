/*
 * checkpoint.c - the commit protocol and resume with fallback.
 *
 * Save (DESIGN.md, Checkpoints):
 *   1. every rank writes its own shard, in parallel, straight from its
 *      state; the storage backend makes it durable before returning;
 *   2. the ranks agree that every write succeeded (a failure anywhere
 *      fails the checkpoint everywhere) and gather their shard records on
 *      rank 0 (a fixed-size entry each: the chunk table stays in the shard)
 *      - which is also the barrier: rank 0 continues only once all shards
 *      are durable;
 *   3. rank 0 writes MANIFEST.json with put-if-absent. Until that moment
 *      the step is incomplete and never loaded. If the step is already
 *      committed (by an earlier run whose step this one could not load, or
 *      any other writer), that commit stays as it is: this launch's shards
 *      of the step are removed and training goes on;
 *   4. rank 0 applies retention (ckpt_clean: the newest K committed steps
 *      up to this one stay; garbage of fenced generations goes).
 * Shard objects carry this launch's writer tag (ckpt.h), so no other
 * writer's object is ever replaced, and a failed save removes exactly the
 * shards this launch wrote. Every launch has a generation: fsdp-super's
 * (FSDP_GENERATION), or, unsupervised, one rank 0 claims at start - a
 * second run started on the same store fences this one.
 * Resume: rank 0 reads each candidate's manifest and broadcasts it (one
 * GET, not one per rank); every rank then fetches only the chunk indexes
 * and chunks of the shards it needs. Newest committed step first; a step
 * that fails to load on any
 * rank (missing object, bad digest, bad manifest, a read error) is reported
 * with the failing rank's message and skipped - it stays in the store for
 * `fsdp-ckpt verify` - and the next older one is tried. A checkpoint of a
 * different model is refused outright. Nothing is deleted because a read
 * failed.
 *
 * Asynchronous saves (--ckpt-async) are checkpoint_async.c: the same
 * protocol, with step 1 on a background thread (checkpoint_internal.h is
 * what the files share). With --verify-load, the state as loaded is
 * compared with the checkpoint's digest (checkpoint_verify.c).
 *
 * Test hook: testhook_stop (testhook.h, FSDP_TEST_STOP_AT) at the points
 * shard-chunk, before-commit, fence-checked and after-commit below.
 */
#include "checkpoint_internal.h"

#include "heartbeat.h"
#include "model_ckpt.h"
#include "testhook.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- agreement ---------------------------------------------------------------- */

/* All ranks learn whether any failed; rank 0 learns the first failing
 * rank's message. Returns 0 if every rank succeeded. */
int tckpt_agree(struct fsdp_comm *comm, int rc, char *err)
{
    double bad = rc != 0;
    char local[FSDP_ERR_LEN];
    if (comm->allreduce_sum_f64(comm, &bad, 1, local))
        return fsdp_err(err, "%s", local);
    if (bad == 0)
        return 0;
    const char *mine = rc ? err : "";
    char *all = NULL;
    size_t lens[comm->world > 0 ? comm->world : 1];
    if (comm->gather_bytes(comm, mine, strlen(mine) + 1, 0, &all, lens, local) == 0 &&
        comm->rank == 0) {
        size_t off = 0;
        for (int r = 0; r < comm->world; off += lens[r], r++) {
            if (lens[r] > 1) {
                char msg[FSDP_ERR_LEN];
                snprintf(msg, sizeof msg, "%.*s", (int)lens[r], all + off);
                if (comm->world > 1)
                    fsdp_err(err, "rank %d: %s", r, msg);
                else
                    fsdp_err(err, "%s", msg);
                break;
            }
        }
    }
    free(all);
    if (!rc && comm->rank != 0)
        fsdp_err(err, "another rank failed");
    return -1;
}

/* ---- open ------------------------------------------------------------------------ */

/* Rank 0, at start: the launch's generation (claimed here when no
 * supervisor gave one), its writer tag, and proof that the store takes a
 * write and a delete - a read-only mount or a file in the way is found now,
 * not after the first --ckpt-every steps of training. */
static int claim_and_probe(struct tckpt *c, char *err)
{
    char sub[FSDP_ERR_LEN];
    if (!c->generation && ckpt_fence_claim(c->st, &c->generation, sub))
        return fsdp_err(err, "checkpoint store %s: cannot claim a generation: %s", c->st->uri, sub);
    if (ckpt_fence_check(c->st, c->generation, sub))
        return fsdp_err(err, "%s", sub);
    if (ckpt_new_writer_tag(c->st, c->generation, c->tag, sizeof c->tag, sub))
        return fsdp_err(err, "%s", sub);
    char key[96];
    snprintf(key, sizeof key, "probe-%s", c->tag);
    if (storage_put(c->st, key, "probe\n", 6, sub) || storage_delete(c->st, key, sub))
        return fsdp_err(err, "checkpoint store %s is not writable: %s", c->st->uri, sub);
    return 0;
}

/* Collective, per_host: the leaders claimed a generation each in their
 * stores; all take the largest (claimed where a store is behind), so that
 * one number fences the launch everywhere. */
static int share_generation(struct tckpt *c, char *err)
{
    struct fsdp_comm *comm = c->comm;
    uint64_t mine = c->leader ? c->generation : 0, top = 0;
    char *all = NULL;
    size_t lens[comm->world];
    if (comm->gather_bytes(comm, &mine, sizeof mine, 0, &all, lens, err))
        return -1;
    for (int r = 0; comm->rank == 0 && r < comm->world; r++) {
        uint64_t g;
        memcpy(&g, all + (size_t)r * sizeof g, sizeof g);
        top = g > top ? g : top;
    }
    free(all);
    if (comm->bcast_bytes(comm, &top, sizeof top, 0, err))
        return -1;
    int rc = c->leader && c->generation != top ? ckpt_fence_claim_at(c->st, top, err) : 0;
    c->generation = top;
    return tckpt_agree(comm, rc, err);
}

/* Collective, per_host, after share_generation: rank 0's writer tag names
 * its own claim, which may be below the agreed generation (its host's
 * store was behind: a rebooted host); a commit refuses a tag of another
 * generation, so the tag is made again for the agreed one. */
static int retag(struct tckpt *c, char *err)
{
    char sub[FSDP_ERR_LEN];
    uint64_t mine;
    int rc = c->comm->rank == 0 && ckpt_tag_generation(c->tag, &mine) == 0 &&
                     mine != c->generation &&
                     ckpt_new_writer_tag(c->st, c->generation, c->tag, sizeof c->tag, sub)
                 ? fsdp_err(err, "%s", sub)
                 : 0;
    return tckpt_agree(c->comm, rc, err);
}

int tckpt_open(struct tckpt *c, const struct tckpt_opts *o, struct fsdp_engine *e,
               struct fsdp_comm *comm, const struct model_layout *m, char *err)
{
    memset(c, 0, sizeof *c);
    c->o = *o;
    c->e = e;
    c->comm = comm;
    c->m = m;
    c->world = e->shard == FSDP_SHARD_NONE ? 1 : comm->world;
    c->generation = o->memory ? 0 : hb_generation();
    int rc = storage_open(o->uri, &c->st, err);
    if (!rc && !(c->codec = ckpt_codec_new(o->write.chunk_bytes)))
        rc = fsdp_err(err, "checkpoint: out of memory for the codec");
    if (!rc && !(c->model_json = model_ckpt_config(&m->cfg)))
        rc = fsdp_err(err, "checkpoint: out of memory");
    for (int k = 0; !rc && e->k->on_device && k < CKPT_NKINDS; k++)
        if (!(c->host[k] = e->k->host_alloc(e->shard_total * sizeof(float))))
            rc = fsdp_err(err, "checkpoint: out of host memory for a copy of the state");
    c->leader = comm->rank == 0 || (o->per_host && comm->local_rank == 0);
    for (int i = 0; !rc && o->per_host && i < 2; i++)
        if (!(c->piece[i] = malloc((size_t)4 << 20)))
            rc = fsdp_err(err, "checkpoint: out of memory");
    if (o->per_host && (tckpt_agree(comm, rc, err) || tckpt_pair_ranks(c, err) ||
                        (o->resume && tckpt_complete_hosts(c, err)))) {
        tckpt_close(c);
        return -1;
    }
    if (!rc && c->leader)
        rc = claim_and_probe(c, err);
    if (tckpt_agree(comm, rc, err) || (o->per_host && share_generation(c, err)) ||
        (o->per_host && retag(c, err)) ||
        comm->bcast_bytes(comm, &c->generation, sizeof c->generation, 0, err) ||
        comm->bcast_bytes(comm, c->tag, sizeof c->tag, 0, err)) {
        tckpt_close(c);
        return -1;
    }
    return 0;
}

void tckpt_close(struct tckpt *c)
{
    free(c->piece[0]);
    free(c->piece[1]);
    free(c->held);
    c->piece[0] = c->piece[1] = NULL;
    c->held = NULL;
    storage_close(c->st);
    ckpt_codec_free(c->codec);
    json_decref(c->model_json);
    c->st = NULL;
    c->codec = NULL;
    c->model_json = NULL;
    for (int k = 0; k < CKPT_NKINDS; k++)
        if (c->host[k])
            c->e->k->host_free(c->host[k]);
    memset(c->host, 0, sizeof c->host);
}

/* ---- save -------------------------------------------------------------------------- */

/* The engine's state of one kind (backend memory). */
float *tckpt_kind_base(struct fsdp_engine *e, int kind)
{
    return kind == CKPT_PARAM ? e->params : kind == CKPT_EXP_AVG ? e->exp_avg : e->exp_avg_sq;
}

/* The same in host memory, where the storage code reads and writes it. */
static float *host_base(struct tckpt *c, int kind)
{
    return c->host[kind] ? c->host[kind] : tckpt_kind_base(c->e, kind);
}

/* Device engines: the state's host copy is made current (before a save)
 * or copied back (after a load). Nothing to do on the CPU. */
static void state_to_host(struct tckpt *c)
{
    for (int k = 0; k < CKPT_NKINDS; k++)
        if (c->host[k])
            c->e->k->download(c->host[k], tckpt_kind_base(c->e, k),
                              c->e->shard_total * sizeof(float));
}

static void state_to_device(struct tckpt *c)
{
    for (int k = 0; k < CKPT_NKINDS; k++)
        if (c->host[k])
            c->e->k->upload(tckpt_kind_base(c->e, k), c->host[k],
                            c->e->shard_total * sizeof(float));
}

/* ckpt_shard_write's callback after each chunk of this rank's shard: the
 * heartbeat sees progress, and the test hook's first point is here. */
static void chunk_hook(int chunk)
{
    hb_progress();
    if (chunk == 0)
        testhook_stop("shard-chunk");
}

/* The same for a snapshot in memory: the test hooks are the store's saves'. */
static void memory_chunk_hook(int chunk)
{
    (void)chunk;
    hb_progress();
}

/* Writes this rank's shard from bases[kind] (the engine's state, or the
 * async staging copy of it). */
int tckpt_write_own_shard(struct tckpt *c, uint64_t step, float *const bases[CKPT_NKINDS],
                          char **json_out, char *err)
{
    const struct model_layout *m = c->m;
    struct fsdp_engine *e = c->e;
    int nsrc = m->nunits * CKPT_NKINDS;
    struct ckpt_src *src = calloc((size_t)nsrc, sizeof *src);
    if (!src)
        return fsdp_err(err, "checkpoint: out of memory");
    for (int u = 0; u < m->nunits; u++)
        for (int k = 0; k < CKPT_NKINDS; k++)
            src[u * CKPT_NKINDS + k] = (struct ckpt_src){
                u, k, e->units[u].shard_lo, e->units[u].shard_n, bases[k] + e->units[u].shard_off};
    char dir[32], file[CKPT_TAG_LEN + 32], key[128];
    ckpt_step_dir(step, dir, sizeof dir);
    ckpt_shard_file(c->comm->rank, c->world, c->tag, file, sizeof file);
    snprintf(key, sizeof key, "%s/%s", dir, file);
    struct ckpt_shard shard;
    int rc = ckpt_shard_write(c->st, key, file, &c->o.write, c->codec, src, nsrc, c->comm->rank,
                              &shard, c->o.memory ? memory_chunk_hook : chunk_hook, err);
    free(src);
    if (rc)
        return -1;
    json_t *j = ckpt_shard_to_json(&shard);
    ckpt_shard_free(&shard);
    *json_out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return *json_out ? 0 : fsdp_err(err, "checkpoint: out of memory");
}

/* Is the manifest's model this run's? Compared as configurations, not as
 * JSON text: a checkpoint written before families existed (no "arch") is
 * GPT-2's and still resumes. */
static int same_model(const struct tckpt *c, const json_t *model, char *why)
{
    struct model_config saved;
    char sub[FSDP_ERR_LEN];
    if (model_ckpt_parse(model, &saved, sub)) {
        snprintf(why, FSDP_ERR_LEN, "has a model this build cannot read (%.300s)", sub);
        return 0;
    }
    if (!model_config_equal(&saved, &c->m->cfg)) {
        char a[256], b[256];
        snprintf(why, FSDP_ERR_LEN, "was written for model %s, this run is %s",
                 model_config_describe(&saved, a, sizeof a),
                 model_config_describe(&c->m->cfg, b, sizeof b));
        return 0;
    }
    return 1;
}

/* Is the step another launch already committed a point of this same run's
 * trajectory (an earlier launch's step this run skipped at resume)? Then
 * it stands for ours. Anything else - a newer launch, another model, other
 * data or seed - is not ours to sit beside. */
static int same_run(const struct tckpt *c, const struct ckpt_manifest *other, json_t *trainer)
{
    char why[FSDP_ERR_LEN];
    if (other->generation >= c->generation || !same_model(c, other->model, why))
        return 0;
    static const char *const keys[] = {"step", "data_cursor", "seed", "global_batch"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *a = json_object_get(other->trainer, keys[i]),
               *b = json_object_get(trainer, keys[i]);
        if (!a || !b || !json_equal(a, b))
            return 0;
    }
    return 1;
}

/* Rank 0: the manifest from every rank's shard record, then the commit.
 * Returns 0 when committed, 1 when the step stays as an earlier launch
 * committed it (this launch's copy removed), -1 on failure. *attempted says
 * whether the commit was tried: from then on ckpt_commit_step alone decides
 * what of this launch's shards goes. */
static int commit(struct tckpt *c, uint64_t step, json_t *trainer, const char *all,
                  const size_t *lens, int *attempted, char *err)
{
    struct ckpt_manifest man = {0};
    man.version = CKPT_FORMAT_VERSION;
    man.chunk_bytes = c->o.write.chunk_bytes;
    man.chunk_hash = c->o.write.hash;
    man.step = step;
    man.generation = c->generation;
    man.world = c->world;
    snprintf(man.sharding, sizeof man.sharding, "%s", fsdp_shard_name(c->e->shard));
    man.model = json_incref(c->model_json);
    man.trainer = json_incref(trainer);
    int rc =
        model_ckpt_units(c->m, c->world, &man) ? fsdp_err(err, "checkpoint: out of memory") : 0;
    man.shards = calloc((size_t)c->world, sizeof *man.shards);
    if (!rc && !man.shards)
        rc = fsdp_err(err, "checkpoint: out of memory");
    size_t off = 0;
    for (int r = 0; !rc && r < c->world; off += lens[r], r++) {
        json_error_t je;
        json_t *j = json_loadb(all + off, lens[r], 0, &je);
        char sub[FSDP_ERR_LEN];
        if (!j || ckpt_shard_from_json(j, &man.shards[r], sub))
            rc = fsdp_err(err, "checkpoint: rank %d sent an unreadable shard record", r);
        else
            man.nshards = r + 1;
        json_decref(j);
    }
    if (!rc) {
        if (!c->o.memory)
            testhook_stop("before-commit");
        rc = ckpt_fence_check(c->st, c->generation, err);
    }
    if (!rc && !c->o.memory)
        testhook_stop("fence-checked"); /* a frozen or partitioned rank 0 can stop here */
    if (!rc) {
        *attempted = 1;
        struct ckpt_commit_result res;
        rc = ckpt_commit_step_held(c->st, &man, c->tag, c->held, &res, err);
        c->stored_bytes = 0;
        for (int r = 0; !rc && r < man.nshards; r++)
            c->stored_bytes += man.shards[r].stored_size;
        if (rc && res.outcome == CKPT_OTHER_UNREADABLE) {
            fprintf(stderr,
                    "fsdp-train: checkpoint step %llu is already committed in %s but "
                    "does not load (kept for fsdp-ckpt verify; not overwritten): this run's copy "
                    "is discarded\n",
                    (unsigned long long)step, c->st->uri);
            rc = 1;
        } else if (rc && res.outcome == CKPT_OTHER_DEAD) {
            fprintf(stderr,
                    "fsdp-train: checkpoint step %llu in %s holds a fenced writer's late "
                    "commit (generation %llu, not part of the run; not overwritten): this run's "
                    "copy is discarded, the next checkpoint counts\n",
                    (unsigned long long)step, c->st->uri, (unsigned long long)res.other.generation);
            rc = 1;
        } else if (rc && res.outcome == CKPT_OTHER && same_run(c, &res.other, trainer)) {
            fprintf(stderr,
                    "fsdp-train: checkpoint step %llu is already committed in %s by an "
                    "earlier launch of this run (generation %llu; not overwritten): this run's "
                    "copy is discarded\n",
                    (unsigned long long)step, c->st->uri, (unsigned long long)res.other.generation);
            rc = 1;
        } else if (rc && res.outcome == CKPT_OTHER) {
            fsdp_err(err,
                     "checkpoint step %llu in %s was committed by another run (generation "
                     "%llu, other model, data or seed): stopping rather than training beside it",
                     (unsigned long long)step, c->st->uri,
                     (unsigned long long)res.other.generation);
            rc = -1;
        }
        ckpt_commit_result_free(&res);
    }
    ckpt_manifest_free(&man);
    return rc < 0 ? -1 : rc;
}

/* A leader, after committing step upto: retention and garbage (cleanup.c
 * decides). */
int tckpt_retain(struct tckpt *c, uint64_t upto, char *err)
{
    struct ckpt_clean_policy p = {.generation = c->generation, .keep = c->o.keep, .upto = upto};
    struct ckpt_clean_report rep;
    char sub[FSDP_ERR_LEN];
    if (ckpt_clean(c->st, &p, &rep, sub))
        return fsdp_err(err, "%s", sub);
    return 0;
}

/* A leader: removes the shards this launch wrote for a step it did not
 * commit. Best effort and silent: the store may be what failed (its error
 * is the one line the user sees); what stays is garbage of this generation,
 * which the next launch's start-up cleanup removes. */
static void discard_own(struct tckpt *c, uint64_t step)
{
    char sub[FSDP_ERR_LEN];
    (void)ckpt_discard_own(c->st, step, c->world, c->tag, sub);
}

/* Rank 0, after a commit that did not count: if a newer generation has
 * claimed the store, this launch is fenced (see TCKPT_FENCED_EXIT). The
 * verdict is said here, before any collective: the other ranks of a stale
 * launch (a host frozen through a partition, thawed after the job moved
 * on) may be gone, and waiting for them in tckpt_agree() would hang
 * unheard. A store that cannot be read decides nothing: the caller reports
 * its error. */
static void exit_if_fenced(struct tckpt *c, uint64_t step, const char *why)
{
    uint64_t cur;
    char sub[FSDP_ERR_LEN];
    if (!c->generation || ckpt_fence_current(c->st, &cur, sub) || cur <= c->generation)
        return;
    if (strncmp(why, "fenced", 6) == 0)
        fprintf(stderr, "fsdp-train: %s; stopping\n", why);
    else
        fprintf(stderr,
                "fsdp-train: fenced: %s now belongs to generation %llu, not this launch's "
                "(%llu); its checkpoint of step %llu: %s; stopping\n",
                c->st->uri, (unsigned long long)cur, (unsigned long long)c->generation,
                (unsigned long long)step, why);
    fflush(stderr);
    hb_event("fenced step=%llu by=%llu", (unsigned long long)step, (unsigned long long)cur);
    hb_stop();
    _exit(TCKPT_FENCED_EXIT);
}

/* Collective, per_host: rank 0's gathered shard records (*all, lens) to
 * every rank, for every host's leader commits the same manifest. */
static int share_records(struct tckpt *c, char **all, size_t *lens, char *err)
{
    struct fsdp_comm *comm = c->comm;
    uint64_t n[comm->world], total = 0;
    for (int r = 0; r < comm->world; r++)
        total += (n[r] = comm->rank == 0 ? lens[r] : 0);
    if (comm->bcast_bytes(comm, n, sizeof n, 0, err))
        return -1;
    total = 0;
    for (int r = 0; r < comm->world; r++)
        total += (lens[r] = (size_t)n[r]);
    double bad = comm->rank != 0 && !(*all = malloc(total + 1));
    if (comm->allreduce_sum_f64(comm, &bad, 1, err))
        return -1;
    if (bad)
        return fsdp_err(err, "checkpoint: a rank is out of memory for the shard records");
    return comm->bcast_bytes(comm, *all, total, 0, err);
}

/* Collective, after every rank wrote (or failed to write) its shard: the
 * agreement, the shard records to rank 0 (with per_host, to every leader),
 * the commit, retention. Takes mine. */
int tckpt_finish_save(struct tckpt *c, uint64_t step, json_t *trainer, char *mine, int rc,
                      char *err)
{
    if (tckpt_agree(c->comm, rc, err)) {
        free(mine);
        if (c->leader)
            discard_own(c, step);
        return -1;
    }
    char *all = NULL;
    size_t lens[c->comm->world];
    const char *send = mine ? mine : "";
    rc = c->comm->gather_bytes(c->comm, send, mine ? strlen(mine) : 0, 0, &all, lens, err);
    free(mine);
    if (!rc && c->o.per_host)
        rc = share_records(c, &all, lens, err);
    if (!rc && c->leader) {
        int attempted = 0;
        rc = commit(c, step, trainer, all, lens, &attempted, err);
        c->skipped = rc == 1;
        if (rc == 0) {
            c->newest_committed = step;
            if (c->comm->rank == 0)
                hb_event("checkpoint_committed step=%llu seconds=%.3f bytes=%llu memory=%d",
                         (unsigned long long)step, fsdp_now() - c->save_t0,
                         (unsigned long long)c->stored_bytes, c->o.memory);
            if (!c->o.memory)
                testhook_stop("after-commit");
            if (c->async)
                tckpt_async_retain(c, step); /* the leader's writer thread deletes old steps */
            else
                rc = tckpt_retain(c, step, err); /* a failure here leaves the commit as it is */
        } else if (rc < 0 && !attempted) {       /* never committed: our shards are garbage */
            discard_own(c, step);
        }
        if (rc < 0)
            exit_if_fenced(c, step, err);
        if (rc == 1)
            rc = 0;
    }
    free(all);
    return tckpt_agree(c->comm, rc, err);
}

int tckpt_save(struct tckpt *c, uint64_t step, json_t *trainer, char *err)
{
    if (c->async) /* an emergency save: rank 0's writer may still apply retention */
        tckpt_async_quiesce(c);
    if (!c->o.memory)
        testhook_save_begins(++c->saves);
    c->save_t0 = fsdp_now();
    hb_set(step, HB_SAVE);
    char *mine = NULL;
    int rc = 0;
    float *const bases[CKPT_NKINDS] = {host_base(c, CKPT_PARAM), host_base(c, CKPT_EXP_AVG),
                                       host_base(c, CKPT_EXP_AVG_SQ)};
    if (c->comm->rank < c->world) {
        state_to_host(c);
        rc = tckpt_write_own_shard(c, step, bases, &mine, err);
    }
    return tckpt_finish_save(c, step, trainer, mine, rc, err);
}

/* ---- resume ------------------------------------------------------------------------ */

/* A leader, at start-up: garbage of fenced generations goes (incomplete
 * steps, losing writers' shards, temporaries); no committed step is
 * touched - retention runs after this launch's own commits. */
static int clean_for_start(struct tckpt *c, char *err)
{
    struct ckpt_clean_policy p = {.generation = c->generation, .keep = 0};
    struct ckpt_clean_report rep;
    char sub[FSDP_ERR_LEN];
    if (ckpt_clean(c->st, &p, &rep, sub))
        return fsdp_err(err, "%s", sub);
    if (rep.incomplete_removed)
        fprintf(stderr,
                "fsdp-train: removed %d incomplete checkpoint%s left by earlier runs in "
                "%s\n",
                rep.incomplete_removed, rep.incomplete_removed == 1 ? "" : "s", c->st->uri);
    return 0;
}

static int check_model(struct tckpt *c, const struct ckpt_manifest *man, char *err)
{
    char why[FSDP_ERR_LEN];
    if (!same_model(c, man->model, why))
        goto differ;
    if (man->nunits != c->m->nunits) {
        snprintf(why, sizeof why, "has %d units where this run's model has %d", man->nunits,
                 c->m->nunits);
        goto differ;
    }
    for (int u = 0; u < man->nunits; u++)
        if (man->units[u].numel != c->m->units[u].numel) {
            snprintf(why, sizeof why,
                     "has %zu parameters in unit %s where this run's model has %zu",
                     man->units[u].numel, man->units[u].name, c->m->units[u].numel);
            goto differ;
        }
    return 0;
differ:
    fsdp_err(err,
             "checkpoint step %llu in %s %s: refusing to resume (use the same model flags, or "
             "another --ckpt)",
             (unsigned long long)man->step, c->st->uri, why);
    return TCKPT_REFUSED;
}

/* Collective: rank 0 loads the manifest (judging that it is live) and
 * broadcasts its bytes; the others parse them. A failure on rank 0 is every
 * rank's, with the same code (tckpt_agree() then reports rank 0's message). */
static int share_manifest(struct tckpt *c, uint64_t step, struct ckpt_manifest *man, char *err)
{
    char *doc = NULL;
    size_t len = 0;
    int64_t head[2] = {0, 0}; /* rank 0's result, the document's length */
    *err = 0;
    if (c->comm->rank == 0) {
        head[0] = ckpt_load_manifest_doc(c->st, step, man, &doc, &len, err);
        head[1] = head[0] ? 0 : (int64_t)len;
    }
    char sub[FSDP_ERR_LEN];
    if (c->comm->bcast_bytes(c->comm, head, sizeof head, 0, sub)) {
        free(doc);
        if (c->comm->rank == 0)
            ckpt_manifest_free(man);
        return fsdp_err(err, "%s", sub);
    }
    /* every rank takes part in the same collectives: the document goes out
     * only if every rank could make room for it */
    double short_of_memory = 0;
    if (c->comm->rank != 0 && head[0] == 0 && !(doc = malloc((size_t)head[1] + 1)))
        short_of_memory = 1;
    if (head[0] == 0 && c->comm->world > 1 &&
        c->comm->allreduce_sum_f64(c->comm, &short_of_memory, 1, sub))
        head[0] = fsdp_err(err, "%s", sub);
    else if (head[0] == 0 && short_of_memory > 0)
        head[0] = fsdp_err(err,
                           "checkpoint: a rank is out of memory for the manifest of step %llu "
                           "(%lld bytes)",
                           (unsigned long long)step, (long long)head[1]);
    else if (head[0] == 0 && c->comm->world > 1 &&
             c->comm->bcast_bytes(c->comm, doc, (size_t)head[1], 0, sub))
        head[0] = fsdp_err(err, "%s", sub);
    if (c->comm->rank != 0 && head[0] == 0 && ckpt_manifest_parse(doc, (size_t)head[1], man, sub))
        head[0] =
            fsdp_err(err, "step %llu: the manifest rank 0 sent: %s", (unsigned long long)step, sub);
    else if (c->comm->rank != 0 && head[0] != 0 && !*err)
        fsdp_err(err, "rank 0 could not load the manifest of step %llu", (unsigned long long)step);
    free(doc);
    return (int)head[0];
}

/* Every rank reads its own part of every unit and kind, from whatever
 * shards hold it (any saved world size), as one plan of ranged reads. */
static int load_step(struct tckpt *c, uint64_t step, struct ckpt_manifest *man,
                     uint64_t *bytes_read, char *err)
{
    int rc = share_manifest(c, step, man, err);
    if (rc)
        return rc == CKPT_CANNOT_JUDGE ? CKPT_CANNOT_JUDGE : -1;
    if ((rc = check_model(c, man, err)))
        return rc;
    if (c->o.check_trainer && (rc = c->o.check_trainer(c->o.check_ctx, man->trainer, step, err)))
        return rc;
    struct ckpt_reader r;
    if (ckpt_reader_init(&r, c->st, man, err))
        return -1;
    r.on_chunk = hb_progress;
    r.threads = c->o.load_threads; /* the compute threads are idle while loading */
    int nw = c->m->nunits * CKPT_NKINDS;
    struct ckpt_want *w = calloc((size_t)nw, sizeof *w);
    if (!w)
        rc = fsdp_err(err, "checkpoint: out of memory");
    for (int u = 0; w && u < c->m->nunits; u++) {
        const struct fsdp_unit *U = &c->e->units[u];
        for (int k = 0; k < CKPT_NKINDS; k++)
            w[u * CKPT_NKINDS + k] =
                (struct ckpt_want){u, k, U->shard_lo, U->shard_n, host_base(c, k) + U->shard_off};
    }
    if (!rc)
        rc = ckpt_load(&r, w, nw, err);
    if (!rc)
        state_to_device(c);
    *bytes_read = r.bytes_fetched;
    free(w);
    ckpt_reader_free(&r);
    return rc;
}

/* Rank 0 prints how much each rank read: about its share, not everything. */
static void report_reads(struct tckpt *c, const struct ckpt_manifest *man, uint64_t mine,
                         double seconds)
{
    char line[64], err[FSDP_ERR_LEN], *all = NULL;
    size_t lens[c->comm->world];
    snprintf(line, sizeof line, " %llu", (unsigned long long)mine);
    if (c->comm->gather_bytes(c->comm, line, strlen(line), 0, &all, lens, err) == 0 &&
        c->comm->rank == 0) {
        uint64_t stored = 0;
        size_t total = 0;
        for (int s = 0; s < man->nshards; s++)
            stored += man->shards[s].stored_size;
        for (int r = 0; r < c->comm->world; r++)
            total += lens[r];
        fprintf(stderr,
                "fsdp-train: loading step %llu read%.*s bytes on ranks 0..%d, of %llu "
                "stored, in %.3f s\n",
                (unsigned long long)man->step, (int)total, all, c->comm->world - 1,
                (unsigned long long)stored, seconds);
    }
    free(all);
}

/* Collective: the committed steps, oldest first, the same on every rank
 * (rank 0 lists the store and broadcasts them). *cand is malloc'd. */
static int list_committed(struct tckpt *c, uint64_t **cand, int *ncand, char *err)
{
    struct fsdp_comm *comm = c->comm;
    struct ckpt_step_info *steps = NULL;
    int n = 0, rc = 0;
    *cand = NULL;
    *ncand = 0;
    if (comm->rank == 0)
        rc = ckpt_list_steps(c->st, &steps, &n, err);
    if (tckpt_agree(comm, rc, err))
        return -1;
    double count = comm->rank == 0 ? n : 0;
    if (comm->allreduce_sum_f64(comm, &count, 1, err)) {
        free(steps);
        return -1;
    }
    n = (int)count;
    uint64_t *v = calloc((size_t)n + 1, sizeof *v);
    int nv = 0;
    for (int i = 0; v && comm->rank == 0 && i < n; i++)
        if (steps[i].committed)
            v[nv++] = steps[i].step;
    free(steps);
    if (tckpt_agree(comm, v ? 0 : fsdp_err(err, "checkpoint: out of memory"), err) ||
        comm->bcast_bytes(comm, &nv, sizeof nv, 0, err) ||
        comm->bcast_bytes(comm, v, (size_t)n * sizeof *v, 0, err)) {
        free(v);
        return -1;
    }
    *cand = v;
    *ncand = nv;
    return 0;
}

/* Collective, with --resume none: a store that holds committed steps is
 * refused; an empty one the fresh run owns, and clears of what a crashed
 * run left. */
static int start_fresh(struct tckpt *c, const uint64_t *cand, int ncand, char *err)
{
    if (ncand > 0)
        return fsdp_err(err,
                        "%s already holds committed checkpoints (newest step %llu): "
                        "use --resume auto, or another --ckpt",
                        c->st->uri, (unsigned long long)cand[ncand - 1]);
    int rc = c->leader ? clean_for_start(c, err) : 0;
    return tckpt_agree(c->comm, rc, err);
}

/* Collective, once step is loaded on every rank: what each rank read, and
 * the events a supervisor counts (a reshard when the world size changed). */
static void announce_load(struct tckpt *c, const struct ckpt_manifest *man, uint64_t step,
                          uint64_t bytes_read, double load_s)
{
    struct fsdp_comm *comm = c->comm;
    report_reads(c, man, bytes_read, load_s);
    c->load_s = load_s;
    if (comm->rank == 0)
        hb_event("loaded step=%llu seconds=%.3f", (unsigned long long)step, load_s);
    if (comm->rank == 0 && man->world != comm->world) {
        fprintf(stderr, "fsdp-train: resharding step %llu from %d to %d ranks\n",
                (unsigned long long)step, man->world, comm->world);
        hb_event("reshard step=%llu from=%d to=%d", (unsigned long long)step, man->world,
                 comm->world);
    }
}

/* Collective: loads committed step into the engine on every rank (and
 * verifies it with --verify-load). Returns 0 when loaded (*man filled), 1
 * when some rank could not load it (err says why: the caller falls back to
 * an older step), TCKPT_REFUSED for another model's checkpoint, -1 when
 * nothing more may be tried. The caller frees *man in every case. */
static int try_step(struct tckpt *c, uint64_t step, struct ckpt_manifest *man, char *err)
{
    struct fsdp_comm *comm = c->comm;
    uint64_t bytes_read = 0;
    double t0 = fsdp_now();
    int rc = load_step(c, step, man, &bytes_read, err);
    double load_s = fsdp_now() - t0;
    int refused = rc == TCKPT_REFUSED;
    double votes[3] = {rc != 0, refused, rc == CKPT_CANNOT_JUDGE};
    char sub[FSDP_ERR_LEN];
    if (comm->allreduce_sum_f64(comm, votes, 3, sub))
        return fsdp_err(err, "%s", sub);
    if (votes[2] > 0) { /* the seals cannot be read: no step may be judged, none skipped */
        if (rc != CKPT_CANNOT_JUDGE)
            fsdp_err(err, "another rank could not tell whether step %llu is live",
                     (unsigned long long)step);
        return -1;
    }
    if (votes[1] > 0) { /* same verdict on every rank: the model differs */
        if (!refused)
            fsdp_err(err, "another rank refused the checkpoint");
        return TCKPT_REFUSED;
    }
    if (tckpt_agree(comm, rc, err))
        return 1;
    announce_load(c, man, step, bytes_read, load_s);
    if (c->o.verify_load && tckpt_verify_loaded(c, man, err))
        return -1;
    return 0;
}

int tckpt_resume(struct tckpt *c, json_t **trainer, uint64_t *loaded, char *err)
{
    *trainer = NULL;
    *loaded = 0;
    hb_set(0, HB_LOAD);
    /* rank 0 lists; everyone tries the same candidates in the same order */
    uint64_t *cand;
    int ncand, rc;
    if (list_committed(c, &cand, &ncand, err))
        return -1;
    if (!c->o.resume) {
        rc = start_fresh(c, cand, ncand, err);
        free(cand);
        return rc;
    }
    for (int i = ncand - 1; i >= 0; i--) {
        if (c->o.load_from && cand[i] < c->o.load_from) {
            c->newest_committed = cand[i]; /* the newer step loaded from elsewhere stands */
            break;
        }
        struct ckpt_manifest man = {0};
        c->tried++;
        rc = try_step(c, cand[i], &man, err);
        if (rc == 0) {
            *trainer = json_incref(man.trainer);
            *loaded = cand[i];
            c->newest_committed = cand[i];
        }
        ckpt_manifest_free(&man);
        if (rc == 0)
            break;
        if (rc < 0) {
            free(cand);
            return rc;
        }
        if (c->comm->rank == 0)
            fprintf(stderr,
                    "fsdp-train: checkpoint step %llu is unusable: %s; %s (step %llu "
                    "stays in the store: fsdp-ckpt verify %s@%llu)\n",
                    (unsigned long long)cand[i], err,
                    i > 0           ? "falling back to the previous committed step"
                    : c->o.fallback ? c->o.fallback
                                    : "no older committed step: starting from scratch",
                    (unsigned long long)cand[i], c->st->uri, (unsigned long long)cand[i]);
    }
    free(cand);
    rc = c->leader ? clean_for_start(c, err) : 0;
    if (tckpt_agree(c->comm, rc, err)) {
        json_decref(*trainer);
        *trainer = NULL;
        return -1;
    }
    fsdp_params_changed(c->e);
    return 0;
}
