/*
 * fault.c - a store that wraps another and injects failures.
 *
 * URI: fault:SPEC;INNER-URI. SPEC is a comma-separated list of rules:
 *   OP=ERR@N     the N-th call of OP (counting from 1) fails with ERR
 *   OP=ERR@N+    the N-th and every later call fails
 *   OP=ERR%P     each call fails with probability P (0..1)
 *   corrupt@N    the N-th get returns its data with one byte flipped
 *   seed=S       seed of the probabilistic rules (default 1)
 * OP is one of put, write, commit, get, stat, list, delete, put_if_absent;
 * ERR is an errno name: ENOSPC, EACCES, EROFS, EIO, ETIMEDOUT, ECONNRESET.
 * Counts are per process. A failed write or commit aborts the inner writer,
 * as a real failure would leave it.
 */
#include "storage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { OP_PUT, OP_WRITE, OP_COMMIT, OP_GET, OP_STAT, OP_LIST, OP_DELETE, OP_PIA, OP_N };
static const char *op_names[OP_N] = {"put",  "write", "commit", "get",
                                     "stat", "list",  "delete", "put_if_absent"};

struct rule {
    enum op op;
    int err;
    unsigned long nth; /* 0: probabilistic */
    int and_later;
    double p;
};

struct fault_store {
    struct storage base;
    struct storage *inner;
    struct rule rules[16];
    int nrules;
    unsigned long calls[OP_N];
    unsigned long corrupt_nth;
    struct fsdp_rng rng;
};

struct fault_writer {
    struct storage_writer base;
    struct storage_writer *inner;
};

static const struct {
    const char *name;
    int value;
} errnos[] = {{"ENOSPC", ENOSPC}, {"EACCES", EACCES},       {"EROFS", EROFS},
              {"EIO", EIO},       {"ETIMEDOUT", ETIMEDOUT}, {"ECONNRESET", ECONNRESET}};

