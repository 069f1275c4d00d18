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
 */
#include "storage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct posix_store {
    struct storage base;
    char root[1024];
    unsigned long counter;
};

struct posix_writer {
    struct storage_writer base;
    int fd;
    char tmp[2048], path[2048];
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

static int posix_put_begin(struct storage *st, const char *key, struct storage_writer **out,
                           char *err)
{
    struct posix_store *s = P(st);
    struct posix_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, STORAGE_ERR_LEN, "storage: out of memory");
        return STORAGE_ERROR;
    }
    w->base.store = st;
    snprintf(w->base.key, sizeof w->base.key, "%s", key);
    if (full_path(s, key, w->path, sizeof w->path, err) || make_parents(w->path, err)) {
        free(w);
        return STORAGE_ERROR;
    }
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d.%lu", w->path, (int)getpid(), ++s->counter);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int rc = fail(err, "create", w->tmp, errno);
        free(w);
        return rc;
    }
    *out = &w->base;
    return 0;
}

static int posix_write(struct storage_writer *wb, const void *buf, size_t n, char *err)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    if (write_fd(w->fd, buf, n))
        return fail(err, "write", w->tmp, errno);
    return 0;
}

static void posix_abort(struct storage_writer *wb)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp);
    free(w);
}

/* Steps 2 and 3-4 of the header comment; on failure the temporary goes. */
static int posix_commit(struct storage_writer *wb, char *err)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    char dir[2048];
    int rc = 0;
    if (fsync(w->fd))
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
    free(w);
    return rc;
}

static int posix_put_if_absent(struct storage *st, const char *key, const void *buf, size_t n,
                               char *err)
{
    struct storage_writer *wb;
    int rc = posix_put_begin(st, key, &wb, err);
    if (rc)
        return rc;
    struct posix_writer *w = (struct posix_writer *)wb;
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
    free(w);
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

static void posix_close(struct storage *st) { free(st); }

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
