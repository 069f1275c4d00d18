/*
 * test_super_parsers.c - the parsers of everything fsdp-super reads from
 * outside, fed hostile bytes: the ranks' datagrams and the supervisor's
 * answers (src/hbmsg.h: bodies, the sealed envelope, the launch's secret,
 * replays, addresses), with the rank's own heartbeat thread on the other
 * end (answers, orders, and stopping itself when the supervisor falls
 * silent), the host file, spot notices, event-log strings, and the chaos
 * plan. Each test is one behaviour and sets up what it needs.
 */
#include "chaos.h"
#include "check.h"
#include "hbmsg.h"
#include "heartbeat.h"
#include "super.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The launch's secret of these tests, and another. */
static const char *TOKEN = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
static const char *OTHER = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

static struct hbmsg_key key_of(const char *hex)
{
    struct hbmsg_key k;
    memset(&k, 0, sizeof k);
    if (hbmsg_key_parse(hex, &k))
        abort();
    return k;
}

/* A body sealed with a secret; returns its length. */
static int seal(char *out, size_t cap, const char *hex, const char *host, uint64_t seq,
                const char *body)
{
    struct hbmsg_key k = key_of(hex);
    return hbmsg_seal(out, cap, &k, host, seq, body, strlen(body));
}

static int open_with(const char *hex, const char *buf, size_t n, struct hbmsg *m)
{
    struct hbmsg_key k = key_of(hex);
    return hbmsg_open(buf, n, &k, m);
}

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

static void control_messages_parse_and_malformed_ones_are_dropped(void)
{
    for (int a = 0; a < HBCTL_N; a++) {
        char buf[HBMSG_MAX_LEN + 1];
        int n = hbmsg_format_ctl(buf, sizeof buf, 12, 3, (enum hb_ctl)a, UINT64_MAX);
        struct hbmsg m;
        REQUIRE(n > 0 && hbmsg_parse(buf, (size_t)n, &m) == 0, "%s", buf);
        CHECK(m.kind == HBMSG_CTL && m.generation == 12 && m.rank == 3 &&
                  m.action == (enum hb_ctl)a && m.echo == UINT64_MAX,
              "%s", buf);
    }
    CHECK(hbmsg_format_ctl(NULL, 0, 1, 0, HBCTL_N, 1) == -1, "an action out of range");
    static const char *bad[] = {
        "fsdp-ctl 1 0 ack",                                /* no echo */
        "fsdp-ctl 1 0 ack 5 6",                            /* one too many */
        "fsdp-ctl 1 0 ACK 5",   "fsdp-ctl 1 0 shutdown 5", /* not an action */
        "fsdp-ctl 1 0 kill -5", "fsdp-ctl 1 0 kill 18446744073709551616",
        "fsdp-ctl 1 -1 kill 5", "fsdp-ctl 0x1 0 kill 5",
        "fsdp-ctl 1 0 kill\t5",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct hbmsg m;
        CHECK(parse(bad[i], &m) == -1, "accepted '%s'", bad[i]);
    }
}

static void a_sealed_datagram_opens_with_its_key_and_names_its_host(void)
{
    char body[HBMSG_MAX_LEN + 1], d[HBMSG_DGRAM_MAX + 1];
    int bn = hbmsg_format_beat(body, sizeof body, 7, 1, 4242, 10, HB_TRAIN, 99);
    int n = seal(d, sizeof d, TOKEN, "node-2.example", 5, body);
    REQUIRE(bn > 0 && n > 0, "seal");
    CHECK(strncmp(d, "fsdp1 ", 6) == 0 && strstr(d, TOKEN) == NULL, "the secret is not sent");
    struct hbmsg m;
    REQUIRE(open_with(TOKEN, d, (size_t)n, &m) == 0, "%s", d);
    CHECK(m.kind == HBMSG_BEAT && m.generation == 7 && m.rank == 1 && m.pid == 4242 &&
              m.step == 10 && m.progress == 99 && m.seq == 5 &&
              strcmp(m.host, "node-2.example") == 0,
          "%s", d);
    /* the longest host and seq, with the longest body, still fit */
    char host[HBMSG_HOST_LEN];
    memset(host, 'h', sizeof host - 1);
    host[sizeof host - 1] = 0;
    static char big[HBMSG_MAX_LEN + 1];
    memset(big, 'a', sizeof big - 1);
    memcpy(big, "fsdp-ev 1 0 ", 12);
    big[HBMSG_MAX_LEN] = 0; /* one name far too long: authentic, not the grammar */
    n = seal(d, sizeof d, TOKEN, host, UINT64_MAX, big);
    REQUIRE(n > 0 && (size_t)n == HBMSG_DGRAM_MAX, "%d", n);
    CHECK(open_with(TOKEN, d, (size_t)n, &m) == HBMSG_EBAD, "authentic but malformed");
    CHECK(seal(d, sizeof d, TOKEN, "bad host", 1, body) == -1, "a host with a space");
    CHECK(seal(d, sizeof d, TOKEN, "", 1, body) == -1, "an empty host");
    CHECK(seal(d, sizeof d, TOKEN, "h", 0, body) == -1, "seq 0");
    CHECK(seal(d, 40, TOKEN, "h", 1, body) == -1, "too small a buffer");
}

