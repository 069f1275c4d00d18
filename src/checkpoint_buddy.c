/*
 * checkpoint_buddy.c - in-memory snapshots on several hosts: each rank's
 * shard is copied to a buddy rank on the next host, and at a relaunch the
 * hosts' stores are completed from one another before the resume.
 *
 * How it fits: with ranks on more than one host, the snapshots' store
 * (--mem-snapshot-every, train_ckpt.c) is a checkpoint store in each
 * host's RAM under the same path, and the host's lowest rank is its leader
 * (tckpt.leader: it claims, commits, cleans, as rank 0 does in a store of
 * one host). Hosts form a ring in the order of their lowest ranks; the
 * rank with local number l on host h sends its shard to the rank with
 * local number l on host h+1 (its buddy) and takes the shard of the one on
 * host h-1 (its ward), every host holding as many ranks. Every leader
 * commits the same manifest, so each host's store names every shard of a
 * step and holds its own ranks' and its wards'.
 *
 * The copy runs on the snapshot writer's thread, right after it wrote its
 * own shard, over MPI on a communicator of its own (comm.h's
 * side_sendrecv, MPI_THREAD_MULTIPLE): the job's own transport, addresses
 * and trust, where a TCP side channel would need a listener, its address
 * on every host and a token to authenticate. A pair exchanges a header
 * (the step, the shard's size or "failed") and then pieces of PIECE bytes
 * both ways at once, so the ring never waits on itself. The write is
 * "done" at the step's vote only with the copy done: a committed snapshot
 * is always in two hosts' RAM.
 *
 * At a relaunch, before the store's claims (tckpt_open), every leader lists
 * its store; rank 0 picks the newest step that has a manifest on some host
 * and sends, for every object of that step a host lacks, the bytes from a
 * host that has it (a broadcast per piece: the leaders that lack it write
 * it; the manifest last). After that every host's store holds the whole
 * step, or a shard is on no host, and the resume (checkpoint.c) reads and
 * verifies it as in one host's store: a missing or damaged shard fails the
 * step, and the checkpoint store decides.
 */
#include "checkpoint_internal.h"

#include "heartbeat.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIECE       ((size_t)4 << 20)  /* a copy's messages */
#define HEAL_PIECE  ((size_t)64 << 20) /* the relaunch's broadcasts */
#define COPY_FAILED UINT64_MAX         /* a header's size: no shard follows */

/* ---- pairs ----------------------------------------------------------------------- */

int tckpt_pair_ranks(struct tckpt *c, char *err)
{
    struct fsdp_comm *comm = c->comm;
    int me[2] = {comm->host, comm->local_rank};
    char *all = NULL;
    size_t lens[comm->world];
    if (comm->gather_bytes(comm, me, sizeof me, 0, &all, lens, err))
        return -1;
    int *where = calloc((size_t)comm->world * 2, sizeof *where);
    double bad = !where;
    if (where && comm->rank == 0)
        memcpy(where, all, (size_t)comm->world * sizeof me);
    free(all);
    if (comm->allreduce_sum_f64(comm, &bad, 1, err) || bad ||
        comm->bcast_bytes(comm, where, (size_t)comm->world * sizeof me, 0, err)) {
        free(where);
        return bad ? fsdp_err(err, "checkpoint: out of memory") : -1;
    }
    const int H = comm->hosts, next = (comm->host + 1) % H, prev = (comm->host + H - 1) % H;
    c->buddy = c->ward = -1;
    if (!(c->held = calloc((size_t)comm->world, 1))) {
        free(where);
        return fsdp_err(err, "checkpoint: out of memory");
    }
    for (int r = 0; r < comm->world; r++) {
        /* this host holds its ranks' shards and those of the previous host */
        c->held[r] = where[2 * r] == comm->host || where[2 * r] == prev;
        if (where[2 * r + 1] != comm->local_rank)
            continue;
        if (where[2 * r] == next)
            c->buddy = r;
        if (where[2 * r] == prev)
            c->ward = r;
    }
    free(where);
    if (c->buddy < 0 || c->ward < 0) /* the caller checked that hosts hold as many ranks */
        return fsdp_err(err, "checkpoint: rank %d has no buddy on host %d", comm->rank, next);
    return 0;
}

/* ---- the copy (the snapshot writer's thread) ------------------------------------- */

static void shard_key(const struct tckpt *c, uint64_t step, int rank, char *key, size_t n)
{
    char dir[32], file[CKPT_TAG_LEN + 32];
    ckpt_step_dir(step, dir, sizeof dir);
    ckpt_shard_file(rank, c->world, c->tag, file, sizeof file);
    snprintf(key, n, "%s/%s", dir, file);
}

