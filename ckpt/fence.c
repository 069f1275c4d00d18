/*
 * fence.c - generations: every launch claims one, and a launch's claim
 * fences every older one out of the store, end to end.
 *
 * A claim is generations/<20 digits>, created with put-if-absent, so two
 * launchers never hold the same generation. A process of generation g
 * checks before it commits or deletes that no newer generation has been
 * claimed (ckpt_fence_check). That check and the commit are two steps: a
 * process stopped between them (a frozen rank, a partitioned host) would
 * commit late, into a store a newer launch already trains in. So the
 * claim is also a seal: right after its claim, the launcher lists the
 * live manifests at that moment - each as its step and its writer's tag -
 * and writes them to fences/<20 digits> (put-if-absent; ckpt_fence_claim
 * returns only when the seal is written, and nothing is launched before).
 * A manifest of generation g is live only if the seal of the first sealed
 * generation after g lists its step with its writer's tag: a commit that
 * landed after that seal, whatever the storage's timing, is not part of
 * the run, and neither is another commit of the same step number. Readers
 * (ckpt_load_manifest) refuse it with a "fenced" line, the late writer
 * finds it out when it reads its commit back. Only the store's current
 * generation removes it (cleanup.c: at its clean-ups, and when its own
 * save of that step meets it), judging it again right before the delete;
 * a writer never removes a manifest it judged dead, since whoever commits
 * the step next could be the one removed. Its shards are garbage of a
 * fenced generation.
 *
 * What this guarantees: on a filesystem (link/rename without replace) and
 * on S3 with conditional writes (If-None-Match: *), no commit of
 * generation g that lands after generation g+1 sealed the store is ever
 * loaded, resumed from, counted by retention or kept; a commit that lands
 * between the claim and the seal counts, as if it came before the claim
 * (the new launch resumes from it: nothing is lost, no two histories
 * mix). Shards are never shared between writers (their names carry the
 * writer's tag), so a late writer's shards replace nothing and are garbage.
 * On a server that ignores conditional writes two launchers can claim the
 * same generation and a seal can be replaced; fencing then holds only as
 * far as one launcher at a time runs (fsdp-super's normal case).
 *
 * A claim whose launcher died before sealing fences nothing (nothing was
 * launched with it). Stores from before seals have claims and no seals:
 * every step in them is live. A seal that cannot be read (a storage error,
 * a damaged or foreign object under fences/) decides nothing: the caller
 * is told it cannot judge (CKPT_CANNOT_JUDGE), never that a step is dead.
 */
#include "ckpt.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define GEN_PREFIX     "generations/"
#define SEAL_PREFIX    "fences/"
#define SEAL_MAX_BYTES (16u << 20)
#define SEAL_MAX_STEPS (1 << 20)

/* "<20 digits>" below 2^63, exactly: the name of a claim or a seal. A junk
 * name that parsed loosely (a saturated strtoull, a wrap of cur + 1 to 0)
 * would silently turn fencing off. */
static int parse_gen_name(const char *p, uint64_t *out)
{
    uint64_t v = 0;
    int n = 0;
    for (; p[n] >= '0' && p[n] <= '9' && n < 20; n++)
        v = v * 10 + (uint64_t)(p[n] - '0');
    /* a leading 0 keeps the value below 10^19: the sum above did not wrap */
    if (n != 20 || p[n] != 0 || p[0] != '0' || v >= (UINT64_C(1) << 63))
        return -1;
    *out = v;
    return 0;
}

/* A listing of generations/ or fences/: the largest number, or (seals)
 * the smallest above `above`. */
struct gen_scan {
    const char *prefix;
    uint64_t above, max, next; /* next: 0 when none */
    char *err;
    const char *uri;
};

static int on_gen(void *arg, const char *key, uint64_t size)
{
    (void)size;
    struct gen_scan *g = arg;
    const char *p = key + strlen(g->prefix);
    if (!*p || strstr(p, ".tmp.")) /* a folder marker; a claim or seal being written */
        return 0;
    uint64_t v;
    if (parse_gen_name(p, &v)) {
        fsdp_err(g->err,
                 "%s/%s is not a generation %s (want %s followed by 20 digits below 2^63): "
                 "remove it to use this checkpoint store",
                 g->uri, key, strcmp(g->prefix, GEN_PREFIX) == 0 ? "claim" : "seal", g->prefix);
        return -1;
    }
    if (v > g->max)
        g->max = v;
    if (v > g->above && (!g->next || v < g->next))
        g->next = v;
    return 0;
}

