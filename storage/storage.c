/*
 * storage.c - opening a store by URI and the calls every backend shares.
 * The core never names a backend beyond choosing one from the URI.
 */
#include "storage.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int storage_open(const char *uri, struct storage **out, char *err)
{
    *out = NULL;
    if (!uri || !*uri) {
        fsdp_err(err, "storage: empty URI");
        return FSDP_ERROR;
    }
    if (strncmp(uri, "fault:", 6) == 0) {
        const char *semi = strchr(uri + 6, ';');
        if (!semi) {
            fsdp_err(err, "storage: '%s': expected fault:SPEC;URI", uri);
            return FSDP_ERROR;
        }
        char spec[512];
        size_t n = (size_t)(semi - (uri + 6));
        if (n >= sizeof spec) {
            fsdp_err(err, "storage: fault spec too long");
            return FSDP_ERROR;
        }
        memcpy(spec, uri + 6, n);
        spec[n] = 0;
        struct storage *inner;
        int rc = storage_open(semi + 1, &inner, err);
        if (rc)
            return rc;
        rc = storage_fault_open(spec, inner, out, err);
        if (rc)
            storage_close(inner);
        return rc;
    }
    if (strncmp(uri, "s3://", 5) == 0)
        return storage_s3_open(uri, out, err);
    if (strncmp(uri, "file://", 7) == 0)
        return storage_posix_open(uri + 7, out, err);
    const char *colon = strstr(uri, "://");
    if (colon) {
        fsdp_err(err,
                 "storage: '%s': unsupported scheme '%.*s' (paths, file:// "
                 "and s3:// are supported)",
                 uri, (int)(colon - uri), uri);
        return FSDP_ERROR;
    }
    return storage_posix_open(uri, out, err);
}

void storage_close(struct storage *s)
{
    if (s)
        s->ops->close(s);
}

int storage_put_begin(struct storage *s, const char *key, struct storage_writer **w, char *err)
{
    return s->ops->put_begin(s, key, w, err);
}

int storage_write(struct storage_writer *w, const void *buf, size_t n, char *err)
{
    int rc = w->store->ops->write(w, buf, n, err);
    if (rc == 0) {
        w->written += n;
        __atomic_fetch_add(&w->store->bytes_written, n, __ATOMIC_RELAXED);
    }
    return rc;
}

int storage_writer_commit(struct storage_writer *w, char *err)
{
    return w->store->ops->commit(w, err);
}

void storage_writer_abort(struct storage_writer *w)
{
    if (w)
        w->store->ops->abort(w);
}

int storage_put(struct storage *s, const char *key, const void *buf, size_t n, char *err)
{
    struct storage_writer *w;
    int rc = storage_put_begin(s, key, &w, err);
    if (rc)
        return rc;
    if ((rc = storage_write(w, buf, n, err))) {
        storage_writer_abort(w);
        return rc;
    }
    return storage_writer_commit(w, err);
}

int storage_get_range(struct storage *s, const char *key, uint64_t off, size_t len, void *buf,
                      char *err)
{
    int rc = s->ops->get_range(s, key, off, len, buf, err);
    if (rc == 0) {
        __atomic_fetch_add(&s->bytes_read, len, __ATOMIC_RELAXED);
        __atomic_fetch_add(&s->gets, 1, __ATOMIC_RELAXED);
    }
    return rc;
}

void storage_prefetch(struct storage *s, const char *key, uint64_t off, uint64_t len)
{
    if (s->ops->prefetch)
        s->ops->prefetch(s, key, off, len);
}

int storage_get_all(struct storage *s, const char *key, size_t max, void **buf, size_t *len,
                    char *err)
{
    uint64_t size;
    *buf = NULL;
    int rc = storage_stat(s, key, &size, err);
    if (rc)
        return rc;
    if (size > max) {
        fsdp_err(err, "%s/%s: %llu bytes, more than the %zu allowed", s->uri, key,
                 (unsigned long long)size, max);
        return FSDP_ERROR;
    }
    char *p = malloc((size_t)size + 1);
    if (!p) {
        fsdp_err(err, "%s/%s: out of memory", s->uri, key);
        return FSDP_ERROR;
    }
    if ((rc = storage_get_range(s, key, 0, (size_t)size, p, err))) {
        free(p);
        return rc;
    }
    p[size] = 0;
    *buf = p;
    *len = (size_t)size;
    return 0;
}

int storage_stat(struct storage *s, const char *key, uint64_t *size, char *err)
{
    return s->ops->stat(s, key, size, err);
}

const char *storage_special(uint64_t size)
{
    if (size < STORAGE_SPECIAL_SIZE(0xF000))
        return NULL;
    const mode_t m = (mode_t)((UINT64_MAX - size) << 12);
    return S_ISLNK(m)    ? "a symbolic link"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "a special file";
}

int storage_list_special(struct storage *s, const char *prefix,
                         int (*fn)(void *arg, const char *key, uint64_t size), void *arg, char *err)
{
    return s->ops->list(s, prefix, fn, arg, err);
}

struct refusing {
    struct storage *s;
    int (*fn)(void *arg, const char *key, uint64_t size);
    void *arg;
    char *err;
};

static int refuse_special(void *arg, const char *key, uint64_t size)
{
    struct refusing *r = arg;
    const char *kind = storage_special(size);
    if (!kind)
        return r->fn(r->arg, key, size);
    fsdp_err(r->err, "%s/%s: is %s; a checkpoint store holds only directories and regular files",
             r->s->uri, key, kind);
    return FSDP_ERROR;
}

int storage_list(struct storage *s, const char *prefix,
                 int (*fn)(void *arg, const char *key, uint64_t size), void *arg, char *err)
{
    struct refusing r = {s, fn, arg, err};
    return s->ops->list(s, prefix, refuse_special, &r, err);
}

int storage_delete(struct storage *s, const char *key, char *err)
{
    return s->ops->del(s, key, err);
}

int storage_delete_many(struct storage *s, const char *const *keys, int n, char *err)
{
    if (s->ops->del_many)
        return s->ops->del_many(s, keys, n, err);
    for (int i = 0; i < n; i++)
        if (storage_delete(s, keys[i], err))
            return FSDP_ERROR;
    return 0;
}

int storage_put_if_absent(struct storage *s, const char *key, const void *buf, size_t n, char *err)
{
    int rc = s->ops->put_if_absent(s, key, buf, n, err);
    if (rc == 0)
        __atomic_fetch_add(&s->bytes_written, n, __ATOMIC_RELAXED);
    return rc;
}

const char *storage_key_problem(const char *key)
{
    if (!*key)
        return "empty";
    for (const char *p = key; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return "a control character";
    for (const char *p = key;; p++) {
        size_t len = strcspn(p, "/");
        if (len == 0)
            return "an empty part (a leading, trailing or doubled '/')";
        if (len == 1 && p[0] == '.')
            return "a '.' part";
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return "a '..' part";
        p += len;
        if (!*p)
            return NULL;
    }
}

int storage_key_check(const char *key, char *err)
{
    const char *why = storage_key_problem(key);
    if (!why)
        return 0;
    char shown[128]; /* one line: control characters shown as '?' */
    size_t i = 0;
    for (; key[i] && i + 1 < sizeof shown; i++)
        shown[i] = (unsigned char)key[i] < 0x20 || key[i] == 0x7f ? '?' : key[i];
    shown[i] = 0;
    fsdp_err(err, "storage: invalid key '%s%s': %s (keys are relative paths of plain names)", shown,
             key[i] ? "..." : "", why);
    return FSDP_ERROR;
}
