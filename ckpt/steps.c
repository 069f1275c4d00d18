/*
 * steps.c - what steps a store holds (one listing, sorted once), loading a
 * step's manifest, and the generations that fence older launches.
 * Deciding what may be deleted is cleanup.c's job alone.
 */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* "step-00000100/NAME" -> 100; -1 for keys that are not a step's object */
static int parse_step_key(const char *key, uint64_t *step, const char **name)
{
    if (strncmp(key, "step-", 5) != 0)
        return -1;
    const char *p = key + 5;
    uint64_t v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 19) {
        v = v * 10 + (uint64_t)(*p++ - '0');
        digits++;
    }
    /* only ckpt_step_dir's own spelling: 8 digits, more only without a
     * leading zero, so a listed key always names the directory that
     * deletions will address */
    if (digits < 8 || (digits > 8 && key[5] == '0') || *p != '/' || !p[1])
        return -1;
    *step = v;
    *name = p + 1;
    return 0;
}

struct flat_key {
    uint64_t step, size;
    char *name;
};

struct flat {
    struct flat_key *v;
    size_t n, cap;
};

static int on_key(void *arg, const char *key, uint64_t size)
{
    struct flat *f = arg;
    uint64_t step;
    const char *name;
    if (parse_step_key(key, &step, &name))
        return 0;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        void *v = realloc(f->v, cap * sizeof *f->v);
        if (!v)
            return -1;
        f->v = v;
        f->cap = cap;
    }
    if (!(f->v[f->n].name = strdup(name)))
        return -1;
    f->v[f->n].step = step;
    f->v[f->n].size = size;
    f->n++;
    return 0;
}

