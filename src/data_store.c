/*
 * data_store.c - token data in a store (--data s3://BUCKET/PREFIX,
 * file://DIR/PREFIX): read with ranged GETs as training goes, never whole.
 *
 * The dataset is every object of the store's "directory" whose name starts
 * with the URI's last part (all of them when the URI ends in '/'; the one
 * object when the last part names one exactly), in byte order of their
 * names. Each is a token file in llm.c's format (header, then tokens); all
 * have the same token width. Their tokens, headers left out, are one
 * stream, and sample i is tokens [i T, i T + T] of it as for a local file,
 * so the seeded order, the cursor and resharding are the same; a sample
 * may span two objects. Opening reads each object's header (one ranged GET
 * each, checked against the size the listing gave), and the data's
 * identity (the same bytes a local file's identity reads, over the objects
 * back to back: one object's identity is its file's).
 *
 * Tokens are checked against the vocabulary as they arrive, not at open
 * (that would read the whole dataset); a bad one stops the run with one
 * line naming the object and the token's index in it.
 *
 * Reading ahead: the trainer names the samples of the steps to come
 * (token_file_prefetch); DATA_STORE_THREADS threads fetch them into a
 * table of slots, and token_file_sample takes a sample from its slot,
 * waiting for it if it is still in flight. A sample not in the table (the
 * first steps, a full table) is fetched there and then. Stores whose reads
 * may not run on several threads (the fault wrapper) are read on demand.
 */
#include "data.h"

#include "storage.h"
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA_STORE_THREADS     4
#define DATA_STORE_MAX_OBJECTS (1 << 20)

struct data_object {
    char *key;
    uint64_t first;   /* its first token's place in the stream */
    uint64_t ntokens; /* as its header says (checked against its size) */
    uint64_t size;    /* bytes */
};

enum slot_state { SLOT_FREE, SLOT_QUEUED, SLOT_BUSY, SLOT_DONE, SLOT_FAILED };

struct data_slot {
    uint64_t sample, seq;
    enum slot_state state;
    uint32_t *tok; /* T + 1 tokens */
    char err[FSDP_ERR_LEN];
};

struct data_remote {
    struct storage *store;
    char uri[1024]; /* as given, for messages */
    struct data_object *obj;
    int nobj, width, vocab, T;
    uint64_t bytes; /* the objects' bytes, headers included */
    char sha[65];   /* the identity's digest */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct data_slot *slot;
    int nslots, nthreads, stop;
    pthread_t thread[DATA_STORE_THREADS];
    uint64_t seq;
    uint64_t ahead, on_demand; /* samples taken from a slot / fetched when asked */
    double wait_s;             /* the trainer's time in token_file_sample */
};

int token_file_is_store(const char *path)
{
    return path && (strncmp(path, "s3://", 5) == 0 || strncmp(path, "file://", 7) == 0 ||
                    strncmp(path, "fault:", 6) == 0); /* tests: fault:SPEC;URI */
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

struct listing {
    const char *prefix;
    struct data_object *obj;
    int n, cap, exact;
    char err[FSDP_ERR_LEN];
};

static int list_one(void *arg, const char *key, uint64_t size)
{
    struct listing *l = arg;
    if (strncmp(key, l->prefix, strlen(l->prefix)) || strchr(key, '/'))
        return 0;              /* another name, or deeper down */
    if (storage_special(size)) /* never opened or followed */
        return fsdp_err(l->err,
                        "%s is %s, not a token file (name the file it stands for; a store's token "
                        "files are regular files)",
                        key, storage_special(size));
    if (l->n == DATA_STORE_MAX_OBJECTS)
        return fsdp_err(l->err, "more than %d objects", DATA_STORE_MAX_OBJECTS);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        void *o = realloc(l->obj, (size_t)cap * sizeof *l->obj);
        if (!o)
            return fsdp_err(l->err, "out of memory for the listing");
        l->obj = o;
        l->cap = cap;
    }
    l->obj[l->n] = (struct data_object){strdup(key), 0, 0, size};
    if (!l->obj[l->n].key)
        return fsdp_err(l->err, "out of memory for the listing");
    l->exact |= strcmp(key, l->prefix) == 0;
    l->n++;
    return 0;
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const struct data_object *)a)->key, ((const struct data_object *)b)->key);
}

