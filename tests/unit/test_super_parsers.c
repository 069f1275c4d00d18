/*
 * test_super_parsers.c - the parsers of everything fsdp-super reads from
 * outside, fed hostile bytes: the ranks' datagrams (src/hbmsg.h, with the
 * rank's own heartbeat thread on the other end), the host file, spot
 * notices, event-log strings, and the chaos plan. Each test is one
 * behaviour and sets up what it needs.
 */
#include "chaos.h"
#include "check.h"
#include "hbmsg.h"
#include "heartbeat.h"
#include "super.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int parse(const char *s, struct hbmsg *m) { return hbmsg_parse(s, strlen(s), m); }

/* ---- datagrams ------------------------------------------------------------------ */

static void a_formatted_heartbeat_parses_back_for_every_phase(void)
{
    for (int p = 0; p < HB_NPHASES; p++) {
        char buf[HBMSG_MAX_LEN + 1];
        int n = hbmsg_format_beat(buf, sizeof buf, HBMSG_MAX_GENERATION, 255, 4194304,
                                  UINT64_C(123456789012), (enum hb_phase)p, UINT64_MAX);
        REQUIRE(n > 0, "format of phase %d", p);
        struct hbmsg m;
        REQUIRE(hbmsg_parse(buf, (size_t)n, &m) == 0, "%s", buf);
        CHECK(m.kind == HBMSG_BEAT && m.generation == HBMSG_MAX_GENERATION && m.rank == 255 &&
                  m.pid == 4194304 && m.step == UINT64_C(123456789012) &&
                  m.phase == (enum hb_phase)p && m.progress == UINT64_MAX,
              "%s", buf);
    }
    CHECK(hbmsg_format_beat(NULL, 0, 1, 0, 1, 0, HB_NPHASES, 0) == -1, "a phase out of range");
}

static void malformed_heartbeats_are_dropped(void)
{
    static const char *bad[] = {
        "",
        " ",
        "fsdp-hb",
        "fsdp-hb 1 0 100 5 train",      /* a field short */
        "fsdp-hb 1 0 100 5 train 7 8",  /* one too many */
        "fsdp-hb 1 0 100 5 tr\"ain 7",  /* a phase with a quote */
        "fsdp-hb 1 0 100 5 training 7", /* not a phase */
        "fsdp-hb 1 0 100 5 TRAIN 7",
        "fsdp-hb 1 0 100 5 train\n7",
        "fsdp-hb 1 0 100 5 train 7\n",
        "fsdp-hb  1 0 100 5 train 7", /* two spaces */
        " fsdp-hb 1 0 100 5 train 7",
        "fsdp-hb 1 0 100 5 train 7 ",
        "fsdp-hb -1 0 100 5 train 7", /* signs */
        "fsdp-hb +1 0 100 5 train 7",
        "fsdp-hb 1 -1 100 5 train 7",
        "fsdp-hb 1 0 -100 5 train 7",
        "fsdp-hb 1 0 0 5 train 7",            /* pid 0 */
        "fsdp-hb 1 2147483648 100 5 train 7", /* rank beyond int */
        "fsdp-hb 1 0 2147483648 5 train 7",
        "fsdp-hb 9223372036854775808 0 100 5 train 7",  /* generation >= 2^63 */
        "fsdp-hb 18446744073709551616 0 100 5 train 7", /* beyond 64 bits */
        "fsdp-hb 99999999999999999999999 0 100 5 train 7",
        "fsdp-hb 1 0 100 9223372036854775808 train 7",
        "fsdp-hb 1 0 100 5 train 18446744073709551616",
        "fsdp-hb 0x10 0 100 5 train 7",
        "fsdp-hb 1 0 100 5 train 7e3",
        "fsdp-hb 1 0 100 5 tr\xc3\xa4in 7",
        "fsdp-HB 1 0 100 5 train 7",
        "fsdp-xx 1 0 100 5 train 7",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct hbmsg m;
        m.rank = 42;
        CHECK(parse(bad[i], &m) == -1, "accepted '%s'", bad[i]);
        CHECK(m.rank == 0 && m.generation == 0, "a rejected message left fields behind");
    }
}