static void a_datagram_without_the_right_mac_is_unauthenticated(void)
{
    char body[HBMSG_MAX_LEN + 1], d[HBMSG_DGRAM_MAX + 1];
    int bn = hbmsg_format_beat(body, sizeof body, 7, 1, 4242, 10, HB_DONE, 99);
    int n = seal(d, sizeof d, TOKEN, "node1", 5, body);
    REQUIRE(bn > 0 && n > 0, "seal");
    struct hbmsg m;
    m.rank = 9;
    CHECK(open_with(OTHER, d, (size_t)n, &m) == HBMSG_EAUTH && m.rank == 0, "another secret");
    CHECK(open_with(TOKEN, body, (size_t)bn, &m) == HBMSG_EAUTH, "no envelope: a bare 'done'");
    /* every single byte flipped, anywhere, breaks it */
    for (int i = 0; i < n; i++) {
        char t[HBMSG_DGRAM_MAX + 1];
        memcpy(t, d, (size_t)n);
        t[i] ^= 0x01;
        CHECK(open_with(TOKEN, t, (size_t)n, &m) == HBMSG_EAUTH, "byte %d flipped", i);
    }
    for (int cut = 0; cut < n; cut++)
        CHECK(open_with(TOKEN, d, (size_t)cut, &m) == HBMSG_EAUTH, "cut to %d", cut);
    char longer[HBMSG_DGRAM_MAX + 2];
    memcpy(longer, d, (size_t)n);
    longer[n] = ' ';
    CHECK(open_with(TOKEN, longer, (size_t)n + 1, &m) == HBMSG_EAUTH, "a trailing byte");
    /* a MAC of the right shape over other bytes, the MAC in capitals */
    char t[HBMSG_DGRAM_MAX + 1];
    memcpy(t, d, (size_t)n);
    for (int i = 6; i < 70; i++)
        t[i] = (char)(t[i] >= 'a' ? t[i] - 32 : t[i]);
    CHECK(open_with(TOKEN, t, (size_t)n, &m) == HBMSG_EAUTH, "the MAC in capitals");
    static const char *junk[] = {
        "", "fsdp1", "fsdp1 ", "fsdp1 x node1 1 fsdp-hb 7 1 4242 10 done 99",
        "fsdp2 0000000000000000000000000000000000000000000000000000000000000000 "
        "node1 1 fsdp-hb 7 1 4242 10 done 99"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++)
        CHECK(open_with(TOKEN, junk[i], strlen(junk[i]), &m) == HBMSG_EAUTH, "'%s'", junk[i]);
    CHECK(open_with(TOKEN, NULL, 0, &m) == HBMSG_EAUTH, "NULL");
}

/* An envelope sealed by the right key around hostile HOST and SEQ fields
 * (as a buggy or hostile token holder could send): refused as malformed. */
static void hostile_envelope_fields_are_malformed_even_when_authentic(void)
{
    static const char *covered[] = {
        "node1 1",                              /* no body */
        "node1 fsdp-hb 7 1 4242 10 train 99",   /* no seq */
        "node1 0 fsdp-hb 7 1 4242 10 train 99", /* seq 0 */
        "node1 -1 fsdp-hb 7 1 4242 10 train 99",
        "node1 18446744073709551616 fsdp-hb 7 1 4242 10 train 99",
        "node\"1 1 fsdp-hb 7 1 4242 10 train 99", /* a quote in the host */
        "node\xff 1 fsdp-hb 7 1 4242 10 train 99",
        " 1 fsdp-hb 7 1 4242 10 train 99",       /* an empty host */
        "node1  1 fsdp-hb 7 1 4242 10 train 99", /* two spaces */
        "node1 1 fsdp-hb 7 1 4242 10 train 99 ", /* a trailing space */
        "node1 1 fsdp-hb 7 1 4242 10 train 99\n",
        "node1 1 fsdp-hb 7 1 4242 10 tr\"ain 99",
        "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh 1 " /* 65 bytes */
        "fsdp-hb 7 1 4242 10 train 99",
    };
    struct hbmsg_key k = key_of(TOKEN);
    for (size_t i = 0; i < sizeof covered / sizeof covered[0]; i++) {
        /* sealed by hand: the MAC over whatever bytes are given */
        char d[HBMSG_DGRAM_MAX + 64];
        size_t cl = strlen(covered[i]);
        int n = snprintf(d, sizeof d, "fsdp1 %064d %s", 0, covered[i]);
        unsigned char md[32];
        unsigned int ml;
        REQUIRE(HMAC(EVP_sha256(), k.k, sizeof k.k, (const unsigned char *)d + 71, cl, md, &ml),
                "hmac");
        for (int b = 0; b < 32; b++)
            snprintf(d + 6 + 2 * b, 3, "%02x", md[b]);
        d[70] = ' ';
        struct hbmsg m;
        m.rank = 5;
        CHECK(hbmsg_open(d, (size_t)n, &k, &m) == HBMSG_EBAD && m.rank == 0 && m.host[0] == 0,
              "case %zu: '%s'", i, covered[i]);
    }
}

