/*
 * test_opts.c - the option-table driver every program's command line runs
 * on (src/common/opts.h): what it accepts, what it refuses and how it says so.
 */
#include "check.h"
#include "opts.h"
#include "util.h"

#include <stddef.h>
#include <stdlib.h>

struct sample {
    const char *name;
    int count, mode, on, parsed;
    long long big;
    double rate, frac, secs;
};

static int parse_even(void *field, const char *v, char *err)
{
    (void)err;
    long long x;
    if (fsdp_parse_i64(v, 0, 100, &x) || x % 2)
        return -1;
    *(int *)field = (int)x;
    return 0;
}

static int parse_says_why(void *field, const char *v, char *err)
{
    (void)field;
    return fsdp_err(err, "--why '%s': a reason of its own", v);
}

#define AT(f) offsetof(struct sample, f)
static const struct opt flags[] = {
    {.kind = OPT_SECTION, .help = "things:"},
    {"--name", OPT_STR, AT(name), .arg = "NAME", .help = "a name"},
    {"--count", OPT_INT, AT(count), .min = -5, .max = 5, .arg = "N", .help = "a count"},
    {"--big", OPT_LLONG, AT(big), .min = 0, .max = INT64_MAX, .arg = "N", .help = "big"},
    {"--rate", OPT_NUM, AT(rate), .lo = 0, .hi = 1, .arg = "X", .help = "line one\nline two"},
    {"--frac", OPT_NUM, AT(frac), .lo = 0, .hi = 1, .open = 1, .help = NULL},
    {"--time", OPT_DURATION, AT(secs), .arg = "D", .help = "a duration"},
    {"--mode", OPT_WORD, AT(mode), .words = {"off", "on"}, .help = NULL},
    {"--layout", OPT_WORD, AT(mode), .words = {"a", "b", "c"}, .help = NULL},
    {"--even", OPT_PARSE, AT(parsed), .parse = parse_even, .expect = "an even number"},
    {"--why", OPT_PARSE, AT(parsed), .parse = parse_says_why},
    {"--on", OPT_SWITCH, AT(on), .help = "a switch"},
    {"--help", OPT_HELP, .help = NULL},
    {"-h", OPT_HELP, .help = NULL},
};

/* argv from a NULL-terminated list; returns opts_parse's status */
static int parse(struct sample *s, int *next, char *err, const char **args)
{
    static char *argv[32];
    int argc = 0;
    argv[argc++] = "prog";
    while (*args)
        argv[argc++] = (char *)*args++;
    *s = (struct sample){.count = 1, .rate = 0.5};
    *next = 1;
    err[0] = 0;
    return opts_parse(flags, OPTS_LEN(flags), s, argc, argv, next, err);
}

#define PARSE(...) parse(&s, &next, err, (const char *[]){__VA_ARGS__, NULL})

static void every_kind_lands_in_its_field(void)
{
    struct sample s;
    int next;
    char err[FSDP_ERR_LEN];
    int rc = PARSE("--name", "x", "--count", "-5", "--big", "9223372036854775807", "--rate", "1",
                   "--frac", "0.25", "--time", "1.5h", "--mode", "on", "--even", "42", "--on");
    REQUIRE(rc == OPTS_OK, "%s", err);
    CHECK(strcmp(s.name, "x") == 0 && s.count == -5 && s.big == INT64_MAX, "%d %lld", s.count,
          s.big);
    CHECK(s.rate == 1 && s.frac == 0.25 && s.secs == 5400, "%g %g %g", s.rate, s.frac, s.secs);
    CHECK(s.mode == 1 && s.parsed == 42 && s.on == 1 && next == 18, "%d %d %d %d", s.mode, s.parsed,
          s.on, next);
}

static void a_flag_not_given_keeps_its_default_and_the_last_one_given_wins(void)
{
    struct sample s;
    int next;
    char err[FSDP_ERR_LEN];
    REQUIRE(PARSE("--count", "2", "--count", "3") == OPTS_OK, "%s", err);
    CHECK(s.count == 3 && s.rate == 0.5 && !s.name, "%d %g", s.count, s.rate);
}

static void a_value_may_look_like_a_flag(void)
{
    struct sample s;
    int next;
    char err[FSDP_ERR_LEN];
    REQUIRE(PARSE("--name", "--help") == OPTS_OK, "%s", err);
    CHECK(strcmp(s.name, "--help") == 0, "%s", s.name);
}