int tckpt_buddy_copy(struct tckpt *c, uint64_t step, int ok, char *err)
{
    struct fsdp_comm *comm = c->comm;
    char mine[128], theirs[128], sub[FSDP_ERR_LEN];
    shard_key(c, step, comm->rank, mine, sizeof mine);
    shard_key(c, step, c->ward, theirs, sizeof theirs);
    uint64_t out[2] = {COPY_FAILED, step}, in[2] = {0, 0};
    if (ok && storage_stat(c->st, mine, &out[0], sub)) {
        fsdp_err(err, "snapshot: %s", sub);
        out[0] = COPY_FAILED;
    }
    if (comm->side_sendrecv(comm, out, sizeof out, c->buddy, in, sizeof in, c->ward, sub))
        return fsdp_err(err, "%s", sub); /* a lost peer: the job ends anyway */
    int rc = out[0] == COPY_FAILED ? -1 : 0;
    if (in[1] != step && !rc) /* the pieces still go both ways: the pair must not hang */
        rc = fsdp_err(err, "snapshot: rank %d sent step %llu for step %llu", c->ward,
                      (unsigned long long)in[1], (unsigned long long)step);
    uint64_t to_send = out[0] == COPY_FAILED ? 0 : out[0];
    uint64_t to_take = in[0] == COPY_FAILED ? 0 : in[0];
    if (in[0] == COPY_FAILED && !rc)
        rc = fsdp_err(err, "snapshot: rank %d could not write its shard of step %llu", c->ward,
                      (unsigned long long)step);
    unsigned char *sbuf = c->piece[0], *rbuf = c->piece[1];
    struct storage_writer *w = NULL;
    if (in[0] != COPY_FAILED && !rc && storage_put_begin(c->st, theirs, &w, sub)) {
        w = NULL;
        if (!rc)
            rc = fsdp_err(err, "snapshot: rank %d's shard: %s", c->ward, sub);
    }
    /* the sizes were promised: every piece goes and is taken, whatever fails
     * here (the step's vote then fails it), or the pair would wait forever */
    for (uint64_t sent = 0, taken = 0; sent < to_send || taken < to_take;) {
        size_t n = to_send - sent < PIECE ? (size_t)(to_send - sent) : PIECE;
        size_t m = to_take - taken < PIECE ? (size_t)(to_take - taken) : PIECE;
        if (n && storage_get_range(c->st, mine, sent, n, sbuf, sub) && !rc)
            rc = fsdp_err(err, "snapshot: %s", sub);
        /* each direction has its own count of pieces (a ring: the buddy's
         * and the ward's shards differ in size): a finished one is left out,
         * so a message always meets the one its peer sends */
        if (comm->side_sendrecv(comm, sbuf, n, sent < to_send ? c->buddy : -1, rbuf, m,
                                taken < to_take ? c->ward : -1, sub)) {
            storage_writer_abort(w);
            return fsdp_err(err, "%s", sub);
        }
        if (m && w && storage_write(w, rbuf, m, sub)) {
            storage_writer_abort(w);
            w = NULL;
            if (!rc)
                rc = fsdp_err(err, "snapshot: rank %d's shard: %s", c->ward, sub);
        }
        sent += n;
        taken += m;
        hb_progress(); /* a big shard's copy is work, not a hang */
    }
    if (w && !rc && storage_writer_commit(w, sub))
        rc = fsdp_err(err, "snapshot: rank %d's shard: %s", c->ward, sub);
    else if (w && rc)
        storage_writer_abort(w);
    return rc;
}

/* ---- completing the hosts' stores at a relaunch ---------------------------------- */

struct listing {
    char *text; /* "SIZE KEY\n" per object of a step: a shard or a manifest */
    size_t len, cap;
};

static int list_one(void *arg, const char *key, uint64_t size)
{
    struct listing *l = arg;
    for (const char *p = key; *p; p++)
        if ((unsigned char)*p <= ' ')
            return 0; /* not a name the store writes, and the listing is lines of words */
    const char *base = strrchr(key, '/');
    base = base ? base + 1 : key;
    if (strcmp(base, CKPT_MANIFEST) != 0 && (strncmp(base, "shard-", 6) || strstr(base, ".tmp.")))
        return 0;
    size_t need = strlen(key) + 24;
    if (l->len + need + 1 > l->cap) {
        size_t cap = (l->cap + need) * 2;
        char *t = realloc(l->text, cap);
        if (!t)
            return -1;
        l->text = t;
        l->cap = cap;
    }
    l->len += (size_t)snprintf(l->text + l->len, l->cap - l->len, "%" PRIu64 " %s\n", size, key);
    return 0;
}

