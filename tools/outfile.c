/*
 * outfile.c - see outfile.h.
 */
#include "outfile.h"

#include "ckpt.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int outfile_open(struct outfile *o, const char *path, char *err)
{
    snprintf(o->path, sizeof o->path, "%s", path);
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%d", path, (int)getpid());
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (o->fd < 0) {
        fsdp_err(err, "%s: cannot create: %s", o->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int outfile_write(struct outfile *o, const void *p, size_t n, char *err)
{
    if (fsdp_write_all(o->fd, p, n) == 0)
        return 0;
    fsdp_err(err, "%s: write failed: %s", o->tmp, strerror(errno));
    return -1;
}

int outfile_close(struct outfile *o, int ok, char *err)
{
    if (!ok) {
        close(o->fd);
        unlink(o->tmp);
        return -1;
    }
    int rc = fsync(o->fd);
    rc |= close(o->fd);
    if (rc || rename(o->tmp, o->path)) {
        fsdp_err(err, "%s: cannot finish: %s", o->path, strerror(errno));
        unlink(o->tmp);
        return -1;
    }
    return 0;
}