static void the_secret_is_64_lowercase_hex_digits(void)
{
    struct hbmsg_key k, again;
    REQUIRE(hbmsg_key_new(&k) == 0, "getrandom");
    char hex[HBMSG_KEY_HEX + 1];
    hbmsg_key_hex(&k, hex);
    CHECK(strlen(hex) == 64 && hbmsg_key_parse(hex, &again) == 0 &&
              memcmp(k.k, again.k, sizeof k.k) == 0,
          "round trip");
    struct hbmsg_key k2;
    REQUIRE(hbmsg_key_new(&k2) == 0, "getrandom");
    CHECK(memcmp(k.k, k2.k, sizeof k.k) != 0, "two launches, one secret");
    char upper[65];
    snprintf(upper, sizeof upper, "%s", TOKEN);
    upper[20] = 'A';
    static const char *bad[] = {"",
                                "0011",
                                "00112233445566778899aabbccddeeff00112233445566778899aabbccddeef",
                                "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff0",
                                "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeg0",
                                " 0112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(hbmsg_key_parse(bad[i], &k) == -1, "'%s'", bad[i]);
    CHECK(hbmsg_key_parse(upper, &k) == -1, "capitals");
    CHECK(hbmsg_key_parse(NULL, &k) == -1, "unset");
}

static void replayed_seqs_are_refused(void)
{
    struct hbmsg_window w = {0, 0};
    CHECK(hbmsg_window_accept(&w, 0) == 0, "seq 0");
    CHECK(hbmsg_window_accept(&w, 1) == 1 && hbmsg_window_accept(&w, 1) == 0, "1 twice");
    CHECK(hbmsg_window_accept(&w, 5) == 1, "a gap");
    CHECK(hbmsg_window_accept(&w, 3) == 1 && hbmsg_window_accept(&w, 3) == 0, "late, once");
    CHECK(hbmsg_window_accept(&w, 100) == 1, "a jump");
    CHECK(hbmsg_window_accept(&w, 37) == 1, "63 below the top");
    CHECK(hbmsg_window_accept(&w, 36) == 0, "64 below the top: too old");
    CHECK(hbmsg_window_accept(&w, 5) == 0, "far too old");
    CHECK(hbmsg_window_accept(&w, UINT64_MAX) == 1 && hbmsg_window_accept(&w, UINT64_MAX) == 0,
          "the largest");
    CHECK(hbmsg_window_accept(&w, 100) == 0, "behind the largest");
}

static void addresses_in_every_form(void)
{
    char h[256];
    int port;
    CHECK(hbmsg_parse_addr("10.0.0.1:7000", 0, h, sizeof h, &port) == 0 &&
              strcmp(h, "10.0.0.1") == 0 && port == 7000,
          "v4");
    CHECK(hbmsg_parse_addr("ctl.example:1", 0, h, sizeof h, &port) == 0 &&
              strcmp(h, "ctl.example") == 0 && port == 1,
          "a name");
    CHECK(hbmsg_parse_addr("[::1]:65535", 0, h, sizeof h, &port) == 0 && strcmp(h, "::1") == 0 &&
              port == 65535,
          "v6");
    CHECK(hbmsg_parse_addr("[fe80::1%eth0]:9", 0, h, sizeof h, &port) == 0 &&
              strcmp(h, "fe80::1%eth0") == 0,
          "a scope");
    CHECK(hbmsg_parse_addr("::", 1, h, sizeof h, &port) == 0 && strcmp(h, "::") == 0 && port == -1,
          "a bare v6 without port");
    CHECK(hbmsg_parse_addr(":0", 1, h, sizeof h, &port) == 0 && h[0] == 0 && port == 0, ":PORT");
    CHECK(hbmsg_parse_addr("[::1]", 1, h, sizeof h, &port) == 0 && port == -1, "[v6]");
    CHECK(hbmsg_parse_addr("ctl", 1, h, sizeof h, &port) == 0 && port == -1, "a name alone");
    static const char *bad_required[] = {
        "",           "ctl",       ":7000",     "ctl:",
        "ctl:x",      "ctl:-1",    "ctl:65536", "ctl:99999999999999999999",
        "::1",        "[::1]",     "[::1]7000", "[]:7000",
        "[ctl]:7000", "[::1:7000", "a b:7000",  "a;b:7000",
        "ctl:7000 ",  "ctl: 7000", "ctl:+7000", "a\"b:1"};
    for (size_t i = 0; i < sizeof bad_required / sizeof bad_required[0]; i++)
        CHECK(hbmsg_parse_addr(bad_required[i], 0, h, sizeof h, &port) == -1, "'%s'",
              bad_required[i]);
    static const char *bad_listen[] = {"", "ctl:", "[::1]x", "[]", "a b", "ctl:65536"};
    for (size_t i = 0; i < sizeof bad_listen / sizeof bad_listen[0]; i++)
        CHECK(hbmsg_parse_addr(bad_listen[i], 1, h, sizeof h, &port) == -1, "'%s'", bad_listen[i]);
    char small[4];
    CHECK(hbmsg_parse_addr("abcd:1", 0, small, sizeof small, &port) == -1, "a host too long");
    CHECK(hbmsg_parse_addr(NULL, 1, h, sizeof h, &port) == -1, "NULL");
}

static void the_host_name_fits_the_grammar(void)
{
    char h[HBMSG_HOST_LEN];
    hbmsg_host_name(h, sizeof h);
    size_t n = strlen(h);
    CHECK(n >= 1 && n < HBMSG_HOST_LEN, "%zu", n);
    char d[HBMSG_DGRAM_MAX + 1];
    CHECK(seal(d, sizeof d, TOKEN, h, 1, "fsdp-ev 1 0 x") > 0, "'%s' is sealable", h);
}

/* ---- the rank's side ------------------------------------------------------------- */

/* The supervisor's end for these tests: a UDP socket on 127.0.0.1 and the
 * launch's environment pointing at it. */
static int listen_udp(void)
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
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    setenv("FSDP_SUPER_ADDR", addr, 1);
    setenv("FSDP_SUPER_TOKEN", TOKEN, 1);
    setenv("FSDP_GENERATION", "7", 1);
    unsetenv("FSDP_SUPER_SILENCE_S");
    return fd;
}

