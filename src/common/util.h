/*
 * util.h - the base every folder builds on: the error convention, a
 * counter-based random number generator, clocks, whole reads and writes,
 * hex, and number parsing. It includes nothing of ours, so storage/, ckpt/,
 * src/, recovery/ and tools/ may all include it (as zstd's lib/common sits
 * under its compressor and decompressor); it is built as its own library.
 *
 * Errors, everywhere in the project:
 *   - a fallible function returns an int: 0 (FSDP_OK) on success, a negative
 *     enum fsdp_status on failure. FSDP_ERROR (-1) is a failure to report;
 *     the other codes are outcomes a caller may act on (STORAGE_NOT_FOUND:
 *     try the next step). All of them are in the one enum below, so no two
 *     layers can give one value two meanings;
 *   - it takes `char *err` of FSDP_ERR_LEN bytes and, on failure, fills it
 *     with one line naming what failed and where (the object, the path, the
 *     errno text), through fsdp_err;
 *   - the caller passes err up unchanged, prefixes context, or prints it.
 *     Nothing below main() exits or aborts, except assert() on a
 *     programmer's error.
 */
#ifndef FSDP_UTIL_H
#define FSDP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FSDP_ERR_LEN 512

enum fsdp_status {
    FSDP_OK = 0,
    FSDP_ERROR = -1,
    STORAGE_NOT_FOUND = -2,  /* no such object (storage.h) */
    STORAGE_EXISTS = -3,     /* put-if-absent found the key taken (storage.h) */
    FSDP_NOT_REGULAR = -4,   /* a FIFO, device, link where a file or object belongs */
    CKPT_NOT_LIVE = -40,     /* a fenced writer's late commit (ckpt.h) */
    CKPT_CANNOT_JUDGE = -41, /* a step's seals cannot be read (ckpt.h) */
    CKPT_DAMAGED = -42,      /* a manifest that fails its checks (ckpt.h) */
    TCKPT_REFUSED = -50,     /* a checkpoint of another model (checkpoint.h) */
};

/* Formats the message into err (if non-NULL) and returns -1. */
int fsdp_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* splitmix64's increment: 2^64 divided by the golden ratio, odd. */
#define FSDP_MIX64_GAMMA 0x9e3779b97f4a7c15ULL

