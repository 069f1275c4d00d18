/*
 * data_main.c - fsdp-data: turns UTF-8 text into token files.
 *
 *   fsdp-data prepare --out FILE [--val-out FILE] [--val-fraction F]
 *                     [--doc-sep LINE] [--token-dtype uint16|uint32]
 *                     [--format bin|hdf5] [--h5-dataset NAME] INPUT...
 *
 * Tokens are bytes (vocabulary 256). Each input file is one document, or
 * several when --doc-sep names a line that separates documents (fortune
 * files use "%"). Every document is preceded by the end-of-text token 0,
 * which is why text containing NUL bytes is refused. The validation split is
 * deterministic: a document goes to the validation file when a hash of its
 * index falls below the fraction.
 */
#include "data.h"
#include "opts.h"
#include "util.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tokens {
    uint16_t *v;
    size_t n, cap;
};

static int push(struct tokens *t, const unsigned char *p, size_t n, char *err)
{
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1 << 16;
        while (cap < t->n + n + 1)
            cap *= 2;
        uint16_t *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return fsdp_err(err, "out of memory at %zu tokens", t->n);
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = DATA_EOT;
    for (size_t i = 0; i < n; i++)
        t->v[t->n++] = p[i];
    return 0;
}

/* Returns the offset of the first byte that is not valid UTF-8 (or is NUL),
 * or n when all of it is valid. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned min;
        if (c == 0)
            return i;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, min = 0x80, c &= 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, min = 0x800, c &= 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, min = 0x10000, c &= 0x07;
        } else {
            return i;
        }
        if (i + len > n)
            return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            c = c << 6 | (s[i + k] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return i;
        i += len;
    }
    return n;
}

static int read_file(const char *path, unsigned char **out, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fsdp_err(err, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        unsigned char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f), e = errno; /* EISDIR for a directory */
    fclose(f);
    if (!buf)
        return fsdp_err(err, "%s: out of memory", path);
    if (bad) {
        free(buf);
        return fsdp_err(err, "%s: cannot read: %s", path, strerror(e ? e : EIO));
    }
    *out = buf;
    *len = n;
    return 0;
}

struct split {
    struct tokens train, val;
    double val_fraction;
    size_t docs, val_docs;
};

static int add_document(struct split *s, const unsigned char *p, size_t n, char *err)
{
    if (n == 0)
        return 0;
    uint64_t h = fsdp_mix64(0xd0c5517eULL ^ s->docs);
    int to_val = (double)(h >> 11) * (1.0 / 9007199254740992.0) < s->val_fraction;
    s->docs++;
    s->val_docs += (size_t)to_val;
    return push(to_val ? &s->val : &s->train, p, n, err);
}

static int split_file(struct split *s, const char *path, const char *sep, char *err)
{
    unsigned char *buf = NULL;
    size_t n = 0;
    if (read_file(path, &buf, &n, err))
        return -1;
    size_t bad = utf8_check(buf, n);
    if (bad < n) {
        int rc = fsdp_err(err, "%s: byte %zu: %s", path, bad,
                          buf[bad] == 0 ? "NUL byte (reserved for end-of-text)"
                                        : "not valid UTF-8 text");
        free(buf);
        return rc;
    }
    int rc = 0;
    if (!sep) {
        rc = add_document(s, buf, n, err);
    } else {
        size_t seplen = strlen(sep), start = 0, i = 0;
        while (i <= n && !rc) {
            size_t eol = i;
            while (eol < n && buf[eol] != '\n')
                eol++;
            if (eol - i == seplen && memcmp(buf + i, sep, seplen) == 0) {
                rc = add_document(s, buf + start, i - start, err);
                start = eol + 1 < n ? eol + 1 : n;
            }
            i = eol + 1;
        }
        if (!rc && start < n)
            rc = add_document(s, buf + start, n - start, err);
    }
    free(buf);
    return rc;
}

struct data_opts {
    const char *out, *val_out, *sep;
    double frac;
    int wide; /* --token-dtype uint32 */
    int hdf5; /* --format hdf5 */
    const char *dataset;
};

static const struct opt data_flags[] = {
    {"--out", OPT_STR, offsetof(struct data_opts, out), .arg = "FILE", .help = "training tokens"},
    {"--val-out", OPT_STR, offsetof(struct data_opts, val_out), .arg = "FILE",
     .help = "validation tokens (a deterministic split of documents)"},
    {"--val-fraction", OPT_NUM, offsetof(struct data_opts, frac), .lo = 0, .hi = 1, .open = 1,
     .arg = "F", .help = "share of documents for validation (default 0.05)"},
    {"--doc-sep", OPT_STR, offsetof(struct data_opts, sep), .arg = "LINE",
     .help = "a line that separates documents inside a file (e.g. %)"},
    {"--token-dtype", OPT_WORD, offsetof(struct data_opts, wide), .words = {"uint16", "uint32"},
     .arg = "uint16|uint32",
     .help = "uint16: llm.c's GPT-2 files (magic 20240520); uint32:\n"
             "its Llama 3 files (magic 20240801), the layout\n"
             "vocabularies over 65,536 need (default uint16)"},
    {"--format", OPT_WORD, offsetof(struct data_opts, hdf5), .words = {"bin", "hdf5"},
     .arg = "bin|hdf5",
     .help = "bin: llm.c's token files (default); hdf5: an HDF5\n"
             "file with one 1-D dataset of the tokens, chunked"},
    {"--h5-dataset", OPT_STR, offsetof(struct data_opts, dataset), .arg = "NAME",
     .help = "the HDF5 dataset's name (default tokens)"},
    {"--help", OPT_HELP, .help = NULL},
};