static void the_parser_reads_only_len_bytes_and_refuses_a_nul(void)
{
    const char *ok = "fsdp-hb 3 1 100 5 train 7";
    char buf[64];
    memset(buf, 'x', sizeof buf); /* no terminator anywhere */
    memcpy(buf, ok, strlen(ok));
    struct hbmsg m;
    CHECK(hbmsg_parse(buf, strlen(ok), &m) == 0 && m.progress == 7, "exact length");
    CHECK(hbmsg_parse(buf, strlen(ok) - 2, &m) == -1, "cut to a trailing space");
    CHECK(hbmsg_parse(buf, strlen(ok) + 1, &m) == -1, "a trailing byte");
    char nul[] = "fsdp-hb 3 1 100 5 train 7\0 8";
    CHECK(hbmsg_parse(nul, sizeof nul - 1, &m) == -1, "a NUL inside");
    CHECK(hbmsg_parse(NULL, 0, &m) == -1, "NULL");
    static char big[HBMSG_MAX_LEN + 2];
    memset(big, '1', sizeof big);
    memcpy(big, "fsdp-hb 3 1 100 5 train ", 24);
    CHECK(hbmsg_parse(big, sizeof big, &m) == -1, "too long");
}

static void events_parse_into_keys_and_values(void)
{
    struct hbmsg m;
    REQUIRE(parse("fsdp-ev 4 0 load_verified step=120 from=2 to=3 digest=equal", &m) == 0, "event");
    CHECK(m.kind == HBMSG_EVENT && m.generation == 4 && m.rank == 0, "header");
    CHECK(strcmp(m.name, "load_verified") == 0 && m.nkv == 4, "%s %d", m.name, m.nkv);
    uint64_t v;
    CHECK(hbmsg_event_u64(&m, "step", &v) == 0 && v == 120, "step");
    CHECK(hbmsg_event_u64(&m, "digest", &v) == -1, "a word is not a number");
    CHECK(hbmsg_event_u64(&m, "nope", &v) == -1, "absent");
    CHECK(strcmp(hbmsg_event_str(&m, "digest"), "equal") == 0, "digest");
    REQUIRE(parse("fsdp-ev 4 1 done", &m) == 0, "an event without pairs");
    CHECK(m.nkv == 0, "no pairs");
    char buf[HBMSG_MAX_LEN + 1];
    int n = hbmsg_format_event(buf, sizeof buf, 9, 2, "resumed step=5 world=2");
    REQUIRE(n > 0 && hbmsg_parse(buf, (size_t)n, &m) == 0, "%s", buf);
    CHECK(m.generation == 9 && m.rank == 2 && hbmsg_event_u64(&m, "world", &v) == 0 && v == 2,
          "round trip");
}

static void malformed_events_are_dropped(void)
{
    static const char *bad[] = {
        "fsdp-ev 4 0",
        "fsdp-ev 4 0 Resumed step=1",
        "fsdp-ev 4 0 resumed step",
        "fsdp-ev 4 0 resumed step=",
        "fsdp-ev 4 0 resumed =1",
        "fsdp-ev 4 0 resumed step=1=2",
        "fsdp-ev 4 0 resumed step=a\"b",
        "fsdp-ev 4 0 resumed step=\\u0000",
        "fsdp-ev 4 0 resumed st-ep=1",
        "fsdp-ev 4 0 resumed step=1 a=1 b=1 c=1 d=1 e=1 f=1 g=1 h=1", /* 9 pairs */
        "fsdp-ev 4 0 a_name_that_is_far_too_long_to_keep step=1",
        "fsdp-ev 4 0 resumed step=12345678901234567890123456789012345678901234567890"
        "12345678901234",
        "fsdp-ev 4 0 resumed step=\xff\xfe",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct hbmsg m;
        CHECK(parse(bad[i], &m) == -1, "accepted '%s'", bad[i]);
    }
}