static void unset_launch(void)
{
    unsetenv("FSDP_SUPER_ADDR");
    unsetenv("FSDP_SUPER_TOKEN");
    unsetenv("FSDP_SUPER_SILENCE_S");
    unsetenv("FSDP_GENERATION");
}

/* A test that plays the supervisor gets its own socket and launch
 * environment (listen_udp); after it, however it ended, the heartbeat
 * thread is stopped, the socket closed and the environment gone. */
static void with_launch(void (*body)(int fd))
{
    int fd = listen_udp();
    CHECK(fd >= 0, "socket");
    if (fd >= 0) {
        body(fd);
        hb_stop(); /* nothing to do unless the body ended with the thread running */
        close(fd);
    }
    unset_launch();
}

/* The next datagram of the given kind, opened with TOKEN (its sender's
 * address in *from); -1 after 2 s of nothing. */
static int receive_from(int fd, enum hbmsg_kind kind, struct hbmsg *m, struct sockaddr_in *from)
{
    char buf[HBMSG_DGRAM_MAX + 1];
    for (int i = 0; i < 100; i++) {
        socklen_t len = sizeof *from;
        ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)from, &len);
        if (n < 0)
            return -1;
        if (open_with(TOKEN, buf, (size_t)n, m) == 0 && m->kind == kind)
            return 0;
    }
    return -1;
}

static int receive(int fd, enum hbmsg_kind kind, struct hbmsg *m)
{
    struct sockaddr_in from;
    return receive_from(fd, kind, m, &from);
}