int ckpt_fence_current(struct storage *st, uint64_t *gen, char *err)
{
    struct gen_scan g = {.prefix = GEN_PREFIX, .err = err, .uri = st->uri};
    *err = 0;
    int rc = storage_list(st, GEN_PREFIX, on_gen, &g, err);
    *gen = g.max;
    return rc ? -1 : 0;
}

int ckpt_fence_sealed_max(struct storage *st, uint64_t *gen, char *err)
{
    struct gen_scan g = {.prefix = SEAL_PREFIX, .err = err, .uri = st->uri};
    *err = 0;
    int rc = storage_list(st, SEAL_PREFIX, on_gen, &g, err);
    *gen = g.max;
    return rc ? -1 : 0;
}

/* ---- seals ---------------------------------------------------------------- */

/* The writer tag of a manifest's shards ("" when untagged). */
static void manifest_tag(const struct ckpt_manifest *m, char *out, size_t n)
{
    const char *dot = m->nshards > 0 ? strchr(m->shards[0].file, '.') : NULL;
    snprintf(out, n, "%s", dot ? dot + 1 : "");
}

/* {"format": "fsdp-ckpt-seal", "generation": G,
 *  "live": [{"step": S, "tag": "g7-..."}, ...]}: every manifest live when G
 * took the store. A manifest that cannot be read now (a storage error)
 * fails the seal: leaving it out would kill a live step for good. One that
 * is damaged, already dead or gone since the listing is left out. */
static int seal_write(struct storage *st, uint64_t gen, char *err)
{
    struct ckpt_step_info *steps;
    int n;
    if (ckpt_list_steps(st, &steps, &n, err))
        return -1;
    json_t *live = json_array();
    int rc = live ? 0 : -1;
    for (int i = 0; !rc && i < n; i++) {
        if (!steps[i].committed)
            continue;
        struct ckpt_manifest m;
        char sub[FSDP_ERR_LEN], tag[CKPT_TAG_LEN + 8];
        int lr = ckpt_load_manifest(st, steps[i].step, &m, sub);
        if (lr == CKPT_NOT_LIVE || lr == CKPT_DAMAGED || lr == STORAGE_NOT_FOUND)
            continue; /* dead, damaged, or removed since the listing */
        if (lr) {
            fsdp_err(err, "cannot seal: %s", sub);
            rc = 1;
            break;
        }
        manifest_tag(&m, tag, sizeof tag);
        ckpt_manifest_free(&m);
        if (json_array_append_new(
                live, json_pack("{s:I, s:s}", "step", (json_int_t)steps[i].step, "tag", tag)))
            rc = -1;
    }
    free(steps);
    json_t *doc = !rc ? json_pack("{s:s, s:I, s:O}", "format", "fsdp-ckpt-seal", "generation",
                                  (json_int_t)gen, "live", live)
                      : NULL;
    json_decref(live);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (rc > 0)
        return -1;
    if (!text) {
        fsdp_err(err, "%s: out of memory while sealing generation %llu", st->uri,
                 (unsigned long long)gen);
        return -1;
    }
    char key[64];
    snprintf(key, sizeof key, SEAL_PREFIX "%020llu", (unsigned long long)gen);
    rc = storage_put_if_absent(st, key, text, strlen(text), err);
    free(text);
    if (rc == STORAGE_EXISTS) /* only this claimant seals gen: a put retried after a lost answer */
        return 0;
    return rc ? -1 : 0;
}

/* 1 if generation gen's seal lists (step, tag), 0 if not, -1 with err if
 * it cannot be read. */
static int seal_lists(struct storage *st, uint64_t gen, uint64_t step, const char *tag, char *err)
{
    char key[64];
    snprintf(key, sizeof key, SEAL_PREFIX "%020llu", (unsigned long long)gen);
    void *buf;
    size_t len;
    if (storage_get_all(st, key, SEAL_MAX_BYTES, &buf, &len, err))
        return -1;
    json_error_t je;
    json_t *doc = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    json_t *live = json_object_get(doc, "live");
    json_t *g = json_object_get(doc, "generation");
    const char *fmt = json_string_value(json_object_get(doc, "format"));
    int ok = fmt && strcmp(fmt, "fsdp-ckpt-seal") == 0 && json_is_integer(g) &&
             json_integer_value(g) == (json_int_t)gen && json_is_array(live) &&
             json_array_size(live) <= SEAL_MAX_STEPS;
    int found = 0;
    for (size_t i = 0; ok && i < json_array_size(live); i++) {
        json_t *e = json_array_get(live, i), *s = json_object_get(e, "step");
        const char *t = json_string_value(json_object_get(e, "tag"));
        if (!json_is_integer(s) || json_integer_value(s) < 0 || !t)
            ok = 0;
        else if ((uint64_t)json_integer_value(s) == step && strcmp(t, tag) == 0)
            found = 1;
    }
    json_decref(doc);
    if (!ok) {
        fsdp_err(err, "%s/%s: not a seal this build reads", st->uri, key);
        return -1;
    }
    return found;
}

