/*
 * outfile.h - a file the tools write whole: under a temporary name beside
 * it (O_NOFOLLOW), fsynced and renamed into place only when finished, so a
 * reader sees the old file or the complete new one, never a part.
 */
#ifndef FSDP_OUTFILE_H
#define FSDP_OUTFILE_H

#include <stddef.h>

struct outfile {
    char path[4096], tmp[4200];
    int fd;
};

int outfile_open(struct outfile *o, const char *path, char *err);
int outfile_write(struct outfile *o, const void *p, size_t n, char *err);
/* ok: fsync, close, rename into place; else close and remove the
 * temporary. Returns 0 only when the file is in place. */
int outfile_close(struct outfile *o, int ok, char *err);

#endif
