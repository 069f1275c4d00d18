/*
 * steps.c - what steps a store holds (one listing, sorted once) and
 * loading a step's manifest (only a live one: fence.c).
 * Deciding what may be deleted is cleanup.c's job alone.
 */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const char *uri;
    char *err;
};

/* A link, FIFO or device inside a step's directory is one of the step's
 * objects that cannot be read: the step is damaged (listed, passed over at
 * resume, reported by verify, as a manifest that does not parse is). One
 * that stands where a step's directory belongs is refused: it would hide
 * a step. */
static int on_key(void *arg, const char *key, uint64_t size)
{
    struct flat *f = arg;
    uint64_t step;
    const char *name;
    if (parse_step_key(key, &step, &name)) {
        if (storage_special(size))
            return fsdp_err(f->err,
                            "%s/%s: is %s; a checkpoint store holds only directories and "
                            "regular files",
                            f->uri, key, storage_special(size));
        return 0;
    }
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
int ckpt_list_step_objects(struct storage *st, struct ckpt_step_objects **out, int *nout, char *err)
{
    struct flat f = {.uri = st->uri, .err = err};
    struct ckpt_step_objects *s = NULL;
    err[0] = 0;
    int n = 0, rc = storage_list_special(st, "step-", on_key, &f, err);
    if (rc == -1 && !*err)
        fsdp_err(err, "%s: out of memory while listing", st->uri);
    if (!rc && f.n > 1)
        qsort(f.v, f.n, sizeof *f.v, by_step_name);
    size_t steps = 0;
    for (size_t i = 0; !rc && i < f.n; i++)
        steps += i == 0 || f.v[i].step != f.v[i - 1].step;
    if (!rc && steps > INT32_MAX)
        rc = -1, fsdp_err(err, "%s: too many steps", st->uri);
    if (!rc && !(s = calloc(steps ? steps : 1, sizeof *s)))
        rc = -1, fsdp_err(err, "%s: out of memory while listing", st->uri);
    for (size_t i = 0, j; !rc && i < f.n; i = j) {
        for (j = i; j < f.n && f.v[j].step == f.v[i].step; j++)
            ;
        struct ckpt_step_objects *x = &s[n++];
        x->info.step = f.v[i].step;
        if (!(x->obj = calloc(j - i, sizeof *x->obj))) {
            rc = -1;
            fsdp_err(err, "%s: out of memory while listing", st->uri);
            break;
        }
        for (size_t k = i; k < j; k++) {
            x->info.committed |= strcmp(f.v[k].name, CKPT_MANIFEST) == 0;
            x->info.stored_bytes += storage_special(f.v[k].size) ? 0 : f.v[k].size;
            x->info.special += storage_special(f.v[k].size) != NULL;
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
        fsdp_err(err, "%s: out of memory while listing", st->uri);
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
    return ckpt_load_manifest_doc(st, step, m, NULL, NULL, err);
}

int ckpt_load_manifest_doc(struct storage *st, uint64_t step, struct ckpt_manifest *m, char **doc,
                           size_t *doc_len, char *err)
{
    char key[96], dir[32], sub[FSDP_ERR_LEN];
    ckpt_step_dir(step, dir, sizeof dir);
    snprintf(key, sizeof key, "%s/%s", dir, CKPT_MANIFEST);
    void *buf;
    size_t len;
    if (doc)
        *doc = NULL;
    int rc = storage_get_all(st, key, CKPT_MAX_MANIFEST_BYTES, &buf, &len, err);
    if (rc == FSDP_NOT_REGULAR)
        return CKPT_DAMAGED; /* a link or FIFO where the manifest belongs */
    if (rc)
        return rc;
    if (ckpt_manifest_parse(buf, len, m, sub)) {
        fsdp_err(err, "%s/%s: %s", st->uri, key, sub);
        free(buf);
        return CKPT_DAMAGED;
    }
    uint64_t by;
    int live = m->step == step ? ckpt_manifest_live(st, m, &by, sub) : -2;
    if (live == -2)
        fsdp_err(err, "%s/%s: says step %llu", st->uri, key, (unsigned long long)m->step);
    else if (live == 0)
        fsdp_err(err,
                 "%s/%s: fenced: committed by generation %llu after generation %llu sealed "
                 "the store; not part of the run (retention removes it)",
                 st->uri, key, (unsigned long long)m->generation, (unsigned long long)by);
    else if (live != 1)
        fsdp_err(err, "%s/%s: cannot tell whether it is live: %s", st->uri, key, sub);
    if (live != 1) {
        ckpt_manifest_free(m);
        free(buf);
        return live == -2 ? CKPT_DAMAGED : live == 0 ? CKPT_NOT_LIVE : CKPT_CANNOT_JUDGE;
    }
    if (doc) {
        *doc = buf;
        *doc_len = len;
    } else {
        free(buf);
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
        fsdp_err(err, "getrandom failed: cannot name this writer's objects");
        return -1;
    }
    return 0;
}
