/*
 * events.c - the supervisor's event log: one JSON object per line,
 * {"t": seconds since the epoch, "event": NAME, ...}, flushed as written.
 *
 * Every line is built by jansson from a pack format, never by printf:
 * much of what goes in came off the network or out of another program
 * (a spot notice's time, mpirun's lines, a rank's error), and no such
 * bytes may break a line or add a key. Strings that may hold anything go
 * through ev_text, which also makes invalid UTF-8 encodable.
 */
#include "super.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *events;

/* A FIFO without a reader is not waited for (O_NONBLOCK: ENXIO), and
 * the supervisor goes on without events rather than blocking in open()
 * with no rank watched. */
int ev_open(const char *path)
{
    int fd = path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644) : -1;
    int fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
    if (fl != -1 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0)
        events = fdopen(fd, "a");
    if (fd >= 0 && !events)
        close(fd);
    if (path && !events)
        fprintf(stderr, "fsdp-super: cannot open %s for events (%s); going on without\n", path,
                fd < 0 && errno == ENXIO ? "a FIFO with no reader" : strerror(errno));
    return events != NULL;
}

void ev_close(void)
{
    if (events)
        fclose(events);
    events = NULL;
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629), 0 if none. */
static size_t utf8_seq(const unsigned char *p)
{
    unsigned char c = p[0];
    if (c < 0x80)
        return 1;
    int n = c >= 0xc2 && c <= 0xdf   ? 2
            : c >= 0xe0 && c <= 0xef ? 3
            : c >= 0xf0 && c <= 0xf4 ? 4
                                     : 0;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    for (int i = 1; i < n; i++) {
        unsigned char b = p[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xbf))
            return 0;
    }
    return (size_t)n;
}

json_t *ev_text(const char *s)
{
    size_t len = strlen(s);
    char *clean = malloc(len + 1);
    if (!clean)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_seq((const unsigned char *)s + i);
        if (n == 0) { /* a byte that is not UTF-8 */
            clean[o++] = '?';
            i++;
            continue;
        }
        memcpy(clean + o, s + i, n);
        o += n;
        i += n;
    }
    json_t *t = json_stringn(clean, o);
    free(clean);
    return t;
}

void ev_emit(const char *event, const char *fmt, ...)
{
    /* packed even without a log: "o" arguments are references handed over */
    json_t *fields = NULL;
    int bad = 0;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        json_error_t e;
        fields = json_vpack_ex(&e, 0, fmt, ap);
        va_end(ap);
        bad = !fields;
    }
    json_t *line = events ? json_pack("{s:f, s:s}", "t", fsdp_unix_now(), "event", event) : NULL;
    if (!line) {
        json_decref(fields);
        return;
    }
    if (fields)
        json_object_update(line, fields);
    if (bad) /* a field that could not be encoded: say so rather than lose the event */
        json_object_set_new(line, "unencodable", json_true());
    json_decref(fields);
    char *txt = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(13));
    if (txt) {
        fprintf(events, "%s\n", txt);
        fflush(events);
    }
    free(txt);
    json_decref(line);
}
