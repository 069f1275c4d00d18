/*
 * opts.h - the command line of every program here, as a table.
 *
 * A program lists its flags as an array of struct opt: the flag, the kind of
 * value it takes, the bounds, where the value goes in the program's options
 * struct (offsetof) and one line of help. opts_parse walks argv against the
 * table and fills the struct; opts_usage prints the same table as --help.
 *
 * A flag is matched whole and takes its value from the next argument
 * ("--steps 5": never "--step 5" or "--steps=5", so that fsdp-super's scan
 * of the trainer's arguments reads them as the trainer does); a value may
 * start with '-' ("--bucket-mib -1" is refused for its bound, not taken for
 * a flag). What the flags mean together is the program's to check.
 *
 * Depends on libc and util.h only.
 */
#ifndef FSDP_OPTS_H
#define FSDP_OPTS_H

#include <stddef.h>
#include <stdio.h>

enum opt_kind {
    OPT_STR,      /* const char *: the argument as given */
    OPT_INT,      /* int: an integer in [min, max] */
    OPT_LLONG,    /* long long: an integer in [min, max] */
    OPT_NUM,      /* double: a number in [lo, hi], or (lo, hi) with .open */
    OPT_DURATION, /* double: seconds from 90, 90s, 45m, 1.5h, 2d */
    OPT_WORD,     /* int: the index of the argument in .words */
    OPT_PARSE,    /* .parse turns the argument into the field */
    OPT_SWITCH,   /* int: set to 1; the flag takes no argument */
    OPT_HELP,     /* opts_parse stops and returns OPTS_HELP */
    OPT_SECTION,  /* no flag: a heading (.help) in the usage text */
};

struct opt {
    const char *flag; /* "--steps" */
    enum opt_kind kind;
    size_t off;           /* offsetof the field in the options struct */
    long long min, max;   /* OPT_INT, OPT_LLONG */
    double lo, hi;        /* OPT_NUM */
    int open;             /* OPT_NUM: lo and hi themselves are refused */
    const char *words[4]; /* OPT_WORD: the names of 0, 1, ... (unused: NULL) */
    /* OPT_PARSE: 0, or non-zero with a message in err, or with err left
     * empty for "FLAG 'ARG' is not EXPECT" */
    int (*parse)(void *field, const char *arg, char *err);
    const char *expect; /* OPT_PARSE, OPT_WORD (else the words are listed) */
    const char *arg;    /* usage: what the argument is ("N", "FILE") */
    const char *help;   /* usage: what the flag does, lines split by '\n';
                           NULL: the flag is not listed */
};

#define OPTS_LEN(table) (sizeof(table) / sizeof((table)[0]))

enum { OPTS_OK = 0, OPTS_HELP = 1 };

/* Parses the flags from argv[*next] on into dst, stopping at the first
 * argument that is neither a flag of the table nor starts with "--" (an
 * operand, "-x") or that is "--" itself; *next is left on it (argc at the
 * end). Returns OPTS_OK, OPTS_HELP (*next on the help flag), or -1 with one
 * line in err (FSDP_ERR_LEN) naming the flag and the bad value: an unknown
 * flag, a missing value, a value out of bounds. */
int opts_parse(const struct opt *t, size_t n, void *dst, int argc, char **argv, int *next,
               char *err);

/* The row of flag (matched whole), or NULL. */
const struct opt *opts_find(const struct opt *t, size_t n, const char *flag);

/* The table as usage lines: "  FLAG ARG" padded to `width` columns, then
 * the help, its later lines under its first; sections as headings. */
void opts_usage(FILE *f, const struct opt *t, size_t n, int width);

#endif