/* The supervisor's answer to a datagram, sealed with hex. */
static void answer(int fd, const struct sockaddr_in *to, const char *hex, uint64_t gen, int rank,
                   enum hb_ctl action, uint64_t echo)
{
    char body[HBMSG_MAX_LEN + 1], d[HBMSG_DGRAM_MAX + 1];
    hbmsg_format_ctl(body, sizeof body, gen, rank, action, echo);
    int n = seal(d, sizeof d, hex, "ctl", 1000 + echo, body);
    sendto(fd, d, (size_t)n, 0, (const struct sockaddr *)to, sizeof *to);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void the_heartbeat_thread_speaks_the_parsers_language_body(int fd)
{
    hb_set(5, HB_HOLD);
    char err[512], me[HBMSG_HOST_LEN];
    REQUIRE(hb_start(3, err) == 0, "%s", err);
    hbmsg_host_name(me, sizeof me);
    struct hbmsg m;
    CHECK(receive(fd, HBMSG_BEAT, &m) == 0 && m.generation == 7 && m.rank == 3 &&
              m.pid == (int)getpid() && m.step == 5 && m.phase == HB_HOLD &&
              strcmp(m.host, me) == 0 && m.seq >= 1,
          "heartbeat");
    uint64_t first = m.seq;
    hb_event("resumed step=%d world=%d", 5, 2);
    uint64_t v;
    CHECK(receive(fd, HBMSG_EVENT, &m) == 0 && strcmp(m.name, "resumed") == 0 &&
              hbmsg_event_u64(&m, "world", &v) == 0 && v == 2 && m.seq > first,
          "event");
    hb_stop();
}

static void the_heartbeat_thread_speaks_the_parsers_language(void)
{
    with_launch(the_heartbeat_thread_speaks_the_parsers_language_body);
}

static void hb_stop_wakes_the_thread_instead_of_waiting_out_its_sleep_body(int fd)
{
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
}

static void hb_stop_wakes_the_thread_instead_of_waiting_out_its_sleep(void)
{
    with_launch(hb_stop_wakes_the_thread_instead_of_waiting_out_its_sleep_body);
}

static void a_launch_environment_without_a_valid_token_is_refused_body(int fd)
{
    (void)fd; /* its address, in the environment, is all this test needs */
    static const char *bad[] = {NULL, "", "secret", "00112233"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i])
            setenv("FSDP_SUPER_TOKEN", bad[i], 1);
        else
            unsetenv("FSDP_SUPER_TOKEN");
        char err[512] = "";
        CHECK(hb_start(0, err) == -1 && strstr(err, "FSDP_SUPER_TOKEN"), "%s", err);
        CHECK(!bad[i] || !bad[i][0] || !strstr(err, bad[i]), "the value is echoed: %s", err);
    }
    setenv("FSDP_SUPER_TOKEN", TOKEN, 1);
    static const char *bad_silence[] = {"", "x", "-1", "0", "0.1", " 5", "5s", "1e9"};
    for (size_t i = 0; i < sizeof bad_silence / sizeof bad_silence[0]; i++) {
        setenv("FSDP_SUPER_SILENCE_S", bad_silence[i], 1);
        char err[512] = "";
        CHECK(hb_start(0, err) == -1 && strstr(err, "FSDP_SUPER_SILENCE_S"), "'%s': %s",
              bad_silence[i], err);
    }
    unsetenv("FSDP_SUPER_SILENCE_S");
    static const char *bad_addr[] = {"127.0.0.1", "127.0.0.1:0", "::1:5", "[::1]", "x y:5"};
    for (size_t i = 0; i < sizeof bad_addr / sizeof bad_addr[0]; i++) {
        setenv("FSDP_SUPER_ADDR", bad_addr[i], 1);
        char err[512] = "";
        CHECK(hb_start(0, err) == -1 && strstr(err, "FSDP_SUPER_ADDR"), "'%s': %s", bad_addr[i],
              err);
    }
}

static void a_launch_environment_without_a_valid_token_is_refused(void)
{
    with_launch(a_launch_environment_without_a_valid_token_is_refused_body);
}

static void a_preempt_order_in_an_answer_sets_the_flag_and_others_are_ignored_body(int fd)
{
    char err[512];
    REQUIRE(hb_start(2, err) == 0, "%s", err);
    REQUIRE(!hb_preempted(), "preempted before any order");
    struct hbmsg m;
    struct sockaddr_in rank;
    REQUIRE(receive_from(fd, HBMSG_BEAT, &m, &rank) == 0, "beat");
    /* orders the rank must ignore: another secret, another generation or
     * rank, an echo of nothing it sent */
    answer(fd, &rank, OTHER, 7, 2, HBCTL_PREEMPT, m.seq);
    answer(fd, &rank, TOKEN, 6, 2, HBCTL_PREEMPT, m.seq);
    answer(fd, &rank, TOKEN, 7, 1, HBCTL_PREEMPT, m.seq);
    answer(fd, &rank, TOKEN, 7, 2, HBCTL_PREEMPT, m.seq + 1000);
    sendto(fd, "fsdp-ctl 7 2 preempt 1", 22, 0, (struct sockaddr *)&rank, sizeof rank);
    REQUIRE(receive(fd, HBMSG_BEAT, &m) == 0, "a beat after them");
    CHECK(!hb_preempted(), "an order that is not the supervisor's was obeyed");
    answer(fd, &rank, TOKEN, 7, 2, HBCTL_PREEMPT, m.seq);
    double until = now() + 2;
    while (!hb_preempted() && now() < until)
        usleep(1000);
    CHECK(hb_preempted(), "the supervisor's order was not obeyed");
    hb_stop();
}