static void numbers_are_digits_only_and_in_range(void)
{
    uint64_t v;
    CHECK(hbmsg_parse_uint("18446744073709551615", 20, UINT64_MAX, &v) == 0 && v == UINT64_MAX,
          "the largest");
    CHECK(hbmsg_parse_uint("18446744073709551616", 20, UINT64_MAX, &v) == -1, "wraps");
    CHECK(hbmsg_parse_uint("000000000000000000001", 21, UINT64_MAX, &v) == -1, "21 digits");
    CHECK(hbmsg_parse_uint("", 0, UINT64_MAX, &v) == -1, "empty");
    CHECK(hbmsg_parse_uint("11", 2, 10, &v) == -1, "above max");
    static const char *bad_gen[] = {"",
                                    "0",
                                    "-1",
                                    "+1",
                                    " 1",
                                    "1 ",
                                    "1x",
                                    "0x1",
                                    "9223372036854775808",
                                    "18446744073709551616",
                                    "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad_gen / sizeof bad_gen[0]; i++)
        CHECK(hbmsg_parse_generation(bad_gen[i], &v) == -1, "generation '%s'", bad_gen[i]);
    CHECK(hbmsg_parse_generation("9223372036854775807", &v) == 0 && v == HBMSG_MAX_GENERATION,
          "2^63-1");
    CHECK(hbmsg_parse_generation("007", &v) == 0 && v == 7, "leading zeros");
}

/* ---- the rank's side ------------------------------------------------------------- */

static int listen_udp(char *addr, size_t n)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        return -1;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    snprintf(addr, n, "127.0.0.1:%d", ntohs(a.sin_port));
    return fd;
}

/* The next datagram of the given kind, parsed; -1 after 2 s of nothing. */
static int receive(int fd, enum hbmsg_kind kind, struct hbmsg *m)
{
    char buf[HBMSG_MAX_LEN + 1];
    for (int i = 0; i < 100; i++) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0)
            return -1;
        if (hbmsg_parse(buf, (size_t)n, m) == 0 && m->kind == kind)
            return 0;
    }
    return -1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void the_heartbeat_thread_speaks_the_parsers_language(void)
{
    char addr[64];
    int fd = listen_udp(addr, sizeof addr);
    REQUIRE(fd >= 0, "socket");
    setenv("FSDP_SUPER_ADDR", addr, 1);
    setenv("FSDP_GENERATION", "7", 1);
    hb_set(5, HB_HOLD);
    char err[512];
    REQUIRE(hb_start(3, err) == 0, "%s", err);
    struct hbmsg m;
    CHECK(receive(fd, HBMSG_BEAT, &m) == 0 && m.generation == 7 && m.rank == 3 &&
              m.pid == (int)getpid() && m.step == 5 && m.phase == HB_HOLD,
          "heartbeat");
    hb_event("resumed step=%d world=%d", 5, 2);
    uint64_t v;
    CHECK(receive(fd, HBMSG_EVENT, &m) == 0 && strcmp(m.name, "resumed") == 0 &&
              hbmsg_event_u64(&m, "world", &v) == 0 && v == 2,
          "event");
    hb_stop();
    close(fd);
    unsetenv("FSDP_SUPER_ADDR");
}