/* The size of key in a listing ("SIZE KEY\n" lines); -1 when it is not
 * there. */
static int64_t listed(const char *text, size_t len, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end, *sp = memchr(p, ' ', (size_t)(eol - p));
        if (sp && (size_t)(eol - sp - 1) == kl && memcmp(sp + 1, key, kl) == 0)
            return (int64_t)strtoull(p, NULL, 10);
        p = eol + 1;
    }
    return -1;
}

static uint64_t step_of(const char *key)
{
    unsigned long long s = 0;
    return sscanf(key, "step-%llu/", &s) == 1 ? (uint64_t)s : 0;
}

/* The newest step with a manifest in any listing, and the lowest rank
 * whose listing holds that manifest (-1: none). */
static uint64_t newest_manifest(const char *all, const size_t *lens, int world, int *holder)
{
    uint64_t newest = 0;
    *holder = -1;
    size_t off = 0;
    for (int r = 0; r < world; off += lens[r], r++)
        for (const char *p = all + off, *end = p + lens[r], *nl; p < end; p = nl + 1) {
            if (!(nl = memchr(p, '\n', (size_t)(end - p))))
                break;
            unsigned long long size;
            char key[200];
            char line[256];
            snprintf(line, sizeof line, "%.*s", (int)(nl - p), p);
            const char *base =
                sscanf(line, "%llu %199s", &size, key) == 2 ? strrchr(key, '/') : NULL;
            if (base && strcmp(base + 1, CKPT_MANIFEST) == 0 && step_of(key) > newest) {
                newest = step_of(key);
                *holder = r;
            }
        }
    return newest;
}

/* Which of the old shards (world of man) this rank's part of every unit
 * lies in: need[i] = 1. The manifest's units are checked to be this
 * model's first; 0 or -1 (another model: the resume refuses it). */
static int needed_shards(const struct tckpt *c, const struct ckpt_manifest *man,
                         unsigned char *need)
{
    if (man->nunits != c->m->nunits || man->world <= 0 || man->nshards != man->world)
        return -1;
    memset(need, 0, (size_t)man->world);
    for (int u = 0; u < man->nunits; u++) {
        const struct ckpt_unit *U = &man->units[u];
        const struct fsdp_unit *mine = &c->e->units[u];
        uint64_t per = U->padded / (uint64_t)man->world;
        if (!per || U->numel != mine->numel)
            return -1;
        uint64_t lo = mine->shard_lo, end = mine->shard_lo + mine->shard_n;
        end = end < U->numel ? end : U->numel;
        for (uint64_t x = lo; x < end; x = (x / per + 1) * per)
            need[x / per] = 1;
    }
    return 0;
}

/* One object to every leader that is to write it, from its holder's
 * store, a broadcast per piece: every rank takes part. */
static int send_object(struct tckpt *c, const char *key, uint64_t size, int holder, int write,
                       unsigned char *buf, char *err)
{
    char sub[FSDP_ERR_LEN];
    struct storage_writer *w = NULL;
    int rc = 0;
    if (write && storage_put_begin(c->st, key, &w, sub)) {
        w = NULL;
        rc = fsdp_err(err, "snapshot: %s", sub);
    }
    for (uint64_t at = 0; at < size;) {
        size_t n = size - at < HEAL_PIECE ? (size_t)(size - at) : HEAL_PIECE;
        /* a holder that cannot read sends what it has: the digests at the
         * load judge the copy */
        if (c->comm->rank == holder && storage_get_range(c->st, key, at, n, buf, sub) && !rc)
            rc = fsdp_err(err, "snapshot: %s", sub);
        if (c->comm->bcast_bytes(c->comm, buf, n, holder, sub)) {
            storage_writer_abort(w);
            return fsdp_err(err, "%s", sub);
        }
        if (w && storage_write(w, buf, n, sub)) {
            storage_writer_abort(w);
            w = NULL;
            if (!rc)
                rc = fsdp_err(err, "snapshot: %s", sub);
        }
        at += n;
        hb_progress();
    }
    if (w && rc)
        storage_writer_abort(w);
    else if (w && storage_writer_commit(w, sub))
        rc = fsdp_err(err, "snapshot: %s", sub);
    return rc;
}

/* Rank 0: the plan, a line "SIZE HOLDER KEY HOSTS" for every old shard
 * some host needs and lacks (HOSTS: the hosts to write it, "h1,h2,"), then
 * the manifest's for every host that lacks it. listing/lens: every rank's
 * listing (only leaders list); where: per rank, its host and its needs. */