static void a_preempt_order_in_an_answer_sets_the_flag_and_others_are_ignored(void)
{
    with_launch(a_preempt_order_in_an_answer_sets_the_flag_and_others_are_ignored_body);
}

/* A rank in a child process (so that it may exit): launched against fd
 * with the given silence bound; answered with hex for answer_s seconds
 * (hex NULL: never); returns its wait status, -1 if it outlived limit_s,
 * and what it wrote on stderr in out. */
static int child_rank(int fd, const char *silence, const char *hex, double answer_s, double limit_s,
                      double *took, char *out, size_t outlen)
{
    setenv("FSDP_SUPER_SILENCE_S", silence, 1);
    int errp[2];
    if (pipe(errp))
        return -1;
    double t0 = now();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(errp[1], 2);
        char err[512];
        if (hb_start(0, err))
            _exit(9);
        sleep(30);
        _exit(0);
    }
    close(errp[1]);
    int status = -1;
    struct hbmsg m;
    struct sockaddr_in rank;
    while (now() - t0 < limit_s) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) > 0 && receive_from(fd, HBMSG_BEAT, &m, &rank) == 0 && hex &&
            now() - t0 < answer_s)
            answer(fd, &rank, hex, 7, 0, HBCTL_ACK, m.seq);
        if (waitpid(pid, &status, WNOHANG) == pid)
            break;
        status = -1;
    }
    *took = now() - t0;
    if (status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    ssize_t n = read(errp[0], out, outlen - 1);
    out[n > 0 ? n : 0] = 0;
    close(errp[0]);
    unsetenv("FSDP_SUPER_SILENCE_S");
    return status;
}

static void a_rank_that_hears_nothing_stops_itself_within_the_bound_body(int fd)
{
    char out[1024];
    double took;
    int st = child_rank(fd, "0.6", NULL, 0, 5, &took, out, sizeof out);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == HB_LOST_CONTACT_EXIT,
          "status %d after %.1f s", st, took);
    CHECK(took >= 0.6 && took < 2.5, "stopped after %.2f s (bound 0.6 s)", took);
    CHECK(strstr(out, "lost contact with fsdp-super at 127.0.0.1:") && strstr(out, "stopping") &&
              !strstr(out, TOKEN) && strchr(out, '\n') == out + strlen(out) - 1,
          "'%s'", out);
    /* answers with another secret are no contact at all */
    st = child_rank(fd, "0.6", OTHER, 5, 5, &took, out, sizeof out);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == HB_LOST_CONTACT_EXIT && took < 2.5,
          "status %d after %.1f s", st, took);
}

static void a_rank_that_hears_nothing_stops_itself_within_the_bound(void)
{
    with_launch(a_rank_that_hears_nothing_stops_itself_within_the_bound_body);
}

static void a_rank_that_is_answered_keeps_going_and_stops_when_the_answers_stop_body(int fd)
{
    char out[1024];
    double took;
    /* answered for 2 s with a bound of 0.6 s: alive all along, then stopped */
    int st = child_rank(fd, "0.6", TOKEN, 2, 6, &took, out, sizeof out);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == HB_LOST_CONTACT_EXIT,
          "status %d after %.1f s", st, took);
    CHECK(took > 2.3 && took < 4.5, "stopped after %.2f s: answered until 2 s, bound 0.6 s", took);
}

static void a_rank_that_is_answered_keeps_going_and_stops_when_the_answers_stop(void)
{
    with_launch(a_rank_that_is_answered_keeps_going_and_stops_when_the_answers_stop_body);
}

static void a_kill_order_kills_the_rank_body(int fd)
{
    setenv("FSDP_SUPER_SILENCE_S", "30", 1);
    pid_t pid = fork();
    if (pid == 0) {
        char err[512];
        if (hb_start(0, err))
            _exit(9);
        sleep(30);
        _exit(0);
    }
    struct hbmsg m;
    struct sockaddr_in rank;
    int got = receive_from(fd, HBMSG_BEAT, &m, &rank);
    CHECK(got == 0 && m.pid == pid, "beat");
    if (got == 0)
        answer(fd, &rank, TOKEN, 7, 0, HBCTL_KILL, m.seq);
    int st = 0;
    double until = now() + 3;
    while (waitpid(pid, &st, WNOHANG) == 0 && now() < until)
        usleep(10000);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status %d", st);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, WNOHANG);
}

static void a_kill_order_kills_the_rank(void) { with_launch(a_kill_order_kills_the_rank_body); }

