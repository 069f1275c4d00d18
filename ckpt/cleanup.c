/*
 * cleanup.c - what may be deleted, and when. Nothing else in the project
 * decides to delete checkpoint data: the trainer (retention after its own
 * commit, garbage at start-up, its own shards after a failed commit),
 * `fsdp-ckpt prune`, import, reshard and cp all come here.
 *
 * The rules (ckpt.h says them to callers):
 *   - a committed step goes only by retention: the newest `keep` committed
 *     steps at or below `upto` stay, and so does every committed step above
 *     it (steps a run skipped because they did not load are not its to
 *     judge). Its manifest is deleted first, durably, so a crash half-way
 *     leaves an incomplete step, never a committed one missing shards;
 *   - an object no manifest references is garbage only if its writer can
 *     never commit it: the generation in its tag is older than the store's
 *     current one (fenced). A live writer's objects carry the current
 *     generation (or a newer one) and are left alone, whatever the step;
 *   - a committed step's manifest is read to tell its shards from a losing
 *     writer's; if it cannot be read, nothing of that step is touched;
 *   - a manifest that is not live (a fenced writer's late commit, fence.c)
 *     is removed by the store's current generation only, judged dead again
 *     right before the delete (remove_dead): at clean-up, and when that
 *     generation's own save of the step meets it; its writer's shards are
 *     garbage by their generation;
 *   - names ckpt does not know are never deleted;
 *   - the store is listed once (the listing is sorted once), so start-up
 *     cleanup costs O(objects log objects), not a listing per step; each
 *     manifest that is read costs a listing of fences/ and a seal's GET
 *     too (fence.c), for the committed steps that need reading.
 */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum obj_class { OBJ_UNKNOWN, OBJ_MANIFEST, OBJ_MANIFEST_TEMP, OBJ_SHARD };

/* "<digits>.<digits>" and nothing else: the posix backend's temporaries
 * are "NAME.tmp.PID.N" */
static int temp_suffix(const char *s)
{
    size_t a = strspn(s, "0123456789");
    if (a == 0 || s[a] != '.')
        return 0;
    size_t b = strspn(s + a + 1, "0123456789");
    return b > 0 && s[a + 1 + b] == 0;
}

/* What an object is, from its name; a shard's (or a shard temporary's)
 * writer generation. Anything else - a nested path, a name that is not a
 * valid key, a temporary of a name we do not know - is OBJ_UNKNOWN and is
 * never deleted. */
static enum obj_class classify(const char *name, uint64_t *gen, char *tag, size_t tagn)
{
    *gen = 0;
    if (tag)
        tag[0] = 0;
    if (strcmp(name, CKPT_MANIFEST) == 0)
        return OBJ_MANIFEST;
    if (strchr(name, '/') || storage_key_problem(name))
        return OBJ_UNKNOWN;
    char base[256];
    const char *tmp = strstr(name, ".tmp.");
    if (tmp && !temp_suffix(tmp + 5))
        return OBJ_UNKNOWN;
    size_t n = tmp ? (size_t)(tmp - name) : strlen(name);
    if (n >= sizeof base)
        return OBJ_UNKNOWN;
    memcpy(base, name, n);
    base[n] = 0;
    if (tmp && strcmp(base, CKPT_MANIFEST) == 0)
        return OBJ_MANIFEST_TEMP;
    int rank, world;
    if (ckpt_parse_shard_name(base, &rank, &world, gen))
        return OBJ_UNKNOWN;
    if (tag) { /* the tag, or "" for an untagged shard; "+" marks a temporary */
        const char *dot = strchr(base, '.');
        snprintf(tag, tagn, "%s%s", dot ? dot + 1 : "", tmp ? "+" : "");
    }
    return OBJ_SHARD;
}

static int delete_names(struct storage *st, uint64_t step, char **names, int n, char *err)
{
    if (n == 0)
        return 0;
    char dir[32];
    ckpt_step_dir(step, dir, sizeof dir);
    char **keys = calloc((size_t)n, sizeof *keys);
    int rc = keys ? 0 : -1;
    for (int i = 0; !rc && i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        if (!(keys[i] = malloc(len)))
            rc = -1;
        else
            snprintf(keys[i], len, "%s/%s", dir, names[i]);
    }
    if (rc)
        fsdp_err(err, "%s: out of memory while deleting", st->uri);
    else
        rc = storage_delete_many(st, (const char *const *)keys, n, err);
    for (int i = 0; keys && i < n; i++)
        free(keys[i]);
    free(keys);
    return rc ? -1 : 0;
}

