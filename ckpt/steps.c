/*
 * steps.c - what steps a store holds, loading a step's manifest, and
 * removing a step without ever leaving a "committed" step whose shards are
 * gone (the manifest goes first, durably).
 */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

struct listing {
    struct ckpt_step_info *v;
    int n, cap;
};

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
    if (digits < 8 || *p != '/')
        return -1;
    *step = v;
    *name = p + 1;
    return 0;
}

static int on_key(void *arg, const char *key, uint64_t size)
{
    struct listing *l = arg;
    uint64_t step;
    const char *name;
    if (parse_step_key(key, &step, &name))
        return 0;
    int i;
    for (i = 0; i < l->n && l->v[i].step != step; i++)
        ;
    if (i == l->n) {
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 16;
            struct ckpt_step_info *v = realloc(l->v, (size_t)cap * sizeof *v);
            if (!v)
                return -1;
            l->v = v;
            l->cap = cap;
        }
        l->v[l->n++] = (struct ckpt_step_info){.step = step};
    }
    l->v[i].stored_bytes += size;
    l->v[i].objects++;
    if (strcmp(name, CKPT_MANIFEST) == 0)
        l->v[i].committed = 1;
    return 0;
}

static int by_step(const void *a, const void *b)
{
    uint64_t x = ((const struct ckpt_step_info *)a)->step;
    uint64_t y = ((const struct ckpt_step_info *)b)->step;
    return x < y ? -1 : x > y;
}

int ckpt_list_steps(struct storage *st, struct ckpt_step_info **out, int *n, char *err)
{
    struct listing l = {0};
    int rc = storage_list(st, "step-", on_key, &l, err);
    if (rc) {
        if (rc == -1 && !*err)
            snprintf(err, CKPT_ERR_LEN, "%s: out of memory while listing", st->uri);
        free(l.v);
        return -1;
    }
    if (l.n > 1)
        qsort(l.v, (size_t)l.n, sizeof *l.v, by_step);
    *out = l.v;
    *n = l.n;
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

struct keys {
    char (*v)[256];
    int n, cap;
};

static int collect(void *arg, const char *key, uint64_t size)
{
    (void)size;
    struct keys *k = arg;
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 16;
        void *v = realloc(k->v, (size_t)cap * sizeof *k->v);
        if (!v)
            return -1;
        k->v = v;
        k->cap = cap;
    }
    snprintf(k->v[k->n++], sizeof k->v[0], "%s", key);
    return 0;
}

int ckpt_delete_step(struct storage *st, uint64_t step, char *err)
{
    char dir[40], key[96];
    ckpt_step_dir(step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    if (storage_delete(st, key, err))
        return -1;
    strcat(dir, "/");
    struct keys k = {0};
    int rc = storage_list(st, dir, collect, &k, err);
    const char **v = calloc((size_t)k.n + 1, sizeof *v);
    if (!rc && !v)
        rc = -1;
    for (int i = 0; !rc && i < k.n; i++)
        v[i] = k.v[i];
    if (!rc)
        rc = storage_delete_many(st, v, k.n, err);
    free(v);
    free(k.v);
    return rc;
}

/* ---- fencing -------------------------------------------------------------- */

/* generations/00000000000000000007: one object per launch, created with
 * put-if-absent, so two launchers can never claim the same generation. */
#define GEN_PREFIX "generations/"

static int on_gen(void *arg, const char *key, uint64_t size)
{
    (void)size;
    uint64_t *max = arg;
    const char *p = key + strlen(GEN_PREFIX);
    char *end;
    unsigned long long g = strtoull(p, &end, 10);
    if (*p && !*end && g > *max)
        *max = g;
    return 0;
}

int ckpt_fence_current(struct storage *st, uint64_t *gen, char *err)
{
    *gen = 0;
    return storage_list(st, GEN_PREFIX, on_gen, gen, err) ? -1 : 0;
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
