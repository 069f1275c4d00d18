/*
 * posix.c - the filesystem backend.
 *
 * Durability, in the order it happens (SQLite's os_unix.c spells out the
 * same reasoning):
 *   1. data goes to a temporary file next to the final name
 *      (KEY.tmp.PID.N), so a crash mid-write leaves only a temporary that
 *      no reader looks at;
 *   2. fsync(file) makes the bytes and the inode durable before the name
 *      can point at them - without it a crash after the rename could leave
 *      the final name on an empty or partial file;
 *   3. rename(tmp, final) swaps the name in atomically (put_if_absent uses
 *      renameat2(RENAME_NOREPLACE), or link() where that is missing, so an
 *      existing object is never replaced);
 *   4. fsync(directory) makes the rename itself durable - without it the
 *      object could vanish after a crash although commit returned success.
 * Directories created on the way are fsynced into their parents for the
 * same reason. Deletions fsync the directory too: a deleted manifest must
 * stay deleted before the shards it describes go (see ckpt/).
 *
 * Shards are written with O_DIRECT: the bytes go from an aligned staging
 * buffer straight to the device, not through the page cache. A checkpoint
 * is gigabytes that nobody reads back soon; buffered, every byte is copied
 * into freshly allocated cache pages (on these VMs the first touch of a
 * page runs at about 0.3 GB/s, which made write() the whole cost of a save)
 * and then evicts the training job's own cache. O_DIRECT still needs the
 * fsync of step 2: it makes the data reach the device, not the inode's size
 * and extents. The last partial block goes through the cache (O_DIRECT
 * cleared with fcntl). A filesystem that refuses O_DIRECT (EINVAL at open or
 * at a write) gets buffered writes for that object; FSDP_DIRECT_IO=0 turns
 * it off.
 */
#include "storage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIRECT_ALIGN 4096     /* a multiple of every logical block size in use */
#define DIRECT_BUF (8u << 20) /* bytes staged per O_DIRECT write */

struct posix_store {
    struct storage base;
    char root[1024];
    int direct; /* try O_DIRECT for writers */
    pthread_mutex_t mu;
    unsigned long counter;
    unsigned char *spare[2]; /* staging buffers kept for the next writer (warm pages) */
};

/* A writer either writes through the page cache as it is handed bytes, or
 * (staged) fills one of two aligned buffers while its I/O thread writes the
 * other with O_DIRECT, so hashing and compressing the next bytes overlaps
 * the device's work on the previous ones. Writes stay in order: a buffer is
 * handed over only once the previous one is written. */
struct posix_writer {
    struct storage_writer base;
    int fd;
    char tmp[2048], path[2048];
    int staged;
    unsigned char *buf[2]; /* DIRECT_BUF bytes each, DIRECT_ALIGN-aligned */
    int cur;               /* the buffer being filled */
    size_t fill;
    /* shared with the I/O thread, under mu */
    pthread_t io;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending; /* buffer the I/O thread is to write, -1: none */
    int quit, io_errno;
    int direct; /* fd has O_DIRECT: the I/O thread's, or the owner's once it is idle */
};

static struct posix_store *P(struct storage *s) { return (struct posix_store *)s; }

static int fail(char *err, const char *op, const char *path, int e)
{
    snprintf(err, STORAGE_ERR_LEN, "%s %s: %s", op, path, strerror(e));
    return STORAGE_ERROR;
}

/* Keys are relative paths of plain components: no "..", no empty parts. */
static int key_ok(const char *key, char *err)
{
    size_t n = strlen(key);
    int bad = n == 0 || n > 400 || key[0] == '/' || key[n - 1] == '/' || strstr(key, "//") ||
              strcmp(key, "..") == 0 || strncmp(key, "../", 3) == 0 || strstr(key, "/../") ||
              (n >= 3 && strcmp(key + n - 3, "/..") == 0);
    if (bad)
        snprintf(err, STORAGE_ERR_LEN, "storage: invalid key '%s'", key);
    return bad ? STORAGE_ERROR : 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static void parent_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash == out)
        slash[1] = 0;
    else if (slash)
        *slash = 0;
    else
        snprintf(out, n, ".");
}

