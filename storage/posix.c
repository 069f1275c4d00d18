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
 * Nothing inside a store is ever followed. A store holds only directories
 * and regular files; a symbolic link, FIFO, socket or device anywhere in
 * it is refused, naming its path, by every operation that meets it (read,
 * write, stat, delete, list), so a link planted in a store can neither
 * redirect a write onto another run's committed step nor hide from a
 * listing. Every key is resolved from the root one component at a time:
 * openat(O_DIRECTORY | O_NOFOLLOW) for each directory, the *at calls with
 * that directory's descriptor for the leaf (create with O_EXCL |
 * O_NOFOLLOW, renameat, linkat, unlinkat, fstatat(AT_SYMLINK_NOFOLLOW)),
 * and files are read only after fstat says S_ISREG (opened O_NONBLOCK, so
 * a FIFO can never block). The root the user named may itself be a link:
 * that is the user's choice, resolved once when the store is opened (or
 * when its first write creates it, or again if it was removed).
 *
 * The bytes themselves (staging buffers, O_DIRECT) are posix_io.c's.
 */
#include "posix_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_KEY    400  /* bytes in a key */
#define MAX_LISTED 1024 /* bytes in a key a listing meets (temporaries included) */

static struct posix_store *P(struct storage *s) { return (struct posix_store *)s; }

static int fail(char *err, const char *op, const char *path, int e)
{
    fsdp_err(err, "%s %s: %s", op, path, strerror(e));
    return FSDP_ERROR;
}

static int oom(char *err)
{
    fsdp_err(err, "storage: out of memory");
    return FSDP_ERROR;
}

/* "ROOT/" and the first len bytes of key: what messages name. */
static void where(const struct posix_store *s, const char *key, size_t len, char *out, size_t n)
{
    snprintf(out, n, "%s/%.*s", s->root, (int)len, key);
}

static const char *kind_of(mode_t m)
{
    return S_ISLNK(m)    ? "a symbolic link"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISDIR(m)  ? "a directory"
           : S_ISREG(m)  ? "a regular file"
                         : "a special file";
}

/* The one refusal of anything but a directory or a regular file. */
static int refuse(char *err, const char *path, mode_t m)
{
    fsdp_err(err, "%s: is %s; a checkpoint store holds only directories and regular files", path,
             kind_of(m));
    return FSDP_ERROR;
}

/* What name in dir is, not followed: 0 with *sb, STORAGE_NOT_FOUND, or an
 * error naming path. */
static int entry_stat(int dir, const char *name, const char *path, struct stat *sb, char *err)
{
    if (fstatat(dir, name, sb, AT_SYMLINK_NOFOLLOW) == 0)
        return 0;
    if (errno == ENOENT) {
        fsdp_err(err, "%s: not found", path);
        return STORAGE_NOT_FOUND;
    }
    return fail(err, "stat", path, errno);
}

/* An object's name: absent (STORAGE_NOT_FOUND) or a regular file (0, *sb
 * filled); a directory or anything special is refused naming path. */
static int object_stat(int dir, const char *name, const char *path, struct stat *sb, char *err)
{
    int rc = entry_stat(dir, name, path, sb, err);
    if (rc || S_ISREG(sb->st_mode))
        return rc;
    if (S_ISDIR(sb->st_mode)) {
        fsdp_err(err, "%s: is a directory, not an object", path);
        return FSDP_ERROR;
    }
    refuse(err, path, sb->st_mode);
    return FSDP_NOT_REGULAR;
}

