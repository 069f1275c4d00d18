/*
 * util.c - error formatting, random numbers, clocks, whole reads and
 * writes, opening user-named files, hex and number parsing.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

int fsdp_err(char *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, FSDP_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

uint64_t fsdp_rng_below(struct fsdp_rng *r, uint64_t n)
{
    unsigned __int128 m = (unsigned __int128)fsdp_rng_next(r) * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t threshold = -n % n;
        while (low < threshold) {
            m = (unsigned __int128)fsdp_rng_next(r) * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

float fsdp_normal_at(uint64_t key, uint64_t index)
{
    /* Box-Muller on two uniforms drawn from a hash of (key, index). */
    uint64_t a = fsdp_mix64(key ^ fsdp_mix64(index));
    uint64_t b = fsdp_mix64(a);
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);         /* [0, 1) */
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

double fsdp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int fsdp_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int fsdp_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0) {
            errno = EIO;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

const char *fsdp_file_kind(mode_t m)
{
    return S_ISREG(m)    ? "a regular file"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISDIR(m)  ? "a directory"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a regular file";
}

int fsdp_open_regular(const char *path, const char *what, int *fd, uint64_t *size, char *err)
{
    *fd = -1;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fsdp_err(err, "%s: is %s, not a regular file (%s is one)", path, fsdp_file_kind(st.st_mode),
                 what);
        return FSDP_NOT_REGULAR;
    }
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        int e = errno;
        fsdp_err(err, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(f, &st) < 0) {
        int e = errno;
        close(f);
        fsdp_err(err, "%s: cannot stat: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) { /* swapped in since the stat above */
        close(f);
        fsdp_err(err, "%s: is %s, not a regular file (%s is one)", path, fsdp_file_kind(st.st_mode),
                 what);
        return FSDP_NOT_REGULAR;
    }
    *fd = f;
    if (size)
        *size = (uint64_t)st.st_size;
    return 0;
}

double fsdp_unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fsdp_hex(const void *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int fsdp_unhex(const char *s, size_t n, void *out)
{
    unsigned char *b = out;
    if (!s || strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

int fsdp_sha256_hex(const void *p, size_t n, char out[65])
{
    unsigned char d[32];
    unsigned int len = 0;
    if (!EVP_Digest(p, n, d, &len, EVP_sha256(), NULL) || len != sizeof d)
        return -1;
    fsdp_hex(d, sizeof d, out);
    return 0;
}

int fsdp_parse_i64(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

const char *fsdp_url_redact(const char *url, char *out, size_t n)
{
    if (!n)
        return out;
    const char *sep = url ? strstr(url, "://") : NULL;
    const char *host = sep ? sep + 3 : NULL;
    /* users write passwords with '/', '@' and '#' in them unencoded: the
     * last '@' anywhere after the scheme ends what is hidden (a path or
     * query that holds one is hidden too: too much hidden, never too little) */
    const char *at = host ? strrchr(host, '@') : NULL;
    if (!at)
        snprintf(out, n, "%s", url ? url : "");
    else
        snprintf(out, n, "%.*s***%s", (int)(host - url), url, at);
    return out;
}

int fsdp_parse_duration(const char *s, double *secs)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double unit = !*end                   ? 1
                  : strcmp(end, "s") == 0 ? 1
                  : strcmp(end, "m") == 0 ? 60
                  : strcmp(end, "h") == 0 ? 3600
                  : strcmp(end, "d") == 0 ? 86400
                                          : 0;
    if (errno || unit == 0 || !isfinite(v) || !(v > 0) || end == s)
        return -1;
    v *= unit;
    if (v > 3650.0 * 86400)
        return -1;
    *secs = v;
    return 0;
}

int fsdp_parse_f64(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}
