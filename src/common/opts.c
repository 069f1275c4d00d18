/*
 * opts.c - the option-table driver (opts.h).
 *
 * A plain loop over argv rather than getopt_long: getopt_long would also
 * take abbreviations ("--step" for "--steps"), "--flag=value" and reorder
 * argv, none of which these programs ever accepted.
 */
#include "opts.h"

#include "util.h"

#include <string.h>

const struct opt *opts_find(const struct opt *t, size_t n, const char *flag)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].flag && strcmp(t[i].flag, flag) == 0)
            return &t[i];
    return NULL;
}

/* "is not a or b", "is not one of a, b, c" */
static int bad_word(const struct opt *o, const char *v, char *err)
{
    if (o->expect)
        return fsdp_err(err, "%s '%s' is not %s", o->flag, v, o->expect);
    size_t n = 0;
    while (n < OPTS_LEN(o->words) && o->words[n])
        n++;
    if (n == 2)
        return fsdp_err(err, "%s '%s' is not %s or %s", o->flag, v, o->words[0], o->words[1]);
    char list[256] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 o->words[i]);
    return fsdp_err(err, "%s '%s' is not one of %s", o->flag, v, list);
}

static int set_word(const struct opt *o, void *field, const char *v, char *err)
{
    for (int i = 0; i < (int)OPTS_LEN(o->words) && o->words[i]; i++)
        if (strcmp(v, o->words[i]) == 0) {
            memcpy(field, &i, sizeof i);
            return 0;
        }
    return bad_word(o, v, err);
}

static int set_int(const struct opt *o, void *field, const char *v, char *err)
{
    long long x;
    if (fsdp_parse_i64(v, o->min, o->max, &x))
        return fsdp_err(err, "%s '%s' is not an integer in %lld..%lld", o->flag, v, o->min, o->max);
    if (o->kind == OPT_LLONG) {
        memcpy(field, &x, sizeof x);
    } else {
        int i = (int)x; /* the table's bounds keep it in range */
        memcpy(field, &i, sizeof i);
    }
    return 0;
}

static int set_num(const struct opt *o, void *field, const char *v, char *err)
{
    double x;
    int in =
        !fsdp_parse_f64(v, &x) && (o->open ? x > o->lo && x < o->hi : x >= o->lo && x <= o->hi);
    if (!in)
        return fsdp_err(err,
                        o->open ? "%s '%s' is not a number in (%g, %g)"
                                : "%s '%s' is not a number in %g..%g",
                        o->flag, v, o->lo, o->hi);
    memcpy(field, &x, sizeof x);
    return 0;
}

static int set_value(const struct opt *o, void *field, const char *v, char *err)
{
    double secs;
    switch (o->kind) {
    case OPT_STR:
        memcpy(field, &v, sizeof v);
        return 0;
    case OPT_INT:
    case OPT_LLONG:
        return set_int(o, field, v, err);
    case OPT_NUM:
        return set_num(o, field, v, err);
    case OPT_DURATION:
        if (fsdp_parse_duration(v, &secs))
            return fsdp_err(err, "%s '%s' is not a duration (90, 90s, 45m, 1.5h, 2d)", o->flag, v);
        memcpy(field, &secs, sizeof secs);
        return 0;
    case OPT_WORD:
        return set_word(o, field, v, err);
    case OPT_PARSE:
        err[0] = 0;
        if (o->parse(field, v, err) == 0)
            return 0;
        return err[0] ? -1 : fsdp_err(err, "%s '%s' is not %s", o->flag, v, o->expect);
    default:
        return fsdp_err(err, "%s: not a flag with a value", o->flag);
    }
}

int opts_parse(const struct opt *t, size_t n, void *dst, int argc, char **argv, int *next,
               char *err)
{
    int i = *next;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const struct opt *o = opts_find(t, n, a);
        if (!o && (strncmp(a, "--", 2) != 0 || !a[2]))
            break; /* an operand, or "--": the caller's */
        if (!o)
            return fsdp_err(err, "unknown option '%s'", a);
        if (o->kind == OPT_HELP) {
            *next = i;
            return OPTS_HELP;
        }
        if (o->kind == OPT_SWITCH) {
            int one = 1;
            memcpy((char *)dst + o->off, &one, sizeof one);
            continue;
        }
        if (i + 1 >= argc)
            return fsdp_err(err, "%s needs a value", a);
        if (set_value(o, (char *)dst + o->off, argv[++i], err))
            return -1;
    }
    *next = i;
    return OPTS_OK;
}

void opts_usage(FILE *f, const struct opt *t, size_t n, int width)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].kind == OPT_SECTION) {
            fprintf(f, "\n%s\n", t[i].help);
            continue;
        }
        if (!t[i].help)
            continue;
        char left[128];
        int w = snprintf(left, sizeof left, "%s%s%s", t[i].flag, t[i].arg ? " " : "",
                         t[i].arg ? t[i].arg : "");
        size_t first = strcspn(t[i].help, "\n"); /* the help's first line */
        if (w <= width)
            fprintf(f, "  %-*s ", width, left);
        else if (2 + (size_t)w + 2 + first <= 80)
            fprintf(f, "  %s  ", left);
        else /* the help under a long flag */
            fprintf(f, "  %s\n%*s", left, width + 3, "");
        for (const char *h = t[i].help; *h; h++) {
            if (*h == '\n')
                fprintf(f, "\n%*s", width + 3, "");
            else
                fputc(*h, f);
        }
        fputc('\n', f);
    }
}