/* mkdir -p for the directory that will hold path; new directories are
 * fsynced into their parents. */
static int make_parents(const char *path, char *err)
{
    char dir[2048], parent[2048];
    parent_of(path, dir, sizeof dir);
    struct stat st;
    if (stat(dir, &st) == 0)
        return S_ISDIR(st.st_mode) ? 0 : fail(err, "mkdir", dir, ENOTDIR);
    if (make_parents(dir, err))
        return STORAGE_ERROR;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return fail(err, "mkdir", dir, errno);
    parent_of(dir, parent, sizeof parent);
    if (fsync_dir(parent))
        return fail(err, "fsync directory", parent, errno);
    return 0;
}

static int full_path(struct posix_store *s, const char *key, char *out, size_t n, char *err)
{
    if (key_ok(key, err))
        return STORAGE_ERROR;
    if ((size_t)snprintf(out, n, "%s/%s", s->root, key) >= n) {
        snprintf(err, STORAGE_ERR_LEN, "storage: path too long for key '%s'", key);
        return STORAGE_ERROR;
    }
    return 0;
}

static int write_fd(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A spare staging buffer of the store, or a new one (NULL: none to be had). */
static unsigned char *take_buffer(struct posix_store *s)
{
    unsigned char *b = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 2 && !b; i++) {
        b = s->spare[i];
        s->spare[i] = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (!b && posix_memalign((void **)&b, DIRECT_ALIGN, DIRECT_BUF))
        b = NULL;
    return b;
}

static void give_buffer(struct posix_store *s, unsigned char *b)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 2 && b; i++)
        if (!s->spare[i]) {
            s->spare[i] = b;
            b = NULL;
        }
    pthread_mutex_unlock(&s->mu);
    free(b);
}

/* From here on, plain buffered writes to the same file. */
static int stop_direct(struct posix_writer *w)
{
    int fl = fcntl(w->fd, F_GETFL);
    if (fl < 0 || fcntl(w->fd, F_SETFL, fl & ~O_DIRECT) < 0)
        return -1;
    w->direct = 0;
    return 0;
}

/* Writes n staged bytes: whole blocks with O_DIRECT while the filesystem
 * takes them (EINVAL: it refuses this alignment), the rest buffered. */
static int write_staged(struct posix_writer *w, const unsigned char *p, size_t n)
{
    while (n && w->direct && n % DIRECT_ALIGN == 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno != EINVAL || stop_direct(w)))
            return -1;
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        }
    }
    if (n && w->direct && stop_direct(w))
        return -1;
    return write_fd(w->fd, p, n);
}

static void *io_main(void *arg)
{
    struct posix_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->pending < 0 && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->pending < 0)
            break;
        const unsigned char *p = w->buf[w->pending];
        pthread_mutex_unlock(&w->mu);
        int rc = write_staged(w, p, DIRECT_BUF), e = errno;
        pthread_mutex_lock(&w->mu);
        if (rc && !w->io_errno)
            w->io_errno = e ? e : EIO;
        w->pending = -1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Waits until the I/O thread has written what it was handed; -1 with errno
 * if any of its writes failed. */
static int io_wait(struct posix_writer *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->pending >= 0)
        pthread_cond_wait(&w->cv, &w->mu);
    int e = w->io_errno;
    pthread_mutex_unlock(&w->mu);
    errno = e;
    return e ? -1 : 0;
}

/* Hands the full current buffer to the I/O thread and fills the other. */
static int io_submit(struct posix_writer *w)
{
    if (io_wait(w))
        return -1;
    pthread_mutex_lock(&w->mu);
    w->pending = w->cur;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    w->cur ^= 1;
    w->fill = 0;
    return 0;
}