/* splitmix64: a bijective 64-bit mixer; the basis of every random stream here. */
static inline uint64_t fsdp_mix64(uint64_t x)
{
    x += FSDP_MIX64_GAMMA;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A sequential generator whose whole state is one word, so it checkpoints as
 * a number. */
struct fsdp_rng {
    uint64_t state;
};

/* splitmix64's stream: the state steps by the mixer's own increment, so the
 * next value is fsdp_mix64 of the state before the step. */
static inline uint64_t fsdp_rng_next(struct fsdp_rng *r)
{
    uint64_t x = r->state;
    r->state += FSDP_MIX64_GAMMA;
    return fsdp_mix64(x);
}

/* Uniform in [0, 1) with 24 random bits, exactly representable as float. */
static inline float fsdp_rng_uniform(struct fsdp_rng *r)
{
    return (float)(fsdp_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform integer in [0, n) without modulo bias (Lemire's method, n > 0). */
uint64_t fsdp_rng_below(struct fsdp_rng *r, uint64_t n);

/* A standard normal value that depends only on (key, index): any rank can
 * produce element i of a tensor without producing elements 0..i-1. */
float fsdp_normal_at(uint64_t key, uint64_t index);

/* Writes all n bytes (retrying short writes and EINTR); -1 with errno set. */
int fsdp_write_all(int fd, const void *buf, size_t n);
/* Reads exactly n bytes at off (any size: Linux moves at most 2 GiB a call);
 * -1 on an error or an early end of file (errno EIO). */
int fsdp_pread_all(int fd, void *buf, size_t n, uint64_t off);

/* What a file of this mode is, for a message: "a FIFO", "a directory", ... */
const char *fsdp_file_kind(mode_t mode);
/* Opens a file a user named for reading, a regular file only, and never
 * blocks doing it: the type is checked first (a device is never even
 * opened), the open is O_NONBLOCK (a FIFO swapped in after that check
 * cannot hang open()) and fstat of what was opened decides.
 *   0: *fd (O_RDONLY | O_NONBLOCK | O_CLOEXEC; reads of a regular file
 *      never block anyway), its size in *size if size is non-NULL;
 *   FSDP_NOT_REGULAR: "PATH: is a FIFO, not a regular file (WHAT is one)"
 *      in err;
 *   -1: "PATH: cannot open: ..." (or stat) in err, errno set. */
int fsdp_open_regular(const char *path, const char *what, int *fd, uint64_t *size, char *err);

/* Monotonic seconds. */
double fsdp_now(void);
/* Seconds since the Unix epoch (the wall clock: it may jump). */
double fsdp_unix_now(void);

/* The 2n lowercase hex digits of p[0..n) and a NUL into out (2n + 1 bytes). */
void fsdp_hex(const void *p, size_t n, char *out);
/* The n bytes written as exactly 2n lowercase hex digits in s (the form
 * fsdp_hex writes) into out; -1 for anything else (NULL, another length,
 * an uppercase digit), with out left partly written. */
int fsdp_unhex(const char *s, size_t n, void *out);
/* The SHA-256 of p[0..n) as 64 lowercase hex digits and a NUL; -1 when
 * OpenSSL fails (its one-shot calls allocate inside). */
int fsdp_sha256_hex(const void *p, size_t n, char out[65]);

/* Parses a whole decimal string into a number in [lo, hi]; -1 if it is not one. */
int fsdp_parse_i64(const char *s, long long lo, long long hi, long long *out);
int fsdp_parse_f64(const char *s, double *out);
/* "90", "90s", "45m", "1.5h", "2d": seconds in (0, 10 years]; -1 if not one. */
int fsdp_parse_duration(const char *s, double *secs);

/* url as it may be printed: its user information ("user:password@" in
 * scheme://user:password@host/...; everything up to the last '@', since
 * passwords are written with '/' and '@' unencoded) replaced by "***@",
 * anything else copied (cut to n - 1 bytes). Returns out. */
const char *fsdp_url_redact(const char *url, char *out, size_t n);

/* bf16 is the upper half of a float: widening is exact; rounding is to
 * nearest even, and a NaN stays a NaN (the kernels' to_bf16, one value). */
static inline float fsdp_bf16_widen(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static inline uint16_t fsdp_bf16_round(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    uint32_t u = v.u;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* IEEE half precision in integers (a compiler without _Float16 gets the
 * same bits): rounding is to nearest even, 65520 and up become an
 * infinity, a NaN stays a NaN; widening is exact. */
static inline uint16_t fsdp_fp16_round(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    const uint16_t sign = (uint16_t)((v.u >> 16) & 0x8000u);
    const uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* a normal half: 13 bits dropped, rounded to even */
        uint32_t r = a - 0x38000000u;
        return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    }
    if (a < 0x33000000u) /* below 2^-25 (and 2^-25 itself, to even): zero */
        return sign;
    /* a subnormal half: the value in units of 2^-24, rounded to even */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += rem > half || (rem == half && (q & 1u));
    return sign | (uint16_t)q;
}

static inline float fsdp_fp16_widen(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    union {
        uint32_t u;
        float f;
    } v;
    if (e == 0x1f)
        v.u = sign | 0x7f800000u | (m << 13);
    else if (e)
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    else {
        v.f = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        v.u |= sign;
    }
    return v.f;
}

/* A whole file written at a path the user named (outfile.c says the rule):
 * what exists there and is not a regular file is never replaced, an
 * existing regular file only when replace is 1; the bytes go to a hidden
 * temporary beside it, renamed into place (and the directory fsynced) only
 * when complete. */
struct fsdp_outfile {
    char path[4096], tmp[4200];
    int fd;
};
/* The check alone, for a program that refuses before doing the work. */
int fsdp_outfile_check(const char *path, int replace, char *err);
int fsdp_outfile_open(struct fsdp_outfile *o, const char *path, int replace, char *err);
int fsdp_outfile_write(struct fsdp_outfile *o, const void *p, size_t n, char *err);
/* ok: fsync, close, rename into place; else close and remove the
 * temporary. Returns 0 only when the file is in place. */
int fsdp_outfile_close(struct fsdp_outfile *o, int ok, char *err);
/* 1 when a and b name the same file: the same inode when both exist (a
 * hard link, "./x" and "x"), the same directory entry when neither does. */
int fsdp_same_file(const char *a, const char *b);

#endif