static char *make_plan(const struct ckpt_manifest *man, const char *listing, const size_t *lens,
                       const unsigned char *where, int world, int hosts)
{
    const size_t rec = 1 + (size_t)man->world;
    size_t *offs = calloc((size_t)world, sizeof *offs);
    int *leader_of = malloc((size_t)hosts * sizeof *leader_of);
    char *plan = malloc(((size_t)man->world + 1) * (260 + 4 * (size_t)hosts) + 1);
    if (!offs || !leader_of || !plan) {
        free(offs);
        free(leader_of);
        free(plan);
        return NULL;
    }
    for (int h = 0; h < hosts; h++)
        leader_of[h] = -1;
    for (int r = 0, off = 0; r < world; off += (int)lens[r], r++) {
        offs[r] = (size_t)off;
        int h = where[(size_t)r * rec];
        if (h < hosts && leader_of[h] < 0)
            leader_of[h] = r; /* ranks in order: a host's lowest */
    }
    size_t len = 0;
    plan[0] = 0;
    char dir[32];
    ckpt_step_dir(man->step, dir, sizeof dir);
    for (int i = 0; i <= man->world; i++) { /* the shards, then the manifest */
        char key[200];
        snprintf(key, sizeof key, "%s/%s", dir,
                 i < man->world ? man->shards[i].file : CKPT_MANIFEST);
        int from = -1;
        int64_t size = -1;
        for (int h = 0; from < 0 && h < hosts; h++)
            if (leader_of[h] >= 0 &&
                (size = listed(listing + offs[leader_of[h]], lens[leader_of[h]], key)) >= 0)
                from = leader_of[h];
        if (from < 0)
            continue; /* on no host: the load fails the step */
        char to[4 * 256 + 1] = "";
        size_t tl = 0;
        for (int h = 0; h < hosts; h++) {
            int needs = i == man->world;
            for (int r = 0; !needs && r < world; r++)
                needs = where[(size_t)r * rec] == h && where[(size_t)r * rec + 1 + i];
            if (needs && leader_of[h] >= 0 &&
                listed(listing + offs[leader_of[h]], lens[leader_of[h]], key) < 0)
                tl += (size_t)sprintf(to + tl, "%d,", h);
        }
        if (tl)
            len += (size_t)sprintf(plan + len, "%lld %d %s %s\n", (long long)size, from, key, to);
    }
    free(offs);
    free(leader_of);
    return plan;
}