static void io_stop(struct posix_writer *w)
{
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->io, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* Two buffers and an I/O thread for fd (opened with O_DIRECT); on any
 * shortage the writer stays a plain buffered one. */
static void start_staging(struct posix_store *s, struct posix_writer *w)
{
    w->buf[0] = take_buffer(s);
    w->buf[1] = w->buf[0] ? take_buffer(s) : NULL;
    w->pending = -1;
    if (w->buf[1] && pthread_mutex_init(&w->mu, NULL) == 0) {
        if (pthread_cond_init(&w->cv, NULL) == 0) {
            if (pthread_create(&w->io, NULL, io_main, w) == 0) {
                w->staged = 1;
                return;
            }
            pthread_cond_destroy(&w->cv);
        }
        pthread_mutex_destroy(&w->mu);
    }
    stop_direct(w);
}

static void free_writer(struct posix_writer *w)
{
    if (w->staged)
        io_stop(w);
    for (int i = 0; i < 2; i++)
        if (w->buf[i])
            give_buffer(P(w->base.store), w->buf[i]);
    free(w);
}

/* A writer on a new temporary; direct: stage for O_DIRECT if the store may. */
static int open_writer(struct storage *st, const char *key, int direct,
                       struct posix_writer **out, char *err)
{
    struct posix_store *s = P(st);
    struct posix_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, STORAGE_ERR_LEN, "storage: out of memory");
        return STORAGE_ERROR;
    }
    w->base.store = st;
    w->fd = -1;
    snprintf(w->base.key, sizeof w->base.key, "%s", key);
    if (full_path(s, key, w->path, sizeof w->path, err) || make_parents(w->path, err)) {
        free(w);
        return STORAGE_ERROR;
    }
    pthread_mutex_lock(&s->mu);
    unsigned long n = ++s->counter;
    pthread_mutex_unlock(&s->mu);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d.%lu", w->path, (int)getpid(), n);
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    if (direct && s->direct) {
        w->fd = open(w->tmp, flags | O_DIRECT, 0644);
        if (w->fd >= 0) {
            w->direct = 1;
            start_staging(s, w);
        } else if (errno == EINVAL) { /* this filesystem has no O_DIRECT */
            w->fd = open(w->tmp, flags, 0644);
        }
    } else {
        w->fd = open(w->tmp, flags, 0644);
    }
    if (w->fd < 0) {
        int rc = fail(err, "create", w->tmp, errno);
        free_writer(w);
        return rc;
    }
    *out = w;
    return 0;
}

static int posix_put_begin(struct storage *st, const char *key, struct storage_writer **out,
                           char *err)
{
    struct posix_writer *w;
    int rc = open_writer(st, key, 1, &w, err);
    *out = rc ? NULL : &w->base;
    return rc;
}

static int posix_write(struct storage_writer *wb, const void *buf, size_t n, char *err)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    if (!w->staged)
        return write_fd(w->fd, buf, n) ? fail(err, "write", w->tmp, errno) : 0;
    const unsigned char *p = buf;
    while (n) {
        size_t take = DIRECT_BUF - w->fill < n ? DIRECT_BUF - w->fill : n;
        memcpy(w->buf[w->cur] + w->fill, p, take);
        w->fill += take;
        p += take;
        n -= take;
        if (w->fill == DIRECT_BUF && io_submit(w))
            return fail(err, "write", w->tmp, errno);
    }
    return 0;
}

static void posix_abort(struct storage_writer *wb)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    if (w->staged)
        io_wait(w);
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp);
    free_writer(w);
}