/* storage_key_check's rule, and what a path here can hold. */
static int key_ok(const char *key, char *err)
{
    if (storage_key_check(key, err))
        return FSDP_ERROR;
    const char *why = strlen(key) > MAX_KEY ? "longer than 400 bytes" : NULL;
    for (const char *p = key; !why; p++) {
        size_t len = strcspn(p, "/");
        if (len > NAME_MAX)
            why = "a part longer than NAME_MAX (255 bytes)";
        p += len;
        if (!*p)
            break;
    }
    if (why)
        fsdp_err(err, "storage: invalid key '%.100s...': %s", key, why);
    return why ? FSDP_ERROR : 0;
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

/* mkdir -p of the root the user named (outside the store: links on its
 * path are the user's); new directories are fsynced into their parents. */
static int make_root(const char *dir, char *err)
{
    char parent[1024];
    struct stat st;
    if (stat(dir, &st) == 0)
        return S_ISDIR(st.st_mode) ? 0 : fail(err, "mkdir", dir, ENOTDIR);
    parent_of(dir, parent, sizeof parent);
    if (strcmp(parent, dir) != 0 && make_root(parent, err))
        return FSDP_ERROR;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return fail(err, "mkdir", dir, errno);
    if (fsync_dir(parent))
        return fail(err, "fsync directory", parent, errno);
    return 0;
}

/* A descriptor of the root for the caller to close. The root is resolved
 * once and kept open (under mu); it is opened again only when it did not
 * exist yet or was removed since. create: make it if missing; otherwise a
 * missing root is STORAGE_NOT_FOUND. */
static int root_dir(struct posix_store *s, int create, int *out, char *err)
{
    int rc = 0;
    struct stat sb;
    pthread_mutex_lock(&s->mu);
    if (s->root_fd >= 0 && (fstat(s->root_fd, &sb) || sb.st_nlink == 0)) {
        close(s->root_fd); /* removed; every user holds a descriptor of its own */
        s->root_fd = -1;
    }
    if (s->root_fd < 0 && create)
        rc = make_root(s->root, err);
    if (!rc && s->root_fd < 0) {
        s->root_fd = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (s->root_fd < 0 && errno == ENOENT && !create) {
            fsdp_err(err, "%s: not found", s->root);
            rc = STORAGE_NOT_FOUND;
        } else if (s->root_fd < 0) {
            rc = fail(err, "open", s->root, errno);
        }
    }
    /* a new open file description, not a dup(): a listing's readdir
     * position must not be shared */
    if (!rc && (*out = openat(s->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        rc = fail(err, "open", s->root, errno);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Opens directory name in dir without following it; path names it for
 * messages. create: a missing one is made and fsynced into dir.
 * STORAGE_NOT_FOUND (no message) when it is missing. */
static int open_subdir(int dir, const char *name, const char *path, int create, int *out, char *err)
{
    for (int tries = 0;; tries++) {
        int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            *out = fd;
            return 0;
        }
        int e = errno;
        struct stat sb;
        if (e == ENOENT && create && tries < 3) {
            if (mkdirat(dir, name, 0755) == 0) {
                if (fsync(dir)) {
                    char parent[2048];
                    parent_of(path, parent, sizeof parent);
                    return fail(err, "fsync directory", parent, errno);
                }
            } else if (errno != EEXIST) {
                return fail(err, "mkdir", path, errno);
            }
            continue;
        }
        if (e == ENOENT)
            return STORAGE_NOT_FOUND;
        if ((e == ELOOP || e == ENOTDIR) && fstatat(dir, name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
            if (S_ISREG(sb.st_mode)) {
                fsdp_err(err, "%s: is a regular file, not a directory", path);
                return FSDP_ERROR;
            }
            if (!S_ISDIR(sb.st_mode))
                return refuse(err, path, sb.st_mode);
        }
        return fail(err, "open", path, e);
    }
}

/* Resolves every directory of key from the root, one component at a time,
 * never following a link: *out is the directory that holds the last
 * component (the caller closes it), *leaf that component inside key.
 * create: missing directories are made (and the root). STORAGE_NOT_FOUND
 * with "PATH: not found" when a directory or the root is missing. */
static int open_parent(struct posix_store *s, const char *key, int create, int *out,
                       const char **leaf, char *err)
{
    char path[2048];
    int fd = -1, rc = key_ok(key, err);
    if (!rc)
        rc = root_dir(s, create, &fd, err);
    const char *p = key;
    for (const char *slash; !rc && (slash = strchr(p, '/')); p = slash + 1) {
        char name[NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(slash - p), p); /* key_ok: it fits */
        where(s, key, (size_t)(slash - key), path, sizeof path);
        int next = -1;
        rc = open_subdir(fd, name, path, create, &next, err);
        close(fd);
        fd = next;
    }
    if (rc == STORAGE_NOT_FOUND) {
        where(s, key, strlen(key), path, sizeof path);
        fsdp_err(err, "%s: not found", path);
    }
    if (rc)
        return rc;
    *leaf = p;
    *out = fd;
    return 0;
}

static void free_writer(struct posix_writer *w)
{
    posix_staging_free(w);
    if (w->dir >= 0)
        close(w->dir);
    free(w);
}

/* A writer on a new temporary; direct: stage for O_DIRECT if the store may.
 * The object's name must be free or a regular file (which commit replaces). */
static int open_writer(struct storage *st, const char *key, int direct, struct posix_writer **out,
                       char *err)
{
    struct posix_store *s = P(st);
    struct posix_writer *w = calloc(1, sizeof *w);
    if (!w)
        return oom(err);
    w->base.store = st;
    w->fd = w->dir = -1;
    snprintf(w->base.key, sizeof w->base.key, "%s", key);
    const char *leaf;
    struct stat sb;
    int rc = open_parent(s, key, 1, &w->dir, &leaf, err);
    if (rc)
        goto fail;
    snprintf(w->name, sizeof w->name, "%s", leaf);
    where(s, key, strlen(key), w->path, sizeof w->path);
    if ((rc = object_stat(w->dir, w->name, w->path, &sb, err)) == STORAGE_NOT_FOUND)
        rc = 0;
    if (rc)
        goto fail;
    pthread_mutex_lock(&s->mu);
    unsigned long n = ++s->counter;
    pthread_mutex_unlock(&s->mu);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d.%lu", w->path, (int)getpid(), n);
    if ((size_t)snprintf(w->tmpname, sizeof w->tmpname, "%s.tmp.%d.%lu", w->name, (int)getpid(),
                         n) >= sizeof w->tmpname) {
        rc = fail(err, "create", w->tmp, ENAMETOOLONG);
        goto fail;
    }
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    if (direct && s->direct) {
        w->fd = openat(w->dir, w->tmpname, flags | O_DIRECT, 0644);
        if (w->fd >= 0) {
            w->direct = 1;
            posix_staging_start(s, w);
        } else if (errno == EINVAL) { /* this filesystem has no O_DIRECT */
            w->fd = openat(w->dir, w->tmpname, flags, 0644);
        }
    } else {
        w->fd = openat(w->dir, w->tmpname, flags, 0644);
    }
    if (w->fd < 0) {
        rc = fail(err, "create", w->tmp, errno);
        goto fail;
    }
    *out = w;
    return 0;
fail:
    free_writer(w);
    return rc;
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
    int rc = w->staged ? posix_staged_write(w, buf, n) : fsdp_write_all(w->fd, buf, n);
    return rc ? fail(err, "write", w->tmp, errno) : 0;
}

static void posix_abort(struct storage_writer *wb)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    posix_staging_wait(w);
    if (w->fd >= 0)
        close(w->fd);
    unlinkat(w->dir, w->tmpname, 0);
    free_writer(w);
}

/* Step 2 of the header comment: the temporary's bytes durable, closed. */
static int finish_tmp(struct posix_writer *w, char *err)
{
    int rc = 0;
    if (w->staged && posix_staged_flush(w))
        rc = fail(err, "write", w->tmp, errno);
    if (!rc && fsync(w->fd))
        rc = fail(err, "fsync", w->tmp, errno);
    if (close(w->fd) && !rc)
        rc = fail(err, "close", w->tmp, errno);
    w->fd = -1;
    return rc;
}

/* Step 4: the name change durable. */
static int sync_dir(struct posix_writer *w, char *err)
{
    if (fsync(w->dir) == 0)
        return 0;
    char dir[2048];
    parent_of(w->path, dir, sizeof dir);
    return fail(err, "fsync directory", dir, errno);
}

/* Steps 2-4 of the header comment; on failure the temporary goes. The name
 * is checked again just before the rename: a link or FIFO planted there
 * while the object was written is refused, not replaced. */
static int posix_commit(struct storage_writer *wb, char *err)
{
    struct posix_writer *w = (struct posix_writer *)wb;
    struct stat sb;
    int rc = finish_tmp(w, err);
    if (!rc && (rc = object_stat(w->dir, w->name, w->path, &sb, err)) == STORAGE_NOT_FOUND)
        rc = 0;
    if (!rc && renameat(w->dir, w->tmpname, w->dir, w->name))
        rc = fail(err, "rename to", w->path, errno);
    if (!rc)
        rc = sync_dir(w, err);
    if (rc)
        unlinkat(w->dir, w->tmpname, 0);
    free_writer(w);
    return rc;
}

/* Moves the temporary to the object's name unless that name exists. */
static int move_no_replace(struct posix_writer *w, char *err)
{
    const char *op = "rename to";
    int rc = renameat2(w->dir, w->tmpname, w->dir, w->name, RENAME_NOREPLACE);
    if (rc && (errno == EINVAL || errno == ENOSYS)) { /* no renameat2 here: link (then unlink) */
        op = "link to";
        rc = linkat(w->dir, w->tmpname, w->dir, w->name, 0);
    }
    if (rc == 0)
        return 0;
    if (errno != EEXIST)
        return fail(err, op, w->path, errno);
    struct stat sb; /* what holds the name: an object, or something to refuse */
    rc = object_stat(w->dir, w->name, w->path, &sb, err);
    if (rc == 0 || rc == STORAGE_NOT_FOUND) {
        fsdp_err(err, "%s already exists", w->path);
        rc = STORAGE_EXISTS;
    }
    return rc;
}

static int posix_put_if_absent(struct storage *st, const char *key, const void *buf, size_t n,
                               char *err)
{
    struct posix_writer *w; /* small objects (manifests): buffered */
    int rc = open_writer(st, key, 0, &w, err);
    if (rc)
        return rc;
    if (fsdp_write_all(w->fd, buf, n))
        rc = fail(err, "write", w->tmp, errno);
    if (!rc)
        rc = finish_tmp(w, err);
    if (!rc)
        rc = move_no_replace(w, err); /* of two racing writers exactly one wins */
    if (!rc)
        rc = sync_dir(w, err);
    unlinkat(w->dir, w->tmpname, 0); /* gone after a rename; the spare name after a link */
    free_writer(w);
    return rc;
}

/* Opens key's regular file for reading: O_NOFOLLOW, and O_NONBLOCK so a
 * FIFO put there can never block; fstat must say S_ISREG. */
static int open_object(struct posix_store *s, const char *key, int *out, char *path, size_t pn,
                       char *err)
{
    const char *leaf;
    struct stat sb;
    int dir, rc = open_parent(s, key, 0, &dir, &leaf, err);
    if (rc)
        return rc;
    where(s, key, strlen(key), path, pn);
    if ((rc = object_stat(dir, leaf, path, &sb, err))) { /* a device is never even opened */
        close(dir);
        return rc;
    }
    int fd = openat(dir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int e = errno;
    close(dir);
    if (fd < 0 && e == ENOENT) {
        fsdp_err(err, "%s: not found", path);
        return STORAGE_NOT_FOUND;
    }
    if (fd < 0 && e == ELOOP)
        return refuse(err, path, S_IFLNK);
    if (fd < 0)
        return fail(err, "open", path, e);
    if (fstat(fd, &sb)) {
        rc = fail(err, "stat", path, errno);
        close(fd);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) { /* swapped since the check above */
        close(fd);
        return refuse(err, path, sb.st_mode);
    }
    *out = fd;
    return 0;
}

static int posix_get_range(struct storage *st, const char *key, uint64_t off, size_t len, void *buf,
                           char *err)
{
    char path[2048];
    int fd = -1, rc = open_object(P(st), key, &fd, path, sizeof path, err);
    if (rc)
        return rc;
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = fail(err, "read", path, errno);
            break;
        }
        if (r == 0) {
            fsdp_err(err, "%s: truncated: wanted %zu bytes at offset %llu, found %zu", path, len,
                     (unsigned long long)off, done);
            rc = FSDP_ERROR;
            break;
        }
        done += (size_t)r;
    }
    close(fd);
    return rc;
}

static void posix_prefetch(struct storage *st, const char *key, uint64_t off, uint64_t len)
{
    char path[2048], err[FSDP_ERR_LEN];
    int fd = -1;
    if (open_object(P(st), key, &fd, path, sizeof path, err))
        return; /* a hint: the read that follows reports what is wrong */
    (void)posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
    close(fd);
}

static int posix_stat(struct storage *st, const char *key, uint64_t *size, char *err)
{
    const char *leaf;
    char path[2048];
    struct stat sb;
    int dir, rc = open_parent(P(st), key, 0, &dir, &leaf, err);
    if (rc)
        return rc;
    where(P(st), key, strlen(key), path, sizeof path);
    rc = object_stat(dir, leaf, path, &sb, err);
    close(dir);
    if (rc == 0)
        *size = (uint64_t)sb.st_size;
    return rc;
}

struct walk {
    struct posix_store *s;
    const char *prefix;
    size_t pl;
    int (*fn)(void *, const char *, uint64_t);
    void *arg;
    char *err;
    char key[MAX_LISTED + 1]; /* the key of the entry at hand, built in place */
    char path[2048];          /* for messages: not on the stack of every level */
};

/* Walks the directory fd (closed here) whose key is key[0..kl) ("" at the
 * root) depth first. Only entries that can match the prefix are looked
 * at; one that is neither a directory nor a regular file fails the listing
 * naming its path: a listing never skips what it cannot read. */
static int walk_dir(struct walk *wk, int fd, size_t kl)
{
    char *path = wk->path;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        where(wk->s, wk->key, kl, path, sizeof wk->path);
        return fail(wk->err, "list", path, e);
    }
    int rc = 0;
    while (!rc) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno) {
                where(wk->s, wk->key, kl, path, sizeof wk->path);
                rc = fail(wk->err, "list", path, errno);
            }
            break;
        }
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        size_t nl = strlen(name), el = kl + (kl ? 1 : 0) + nl;
        if (el > MAX_LISTED) {
            where(wk->s, wk->key, kl, path, sizeof wk->path);
            fsdp_err(wk->err, "%s/%s: path longer than %d bytes in a store", path, name,
                     MAX_LISTED);
            rc = FSDP_ERROR;
            break;
        }
        if (kl)
            wk->key[kl] = '/';
        memcpy(wk->key + el - nl, name, nl + 1);
        /* descend only where the prefix can still match */
        size_t n = el < wk->pl ? el : wk->pl;
        if (strncmp(wk->key, wk->prefix, n) != 0)
            continue;
        int matches = el >= wk->pl, on_the_way = !matches && wk->prefix[el] == '/';
        struct stat sb;
        if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW)) {
            int e = errno;
            if (e != ENOENT) { /* else deleted while we listed */
                where(wk->s, wk->key, el, path, sizeof wk->path);
                rc = fail(wk->err, "stat", path, e);
            }
            continue;
        }
        if (S_ISDIR(sb.st_mode)) {
            int sub;
            where(wk->s, wk->key, el, path, sizeof wk->path);
            rc = open_subdir(dirfd(d), name, path, 0, &sub, wk->err);
            if (rc == STORAGE_NOT_FOUND)
                rc = 0; /* deleted while we listed */
            else if (rc == 0)
                rc = walk_dir(wk, sub, el);
        } else if (S_ISREG(sb.st_mode)) {
            if (matches)
                rc = wk->fn(wk->arg, wk->key, (uint64_t)sb.st_size);
        } else if (matches) { /* storage_list refuses it, storage_list_special judges */
            rc = wk->fn(wk->arg, wk->key, STORAGE_SPECIAL_SIZE(sb.st_mode & S_IFMT));
        } else if (on_the_way) {
            where(wk->s, wk->key, el, path, sizeof wk->path);
            rc = refuse(wk->err, path, sb.st_mode);
        }
    }
    closedir(d);
    return rc;
}