/* Reads [off, off + len) of the objects' bytes back to back. */
static int read_bytes(struct data_remote *r, uint64_t off, size_t len, unsigned char *buf,
                      char *err)
{
    for (int i = 0; i < r->nobj && len; i++) {
        const struct data_object *o = &r->obj[i];
        if (off >= o->size) {
            off -= o->size;
            continue;
        }
        size_t n = o->size - off < len ? (size_t)(o->size - off) : len;
        if (storage_get_range(r->store, o->key, off, n, buf, err))
            return -1;
        buf += n;
        len -= n;
        off = 0;
    }
    return len ? fsdp_err(err, "%s: read past the data's end", r->uri) : 0;
}

/* Checks object o's header and size; sets its token count and the width. */
static int check_header(struct data_remote *r, struct data_object *o, char *err)
{
    const size_t hdr = DATA_HEADER_INTS * 4;
    unsigned char head[12];
    char sub[FSDP_ERR_LEN];
    if (o->size < hdr)
        return fsdp_err(err, "%s%s: not a token file: %llu bytes, shorter than the %zu-byte header",
                        r->uri, o->key, (unsigned long long)o->size, hdr);
    if (storage_get_range(r->store, o->key, 0, sizeof head, head, sub))
        return fsdp_err(err, "%s%s: %s", r->uri, o->key, sub);
    uint32_t magic = le32(head), version = le32(head + 4), count = le32(head + 8);
    int w = magic == DATA_MAGIC_U32 ? 4 : 2;
    if (magic != DATA_MAGIC && magic != DATA_MAGIC_U32)
        return fsdp_err(err,
                        "%s%s: not a token file: magic %u, expected %d (uint16 tokens) or %d "
                        "(uint32 tokens; a store holds llm.c token files, HDF5 is read from a "
                        "local file)",
                        r->uri, o->key, magic, DATA_MAGIC, DATA_MAGIC_U32);
    if (version != (w == 4 ? DATA_VERSION_U32 : DATA_VERSION))
        return fsdp_err(err, "%s%s: unsupported token file version %u for magic %u", r->uri, o->key,
                        version, magic);
    if (r->width && w != r->width)
        return fsdp_err(err, "%s%s: uint%d tokens, the objects before it hold uint%d", r->uri,
                        o->key, 8 * w, 8 * r->width);
    if (count > INT32_MAX)
        return fsdp_err(err, "%s%s: corrupt header: token count %u is negative as int32", r->uri,
                        o->key, count);
    if (o->size != hdr + (uint64_t)count * (uint64_t)w)
        return fsdp_err(err, "%s%s: the header says %u tokens (%llu bytes), the object has %llu",
                        r->uri, o->key, count, (unsigned long long)(hdr + (uint64_t)count * w),
                        (unsigned long long)o->size);
    r->width = w;
    o->ntokens = count;
    return 0;
}

/* Tokens [first, first + n) of the stream into out, checked against the
 * vocabulary. */