/* Steps 2 and 3-4 of the header comment; on failure the temporary goes. */
static int posix_commit(struct storage_writer *wb, char *err)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    char dir[2048];
    int rc = 0;
    if (w->staged) { /* the I/O thread's last buffer, then the rest, its tail buffered */
        const unsigned char *p = w->buf[w->cur];
        size_t whole = w->fill - w->fill % DIRECT_ALIGN;
        if (io_wait(w) || write_staged(w, p, whole) || (w->direct && stop_direct(w)) ||
            write_fd(w->fd, p + whole, w->fill - whole))
            rc = fail(err, "write", w->tmp, errno);
    }
    if (!rc && fsync(w->fd))
        rc = fail(err, "fsync", w->tmp, errno);
    if (close(w->fd) && !rc)
        rc = fail(err, "close", w->tmp, errno);
    w->fd = -1;
    if (!rc && rename(w->tmp, w->path))
        rc = fail(err, "rename to", w->path, errno);
    parent_of(w->path, dir, sizeof dir);
    if (!rc && fsync_dir(dir))
        rc = fail(err, "fsync directory", dir, errno);
    if (rc)
        unlink(w->tmp);
    free_writer(w);
    return rc;
}

static int posix_put_if_absent(struct storage *st, const char *key, const void *buf, size_t n,
                               char *err)
{
    struct posix_writer *w; /* small objects (manifests): buffered */
    int rc = open_writer(st, key, 0, &w, err);
    if (rc)
        return rc;
    char dir[2048];
    if (write_fd(w->fd, buf, n))
        rc = fail(err, "write", w->tmp, errno);
    if (!rc && fsync(w->fd))
        rc = fail(err, "fsync", w->tmp, errno);
    if (close(w->fd) && !rc)
        rc = fail(err, "close", w->tmp, errno);
    w->fd = -1;
    if (!rc) {
        /* never replaces: of two racing writers exactly one wins */
        if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->path, RENAME_NOREPLACE) == 0) {
        } else if (errno == EEXIST) {
            rc = STORAGE_EXISTS;
            snprintf(err, STORAGE_ERR_LEN, "%s already exists", w->path);
        } else if (errno == EINVAL || errno == ENOSYS) {
            if (link(w->tmp, w->path) == 0)
                unlink(w->tmp);
            else if (errno == EEXIST) {
                rc = STORAGE_EXISTS;
                snprintf(err, STORAGE_ERR_LEN, "%s already exists", w->path);
            } else
                rc = fail(err, "link to", w->path, errno);
        } else {
            rc = fail(err, "rename to", w->path, errno);
        }
    }
    parent_of(w->path, dir, sizeof dir);
    if (!rc && fsync_dir(dir))
        rc = fail(err, "fsync directory", dir, errno);
    unlink(w->tmp);
    free_writer(w);
    return rc;
}

static int posix_get_range(struct storage *st, const char *key, uint64_t off, size_t len,
                           void *buf, char *err)
{
    char path[2048];
    if (full_path(P(st), key, path, sizeof path, err))
        return STORAGE_ERROR;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            snprintf(err, STORAGE_ERR_LEN, "%s: not found", path);
            return STORAGE_NOT_FOUND;
        }
        return fail(err, "open", path, errno);
    }
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return fail(err, "read", path, e);
        }
        if (r == 0) {
            close(fd);
            snprintf(err, STORAGE_ERR_LEN,
                     "%s: truncated: wanted %zu bytes at offset %llu, found %zu", path, len,
                     (unsigned long long)off, done);
            return STORAGE_ERROR;
        }
        done += (size_t)r;
    }
    close(fd);
    return 0;
}

static int posix_stat(struct storage *st, const char *key, uint64_t *size, char *err)
{
    char path[2048];
    if (full_path(P(st), key, path, sizeof path, err))
        return STORAGE_ERROR;
    struct stat sb;
    if (stat(path, &sb)) {
        if (errno == ENOENT) {
            snprintf(err, STORAGE_ERR_LEN, "%s: not found", path);
            return STORAGE_NOT_FOUND;
        }
        return fail(err, "stat", path, errno);
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, STORAGE_ERR_LEN, "%s: not a regular file", path);
        return STORAGE_ERROR;
    }
    *size = (uint64_t)sb.st_size;
    return 0;
}

