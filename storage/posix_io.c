/*
 * posix_io.c - the posix backend's bytes on their way to the device: the
 * staging buffers, the writer's I/O thread and O_DIRECT (posix.c names,
 * commits and lists objects).
 *
 * Shards are written with O_DIRECT: the bytes go from an aligned staging
 * buffer straight to the device, not through the page cache. A checkpoint
 * is gigabytes that nobody reads back soon; buffered, every byte is copied
 * into freshly allocated cache pages (on these VMs the first touch of a
 * page runs at about 0.3 GB/s, which made write() the whole cost of a save)
 * and then evicts the training job's own cache. O_DIRECT still needs the
 * fsync of step 2 (posix.c): it makes the data reach the device, not the inode's size
 * and extents. The last partial block goes through the cache (O_DIRECT
 * cleared with fcntl). A filesystem that refuses O_DIRECT (EINVAL at open or
 * at a write) gets buffered writes for that object; FSDP_DIRECT_IO=0 turns
 * it off.
 *
 * A staged writer fills one of two aligned buffers while its I/O thread
 * writes the other with O_DIRECT, so hashing and compressing the next
 * bytes overlaps the device's work on the previous ones. Writes stay in
 * order: a buffer is handed over only once the previous one is written.
 * The store keeps two spare buffers for the next writer (warm pages).
 */
#include "posix_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    return fsdp_write_all(w->fd, p, n);
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

void posix_staging_start(struct posix_store *s, struct posix_writer *w)
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

int posix_staged_write(struct posix_writer *w, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n) {
        size_t take = DIRECT_BUF - w->fill < n ? DIRECT_BUF - w->fill : n;
        memcpy(w->buf[w->cur] + w->fill, p, take);
        w->fill += take;
        p += take;
        n -= take;
        if (w->fill == DIRECT_BUF && io_submit(w))
            return -1;
    }
    return 0;
}

int posix_staged_flush(struct posix_writer *w)
{
    const unsigned char *p = w->buf[w->cur];
    size_t whole = w->fill - w->fill % DIRECT_ALIGN;
    if (io_wait(w) || write_staged(w, p, whole) || (w->direct && stop_direct(w)) ||
        fsdp_write_all(w->fd, p + whole, w->fill - whole))
        return -1;
    return 0;
}

void posix_staging_wait(struct posix_writer *w)
{
    if (w->staged)
        io_wait(w);
}

void posix_staging_free(struct posix_writer *w)
{
    if (w->staged)
        io_stop(w);
    w->staged = 0;
    for (int i = 0; i < 2; i++)
        if (w->buf[i])
            give_buffer((struct posix_store *)w->base.store, w->buf[i]);
    w->buf[0] = w->buf[1] = NULL;
}