static int read_tokens(struct data_remote *r, uint64_t first, size_t n, uint32_t *out, char *err)
{
    int lo = 0, hi = r->nobj - 1; /* the last object whose first token is <= first */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (r->obj[mid].first <= first)
            lo = mid;
        else
            hi = mid - 1;
    }
    unsigned char *raw = malloc(n * (size_t)r->width);
    if (!raw)
        return fsdp_err(err, "%s: out of memory for a sample", r->uri);
    int rc = 0;
    for (int i = lo; i < r->nobj && n && !rc; i++) {
        const struct data_object *o = &r->obj[i];
        uint64_t at = first - o->first; /* first >= o->first from here on */
        if (at >= o->ntokens)
            continue;
        size_t k = o->ntokens - at < n ? (size_t)(o->ntokens - at) : n;
        char sub[FSDP_ERR_LEN];
        if (storage_get_range(r->store, o->key, DATA_HEADER_INTS * 4 + at * (uint64_t)r->width,
                              k * (size_t)r->width, raw, sub)) {
            rc = fsdp_err(err, "%s%s: %s", r->uri, o->key, sub);
            break;
        }
        for (size_t j = 0; j < k; j++) {
            const unsigned char *p = raw + j * (size_t)r->width;
            uint32_t t = r->width == 4 ? le32(p) : (uint32_t)p[0] | (uint32_t)p[1] << 8;
            if (t >= (uint32_t)r->vocab) {
                rc = fsdp_err(err,
                              "%s%s: token %u at index %llu is outside the model's vocabulary "
                              "of %d (use --vocab or a model whose vocabulary covers it)",
                              r->uri, o->key, t, (unsigned long long)(at + j), r->vocab);
                break;
            }
            out[j] = t;
        }
        out += k;
        n -= k;
        first += k;
    }
    free(raw);
    return rc ? rc : n ? fsdp_err(err, "%s: a sample past the data's end", r->uri) : 0;
}

static void *reader(void *arg)
{
    struct data_remote *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        struct data_slot *s = NULL;
        for (int i = 0; i < r->nslots; i++)
            if (r->slot[i].state == SLOT_QUEUED && (!s || r->slot[i].seq < s->seq))
                s = &r->slot[i];
        if (!s && r->stop)
            break;
        if (!s) {
            pthread_cond_wait(&r->work, &r->mu);
            continue;
        }
        s->state = SLOT_BUSY;
        uint64_t first = s->sample * (uint64_t)r->T;
        pthread_mutex_unlock(&r->mu);
        int rc = read_tokens(r, first, (size_t)r->T + 1, s->tok, s->err);
        pthread_mutex_lock(&r->mu);
        s->state = rc ? SLOT_FAILED : SLOT_DONE;
        pthread_cond_broadcast(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Ends the read-ahead: what is queued is dropped, reads in flight end. */
static void stop_readers(struct data_remote *r)
{
    if (!r->nthreads)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    for (int i = 0; i < r->nslots; i++) /* what is still queued is not wanted */
        if (r->slot[i].state == SLOT_QUEUED)
            r->slot[i].state = SLOT_FREE;
    pthread_cond_broadcast(&r->work);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->nthreads; i++)
        pthread_join(r->thread[i], NULL);
    r->nthreads = 0;
}

static void remote_free(struct data_remote *r)
{
    if (!r)
        return;
    stop_readers(r);
    if (r->slot) {
        for (int i = 0; i < r->nslots; i++)
            free(r->slot[i].tok);
        free(r->slot);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->work);
        pthread_cond_destroy(&r->done);
    }
    for (int i = 0; i < r->nobj; i++)
        free(r->obj[i].key);
    free(r->obj);
    if (r->store)
        storage_close(r->store);
    free(r);
}

/* The identity (train_ckpt.c's rule, token_file_identity) over the
 * objects' bytes back to back. */
static int remote_identity(struct data_remote *r, char *err)
{
    unsigned char *buf;
    size_t n;
    uint64_t at[TOKEN_ID_BLOCKS + 1];
    size_t len[TOKEN_ID_BLOCKS + 1];
    int parts = token_file_identity_parts(r->bytes, at, len);
    size_t total = 0;
    for (int i = 0; i < parts; i++)
        total += len[i];
    if (!(buf = malloc(total ? total : 1)))
        return fsdp_err(err, "%s: out of memory for the data's identity", r->uri);
    n = 0;
    int rc = 0;
    for (int i = 0; i < parts && !rc; i++) {
        rc = read_bytes(r, at[i], len[i], buf + n, err);
        n += len[i];
    }
    if (!rc && fsdp_sha256_hex(buf, n, r->sha))
        rc = fsdp_err(err, "%s: cannot hash the data's identity", r->uri);
    free(buf);
    return rc;
}