/* ---- the host file ---------------------------------------------------------------- */

static int hosts(const char *text, struct host *h, int *nh, int *total, char *err)
{
    return super_parse_hosts(text, strlen(text), "hosts", h, SUPER_MAX_HOSTS, nh, total, err,
                             FSDP_ERR_LEN);
}

static void host_lines_in_every_form(void)
{
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[FSDP_ERR_LEN] = "";
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
        {"\xff 1\n", "hosts:1: a host name is letters, digits and . - _ :, not '\\xff'"},
        /* what the launch agent would take for an option, named */
        {"-Fevil 2\n", "hosts:1: host name '-Fevil' begins with '-'"},
        {"a 1\n-J\n", "hosts:2: host name '-J' begins with '-'"},
        {"- 1\n", "hosts:1: host name '-' begins with '-'"},
        {"-oProxyCommand=sh 1\n", "not '-oProxyCommand=sh'"},
        /* control and shell characters, shown escaped on one line */
        {"node\x1b[31m 1\n", "not 'node\\x1b[31m'"},
        {"a\x0b\x0c\x1c 1\n", "not 'a\\x0b\\x0c\\x1c'"},
        {"a'b 1\n", "not 'a\\x27b'"},
        {"a\\b 1\n", "not 'a\\x5cb'"},
        {"$(reboot) 1\n", "not '$(reboot)'"},
        {"a`id` 1\n", "not 'a`id`'"},
        {"user@host 1\n", "not 'user@host'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct host h[SUPER_MAX_HOSTS];
        int nh, total;
        char err[FSDP_ERR_LEN] = "";
        int rc = hosts(bad[i].text, h, &nh, &total, err);
        CHECK(rc == -1 && strstr(err, bad[i].want), "case %zu: rc %d, '%s'", i, rc, err);
    }
    static const char nul[] = "ok 1\n\nx\0y 1\n";
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[FSDP_ERR_LEN];
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
    char err[FSDP_ERR_LEN] = "";
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
    char err[FSDP_ERR_LEN] = "";
    CHECK(super_read_hosts("/nonexistent/hosts", h, SUPER_MAX_HOSTS, &nh, &total, err,
                           sizeof err) == -1 &&
              strstr(err, "/nonexistent/hosts"),
          "%s", err);
}

/* A FIFO, a directory, a device: refused at once, never opened for long
 * (a FIFO with no writer would block a plain open() for good). */
static void a_host_file_that_is_no_regular_file_is_refused_without_blocking(void)
{
    char dir[] = "/tmp/test-super-hosts-XXXXXX", fifo[64], sub[64];
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(sub, sizeof sub, "%s/dir", dir);
    REQUIRE(mkfifo(fifo, 0600) == 0 && mkdir(sub, 0700) == 0, "mkfifo, mkdir");
    const char *paths[] = {fifo, sub, "/dev/null"};
    const char *kinds[] = {"is a FIFO, not a regular file", "is a directory, not a regular file",
                           "is a character device, not a regular file"};
    for (int i = 0; i < 3; i++) {
        struct host h[SUPER_MAX_HOSTS];
        int nh, total;
        char err[FSDP_ERR_LEN] = "";
        int rc = super_read_hosts(paths[i], h, SUPER_MAX_HOSTS, &nh, &total, err, sizeof err);
        CHECK(rc == FSDP_NOT_REGULAR && strstr(err, paths[i]) && strstr(err, kinds[i]) && nh == 0 &&
                  total == 0,
              "%s: rc %d, '%s'", paths[i], rc, err);
    }
    unlink(fifo);
    rmdir(sub);
    rmdir(dir);
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
    char err[FSDP_ERR_LEN] = "";
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
        char err[FSDP_ERR_LEN] = "";
        CHECK(chaos_init(&c, bad[i].spec, &o, err, sizeof err) == -1 && strstr(err, bad[i].want),
              "%s: '%s'", bad[i].spec, err);
        chaos_free(&c);
    }
    struct chaos c;
    char err[FSDP_ERR_LEN] = "";
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

/* policy.c: independent failures relaunch at once and are not counted;
 * recurring ones back off doubling to 30 s and give up after
 * --max-restarts in a row; 0 never relaunches. */