static int posix_list(struct storage *st, const char *prefix,
                      int (*fn)(void *, const char *, uint64_t), void *arg, char *err)
{
    struct walk *wk = calloc(1, sizeof *wk);
    if (!wk)
        return oom(err);
    *wk = (struct walk){
        .s = P(st), .prefix = prefix, .pl = strlen(prefix), .fn = fn, .arg = arg, .err = err};
    int fd, rc = root_dir(P(st), 0, &fd, err);
    if (rc == STORAGE_NOT_FOUND)
        rc = 0; /* no root yet: nothing in it */
    else if (rc == 0)
        rc = walk_dir(wk, fd, 0);
    free(wk);
    return rc;
}

/* Removes the directories of key that its deletion emptied, deepest first,
 * up to (not including) the root. */
static void drop_empty_dirs(struct posix_store *s, const char *key)
{
    char dirkey[MAX_KEY + 1], err[FSDP_ERR_LEN];
    snprintf(dirkey, sizeof dirkey, "%s", key);
    for (char *slash; (slash = strrchr(dirkey, '/'));) {
        *slash = 0;
        const char *leaf;
        int dir;
        if (open_parent(s, dirkey, 0, &dir, &leaf, err))
            return;
        int gone = unlinkat(dir, leaf, AT_REMOVEDIR) == 0;
        close(dir);
        if (!gone)
            return;
    }
}