/* Retention: the manifest first, durably (the backend syncs a deletion
 * before returning), then every object of the step that ckpt knows. */
static int drop_step(struct storage *st, const struct ckpt_step_objects *x,
                     struct ckpt_clean_report *rep, char *err)
{
    char *man = CKPT_MANIFEST;
    if (delete_names(st, x->info.step, &man, 1, err))
        return -1;
    char **names = calloc((size_t)x->nobj + 1, sizeof *names);
    if (!names) {
        fsdp_err(err, "%s: out of memory while deleting", st->uri);
        return -1;
    }
    int n = 0;
    for (int i = 0; i < x->nobj; i++) {
        uint64_t gen;
        enum obj_class c = classify(x->obj[i].name, &gen, NULL, 0);
        if (c == OBJ_SHARD || c == OBJ_MANIFEST_TEMP)
            names[n++] = x->obj[i].name;
    }
    int rc = delete_names(st, x->info.step, names, n, err);
    free(names);
    if (!rc) {
        rep->steps_removed++;
        rep->objects_removed += n + 1;
    }
    return rc;
}

/* A committed step whose objects are its manifest and one writer's
 * complete set of shards, written after the newest seal, needs no reading:
 * nothing in it is garbage (*shard_gen: that writer's generation). */
static int looks_clean(const struct ckpt_step_objects *x, uint64_t *shard_gen)
{
    char first[CKPT_TAG_LEN + 2] = "", tag[CKPT_TAG_LEN + 2];
    int shards = 0, world = 0;
    for (int i = 0; i < x->nobj; i++) {
        uint64_t gen;
        enum obj_class c = classify(x->obj[i].name, &gen, tag, sizeof tag);
        if (c == OBJ_MANIFEST_TEMP || (c == OBJ_SHARD && strchr(tag, '+')))
            return 0; /* a temporary */
        int rank, w;
        if (c != OBJ_SHARD || ckpt_parse_shard_name(x->obj[i].name, &rank, &w, &gen))
            continue;
        if (shards++ == 0) {
            snprintf(first, sizeof first, "%s", tag);
            world = w;
            *shard_gen = gen;
        } else if (strcmp(tag, first) != 0 || w != world) {
            return 0;
        }
    }
    return shards == world;
}

static int referenced(const struct ckpt_manifest *m, const char *name)
{
    for (int s = 0; s < m->nshards; s++)
        if (strcmp(m->shards[s].file, name) == 0)
            return 1;
    return 0;
}

/* A fenced writer's late commit at step: removed by the store's current
 * generation only (current: the caller's, fence-checked here), judged dead
 * once more right before the delete. 0 when it is gone. The window left:
 * a remover stopped between that judgement and its delete while a newer
 * generation claims, seals and commits this very step (README). */
static int remove_dead(struct storage *st, uint64_t step, uint64_t current, char *err)
{
    if (current && ckpt_fence_check(st, current, err))
        return -1;
    struct ckpt_manifest m;
    int lr = ckpt_load_manifest(st, step, &m, err);
    if (lr != CKPT_NOT_LIVE) {
        if (lr == 0) {
            ckpt_manifest_free(&m);
            fsdp_err(err, "%s: step %llu is live now: left", st->uri, (unsigned long long)step);
        }
        return -1;
    }
    char *man = CKPT_MANIFEST;
    return delete_names(st, step, &man, 1, err);
}

/* Removes the objects of one step that are garbage by the rules above. */
static int collect_garbage(struct storage *st, const struct ckpt_step_objects *x, uint64_t current,
                           uint64_t sealed, struct ckpt_clean_report *rep, char *err)
{
    struct ckpt_manifest m = {0};
    int have_manifest = 0;
    if (x->info.committed) {
        uint64_t gen = 0;
        if (looks_clean(x, &gen) && gen >= sealed)
            return 0;
        char sub[FSDP_ERR_LEN];
        int lr = ckpt_load_manifest(st, x->info.step, &m, sub);
        if (lr && lr != CKPT_NOT_LIVE)
            return 0; /* unreadable: nothing of it is ours to judge */
        if (lr == 0 && looks_clean(x, &gen)) {
            ckpt_manifest_free(&m);
            return 0;
        }
        /* a fenced writer's late commit: the manifest goes first (judged
         * again), then its shards are garbage by their generation */
        if (lr == CKPT_NOT_LIVE) {
            if (remove_dead(st, x->info.step, current, sub))
                return 0;
            rep->steps_removed++;
            rep->objects_removed++;
        }
        have_manifest = lr == 0;
    }
    char **names = calloc((size_t)x->nobj + 1, sizeof *names);
    if (!names) {
        ckpt_manifest_free(&m);
        fsdp_err(err, "%s: out of memory while cleaning", st->uri);
        return -1;
    }
    int n = 0, left = 0;
    for (int i = 0; i < x->nobj; i++) {
        const char *name = x->obj[i].name;
        uint64_t gen;
        enum obj_class c = classify(name, &gen, NULL, 0);
        int garbage = 0;
        if (c == OBJ_SHARD)
            garbage = gen < current && !(have_manifest && referenced(&m, name));
        else if (c == OBJ_MANIFEST_TEMP)
            garbage = have_manifest; /* a losing commit's leftover */
        if (garbage)
            names[n++] = (char *)name;
        else
            left++;
    }
    int rc = delete_names(st, x->info.step, names, n, err);
    if (!rc) {
        rep->objects_removed += n;
        if (!x->info.committed && n > 0 && left == 0)
            rep->incomplete_removed++;
        else if (!x->info.committed)
            rep->incomplete_left++;
    }
    free(names);
    ckpt_manifest_free(&m);
    return rc;
}