static void parsing_stops_at_an_operand_or_a_double_dash(void)
{
    struct sample s;
    int next;
    char err[FSDP_ERR_LEN];
    CHECK(PARSE("--on", "file", "--count", "2") == OPTS_OK && next == 2 && s.count == 1, "%d",
          next);
    CHECK(PARSE("--on", "-x") == OPTS_OK && next == 2, "%d", next);
    CHECK(PARSE("--count", "2", "--", "--on") == OPTS_OK && next == 3 && !s.on, "%d", next);
}

static void help_stops_parsing_where_it_stands(void)
{
    struct sample s;
    int next;
    char err[FSDP_ERR_LEN];
    CHECK(PARSE("--on", "--help", "--count", "x") == OPTS_HELP && next == 2, "%d", next);
    CHECK(PARSE("-h") == OPTS_HELP, "-h");
    CHECK(PARSE("--count", "x", "--help") == -1, "an error before --help is the answer");
}

/* one line naming the flag and the value */
static void expect_error(const char **args, const char *want)
{
    struct sample s;
    int next;
    char err[FSDP_ERR_LEN];
    CHECK(parse(&s, &next, err, args) == -1, "%s accepted", args[0]);
    CHECK(strcmp(err, want) == 0, "got \"%s\", want \"%s\"", err, want);
}

#define EXPECT_ERROR(want, ...) expect_error((const char *[]){__VA_ARGS__, NULL}, want)

static void bad_input_is_one_line_naming_the_flag_and_value(void)
{
    EXPECT_ERROR("unknown option '--bogus'", "--bogus", "1");
    EXPECT_ERROR("--count needs a value", "--count");
    EXPECT_ERROR("--count '6' is not an integer in -5..5", "--count", "6");
    EXPECT_ERROR("--count '1.5' is not an integer in -5..5", "--count", "1.5");
    EXPECT_ERROR("--big '' is not an integer in 0..9223372036854775807", "--big", "");
    EXPECT_ERROR("--rate 'x' is not a number in 0..1", "--rate", "x");
    EXPECT_ERROR("--rate 'nan' is not a number in 0..1", "--rate", "nan");
    EXPECT_ERROR("--frac '1' is not a number in (0, 1)", "--frac", "1");
    EXPECT_ERROR("--time '5x' is not a duration (90, 90s, 45m, 1.5h, 2d)", "--time", "5x");
    EXPECT_ERROR("--mode 'maybe' is not off or on", "--mode", "maybe");
    EXPECT_ERROR("--layout 'd' is not one of a, b, c", "--layout", "d");
    EXPECT_ERROR("--even '3' is not an even number", "--even", "3");
    EXPECT_ERROR("--why 'x': a reason of its own", "--why", "x");
}

static void flags_match_whole_never_a_prefix_or_with_equals(void)
{
    EXPECT_ERROR("unknown option '--coun'", "--coun", "2");
    EXPECT_ERROR("unknown option '--count=2'", "--count=2");
    EXPECT_ERROR("unknown option '--counts'", "--counts", "2");
}

static void usage_lists_the_table_with_help_lines_aligned(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    opts_usage(f, flags, OPTS_LEN(flags), 12);
    fclose(f);
    const char *want = "\nthings:\n"
                       "  --name NAME  a name\n"
                       "  --count N    a count\n"
                       "  --big N      big\n"
                       "  --rate X     line one\n"
                       "               line two\n"
                       "  --time D     a duration\n"
                       "  --on         a switch\n";
    CHECK(strcmp(text, want) == 0, "got:\n%s", text);
    free(text);
}

CHECK_MAIN(TEST(every_kind_lands_in_its_field),
           TEST(a_flag_not_given_keeps_its_default_and_the_last_one_given_wins),
           TEST(a_value_may_look_like_a_flag), TEST(parsing_stops_at_an_operand_or_a_double_dash),
           TEST(help_stops_parsing_where_it_stands),
           TEST(bad_input_is_one_line_naming_the_flag_and_value),
           TEST(flags_match_whole_never_a_prefix_or_with_equals),
           TEST(usage_lists_the_table_with_help_lines_aligned))