/* Does the plan line's HOSTS ("h1,h2,") name host h? */
static int names_host(const char *hostlist, int h)
{
    for (const char *p = hostlist; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            return 0;
        if (v == h)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* Collective: the manifest of step from rank holder's store to every rank,
 * parsed into *man; its bytes stay in *doc (the manifest's plan line sends
 * them again from holder's store). 0, 1 when it cannot be read or parsed
 * (every rank then says so), -1 on a failed collective. */
static int share_doc(struct tckpt *c, uint64_t step, int holder, struct ckpt_manifest *man,
                     char *err)
{
    struct fsdp_comm *comm = c->comm;
    char dir[32], key[64], sub[FSDP_ERR_LEN];
    ckpt_step_dir(step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    void *doc = NULL;
    size_t len = 0;
    int64_t head[2] = {0, 0};
    if (comm->rank == holder) {
        head[0] = storage_get_all(c->st, key, CKPT_MAX_MANIFEST_BYTES, &doc, &len, sub) ? 1 : 0;
        head[1] = (int64_t)len;
    }
    if (comm->bcast_bytes(comm, head, sizeof head, holder, err))
        return -1;
    double bad = head[0] == 0 && comm->rank != holder && !(doc = malloc((size_t)head[1] + 1));
    if (comm->allreduce_sum_f64(comm, &bad, 1, err) ||
        (head[0] == 0 && !bad && comm->bcast_bytes(comm, doc, (size_t)head[1], holder, err))) {
        free(doc);
        return -1;
    }
    int rc = head[0] || bad || ckpt_manifest_parse(doc, (size_t)head[1], man, sub) ? 1 : 0;
    free(doc);
    return rc;
}

/* Collective: runs the plan (the same bytes on every rank); 0, or -1
 * when a collective failed. */
static int run_plan(struct tckpt *c, char *plan, uint64_t step, char *err)
{
    struct fsdp_comm *comm = c->comm;
    unsigned char *buf = *plan ? malloc(HEAL_PIECE) : NULL;
    int rc = 0;
    if (tckpt_agree(comm, *plan && !buf ? fsdp_err(err, "snapshot: out of memory") : 0, err))
        rc = 1;
    int objects = 0;
    uint64_t bytes = 0;
    for (char *line = plan, *nl; !rc && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        long long size;
        int holder;
        char key[200], to[1100];
        if (!nl || sscanf(line, "%lld %d %199s %1099s", &size, &holder, key, to) != 4 || size < 0 ||
            holder < 0 || holder >= comm->world) {
            rc = fsdp_err(err, "rank 0 sent an unreadable plan");
            break; /* the same on every rank: the plan is the same bytes */
        }
        int write = c->leader && names_host(to, comm->host);
        rc = tckpt_agree(comm, send_object(c, key, (uint64_t)size, holder, write, buf, err), err)
                 ? 1
                 : 0;
        objects++;
        bytes += (uint64_t)size;
    }
    free(buf);
    /* what could not be completed is a step some host lacks: its load
     * fails there, and the checkpoint store decides */
    if (comm->rank == 0 && rc)
        fprintf(stderr, "fsdp-train: snapshots: the hosts' stores cannot be completed: %s\n", err);
    else if (comm->rank == 0 && objects)
        fprintf(stderr,
                "fsdp-train: snapshots: %d object%s of step %llu (%.1f MiB) copied to the hosts "
                "whose ranks need them\n",
                objects, objects == 1 ? "" : "s", (unsigned long long)step,
                (double)bytes / 1048576.0);
    return 0;
}

/* Collective, once the manifest of the newest step is in every rank's
 * hands: what each host needs, the plan, its run. */
static int complete_step(struct tckpt *c, const struct ckpt_manifest *man, const char *all,
                         const size_t *lens, char *err)
{
    struct fsdp_comm *comm = c->comm;
    const size_t rec = 1 + (size_t)man->world;
    unsigned char *me = malloc(rec);
    double unusable = !me || needed_shards(c, man, me + 1) != 0 || comm->hosts > 255;
    if (comm->allreduce_sum_f64(comm, &unusable, 1, err)) {
        free(me);
        return -1;
    }
    if (unusable) { /* another model's, or no memory: the resume says why */
        free(me);
        return 0;
    }
    me[0] = (unsigned char)comm->host;
    char *gathered = NULL, *plan = NULL;
    size_t glens[comm->world];
    int rc = comm->gather_bytes(comm, me, rec, 0, &gathered, glens, err);
    free(me);
    if (rc)
        return -1;
    if (comm->rank == 0 &&
        !(plan = make_plan(man, all, lens, (unsigned char *)gathered, comm->world, comm->hosts)))
        rc = fsdp_err(err, "snapshot: out of memory");
    free(gathered);
    uint64_t plen = plan ? strlen(plan) : 0;
    if (tckpt_agree(comm, rc, err) || comm->bcast_bytes(comm, &plen, sizeof plen, 0, err)) {
        free(plan);
        return -1;
    }
    if (comm->rank != 0 && !(plan = malloc(plen + 1)))
        rc = fsdp_err(err, "snapshot: out of memory");
    if (tckpt_agree(comm, rc, err) || comm->bcast_bytes(comm, plan, plen, 0, err)) {
        free(plan);
        return -1;
    }
    plan[plen] = 0;
    rc = run_plan(c, plan, man->step, err);
    free(plan);
    return rc;
}

int tckpt_complete_hosts(struct tckpt *c, char *err)
{
    struct fsdp_comm *comm = c->comm;
    struct listing mine = {0};
    char sub[FSDP_ERR_LEN];
    int rc = c->leader && storage_list(c->st, "step-", list_one, &mine, sub)
                 ? fsdp_err(err, "snapshot: %s", sub)
                 : 0;
    char *all = NULL;
    size_t lens[comm->world];
    if (tckpt_agree(comm, rc, err) ||
        comm->gather_bytes(comm, mine.text ? mine.text : "", mine.len, 0, &all, lens, err)) {
        free(mine.text);
        return -1;
    }
    free(mine.text);
    int64_t pick[2] = {0, -1}; /* the newest step with a manifest, its holder */
    if (comm->rank == 0) {
        int holder;
        pick[0] = (int64_t)newest_manifest(all, lens, comm->world, &holder);
        pick[1] = holder;
    }
    struct ckpt_manifest man = {0};
    rc = comm->bcast_bytes(comm, pick, sizeof pick, 0, err) ? -1 : 0;
    int got = rc || pick[1] < 0 ? 1 : share_doc(c, (uint64_t)pick[0], (int)pick[1], &man, err);
    if (got < 0)
        rc = -1;
    if (!rc && !got) /* else nothing in RAM anywhere, or a manifest the resume judges */
        rc = complete_step(c, &man, all, lens, err);
    free(all);
    ckpt_manifest_free(&man);
    return rc;
}