static void hb_stop_wakes_the_thread_instead_of_waiting_out_its_sleep(void)
{
    char addr[64];
    int fd = listen_udp(addr, sizeof addr);
    REQUIRE(fd >= 0, "socket");
    setenv("FSDP_SUPER_ADDR", addr, 1);
    /* each start sends a beat and sleeps 250 ms: ten stops that waited the
     * sleep out would take 2.5 s; woken, they take milliseconds (the bound
     * is generous for a loaded machine) */
    double t0 = now();
    for (int i = 0; i < 10; i++) {
        char err[512];
        REQUIRE(hb_start(0, err) == 0, "%s", err);
        struct hbmsg m;
        CHECK(receive(fd, HBMSG_BEAT, &m) == 0, "beat %d", i);
        hb_stop();
    }
    double took = now() - t0;
    CHECK(took < 1.2, "10 start/stop cycles took %.2f s", took);
    close(fd);
    unsetenv("FSDP_SUPER_ADDR");
}

/* ---- the host file ---------------------------------------------------------------- */

static int hosts(const char *text, struct host *h, int *nh, int *total, char *err)
{
    return super_parse_hosts(text, strlen(text), "hosts", h, SUPER_MAX_HOSTS, nh, total, err,
                             SUPER_ERR_LEN);
}

static void host_lines_in_every_form(void)
{
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[SUPER_ERR_LEN] = "";
    const char *text = "# the fleet\n"
                       "node-1 4\n"
                       "  node-2\tslots=2   # two\r\n"
                       "\n"
                       "node-3\n"
                       "node-4 0\n"
                       "10.0.0.5 4096";
    REQUIRE(hosts(text, h, &nh, &total, err) == 0, "%s", err);
    CHECK(nh == 4 && total == 4 + 2 + 1 + 4096, "%d hosts, %d slots", nh, total);
    CHECK(strcmp(h[1].name, "node-2") == 0 && h[1].slots == 2, "%s %d", h[1].name, h[1].slots);
    CHECK(strcmp(h[3].name, "10.0.0.5") == 0, "%s", h[3].name);
    CHECK(hosts("", h, &nh, &total, err) == 0 && nh == 0 && total == 0, "empty");
}

static void bad_host_lines_are_named_by_file_and_line(void)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"a 1\nb 2147483647\nc 2147483647\n", "hosts:2: slots"},
        {"a 4097\n", "hosts:1: slots"},
        {"a -1\n", "hosts:1: slots"},
        {"a +1\n", "hosts:1: slots"},
        {"a 1x\n", "hosts:1: slots"},
        {"a slots=\n", "hosts:1: slots"},
        {"a slots=99999999999999999999999\n", "hosts:1: slots"},
        {"a 1 2\n", "hosts:1: expected"},
        {"a b c d\n", "hosts:1: expected"},
        {"a;rm 1\n", "hosts:1: a host name"},
        {"a\"b 1\n", "hosts:1: a host name"},
        {"\xff 1\n", "hosts:1: a host name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct host h[SUPER_MAX_HOSTS];
        int nh, total;
        char err[SUPER_ERR_LEN] = "";
        int rc = hosts(bad[i].text, h, &nh, &total, err);
        CHECK(rc == -1 && strstr(err, bad[i].want), "case %zu: rc %d, '%s'", i, rc, err);
    }
    static const char nul[] = "ok 1\n\nx\0y 1\n";
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[SUPER_ERR_LEN];
    CHECK(super_parse_hosts(nul, sizeof nul - 1, "hosts", h, SUPER_MAX_HOSTS, &nh, &total, err,
                            sizeof err) == -1 &&
              strstr(err, "hosts:3: a NUL byte"),
          "%s", err);
    char name[200];
    memset(name, 'n', sizeof name - 3);
    memcpy(name + sizeof name - 3, " 1", 3);
    CHECK(hosts(name, h, &nh, &total, err) == -1 && strstr(err, "too long"), "%s", err);
}

