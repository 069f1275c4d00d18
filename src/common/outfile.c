/*
 * outfile.c - a file a program writes whole at a path the user named
 * (util.h: fsdp_outfile_*): fsdp-data's token files, fsdp-ckpt export's
 * safetensors and llm.c files, hf export's config and shards.
 *
 * The rule, in one place: what exists at the path and is not a regular
 * file (a device, a FIFO, a socket, a directory, a symbolic link) is never
 * opened, written or replaced; an existing regular file is replaced only
 * when the caller says so (--force); and nothing, not even the temporary,
 * is created before the path passed that check. The bytes go to a hidden
 * temporary beside the path (".NAME.tmp.PID", O_EXCL | O_NOFOLLOW: never
 * one that something else put there), which is fsynced and renamed over
 * the path, and the directory fsynced, only when complete: a reader sees
 * the old file or the whole new one.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fsdp_outfile_check(const char *path, int replace, char *err)
{
    struct stat st;
    if (!path[0])
        return fsdp_err(err, "an empty output path");
    if (lstat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return fsdp_err(err,
                            "%s: exists and is %s, not a regular file; refusing to replace it "
                            "(name a new file)",
                            path, fsdp_file_kind(st.st_mode));
        if (!replace)
            return fsdp_err(err,
                            "%s: exists; refusing to replace it (--force replaces a regular "
                            "file)",
                            path);
        return 0;
    }
    if (errno != ENOENT)
        return fsdp_err(err, "%s: cannot stat: %s", path, strerror(errno));
    return 0;
}

/* ".NAME.tmp.PID" in path's directory */
static int tmp_name(char *tmp, size_t len, const char *path)
{
    const char *slash = strrchr(path, '/');
    const size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    const char *base = slash ? slash + 1 : path;
    if (!base[0])
        return -1;
    int n = snprintf(tmp, len, "%.*s.%s.tmp.%d", (int)dirlen, path, base, (int)getpid());
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int fsdp_outfile_open(struct fsdp_outfile *o, const char *path, int replace, char *err)
{
    o->fd = -1;
    if (snprintf(o->path, sizeof o->path, "%s", path) >= (int)sizeof o->path ||
        tmp_name(o->tmp, sizeof o->tmp, path))
        return fsdp_err(err, "%s: not a file name this program can write", path);
    if (fsdp_outfile_check(path, replace, err))
        return -1;
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    o->fd = open(o->tmp, flags, 0644);
    struct stat st; /* a regular file an earlier process of this id left */
    if (o->fd < 0 && errno == EEXIST && lstat(o->tmp, &st) == 0 && S_ISREG(st.st_mode) &&
        unlink(o->tmp) == 0)
        o->fd = open(o->tmp, flags, 0644);
    if (o->fd < 0)
        return fsdp_err(err, "%s: cannot create: %s", o->tmp, strerror(errno));
    return 0;
}

int fsdp_outfile_write(struct fsdp_outfile *o, const void *p, size_t n, char *err)
{
    if (fsdp_write_all(o->fd, p, n) == 0)
        return 0;
    return fsdp_err(err, "%s: write failed: %s", o->tmp, strerror(errno));
}

int fsdp_outfile_close(struct fsdp_outfile *o, int ok, char *err)
{
    if (o->fd < 0)
        return -1;
    if (!ok) {
        close(o->fd);
        unlink(o->tmp);
        o->fd = -1;
        return -1;
    }
    int e = 0;
    if (fsync(o->fd))
        e = errno;
    if (close(o->fd) && !e)
        e = errno;
    o->fd = -1;
    if (e) {
        unlink(o->tmp);
        return fsdp_err(err, "%s: write failed: %s", o->tmp, strerror(e));
    }
    /* what appeared at the path while we wrote is judged again: rename
     * replaces a directory entry (never writes into a device), but a node
     * that is not ours must not vanish either */
    struct stat st;
    if (lstat(o->path, &st) == 0 && !S_ISREG(st.st_mode)) {
        unlink(o->tmp);
        return fsdp_err(err, "%s: became %s while it was written; refusing to replace it", o->path,
                        fsdp_file_kind(st.st_mode));
    }
    if (rename(o->tmp, o->path)) {
        e = errno;
        unlink(o->tmp);
        return fsdp_err(err, "%s: cannot commit: %s", o->path, strerror(e));
    }
    char dir[4096]; /* the rename itself survives a crash */
    snprintf(dir, sizeof dir, "%s", o->path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* What a path names: the file's device and inode when it exists, else its
 * directory's real path and its last component. */
static int identity(const char *path, struct stat *st, char *where, size_t len)
{
    if (stat(path, st) == 0)
        return 1;
    char dir[4096], base[4096], real[4096];
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(base, sizeof base, "%s", path);
    if (!realpath(dirname(dir), real))
        return -1;
    snprintf(where, len, "%s/%s", real, basename(base));
    return 0;
}

int fsdp_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    char wa[8400], wb[8400];
    int ea = identity(a, &sa, wa, sizeof wa), eb = identity(b, &sb, wb, sizeof wb);
    if (ea == 1 && eb == 1)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return ea == 0 && eb == 0 && strcmp(wa, wb) == 0;
}