static int start_readers(struct data_remote *r, int nslots, char *err)
{
    r->slot = calloc((size_t)nslots, sizeof *r->slot);
    if (!r->slot)
        return fsdp_err(err, "%s: out of memory for the read-ahead", r->uri);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work, NULL);
    pthread_cond_init(&r->done, NULL);
    r->nslots = nslots;
    for (int i = 0; i < nslots; i++)
        if (!(r->slot[i].tok = malloc(((size_t)r->T + 1) * sizeof *r->slot[i].tok)))
            return fsdp_err(err, "%s: out of memory for the read-ahead", r->uri);
    if (!r->store->ops->concurrent_reads)
        return 0; /* read on demand only */
    for (; r->nthreads < DATA_STORE_THREADS; r->nthreads++)
        if (pthread_create(&r->thread[r->nthreads], NULL, reader, r))
            return fsdp_err(err, "%s: cannot start a reader thread", r->uri);
    return 0;
}

int token_file_open_store(struct token_file *f, const char *uri, int vocab, int T, int ahead,
                          char *err)
{
    memset(f, 0, sizeof *f);
    const char *scheme = strstr(uri, "://"), *slash = strrchr(uri, '/');
    if (!scheme || !slash)
        return fsdp_err(err, "%s: a store's URI is s3://BUCKET/PREFIX or file://DIR/PREFIX", uri);
    const char *after = scheme + 3;
    struct data_remote *r = calloc(1, sizeof *r);
    if (!r)
        return fsdp_err(err, "%s: out of memory", uri);
    snprintf(r->uri, sizeof r->uri, "%.*s", (int)(slash + 1 - uri), uri);
    r->vocab = vocab;
    r->T = T;
    char root[1024], sub[FSDP_ERR_LEN];
    /* s3://bucket/x: the bucket's own objects; file:///d/x: d's */
    const size_t rootlen = slash > after ? (size_t)(slash - uri) : strlen(uri);
    snprintf(root, sizeof root, "%.*s", (int)(rootlen < sizeof root ? rootlen : 0), uri);
    struct listing l = {slash > after ? slash + 1 : "", NULL, 0, 0, 0, ""};
    if (strlen(uri) >= sizeof r->uri || strlen(l.prefix) >= 512) {
        remote_free(r);
        return fsdp_err(err, "%.64s...: URI too long", uri);
    }
    if (slash <= after) /* s3://bucket: every object of the bucket */
        snprintf(r->uri, sizeof r->uri, "%s/", uri);
    int rc = storage_open(root, &r->store, sub);
    if (!rc)
        rc = storage_list_special(r->store, l.prefix, list_one, &l, sub);
    r->obj = l.obj;
    r->nobj = l.n;
    if (rc) {
        remote_free(r);
        return fsdp_err(err, "%s: %s", uri, l.err[0] ? l.err : sub);
    }
    if (l.exact) { /* the URI names one object */
        int keep = 0;
        for (int i = 0; i < r->nobj; i++)
            if (strcmp(r->obj[i].key, l.prefix) == 0)
                keep = i;
        struct data_object o = r->obj[keep];
        r->obj[keep] = r->obj[0];
        r->obj[0] = o;
        for (int i = 1; i < r->nobj; i++)
            free(r->obj[i].key);
        r->nobj = 1;
    }
    if (r->nobj == 0) {
        remote_free(r);
        return fsdp_err(err,
                        "%s: no object there (the dataset is every token file whose name "
                        "starts with the URI's last part)",
                        uri);
    }
    qsort(r->obj, (size_t)r->nobj, sizeof *r->obj, by_key);
    uint64_t tokens = 0;
    for (int i = 0; i < r->nobj && !rc; i++) {
        rc = check_header(r, &r->obj[i], err);
        r->obj[i].first = tokens;
        tokens += r->obj[i].ntokens;
        r->bytes += r->obj[i].size;
    }
    if (!rc && tokens > (uint64_t)SIZE_MAX / 4)
        rc = fsdp_err(err, "%s: %llu tokens: too many", uri, (unsigned long long)tokens);
    if (!rc)
        rc = remote_identity(r, err);
    if (!rc)
        rc = start_readers(r, ahead > 0 ? ahead : 1, err);
    if (rc) {
        remote_free(r);
        return -1;
    }
    f->remote = r;
    f->width = r->width;
    f->ntokens = (size_t)tokens;
    return 0;
}