static int manifest_loads(struct storage *st, uint64_t step)
{
    struct ckpt_manifest m;
    char err[FSDP_ERR_LEN];
    if (ckpt_load_manifest(st, step, &m, err))
        return 0;
    ckpt_manifest_free(&m);
    return 1;
}

int ckpt_clean(struct storage *st, const struct ckpt_clean_policy *p, struct ckpt_clean_report *rep,
               char *err)
{
    memset(rep, 0, sizeof *rep);
    uint64_t current;
    if (p->generation) {
        if (ckpt_fence_check(st, p->generation, err))
            return -1;
        current = p->generation;
    } else if (ckpt_fence_current(st, &current, err)) {
        return -1;
    }
    uint64_t sealed; /* steps written after the newest seal are live */
    if (ckpt_fence_sealed_max(st, &sealed, err))
        return -1;
    struct ckpt_step_objects *s;
    int n;
    if (ckpt_list_step_objects(st, &s, &n, err))
        return -1;
    int rc = 0;
    long long good = 0; /* committed steps <= upto whose manifest loads */
    for (int i = n - 1; !rc && i >= 0; i--) {
        if (s[i].info.special) { /* a link or FIFO in it: left as found, for verify */
            s[i].info.objects = -1;
            rep->steps_kept += s[i].info.committed;
            continue;
        }
        if (!s[i].info.committed)
            continue;
        if (p->keep > 0 && s[i].info.step <= p->upto && good >= p->keep) {
            rc = drop_step(st, &s[i], rep, err);
            s[i].info.objects = -1; /* gone */
            continue;
        }
        rep->steps_kept++;
        /* only a step that loads counts toward K: K damaged (or, for now,
         * unreadable) steps never push out the last good ones */
        if (p->keep > 0 && s[i].info.step <= p->upto && manifest_loads(st, s[i].info.step))
            good++;
    }
    for (int i = 0; !rc && i < n; i++)
        if (s[i].info.objects >= 0)
            rc = collect_garbage(st, &s[i], current, sealed, rep, err);
    ckpt_step_objects_free(s, n);
    return rc;
}

int ckpt_discard_own(struct storage *st, uint64_t step, int world, const char *tag, char *err)
{
    if (!tag || !*tag) { /* untagged names may be another writer's */
        fsdp_err(err, "discard: a writer without a tag owns nothing");
        return -1;
    }
    char **names = calloc((size_t)world + 1, sizeof *names);
    int rc = names ? 0 : -1;
    for (int r = 0; !rc && r < world; r++) {
        if (!(names[r] = malloc(CKPT_TAG_LEN + 32)))
            rc = -1;
        else
            ckpt_shard_file(r, world, tag, names[r], CKPT_TAG_LEN + 32);
    }
    if (rc)
        fsdp_err(err, "%s: out of memory while discarding", st->uri);
    else
        rc = delete_names(st, step, names, world, err);
    for (int r = 0; names && r < world; r++)
        free(names[r]);
    free(names);
    return rc;
}

/* ---- committing, with every ambiguous answer settled --------------------- */

struct names {
    const struct ckpt_manifest *m;
    const char *dir;
    int *seen;
};

static int on_step_key(void *arg, const char *key, uint64_t size)
{
    (void)size;
    struct names *x = arg;
    size_t dl = strlen(x->dir);
    if (strncmp(key, x->dir, dl) != 0 || key[dl] != '/')
        return 0;
    for (int s = 0; s < x->m->nshards; s++)
        if (strcmp(key + dl + 1, x->m->shards[s].file) == 0)
            x->seen[s] = 1;
    return 0;
}