static void the_slot_total_cannot_overflow(void)
{
    /* the most a file may offer: every host at the bound */
    static char text[SUPER_MAX_HOSTS * 16 + 16];
    size_t at = 0;
    for (int i = 0; i < SUPER_MAX_HOSTS; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "h%d %d\n", i, SUPER_MAX_SLOTS);
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[SUPER_ERR_LEN] = "";
    REQUIRE(hosts(text, h, &nh, &total, err) == 0, "%s", err);
    CHECK(nh == SUPER_MAX_HOSTS && total == SUPER_MAX_HOSTS * SUPER_MAX_SLOTS, "%d", total);
    snprintf(text + at, sizeof text - at, "one-more 1\n");
    CHECK(hosts(text, h, &nh, &total, err) == -1 && strstr(err, "hosts:65: more than 64"), "%s",
          err);
    /* a host with 0 slots is not a host, and does not count against the bound */
    snprintf(text + at, sizeof text - at, "idle 0\n");
    CHECK(hosts(text, h, &nh, &total, err) == 0, "%s", err);
}

static void a_missing_host_file_is_an_error(void)
{
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[SUPER_ERR_LEN] = "";
    CHECK(super_read_hosts("/nonexistent/hosts", h, SUPER_MAX_HOSTS, &nh, &total, err,
                           sizeof err) == -1 &&
              strstr(err, "/nonexistent/hosts"),
          "%s", err);
}

/* ---- spot notices ----------------------------------------------------------------- */

static int notice(const char *body, char *when)
{
    return super_parse_notice(body, strlen(body), when, 64);
}