static double next_uniform(struct fault_store *f)
{
    return (double)(fsdp_rng_next(&f->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* Counts the call; returns the errno to inject or 0. */
static int injected(struct fault_store *f, enum op op)
{
    unsigned long n = ++f->calls[op];
    for (int i = 0; i < f->nrules; i++) {
        const struct rule *r = &f->rules[i];
        if (r->op != op)
            continue;
        if (r->nth ? (n == r->nth || (r->and_later && n > r->nth)) : next_uniform(f) < r->p)
            return r->err;
    }
    return 0;
}

static int fail(char *err, enum op op, const char *key, int e)
{
    const char *name = "?";
    for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++)
        if (errnos[i].value == e)
            name = errnos[i].name;
    fsdp_err(err, "%s %s: %s (%s, injected)", op_names[op], key, strerror(e), name);
    return FSDP_ERROR;
}

#define F(s) ((struct fault_store *)(s))

static int f_put_begin(struct storage *s, const char *key, struct storage_writer **out, char *err)
{
    int e = injected(F(s), OP_PUT);
    if (e)
        return fail(err, OP_PUT, key, e);
    struct fault_writer *w = calloc(1, sizeof *w);
    if (!w) {
        fsdp_err(err, "storage: out of memory");
        return FSDP_ERROR;
    }
    int rc = storage_put_begin(F(s)->inner, key, &w->inner, err);
    if (rc) {
        free(w);
        return rc;
    }
    w->base.store = s;
    snprintf(w->base.key, sizeof w->base.key, "%s", key);
    *out = &w->base;
    return 0;
}

static int f_write(struct storage_writer *wb, const void *buf, size_t n, char *err)
{
    struct fault_writer *w = (struct fault_writer *)wb;
    int e = injected(F(wb->store), OP_WRITE);
    if (e)
        return fail(err, OP_WRITE, wb->key, e);
    return storage_write(w->inner, buf, n, err);
}

static int f_commit(struct storage_writer *wb, char *err)
{
    struct fault_writer *w = (struct fault_writer *)wb;
    int e = injected(F(wb->store), OP_COMMIT);
    int rc;
    if (e) {
        rc = fail(err, OP_COMMIT, wb->key, e);
        storage_writer_abort(w->inner);
    } else {
        rc = storage_writer_commit(w->inner, err);
    }
    free(w);
    return rc;
}

static void f_abort(struct storage_writer *wb)
{
    struct fault_writer *w = (struct fault_writer *)wb;
    storage_writer_abort(w->inner);
    free(w);
}

static int f_get_range(struct storage *s, const char *key, uint64_t off, size_t len, void *buf,
                       char *err)
{
    struct fault_store *f = F(s);
    int e = injected(f, OP_GET);
    if (e)
        return fail(err, OP_GET, key, e);
    int rc = storage_get_range(f->inner, key, off, len, buf, err);
    if (rc == 0 && len > 0 && f->corrupt_nth && f->calls[OP_GET] == f->corrupt_nth)
        ((unsigned char *)buf)[len / 2] ^= 0x40;
    return rc;
}

static int f_stat(struct storage *s, const char *key, uint64_t *size, char *err)
{
    int e = injected(F(s), OP_STAT);
    return e ? fail(err, OP_STAT, key, e) : storage_stat(F(s)->inner, key, size, err);
}

static int f_list(struct storage *s, const char *prefix, int (*fn)(void *, const char *, uint64_t),
                  void *arg, char *err)
{
    int e = injected(F(s), OP_LIST);
    return e ? fail(err, OP_LIST, prefix, e) : storage_list(F(s)->inner, prefix, fn, arg, err);
}

static int f_del(struct storage *s, const char *key, char *err)
{
    int e = injected(F(s), OP_DELETE);
    return e ? fail(err, OP_DELETE, key, e) : storage_delete(F(s)->inner, key, err);
}

static int f_del_many(struct storage *s, const char *const *keys, int n, char *err)
{
    for (int i = 0; i < n; i++)
        if (f_del(s, keys[i], err))
            return FSDP_ERROR;
    return 0;
}

static int f_pia(struct storage *s, const char *key, const void *buf, size_t n, char *err)
{
    int e = injected(F(s), OP_PIA);
    return e ? fail(err, OP_PIA, key, e) : storage_put_if_absent(F(s)->inner, key, buf, n, err);
}

static void f_close(struct storage *s)
{
    storage_close(F(s)->inner);
    free(s);
}

static const struct storage_ops fault_ops = {
    .scheme = "fault",
    .put_begin = f_put_begin,
    .write = f_write,
    .commit = f_commit,
    .abort = f_abort,
    .get_range = f_get_range,
    .stat = f_stat,
    .list = f_list,
    .del = f_del,
    .del_many = f_del_many,
    .put_if_absent = f_pia,
    .close = f_close,
};

static int parse_rule(struct fault_store *f, char *tok, char *err)
{
    if (strncmp(tok, "seed=", 5) == 0) {
        f->rng.state = strtoull(tok + 5, NULL, 10);
        return 0;
    }
    if (strncmp(tok, "corrupt@", 8) == 0) {
        f->corrupt_nth = strtoul(tok + 8, NULL, 10);
        return f->corrupt_nth ? 0 : FSDP_ERROR;
    }
    char *eq = strchr(tok, '=');
    if (!eq || f->nrules == (int)(sizeof f->rules / sizeof f->rules[0]))
        return FSDP_ERROR;
    *eq = 0;
    struct rule r = {.op = OP_N};
    for (int i = 0; i < OP_N; i++)
        if (strcmp(tok, op_names[i]) == 0)
            r.op = (enum op)i;
    char *at = strpbrk(eq + 1, "@%");
    if (r.op == OP_N || !at)
        return FSDP_ERROR;
    char mark = *at;
    *at = 0;
    for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++)
        if (strcmp(eq + 1, errnos[i].name) == 0)
            r.err = errnos[i].value;
    if (!r.err)
        return FSDP_ERROR;
    char *end;
    if (mark == '@') {
        r.nth = strtoul(at + 1, &end, 10);
        r.and_later = *end == '+';
        if (!r.nth || (*end && strcmp(end, "+") != 0))
            return FSDP_ERROR;
    } else {
        r.p = strtod(at + 1, &end);
        if (*end || r.p < 0 || r.p > 1)
            return FSDP_ERROR;
    }
    (void)err;
    f->rules[f->nrules++] = r;
    return 0;
}

int storage_fault_open(const char *spec, struct storage *inner, struct storage **out, char *err)
{
    struct fault_store *f = calloc(1, sizeof *f);
    if (!f) {
        fsdp_err(err, "storage: out of memory");
        return FSDP_ERROR;
    }
    f->base.ops = &fault_ops;
    f->inner = inner;
    f->rng.state = 1;
    snprintf(f->base.uri, sizeof f->base.uri, "%s", inner->uri);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char copy[128];
        snprintf(copy, sizeof copy, "%s", tok);
        if (parse_rule(f, tok, err)) {
            fsdp_err(err,
                     "storage: bad fault rule '%s' (expected OP=ERR@N, "
                     "OP=ERR@N+, OP=ERR%%P, corrupt@N or seed=S)",
                     copy);
            free(f);
            return FSDP_ERROR;
        }
    }
    *out = &f->base;
    return 0;
}