void token_file_close_store(struct token_file *f) { remote_free(f->remote); }

void token_file_prefetch(const struct token_file *f, uint64_t sample)
{
    struct data_remote *r = f->remote;
    if (!r || !r->nthreads)
        return;
    pthread_mutex_lock(&r->mu);
    struct data_slot *free_slot = NULL;
    for (int i = 0; i < r->nslots; i++) {
        if (r->slot[i].state != SLOT_FREE && r->slot[i].sample == sample) {
            free_slot = NULL;
            goto out; /* asked for already */
        }
        if (r->slot[i].state == SLOT_FREE && !free_slot)
            free_slot = &r->slot[i];
    }
    if (free_slot) { /* a full table: it is fetched when it is wanted */
        free_slot->sample = sample;
        free_slot->seq = r->seq++;
        free_slot->state = SLOT_QUEUED;
        pthread_cond_signal(&r->work);
    }
out:
    pthread_mutex_unlock(&r->mu);
}

int token_file_sample(const struct token_file *f, uint64_t sample, uint32_t *tok, char *err)
{
    struct data_remote *r = f->remote;
    struct data_slot *s = NULL;
    const double t0 = fsdp_now();
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->nslots && !s; i++)
        if (r->slot[i].state != SLOT_FREE && r->slot[i].sample == sample)
            s = &r->slot[i];
    if (!s) {
        r->on_demand++;
        pthread_mutex_unlock(&r->mu);
        int rc = read_tokens(r, sample * (uint64_t)r->T, (size_t)r->T + 1, tok, err);
        pthread_mutex_lock(&r->mu);
        r->wait_s += fsdp_now() - t0;
        pthread_mutex_unlock(&r->mu);
        return rc;
    }
    while (s->state == SLOT_QUEUED || s->state == SLOT_BUSY)
        pthread_cond_wait(&r->done, &r->mu);
    const int failed = s->state == SLOT_FAILED;
    if (!failed)
        memcpy(tok, s->tok, ((size_t)r->T + 1) * sizeof *tok);
    s->state = SLOT_FREE;
    r->ahead += !failed;
    r->on_demand += failed;
    pthread_mutex_unlock(&r->mu);
    /* a read ahead that failed (a throttling burst past the retries) is
     * read once more now, and its error is this one's */
    int rc = failed ? read_tokens(r, sample * (uint64_t)r->T, (size_t)r->T + 1, tok, err) : 0;
    pthread_mutex_lock(&r->mu);
    r->wait_s += fsdp_now() - t0;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void token_file_store_stats(const struct token_file *f, uint64_t *ahead, uint64_t *on_demand,
                            double *wait_s, uint64_t *gets, uint64_t *bytes)
{
    struct data_remote *r = f->remote;
    stop_readers(r); /* the store's counters are read with no read in flight */
    pthread_mutex_lock(&r->mu);
    *ahead = r->ahead;
    *on_demand = r->on_demand;
    *wait_s = r->wait_s;
    pthread_mutex_unlock(&r->mu);
    *gets = r->store->gets;
    *bytes = r->store->bytes_read;
}

const char *token_file_store_identity(const struct token_file *f, uint64_t *bytes)
{
    *bytes = f->remote->bytes;
    return f->remote->sha;
}
