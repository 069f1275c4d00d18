/*
 * storage.h - one interface over where checkpoints live.
 *
 * A store is opened from a URI: a plain path or file://PATH (posix),
 * s3://BUCKET/PREFIX (S3-compatible object storage), and fault:SPEC;URI,
 * which wraps any other store and injects failures (tests, chaos). Keys are relative, '/'-separated
 * paths of plain names ("step-00000100/MANIFEST.json"; no '.', '..' or empty parts, no control
 * characters: storage_key_check), refused before any I/O otherwise. storage knows nothing of
 * tensors.
 *
 * Durability contract: storage_writer_commit returns 0 only once the object
 * is durable under its final key, and before that moment no reader can see
 * a partial object under that key. storage_put_if_absent is atomic: of two
 * racing writers exactly one succeeds, the other gets STORAGE_EXISTS. A
 * backend that retries may find its own earlier attempt in place (its answer
 * was lost); it reports success when the object holds exactly the bytes it
 * was given, so writers make those bytes their own (a nonce, a generation).
 *
 * Errors (util.h's convention): negative returns with a one-line message in
 * err (FSDP_ERR_LEN) naming the operation, the object and the cause (errno
 * text); STORAGE_NOT_FOUND and STORAGE_EXISTS (util.h's enum fsdp_status)
 * are distinguishable outcomes, not failures to report.
 *
 * Threads: a struct storage, and every writer it hands out, is used by one
 * thread at a time; a caller that passes it between threads orders the
 * hand-over itself (a mutex, a join). The one exception: when
 * ops->concurrent_reads is set, storage_get_range, storage_stat,
 * storage_get_all (stat, then get_range) and storage_prefetch may run on
 * several threads at once with one another - not with a put, delete, list
 * or close. posix sets it (each of those calls opens its own descriptor),
 * s3 sets it (each request takes an easy handle from a pool guarded by a
 * mutex, the retry jitter's generator is per thread, the retry count is
 * added atomically); the fault store does not (its call counts and random
 * stream are unguarded). The counters of struct storage are added to
 * atomically, so concurrent reads lose no bytes or gets; read them once
 * no operation is in flight.
 */
#ifndef FSDP_STORAGE_H
#define FSDP_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct storage;

/* Backends embed this as the first member of their writer. */
struct storage_writer {
    struct storage *store;
    char key[512];
    uint64_t written;
};

struct storage_ops {
    const char *scheme;
    int (*put_begin)(struct storage *s, const char *key, struct storage_writer **w, char *err);
    int (*write)(struct storage_writer *w, const void *buf, size_t n, char *err);
    int (*commit)(struct storage_writer *w, char *err); /* frees w */
    void (*abort)(struct storage_writer *w);            /* frees w */
    int (*get_range)(struct storage *s, const char *key, uint64_t off, size_t len, void *buf,
                     char *err);
    int (*stat)(struct storage *s, const char *key, uint64_t *size, char *err);
    /* optional: a hint that [off, off + len) of key will be read soon (starts
     * reading it into a cache without waiting); may be called from several
     * threads when concurrent_reads is set */
    void (*prefetch)(struct storage *s, const char *key, uint64_t off, uint64_t len);
    /* calls fn for every key that starts with prefix, in no particular order;
     * a non-zero return from fn stops the listing and is returned */
    int (*list)(struct storage *s, const char *prefix,
                int (*fn)(void *arg, const char *key, uint64_t size), void *arg, char *err);
    int (*del)(struct storage *s, const char *key, char *err); /* absent is fine */
    /* many keys at once; NULL: del for each */
    int (*del_many)(struct storage *s, const char *const *keys, int n, char *err);
    int (*put_if_absent)(struct storage *s, const char *key, const void *buf, size_t n, char *err);
    void (*close)(struct storage *s);
    /* 1: get_range and stat may be called from several threads at once
     * (everything else: one thread at a time) */
    int concurrent_reads;
};

struct storage {
    const struct storage_ops *ops;
    char uri[1024];
    /* counters for tests and benchmarks (updated atomically) */
    uint64_t bytes_read, bytes_written, gets;
};

int storage_open(const char *uri, struct storage **out, char *err);
void storage_close(struct storage *s);

int storage_put_begin(struct storage *s, const char *key, struct storage_writer **w, char *err);
int storage_write(struct storage_writer *w, const void *buf, size_t n, char *err);
int storage_writer_commit(struct storage_writer *w, char *err);
void storage_writer_abort(struct storage_writer *w);
/* A whole small object in one call (put_begin + write + commit). */
int storage_put(struct storage *s, const char *key, const void *buf, size_t n, char *err);
int storage_get_range(struct storage *s, const char *key, uint64_t off, size_t len, void *buf,
                      char *err);
/* A hint that those bytes will be read soon; does nothing where the backend
 * has no use for it. */
void storage_prefetch(struct storage *s, const char *key, uint64_t off, uint64_t len);
/* Reads a whole object of at most max bytes into a fresh allocation. */
int storage_get_all(struct storage *s, const char *key, size_t max, void **buf, size_t *len,
                    char *err);
int storage_stat(struct storage *s, const char *key, uint64_t *size, char *err);
/* Listings: a backend's list passes an entry that is neither a directory
 * nor a regular file (posix: a link, FIFO, socket or device, never
 * followed) with a size storage_special() recognises. storage_list refuses
 * one ("ROOT/KEY: is a FIFO; a checkpoint store holds only ..."), so no
 * caller meets it by accident; storage_list_special hands it to fn, for
 * the one caller that judges it (ckpt's step listing: a step holding one
 * is damaged, not a reason to fail every start). Reading such a key fails
 * with FSDP_NOT_REGULAR. */
#define STORAGE_SPECIAL_SIZE(type_bits) (UINT64_MAX - (uint64_t)((type_bits) >> 12 & 0xF))
/* "a FIFO", "a symbolic link", ... for a special size; NULL for a real one */
const char *storage_special(uint64_t size);
int storage_list_special(struct storage *s, const char *prefix,
                         int (*fn)(void *arg, const char *key, uint64_t size), void *arg,
                         char *err);
int storage_list(struct storage *s, const char *prefix,
                 int (*fn)(void *arg, const char *key, uint64_t size), void *arg, char *err);
int storage_delete(struct storage *s, const char *key, char *err);
int storage_delete_many(struct storage *s, const char *const *keys, int n, char *err);
int storage_put_if_absent(struct storage *s, const char *key, const void *buf, size_t n, char *err);

/* The rule every backend applies to keys (and S3 to a bucket prefix): a
 * relative path of plain names, '/'-separated, none empty, none "." or
 * "..", no control characters. NULL when key follows it, else what is
 * wrong ("a '..' part"); backends add their own length limits. */
const char *storage_key_problem(const char *key);
/* 0, or FSDP_ERROR with "storage: invalid key 'KEY': PROBLEM (...)". */
int storage_key_check(const char *key, char *err);

/* backends */
int storage_posix_open(const char *root, struct storage **out, char *err);
int storage_fault_open(const char *spec, struct storage *inner, struct storage **out, char *err);
int storage_s3_open(const char *uri, struct storage **out, char *err);

#endif