struct walk {
    const char *prefix;
    int (*fn)(void *, const char *, uint64_t);
    void *arg;
    char *err;
};

/* Walks dir (the key prefix rel, "" at the root) depth first. */
static int walk_dir(struct posix_store *s, const char *rel, struct walk *wk)
{
    char path[2048];
    snprintf(path, sizeof path, "%s%s%s", s->root, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return fail(wk->err, "list", path, errno);
    }
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char key[1024];
        if ((size_t)snprintf(key, sizeof key, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >=
            sizeof key)
            continue;
        size_t kl = strlen(key), pl = strlen(wk->prefix);
        /* descend only where the prefix can still match */
        if (strncmp(key, wk->prefix, kl < pl ? kl : pl) != 0)
            continue;
        char full[2048];
        snprintf(full, sizeof full, "%s/%s", s->root, key);
        struct stat sb;
        if (lstat(full, &sb))
            continue; /* deleted while we listed */
        if (S_ISDIR(sb.st_mode))
            rc = walk_dir(s, key, wk);
        else if (S_ISREG(sb.st_mode) && kl >= pl)
            rc = wk->fn(wk->arg, key, (uint64_t)sb.st_size);
    }
    closedir(d);
    return rc;
}

static int posix_list(struct storage *st, const char *prefix,
                      int (*fn)(void *, const char *, uint64_t), void *arg, char *err)
{
    struct walk wk = {prefix, fn, arg, err};
    return walk_dir(P(st), "", &wk);
}

static int posix_del(struct storage *st, const char *key, char *err)
{
    struct posix_store *s = P(st);
    char path[2048], dir[2048];
    if (full_path(s, key, path, sizeof path, err))
        return STORAGE_ERROR;
    if (unlink(path) && errno != ENOENT)
        return fail(err, "delete", path, errno);
    parent_of(path, dir, sizeof dir);
    if (fsync_dir(dir) && errno != ENOENT)
        return fail(err, "fsync directory", dir, errno);
    /* drop directories the deletion emptied, up to the root */
    while (strlen(dir) > strlen(s->root) && rmdir(dir) == 0) {
        char up[2048];
        parent_of(dir, up, sizeof up);
        snprintf(dir, sizeof dir, "%s", up);
    }
    return 0;
}

static void posix_close(struct storage *st)
{
    struct posix_store *s = P(st);
    pthread_mutex_destroy(&s->mu);
    free(s->spare[0]);
    free(s->spare[1]);
    free(st);
}

static const struct storage_ops posix_ops = {
    .scheme = "file",
    .put_begin = posix_put_begin,
    .write = posix_write,
    .commit = posix_commit,
    .abort = posix_abort,
    .get_range = posix_get_range,
    .stat = posix_stat,
    .list = posix_list,
    .del = posix_del,
    .put_if_absent = posix_put_if_absent,
    .close = posix_close,
};

int storage_posix_open(const char *root, struct storage **out, char *err)
{
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    if (n == 0 || n >= sizeof(((struct posix_store *)0)->root)) {
        snprintf(err, STORAGE_ERR_LEN, "storage: bad path '%s'", root);
        return STORAGE_ERROR;
    }
    struct posix_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, STORAGE_ERR_LEN, "storage: out of memory");
        return STORAGE_ERROR;
    }
    memcpy(s->root, root, n);
    s->root[n] = 0;
    s->base.ops = &posix_ops;
    const char *direct = getenv("FSDP_DIRECT_IO");
    s->direct = !(direct && strcmp(direct, "0") == 0);
    pthread_mutex_init(&s->mu, NULL);
    snprintf(s->base.uri, sizeof s->base.uri, "%s", s->root);
    struct stat sb;
    if (stat(s->root, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        snprintf(err, STORAGE_ERR_LEN, "%s: exists and is not a directory", s->root);
        free(s);
        return STORAGE_ERROR;
    }
    /* the root is created by the first write, so reading commands leave no trace */
    *out = &s->base;
    return 0;
}