/* Our manifest is in place: it counts only if it is live (no newer seal
 * leaves it out: fence.c) and every shard it names is still there (a newer
 * launch's clean-up may have removed them while this writer was stopped
 * between its fence check and its commit). If one is gone, the manifest -
 * provably ours, and live, so nobody else may touch it - is withdrawn; a
 * dead one stays. */
static int settle_ours(struct storage *st, const struct ckpt_manifest *m, const char *tag,
                       const unsigned char *held, const char *key, struct ckpt_commit_result *res,
                       char *err)
{
    char sub[FSDP_ERR_LEN];
    uint64_t by;
    int live = ckpt_manifest_live(st, m, &by, sub);
    if (live < 0) {
        res->outcome = CKPT_UNKNOWN; /* committed, most likely: nothing is touched */
        fsdp_err(err, "%s/%s: landed, but whether it is live cannot be told: %s", st->uri, key,
                 sub);
        return -1;
    }
    if (live == 0) {
        /* a newer launch sealed the store before this commit landed: it
         * is not part of the run. The manifest stays (a reader refuses
         * it; removing it now could remove whatever replaced it), our
         * shards go: nothing live names them. */
        ckpt_discard_own(st, m->step, m->world, tag, sub);
        res->outcome = CKPT_NOT_COMMITTED;
        fsdp_err(err,
                 "fenced: generation %llu sealed %s before this commit of step %llu landed "
                 "(this process belongs to generation %llu); the commit does not count",
                 (unsigned long long)by, st->uri, (unsigned long long)m->step,
                 (unsigned long long)m->generation);
        return -1;
    }
    char dir[32], prefix[40];
    ckpt_step_dir(m->step, dir, sizeof dir);
    snprintf(prefix, sizeof prefix, "%s/", dir);
    int *seen = calloc((size_t)m->nshards + 1, sizeof *seen);
    struct names x = {m, dir, seen};
    if (!seen || storage_list(st, prefix, on_step_key, &x, err)) {
        if (!seen)
            fsdp_err(err, "%s: out of memory", st->uri);
        free(seen);
        res->outcome = CKPT_UNKNOWN; /* committed, most likely: nothing is touched */
        return -1;
    }
    int missing = -1;
    for (int s = 0; s < m->nshards && missing < 0; s++)
        if (!seen[s] && (!held || held[s]))
            missing = s;
    free(seen);
    if (missing < 0) {
        /* live now; but if a newer generation has claimed the store and not
         * sealed it yet, its seal decides, and this writer is fenced anyway */
        if (m->generation && ckpt_fence_check(st, m->generation, sub)) {
            res->outcome = CKPT_UNKNOWN;
            fsdp_err(err,
                     "%s (step %llu landed as the newer generation took the store: its seal "
                     "decides whether it counts; nothing removed)",
                     sub, (unsigned long long)m->step);
            return -1;
        }
        res->outcome = CKPT_COMMITTED;
        return 0;
    }
    if (storage_delete(st, key, sub)) {
        res->outcome = CKPT_UNKNOWN;
        fsdp_err(err,
                 "%s/%s: committed, but its shard %s is gone and the "
                 "manifest could not be withdrawn: %s",
                 st->uri, key, m->shards[missing].file, sub);
        return -1;
    }
    ckpt_discard_own(st, m->step, m->world, tag, sub);
    res->outcome = CKPT_NOT_COMMITTED;
    /* a newer launch's clean-up is the one reason the protocol knows for a
     * written shard to go: blame it only when a newer generation exists */
    if (m->generation && ckpt_fence_check(st, m->generation, sub))
        fsdp_err(err,
                 "%s/%s: shard %s was removed before this commit landed (a newer launch's "
                 "clean-up: this writer is fenced); the commit is withdrawn",
                 st->uri, dir, m->shards[missing].file);
    else
        fsdp_err(err,
                 "%s/%s: shard %s vanished after the storage acknowledged its write, and no "
                 "newer launch holds the store: the storage loses acknowledged writes; the "
                 "commit is withdrawn",
                 st->uri, dir, m->shards[missing].file);
    return -1;
}

int ckpt_commit_step(struct storage *st, const struct ckpt_manifest *m, const char *tag,
                     struct ckpt_commit_result *res, char *err)
{
    return ckpt_commit_step_held(st, m, tag, NULL, res, err);
}

