/*
 * posix_internal.h - private to storage/: the posix backend's store and
 * writer, shared by posix.c (keys resolved without following anything,
 * commit, listing, deletion) and posix_io.c (the bytes: staging buffers,
 * the I/O thread, O_DIRECT).
 */
#ifndef FSDP_POSIX_INTERNAL_H
#define FSDP_POSIX_INTERNAL_H

#include "storage.h"

#include <limits.h>
#include <pthread.h>
#include <stddef.h>

#define DIRECT_ALIGN 4096       /* a multiple of every logical block size in use */
#define DIRECT_BUF   (8u << 20) /* bytes staged per O_DIRECT write */

struct posix_store {
    struct storage base;
    char root[1024];
    int root_fd; /* -1 until the root exists (under mu); users get their own (root_dir) */
    int direct;  /* try O_DIRECT for writers */
    pthread_mutex_t mu;
    unsigned long counter;
    unsigned char *spare[2]; /* staging buffers kept for the next writer (warm pages) */
};

/* A writer either writes through the page cache as it is handed bytes, or
 * (staged, see posix_io.c) through two aligned buffers and an I/O thread. */
struct posix_writer {
    struct storage_writer base;
    int fd;
    int dir;                    /* the directory that holds the object */
    char name[NAME_MAX + 1];    /* the object's name in dir */
    char tmpname[NAME_MAX + 1]; /* the temporary's name in dir */
    char tmp[2048], path[2048]; /* full paths, for messages */
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

/* Two buffers and an I/O thread for w->fd (opened with O_DIRECT); on any
 * shortage the writer stays a plain buffered one (O_DIRECT cleared). */
void posix_staging_start(struct posix_store *s, struct posix_writer *w);
/* A staged writer's bytes into its buffers; -1 with errno. */
int posix_staged_write(struct posix_writer *w, const void *buf, size_t n);
/* Everything staged to the file, the last partial block buffered; -1 with errno. */
int posix_staged_flush(struct posix_writer *w);
/* Waits for the I/O thread to finish the buffer it holds (before an abort). */
void posix_staging_wait(struct posix_writer *w);
/* Stops the I/O thread; the buffers go back to the store. */
void posix_staging_free(struct posix_writer *w);

#endif