int ckpt_manifest_live(struct storage *st, const struct ckpt_manifest *m, uint64_t *by, char *err)
{
    *by = 0;
    *err = 0;
    struct gen_scan g = {.prefix = SEAL_PREFIX, .above = m->generation, .err = err, .uri = st->uri};
    if (storage_list(st, SEAL_PREFIX, on_gen, &g, err))
        return -1;
    if (!g.next) /* no launch sealed the store after m's generation */
        return 1;
    char tag[CKPT_TAG_LEN + 8];
    manifest_tag(m, tag, sizeof tag);
    int live = seal_lists(st, g.next, m->step, tag, err);
    if (live == 0)
        *by = g.next;
    return live;
}

/* ---- claims --------------------------------------------------------------- */

/* "host pid nonce": what makes a claim's body this launcher's own, so that
 * a put-if-absent retried after a lost answer can tell its own claim from a
 * rival's (storage.h). */
static void claimant_id(char *out, size_t n)
{
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        nonce = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)getpid() << 48;
    }
    snprintf(out, n, "%s %d %016llx", host, (int)getpid(), (unsigned long long)nonce);
}

/* Claims generation gen (put-if-absent) and seals the store: 0, 1 when a
 * rival holds gen, -1 on another failure. */
static int claim_one(struct storage *st, uint64_t gen, const char *claimant, char *err)
{
    char key[64], body[160];
    snprintf(key, sizeof key, GEN_PREFIX "%020llu", (unsigned long long)gen);
    int n = snprintf(body, sizeof body, "%llu %s\n", (unsigned long long)gen, claimant);
    int rc = storage_put_if_absent(st, key, body, (size_t)n, err);
    if (rc == STORAGE_EXISTS)
        return 1;
    if (rc)
        return -1;
    char sub[FSDP_ERR_LEN];
    if (seal_write(st, gen, sub)) {
        fsdp_err(err, "claimed generation %llu but could not seal the store: %s",
                 (unsigned long long)gen, sub);
        return -1;
    }
    return 0;
}

int ckpt_fence_claim(struct storage *st, uint64_t *gen, char *err)
{
    char claimant[128];
    claimant_id(claimant, sizeof claimant);
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t cur;
        if (ckpt_fence_current(st, &cur, err))
            return -1;
        if (cur + 1 >= (UINT64_C(1) << 63)) {
            fsdp_err(err, "%s: generations are exhausted (2^63 - 1 claimed)", st->uri);
            return -1;
        }
        int rc = claim_one(st, cur + 1, claimant, err);
        if (rc < 0)
            return -1;
        if (rc == 0) {
            *gen = cur + 1;
            return 0;
        }
    }
    fsdp_err(err, "%s: could not claim a generation (too many racing launchers)", st->uri);
    return -1;
}

int ckpt_fence_claim_at(struct storage *st, uint64_t gen, char *err)
{
    uint64_t cur;
    if (ckpt_fence_current(st, &cur, err))
        return -1;
    if (cur == gen)
        return 0; /* this launcher's own claim */
    if (cur > gen || gen >= (UINT64_C(1) << 63))
        return fsdp_err(err, "%s already belongs to generation %llu, not %llu", st->uri,
                        (unsigned long long)cur, (unsigned long long)gen);
    char claimant[128];
    claimant_id(claimant, sizeof claimant);
    int rc = claim_one(st, gen, claimant, err);
    if (rc == 1)
        fsdp_err(err, "%s: generation %llu was claimed by another launcher", st->uri,
                 (unsigned long long)gen);
    return rc ? -1 : 0;
}

int ckpt_fence_check(struct storage *st, uint64_t mine, char *err)
{
    if (mine == 0) /* not launched by a supervisor: unfenced */
        return 0;
    uint64_t cur;
    if (ckpt_fence_current(st, &cur, err))
        return -1;
    if (cur > mine) {
        fsdp_err(err,
                 "fenced: this process belongs to generation %llu, but %s now belongs to "
                 "generation %llu; refusing to commit or delete",
                 (unsigned long long)mine, st->uri, (unsigned long long)cur);
        return -1;
    }
    return 0;
}