static void the_restart_policy_tells_recurring_failures_from_independent_ones(void)
{
    struct restart_history h = {0};
    int rec;
    /* progress since the launch each time: at once, never giving up */
    for (uint64_t k = 1; k <= 50; k++)
        CHECK(super_restart_decide(&h, 1, 10 * k, 10 * k + 5, 1, 2, &rec) == 0 && !rec, "%d",
              (int)k);
    /* nothing trained since the launch: 1, 2, 4 s ... then give up after 3 */
    struct restart_history r = {0};
    CHECK(super_restart_decide(&r, 1, 20, 20, 1, 3, &rec) == 1 && rec, "first wait");
    CHECK(super_restart_decide(&r, 1, 20, 20, 1, 3, &rec) == 2 && rec, "second");
    CHECK(super_restart_decide(&r, 1, 20, 20, 1, 3, &rec) == 4 && rec, "third");
    CHECK(super_restart_decide(&r, 1, 20, 20, 1, 3, &rec) == -1, "a fourth gives up");
    /* the same step and cause again recurs although it trained; another cause does not */
    struct restart_history q = {0};
    CHECK(super_restart_decide(&q, 1, 10, 25, 8, 5, &rec) == 0 && !rec, "first");
    CHECK(super_restart_decide(&q, 1, 20, 25, 8, 5, &rec) == 8 && rec, "same step, cause");
    CHECK(super_restart_decide(&q, 2, 20, 25, 8, 5, &rec) == 0 && !rec, "another cause");
    CHECK(super_restart_decide(&q, 2, 20, 20, 100, 5, &rec) == 30, "the wait is at most 30 s");
    struct restart_history z = {0};
    CHECK(super_restart_decide(&z, 1, 10, 25, 1, 0, &rec) == -1, "--max-restarts 0");
}

/* policy.c: a host is set aside after two failures in a row blamed on it;
 * a failure elsewhere, or one blamed on no host, ends the row, and so does
 * a healthy stretch (watch.c clears on_host). */
static void a_host_that_fails_twice_in_a_row_is_to_be_set_aside(void)
{
    struct restart_history h = {0};
    CHECK(!super_blame_host(&h, "10.0.0.2"), "once");
    CHECK(super_blame_host(&h, "10.0.0.2"), "twice in a row");
    CHECK(!super_blame_host(&h, "10.0.0.2"), "a new row after the set-aside");
    CHECK(!super_blame_host(&h, "10.0.0.3"), "another host");
    CHECK(!super_blame_host(&h, "10.0.0.2"), "the row was broken");
    CHECK(!super_blame_host(&h, NULL), "no host");
    CHECK(!super_blame_host(&h, "10.0.0.2"), "the row was broken by a failure on no host");
    h.on_host = 0; /* a healthy stretch */
    CHECK(!super_blame_host(&h, "10.0.0.2"), "the row was broken by a healthy stretch");
    CHECK(super_blame_host(&h, "10.0.0.2"), "twice in a row again");
    CHECK(!super_blame_host(&h, ""), "an empty name is no host");
}

CHECK_MAIN(TEST(a_formatted_heartbeat_parses_back_for_every_phase),
           TEST(malformed_heartbeats_are_dropped),
           TEST(the_parser_reads_only_len_bytes_and_refuses_a_nul),
           TEST(events_parse_into_keys_and_values), TEST(malformed_events_are_dropped),
           TEST(numbers_are_digits_only_and_in_range),
           TEST(control_messages_parse_and_malformed_ones_are_dropped),
           TEST(a_sealed_datagram_opens_with_its_key_and_names_its_host),
           TEST(a_datagram_without_the_right_mac_is_unauthenticated),
           TEST(hostile_envelope_fields_are_malformed_even_when_authentic),
           TEST(the_secret_is_64_lowercase_hex_digits), TEST(replayed_seqs_are_refused),
           TEST(addresses_in_every_form), TEST(the_host_name_fits_the_grammar),
           TEST(the_heartbeat_thread_speaks_the_parsers_language),
           TEST(hb_stop_wakes_the_thread_instead_of_waiting_out_its_sleep),
           TEST(a_launch_environment_without_a_valid_token_is_refused),
           TEST(a_preempt_order_in_an_answer_sets_the_flag_and_others_are_ignored),
           TEST(a_rank_that_hears_nothing_stops_itself_within_the_bound),
           TEST(a_rank_that_is_answered_keeps_going_and_stops_when_the_answers_stop),
           TEST(a_kill_order_kills_the_rank), TEST(host_lines_in_every_form),
           TEST(bad_host_lines_are_named_by_file_and_line), TEST(the_slot_total_cannot_overflow),
           TEST(a_missing_host_file_is_an_error),
           TEST(a_host_file_that_is_no_regular_file_is_refused_without_blocking),
           TEST(spot_notices_and_what_is_not_one), TEST(any_bytes_become_a_json_string),
           TEST(chaos_faults_land_on_increasing_steps_within_the_run),
           TEST(chaos_specs_that_cannot_be_planned_are_refused),
           TEST(the_restart_policy_tells_recurring_failures_from_independent_ones),
           TEST(a_host_that_fails_twice_in_a_row_is_to_be_set_aside))