static void spot_notices_and_what_is_not_one(void)
{
    char when[64];
    CHECK(notice("{\"action\":\"terminate\",\"time\":\"2024-01-01T00:00:00Z\"}", when) == 1 &&
              strcmp(when, "2024-01-01T00:00:00Z") == 0,
          "terminate");
    CHECK(notice("{\"action\":\"stop\"}", when) == 1 && when[0] == 0, "no time");
    CHECK(notice("{\"action\":\"hibernate\",\"time\":7}", when) == 1 && when[0] == 0, "a number");
    CHECK(notice("{\"action\":\"none\"}", when) == 0, "another action");
    CHECK(notice("{\"action\":\"terminate\",\"time\":\"\\u001b[31mred\"}", when) == 1 &&
              when[0] == 0,
          "an escape sequence is not kept");
    CHECK(notice("{\"action\":\"terminate\",\"time\":\"x\\\",\\\"evil\\\":\\\"1\"}", when) == 1 &&
              strcmp(when, "x\",\"evil\":\"1") == 0,
          "quotes are text: %s", when);
    static const char *bad[] = {"",
                                "null",
                                "[]",
                                "\"terminate\"",
                                "{\"action\":1}",
                                "{\"action\":\"terminate\"",
                                "{\"action\":\"terminate\"}x",
                                "{\"action\":\"stop\",\"action\":\"terminate\"}",
                                "{\"action\":\"termin\xff\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(notice(bad[i], when) == -1, "accepted '%s'", bad[i]);
    /* the length given is the body: nothing past it is read */
    const char *body = "{\"action\":\"stop\"}{\"action\":1}";
    CHECK(super_parse_notice(body, 17, when, sizeof when) == 1, "the first 17 bytes");
}

/* ---- event-log strings -------------------------------------------------------------- */

static void any_bytes_become_a_json_string(void)
{
    json_t *t = ev_text("ok \xc3\xa4 \xff\xfe \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \"\n");
    REQUIRE(t, "ev_text");
    CHECK(strcmp(json_string_value(t), "ok \xc3\xa4 ?? ?? ??? ???? \"\n") == 0, "'%s'",
          json_string_value(t));
    char *s = json_dumps(t, JSON_ENCODE_ANY);
    CHECK(s && strchr(s, '\n') == NULL, "a line break survives: %s", s);
    free(s);
    json_decref(t);
}

/* ---- the chaos plan ------------------------------------------------------------------- */

static void chaos_faults_land_on_increasing_steps_within_the_run(void)
{
    struct super_opts o = {.np = 2, .min_np = 1, .ckpt = "ck", .hosts = "h", .train_steps = 1000};
    char err[SUPER_ERR_LEN] = "";
    for (uint64_t seed = 1; seed <= 20; seed++) {
        struct chaos c;
        char spec[128];
        snprintf(spec, sizeof spec,
                 "seed=%llu,kill=10,stop=10,preempt=10,storage=10,commit=10,hosts=10",
                 (unsigned long long)seed);
        REQUIRE(chaos_init(&c, spec, &o, err, sizeof err) == 0, "%s", err);
        CHECK(c.nfaults == 60, "%d", c.nfaults);
        for (int i = 0; i < c.nfaults; i++) {
            CHECK(c.plan[i].step >= 50 && c.plan[i].step <= 900, "step %llu",
                  (unsigned long long)c.plan[i].step);
            CHECK(i == 0 || c.plan[i].step > c.plan[i - 1].step, "not increasing at %d", i);
        }
        struct chaos again;
        REQUIRE(chaos_init(&again, spec, &o, err, sizeof err) == 0, "%s", err);
        CHECK(memcmp(c.plan, again.plan, sizeof *c.plan * 60) == 0, "the seed decides");
        chaos_free(&c);
        chaos_free(&again);
    }
}

static void chaos_specs_that_cannot_be_planned_are_refused(void)
{
    struct super_opts o = {.np = 2, .min_np = 1, .ckpt = "ck", .train_steps = 100};
    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"kill=1,interval=1-2", "interval= is gone"},
        {"kill=87", "do not fit"}, /* steps 5..90 of 100 hold 86 */
        {"kill=x", "not a whole number"},
        {"kill=-1", "not a whole number"},
        {"kill=100001", "not a whole number"},
        {"seed=18446744073709551616,kill=1", "not a whole number"},
        {"bomb=1", "unknown fault"},
        {"kill", "not KEY=VALUE"},
        {"hosts=1", "needs --hosts"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct chaos c;
        char err[SUPER_ERR_LEN] = "";
        CHECK(chaos_init(&c, bad[i].spec, &o, err, sizeof err) == -1 && strstr(err, bad[i].want),
              "%s: '%s'", bad[i].spec, err);
        chaos_free(&c);
    }
    struct chaos c;
    char err[SUPER_ERR_LEN] = "";
    CHECK(chaos_init(&c, "kill=86", &o, err, sizeof err) == 0, "86 fit: %s", err);
    chaos_free(&c);
    o.train_steps = 3; /* a step for the fault, but none to hold on after it */
    CHECK(chaos_init(&c, "kill=1", &o, err, sizeof err) == -1 && strstr(err, "do not fit"), "%s",
          err);
    o.train_steps = 0;
    CHECK(chaos_init(&c, "kill=1", &o, err, sizeof err) == -1 && strstr(err, "--steps"), "%s", err);
    o.train_steps = 1000;
    o.ckpt = NULL;
    CHECK(chaos_init(&c, "storage=1", &o, err, sizeof err) == -1 && strstr(err, "--ckpt"), "%s",
          err);
}

CHECK_MAIN(TEST(a_formatted_heartbeat_parses_back_for_every_phase),
           TEST(malformed_heartbeats_are_dropped),
           TEST(the_parser_reads_only_len_bytes_and_refuses_a_nul),
           TEST(events_parse_into_keys_and_values), TEST(malformed_events_are_dropped),
           TEST(numbers_are_digits_only_and_in_range),
           TEST(the_heartbeat_thread_speaks_the_parsers_language),
           TEST(hb_stop_wakes_the_thread_instead_of_waiting_out_its_sleep),
           TEST(host_lines_in_every_form), TEST(bad_host_lines_are_named_by_file_and_line),
           TEST(the_slot_total_cannot_overflow), TEST(a_missing_host_file_is_an_error),
           TEST(spot_notices_and_what_is_not_one), TEST(any_bytes_become_a_json_string),
           TEST(chaos_faults_land_on_increasing_steps_within_the_run),
           TEST(chaos_specs_that_cannot_be_planned_are_refused))