int ckpt_commit_step_held(struct storage *st, const struct ckpt_manifest *m, const char *tag,
                          const unsigned char *held, struct ckpt_commit_result *res, char *err)
{
    memset(res, 0, sizeof *res);
    res->outcome = CKPT_UNKNOWN;
    char sub[FSDP_ERR_LEN];
    uint64_t tag_gen;
    if (ckpt_tag_generation(tag, &tag_gen) || tag_gen != m->generation) {
        res->outcome = CKPT_NOT_COMMITTED;
        fsdp_err(err, "manifest: generation %llu is not its writer's (tag %s)",
                 (unsigned long long)m->generation, tag ? tag : "none");
        return -1;
    }
    if (ckpt_manifest_check(m, err)) { /* nothing of the commit was written */
        res->outcome = CKPT_NOT_COMMITTED;
        ckpt_discard_own(st, m->step, m->world, tag, sub);
        return -1;
    }
    char *doc = ckpt_manifest_dump(m);
    if (!doc) {
        fsdp_err(err, "manifest: cannot serialise");
        return -1;
    }
    char key[96], dir[32];
    ckpt_step_dir(m->step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    size_t len = strlen(doc);
    void *buf = NULL;
    size_t got = 0;
    int gr;
    for (int attempt = 0;; attempt++) {
        if (storage_put_if_absent(st, key, doc, len, err) == 0) {
            free(doc);
            return settle_ours(st, m, tag, held, key, res, err);
        }
        /* EXISTS, or an error after which the put may or may not have landed
         * (a lost answer, a failed directory sync): read what is there */
        gr = storage_get_all(st, key, CKPT_MAX_MANIFEST_BYTES, &buf, &got, sub);
        if (gr == 0 && got == len && memcmp(buf, doc, len) == 0) {
            free(buf);
            free(doc);
            return settle_ours(st, m, tag, held, key, res, err);
        }
        /* a fenced writer's late commit in the way: the current generation
         * removes it (remove_dead judges it again) and puts once more */
        if (gr || attempt > 0 || !m->generation || remove_dead(st, m->step, m->generation, sub))
            break;
        free(buf);
        buf = NULL;
    }
    free(doc);
    if (gr == STORAGE_NOT_FOUND) { /* nothing landed */
        res->outcome = CKPT_NOT_COMMITTED;
        ckpt_discard_own(st, m->step, m->world, tag, sub);
        return -1; /* err: the put's own error */
    }
    if (gr == FSDP_NOT_REGULAR) { /* a link or FIFO holds the step: ours are garbage */
        res->outcome = CKPT_OTHER_UNREADABLE;
        ckpt_discard_own(st, m->step, m->world, tag, sub);
        fsdp_err(err, "%s: step %llu is taken: %s (the step stays for fsdp-ckpt verify)", st->uri,
                 (unsigned long long)m->step, sub);
        return -1;
    }
    if (gr) { /* cannot tell: touch nothing */
        snprintf(err + strlen(err), FSDP_ERR_LEN - strlen(err),
                 "; and reading it back failed (%s): this writer's shards are left", sub);
        return -1;
    }
    /* another writer's commit holds the step: ours are garbage */
    res->outcome =
        ckpt_manifest_parse(buf, got, &res->other, sub) == 0 ? CKPT_OTHER : CKPT_OTHER_UNREADABLE;
    free(buf);
    uint64_t by;
    if (res->outcome == CKPT_OTHER && ckpt_manifest_live(st, &res->other, &by, sub) == 0)
        res->outcome = CKPT_OTHER_DEAD; /* and remove_dead could not remove it */
    ckpt_discard_own(st, m->step, m->world, tag, sub);
    if (res->outcome == CKPT_OTHER_DEAD)
        fsdp_err(err,
                 "%s: step %llu holds a fenced writer's late commit (generation %llu, not live: "
                 "generation %llu sealed the store first) that this writer may not remove",
                 st->uri, (unsigned long long)m->step, (unsigned long long)res->other.generation,
                 (unsigned long long)by);
    else if (res->outcome == CKPT_OTHER)
        fsdp_err(err, "%s: step %llu is already committed by another writer (generation %llu)",
                 st->uri, (unsigned long long)m->step, (unsigned long long)res->other.generation);
    else
        fsdp_err(err, "%s: step %llu is already committed, and its manifest does not load", st->uri,
                 (unsigned long long)m->step);
    return -1;
}

void ckpt_commit_result_free(struct ckpt_commit_result *res)
{
    if (res->outcome == CKPT_OTHER || res->outcome == CKPT_OTHER_DEAD)
        ckpt_manifest_free(&res->other);
    memset(res, 0, sizeof *res);
}