static int posix_del(struct storage *st, const char *key, char *err)
{
    struct posix_store *s = P(st);
    const char *leaf;
    char path[2048];
    struct stat sb;
    int dir, rc = open_parent(s, key, 0, &dir, &leaf, err);
    if (rc)
        return rc == STORAGE_NOT_FOUND ? 0 : rc; /* absent is fine */
    where(s, key, strlen(key), path, sizeof path);
    rc = object_stat(dir, leaf, path, &sb, err);
    if (rc == STORAGE_NOT_FOUND)
        rc = 0;
    else if (rc == 0 && unlinkat(dir, leaf, 0) && errno != ENOENT)
        rc = fail(err, "delete", path, errno);
    if (!rc && fsync(dir)) {
        char parent[2048];
        parent_of(path, parent, sizeof parent);
        rc = fail(err, "fsync directory", parent, errno);
    }
    close(dir);
    if (!rc)
        drop_empty_dirs(s, key);
    return rc;
}

static void posix_close(struct storage *st)
{
    struct posix_store *s = P(st);
    if (s->root_fd >= 0)
        close(s->root_fd);
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
    .prefetch = posix_prefetch,
    .stat = posix_stat,
    .list = posix_list,
    .del = posix_del,
    .put_if_absent = posix_put_if_absent,
    .close = posix_close,
    .concurrent_reads = 1, /* get_range and stat open their own descriptors */
};