static int by_step_name(const void *a, const void *b)
{
    const struct flat_key *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

void ckpt_step_objects_free(struct ckpt_step_objects *s, int n)
{
    for (int i = 0; s && i < n; i++) {
        for (int k = 0; k < s[i].nobj; k++)
            free(s[i].obj[k].name);
        free(s[i].obj);
    }
    free(s);
}

/* One listing of the whole store, sorted once: O(k log k) for k objects,
 * whatever the number of steps. */
int ckpt_list_step_objects(struct storage *st, struct ckpt_step_objects **out, int *nout,
                           char *err)
{
    struct flat f = {0};
    struct ckpt_step_objects *s = NULL;
    int n = 0, rc = storage_list(st, "step-", on_key, &f, err);
    if (rc == -1 && !*err)
        snprintf(err, CKPT_ERR_LEN, "%s: out of memory while listing", st->uri);
    if (!rc && f.n > 1)
        qsort(f.v, f.n, sizeof *f.v, by_step_name);
    size_t steps = 0;
    for (size_t i = 0; !rc && i < f.n; i++)
        steps += i == 0 || f.v[i].step != f.v[i - 1].step;
    if (!rc && steps > INT32_MAX)
        rc = -1, snprintf(err, CKPT_ERR_LEN, "%s: too many steps", st->uri);
    if (!rc && !(s = calloc(steps ? steps : 1, sizeof *s)))
        rc = -1, snprintf(err, CKPT_ERR_LEN, "%s: out of memory while listing", st->uri);
    for (size_t i = 0, j; !rc && i < f.n; i = j) {
        for (j = i; j < f.n && f.v[j].step == f.v[i].step; j++)
            ;
        struct ckpt_step_objects *x = &s[n++];
        x->info.step = f.v[i].step;
        if (!(x->obj = calloc(j - i, sizeof *x->obj))) {
            rc = -1;
            snprintf(err, CKPT_ERR_LEN, "%s: out of memory while listing", st->uri);
            break;
        }
        for (size_t k = i; k < j; k++) {
            x->info.committed |= strcmp(f.v[k].name, CKPT_MANIFEST) == 0;
            x->info.stored_bytes += f.v[k].size;
            x->info.objects++;
            x->obj[x->nobj++] = (struct ckpt_object){f.v[k].name, f.v[k].size};
            f.v[k].name = NULL; /* moved */
        }
    }
    for (size_t i = 0; i < f.n; i++)
        free(f.v[i].name);
    free(f.v);
    if (rc) {
        ckpt_step_objects_free(s, n);
        return -1;
    }
    *out = s;
    *nout = n;
    return 0;
}

int ckpt_list_steps(struct storage *st, struct ckpt_step_info **out, int *n, char *err)
{
    struct ckpt_step_objects *s;
    int ns;
    if (ckpt_list_step_objects(st, &s, &ns, err))
        return -1;
    struct ckpt_step_info *v = calloc(ns ? (size_t)ns : 1, sizeof *v);
    if (!v) {
        ckpt_step_objects_free(s, ns);
        snprintf(err, CKPT_ERR_LEN, "%s: out of memory while listing", st->uri);
        return -1;
    }
    for (int i = 0; i < ns; i++)
        v[i] = s[i].info;
    ckpt_step_objects_free(s, ns);
    *out = v;
    *n = ns;
    return 0;
}

int ckpt_load_manifest(struct storage *st, uint64_t step, struct ckpt_manifest *m, char *err)
{
    char key[96], dir[32];
    ckpt_step_dir(step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    void *buf;
    size_t len;
    int rc = storage_get_all(st, key, CKPT_MAX_MANIFEST_BYTES, &buf, &len, err);
    if (rc)
        return rc;
    char sub[CKPT_ERR_LEN];
    rc = ckpt_manifest_parse(buf, len, m, sub);
    free(buf);
    if (rc) {
        snprintf(err, CKPT_ERR_LEN, "%s/%s: %s", st->uri, key, sub);
        return -1;
    }
    if (m->step != step) {
        snprintf(err, CKPT_ERR_LEN, "%s/%s: says step %llu", st->uri, key,
                 (unsigned long long)m->step);
        ckpt_manifest_free(m);
        return -1;
    }
    return 0;
}

int ckpt_step_committed(struct storage *st, uint64_t step, int *committed, char *err)
{
    char key[96], dir[32];
    ckpt_step_dir(step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    uint64_t size;
    int rc = storage_stat(st, key, &size, err);
    *committed = rc == 0;
    return rc == 0 || rc == STORAGE_NOT_FOUND ? 0 : -1;
}

int ckpt_new_writer_tag(struct storage *st, uint64_t generation, char *tag, size_t n, char *err)
{
    if (!generation && ckpt_fence_current(st, &generation, err))
        return -1;
    if (ckpt_writer_tag(generation, tag, n)) {
        snprintf(err, CKPT_ERR_LEN, "getrandom failed: cannot name this writer's objects");
        return -1;
    }
    return 0;
}

/* ---- fencing -------------------------------------------------------------- */

/* generations/00000000000000000007: one object per launch, created with
 * put-if-absent, so two launchers can never claim the same generation. */
#define GEN_PREFIX "generations/"

struct gen_scan {
    uint64_t max;
    char *err; /* the first key that is not a generation claim */
    const char *uri;
};

/* Exactly GEN_PREFIX + 20 decimal digits, below 2^63. A store's
 * temporaries (a claim being written: "....tmp.PID.N") are not claims.
 * Anything else is refused: a junk name that parsed loosely (a saturated
 * strtoull, a wrap of cur + 1 to 0) would silently turn fencing off. */
static int on_gen(void *arg, const char *key, uint64_t size)
{
    (void)size;
    struct gen_scan *g = arg;
    const char *p = key + strlen(GEN_PREFIX);
    if (strstr(p, ".tmp."))
        return 0;
    uint64_t v = 0;
    int n = 0;
    for (; p[n] >= '0' && p[n] <= '9' && n < 20; n++)
        v = v * 10 + (uint64_t)(p[n] - '0');
    /* a leading 0 keeps the value below 10^19: the sum above did not wrap */
    int ok = n == 20 && p[n] == 0 && p[0] == '0' && v < (UINT64_C(1) << 63);
    if (!ok) {
        snprintf(g->err, CKPT_ERR_LEN,
                 "%s/%s is not a generation claim (want %s followed by 20 digits below 2^63): "
                 "remove it to use this checkpoint store",
                 g->uri, key, GEN_PREFIX);
        return -1;
    }
    if (v > g->max)
        g->max = v;
    return 0;
}

int ckpt_fence_current(struct storage *st, uint64_t *gen, char *err)
{
    struct gen_scan g = {0, err, st->uri};
    *err = 0;
    int rc = storage_list(st, GEN_PREFIX, on_gen, &g, err);
    *gen = g.max;
    return rc ? -1 : 0;
}

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

int ckpt_fence_claim(struct storage *st, uint64_t *gen, char *err)
{
    char claimant[128];
    claimant_id(claimant, sizeof claimant);
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t cur;
        if (ckpt_fence_current(st, &cur, err))
            return -1;
        if (cur + 1 >= (UINT64_C(1) << 63)) {
            snprintf(err, CKPT_ERR_LEN, "%s: generations are exhausted (2^63 - 1 claimed)",
                     st->uri);
            return -1;
        }
        char key[64], body[160];
        snprintf(key, sizeof key, GEN_PREFIX "%020llu", (unsigned long long)(cur + 1));
        int n = snprintf(body, sizeof body, "%llu %s\n", (unsigned long long)(cur + 1), claimant);
        int rc = storage_put_if_absent(st, key, body, (size_t)n, err);
        if (rc == 0) {
            *gen = cur + 1;
            return 0;
        }
        if (rc != STORAGE_EXISTS)
            return -1;
    }
    snprintf(err, CKPT_ERR_LEN, "%s: could not claim a generation (too many racing launchers)",
             st->uri);
    return -1;
}

int ckpt_fence_check(struct storage *st, uint64_t mine, char *err)
{
    if (mine == 0) /* not launched by a supervisor: unfenced */
        return 0;
    uint64_t cur;
    if (ckpt_fence_current(st, &cur, err))
        return -1;
    if (cur > mine) {
        snprintf(err, CKPT_ERR_LEN,
                 "fenced: this process belongs to generation %llu, but %s now belongs to "
                 "generation %llu; refusing to commit or delete",
                 (unsigned long long)mine, st->uri, (unsigned long long)cur);
        return -1;
    }
    return 0;
}