static void usage(void)
{
    printf("usage: fsdp-data prepare --out FILE [--val-out FILE] [--val-fraction F]\n"
           "                         [--doc-sep LINE] [--token-dtype uint16|uint32]\n"
           "                         [--format bin|hdf5] [--h5-dataset NAME] INPUT...\n"
           "\n"
           "Turns UTF-8 text files into byte-level token files in llm.c's format\n"
           "(vocabulary 256, token 0 = end of text before every document).\n");
    opts_usage(stdout, data_flags, OPTS_LEN(data_flags), 19);
}

/* prepare's flags, then its inputs from *first: 0 to run, 1 after --help,
 * -1 after a message */
static int parse_prepare(struct data_opts *o, int argc, char **argv, int *first)
{
    char err[FSDP_ERR_LEN];
    *o = (struct data_opts){.frac = 0.05};
    *first = 2;
    int rc = opts_parse(data_flags, OPTS_LEN(data_flags), o, argc, argv, first, err);
    if (rc == OPTS_HELP) {
        usage();
        return 1;
    }
    if (!rc && *first < argc && strcmp(argv[*first], "--") == 0)
        rc = fsdp_err(err, "unknown option '--'");
    if (!rc && (!o->out || *first == argc))
        rc = fsdp_err(err, "--out FILE and at least one INPUT are required");
    if (!rc && o->dataset && !o->hdf5)
        rc = fsdp_err(err, "--h5-dataset names a dataset of --format hdf5");
    if (rc)
        fprintf(stderr, "fsdp-data: %s (see fsdp-data --help)\n", err);
    return rc;
}

int main(int argc, char **argv)
{
    char err[FSDP_ERR_LEN];
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage();
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "prepare") != 0) {
        fprintf(stderr, "fsdp-data: expected the command 'prepare' (see fsdp-data --help)\n");
        return 2;
    }
    struct data_opts o;
    int first_input, prc = parse_prepare(&o, argc, argv, &first_input);
    if (prc)
        return prc > 0 ? 0 : 2;
    const char *out = o.out, *val_out = o.val_out, *sep = o.sep;
    double frac = o.frac;
    struct split s = {.val_fraction = val_out ? frac : 0.0};
    /* before any work: an output that is not a regular file is refused */
    int rc = token_file_check_output(out, err);
    if (!rc && val_out)
        rc = token_file_check_output(val_out, err);
    if (!rc && val_out && fsdp_same_file(out, val_out))
        rc = fsdp_err(err, "--out %s and --val-out %s are the same file: the two splits need two",
                      out, val_out);
    for (int i = first_input; i < argc && !rc; i++)
        for (int k = 0; k < 2 && !rc; k++) {
            const char *o_ = k ? val_out : out;
            if (o_ && fsdp_same_file(o_, argv[i]))
                rc = fsdp_err(err, "%s %s is the input %s: refusing to write over an input",
                              k ? "--val-out" : "--out", o_, argv[i]);
        }
    for (int i = first_input; i < argc && !rc; i++)
        rc = split_file(&s, argv[i], sep, err);
    if (!rc && s.train.n == 0)
        rc = fsdp_err(err, "no training text: the inputs hold no documents");
    if (!rc && val_out && s.val.n == 0)
        rc = fsdp_err(err,
                      "the validation split is empty (%zu documents; use --doc-sep, more "
                      "inputs or a larger --val-fraction)",
                      s.docs);
    const int width = o.wide ? 4 : 2;
    if (!rc)
        rc = o.hdf5 ? token_file_write_hdf5(out, o.dataset, s.train.v, s.train.n, width, err)
                    : token_file_write(out, s.train.v, s.train.n, width, err);
    if (!rc && val_out)
        rc = o.hdf5 ? token_file_write_hdf5(val_out, o.dataset, s.val.v, s.val.n, width, err)
                    : token_file_write(val_out, s.val.v, s.val.n, width, err);
    if (!rc)
        fprintf(stderr, "fsdp-data: %zu documents: %zu tokens -> %s", s.docs, s.train.n, out);
    if (!rc && val_out)
        fprintf(stderr, ", %zu documents: %zu tokens -> %s", s.val_docs, s.val.n, val_out);
    if (!rc)
        fputc('\n', stderr);
    free(s.train.v);
    free(s.val.v);
    if (rc) {
        fprintf(stderr, "fsdp-data: %s\n", err);
        return 1;
    }
    return 0;
}