int storage_posix_open(const char *root, struct storage **out, char *err)
{
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    if (n == 0 || n >= sizeof(((struct posix_store *)0)->root)) {
        fsdp_err(err, "storage: bad path '%s'", root);
        return FSDP_ERROR;
    }
    struct posix_store *s = calloc(1, sizeof *s);
    if (!s)
        return oom(err);
    memcpy(s->root, root, n);
    s->root[n] = 0;
    s->root_fd = -1;
    s->base.ops = &posix_ops;
    const char *direct = getenv("FSDP_DIRECT_IO");
    s->direct = !(direct && strcmp(direct, "0") == 0);
    if (pthread_mutex_init(&s->mu, NULL)) {
        free(s);
        return oom(err);
    }
    snprintf(s->base.uri, sizeof s->base.uri, "%s", s->root);
    /* the root is created by the first write, so reading commands leave no
     * trace; one that exists is resolved now, links on its path followed */
    struct stat sb;
    int fd = -1, rc = 0;
    if (stat(s->root, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        fsdp_err(err, "%s: exists and is not a directory", s->root);
        rc = FSDP_ERROR;
    } else if ((rc = root_dir(s, 0, &fd, err)) == STORAGE_NOT_FOUND) {
        rc = 0;
    }
    if (fd >= 0)
        close(fd);
    if (rc) {
        posix_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return 0;
}
