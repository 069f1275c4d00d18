/*
 * fuzz_hbmsg.c - the trainer <-> supervisor datagrams (src/hbmsg.c): the
 * envelope (hbmsg_open), the bodies inside it (hbmsg_parse), the replay
 * window, the strict number parser, and the address and secret parsers of
 * FSDP_SUPER_ADDR / --listen and FSDP_SUPER_TOKEN.
 *
 * Anything on the network can send fsdp-super a datagram, and a rank reads
 * the supervisor's answers the same way. Each input is used as:
 *   - a datagram, opened with a fixed key: random bytes almost never carry
 *     a right MAC, so an input that has the envelope's shape ("fsdp1 " MAC
 *     " " ...) also has its MAC recomputed here - HMAC-SHA256 of everything
 *     after "MAC ", keyed by the launch's secret, as hbmsg.h defines it,
 *     written here with OpenSSL - so that the HOST, SEQ and body behind the
 *     MAC see every mutation;
 *   - a body, parsed on its own and sealed with hbmsg_seal: opening the
 *     sealed datagram must agree with parsing the body;
 *   - a list of sequence numbers for the replay window;
 *   - an address and a secret (short inputs).
 * Whatever is accepted must be exactly the grammar of hbmsg.h (safe to
 * print and to put in the event log) and must survive formatting it again
 * with the senders' own formatters and parsing that (the same message).
 */
#include "fuzz_common.h"
#include "hbmsg.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

static struct hbmsg_key key;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    for (int i = 0; i < HBMSG_KEY_LEN; i++)
        key.k[i] = (unsigned char)(i * 7 + 1);
    return 0;
}

static int value_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= HBMSG_NAME_LEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_'))
            return 0;
    return 1;
}

static int value_ok(const char *s, size_t cap)
{
    size_t n = strlen(s);
    if (n == 0 || n >= cap)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!value_char(s[i]))
            return 0;
    return 1;
}

static int same_body(const struct hbmsg *a, const struct hbmsg *b)
{
    if (a->kind != b->kind || a->generation != b->generation || a->rank != b->rank)
        return 0;
    if (a->kind == HBMSG_BEAT)
        return a->pid == b->pid && a->step == b->step && a->phase == b->phase &&
               a->progress == b->progress;
    if (a->kind == HBMSG_CTL)
        return a->action == b->action && a->echo == b->echo;
    if (strcmp(a->name, b->name) || a->nkv != b->nkv)
        return 0;
    for (int i = 0; i < a->nkv; i++)
        if (strcmp(a->key[i], b->key[i]) || strcmp(a->val[i], b->val[i]))
            return 0;
    return 1;
}

/* The body of an accepted message, formatted again by the senders' code;
 * its length. */
static int format_body(const struct hbmsg *m, char *buf, size_t cap)
{
    FUZZ_CHECK(m->generation <= HBMSG_MAX_GENERATION && m->rank >= 0);
    if (m->kind == HBMSG_BEAT) {
        FUZZ_CHECK(hbmsg_phase_name(m->phase) != NULL && m->pid >= 1);
        FUZZ_CHECK(m->step <= HBMSG_MAX_GENERATION);
        return hbmsg_format_beat(buf, cap, m->generation, m->rank, m->pid, m->step, m->phase,
                                 m->progress);
    }
    if (m->kind == HBMSG_CTL) {
        FUZZ_CHECK(hbmsg_ctl_name(m->action) != NULL);
        return hbmsg_format_ctl(buf, cap, m->generation, m->rank, m->action, m->echo);
    }
    FUZZ_CHECK(m->kind == HBMSG_EVENT && name_ok(m->name));
    FUZZ_CHECK(m->nkv >= 0 && m->nkv <= HBMSG_MAX_KV);
    char text[HBMSG_MAX_LEN + 1];
    size_t o = (size_t)snprintf(text, sizeof text, "%s", m->name);
    for (int i = 0; i < m->nkv; i++) {
        FUZZ_CHECK(name_ok(m->key[i]) && value_ok(m->val[i], HBMSG_VAL_LEN));
        FUZZ_CHECK(hbmsg_event_str(m, m->key[i]) != NULL);
        uint64_t v;
        (void)hbmsg_event_u64(m, m->key[i], &v);
        o += (size_t)snprintf(text + o, sizeof text - o, " %s=%s", m->key[i], m->val[i]);
        FUZZ_CHECK(o < sizeof text);
    }
    return hbmsg_format_event(buf, cap, m->generation, m->rank, text);
}

/* An accepted body: formatted again (never longer: numbers lose leading
 * zeros) and parsed, the same message. */
static void body_round_trip(const struct hbmsg *m)
{
    char buf[HBMSG_MAX_LEN + 1];
    int n = format_body(m, buf, sizeof buf);
    FUZZ_CHECK(n > 0);
    struct hbmsg again;
    FUZZ_CHECK(hbmsg_parse(buf, (size_t)n, &again) == 0);
    FUZZ_CHECK(same_body(m, &again));
}

/* An opened datagram: its envelope fields in grammar, and sealing its body
 * again for the same host and SEQ opens to the same message. */
static void opened(const struct hbmsg *m)
{
    FUZZ_CHECK(m->seq >= 1 && value_ok(m->host, HBMSG_HOST_LEN));
    body_round_trip(m);
    char body[HBMSG_MAX_LEN + 1], dgram[HBMSG_DGRAM_MAX + 1];
    int bn = format_body(m, body, sizeof body);
    int dn = hbmsg_seal(dgram, sizeof dgram, &key, m->host, m->seq, body, (size_t)bn);
    FUZZ_CHECK(dn > 0);
    struct hbmsg again;
    FUZZ_CHECK(hbmsg_open(dgram, (size_t)dn, &key, &again) == 0);
    FUZZ_CHECK(same_body(m, &again) && again.seq == m->seq && !strcmp(again.host, m->host));
}

static int zeroed(const struct hbmsg *m)
{
    static const struct hbmsg zero;
    return memcmp(m, &zero, sizeof zero) == 0;
}

/* The input as a datagram; when it has the envelope's shape, with its MAC
 * made right. */
static void datagram(const uint8_t *data, size_t size)
{
    struct hbmsg m;
    int rc = hbmsg_open((const char *)data, size, &key, &m);
    FUZZ_CHECK(rc == 0 || rc == HBMSG_EAUTH || rc == HBMSG_EBAD);
    if (rc == 0)
        opened(&m);
    else
        FUZZ_CHECK(zeroed(&m));
    const size_t covered = 6 + 64 + 1;
    if (size <= covered || memcmp(data, "fsdp1 ", 6) != 0 || data[covered - 1] != ' ')
        return;
    char *d = fuzz_strndup(data, size);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    FUZZ_CHECK(HMAC(EVP_sha256(), key.k, (int)sizeof key.k, (const unsigned char *)d + covered,
                    size - covered, md, &mdlen) != NULL &&
               mdlen == 32);
    for (unsigned int i = 0; i < 32; i++) {
        static const char hex[] = "0123456789abcdef";
        d[6 + 2 * i] = hex[md[i] >> 4];
        d[6 + 2 * i + 1] = hex[md[i] & 15];
    }
    rc = hbmsg_open(d, size, &key, &m);
    FUZZ_CHECK(rc == 0 || rc == HBMSG_EBAD || (rc == HBMSG_EAUTH && size > HBMSG_DGRAM_MAX));
    if (rc == 0)
        opened(&m);
    else
        FUZZ_CHECK(zeroed(&m));
    free(d);
}

/* The input as a body: parsed, and sealed then opened, the same verdict. */
static void body(const uint8_t *data, size_t size)
{
    struct hbmsg m;
    int rc = hbmsg_parse((const char *)data, size, &m);
    if (rc == 0)
        body_round_trip(&m);
    else
        FUZZ_CHECK(zeroed(&m)); /* nothing of a refused message is left behind */
    /* hbmsg_seal takes a formatted body: a C string, blen its length */
    if (memchr(data, 0, size))
        return;
    char dgram[HBMSG_DGRAM_MAX + 1];
    int dn = hbmsg_seal(dgram, sizeof dgram, &key, "node-1.example", 42, (const char *)data, size);
    if (dn < 0) {
        FUZZ_CHECK(size > HBMSG_MAX_LEN);
        return;
    }
    struct hbmsg o;
    int orc = hbmsg_open(dgram, (size_t)dn, &key, &o);
    FUZZ_CHECK(orc == (rc == 0 ? 0 : HBMSG_EBAD));
    if (orc == 0)
        FUZZ_CHECK(same_body(&m, &o) && o.seq == 42 && !strcmp(o.host, "node-1.example"));
}

/* The input as SEQs (8 bytes each): a SEQ just accepted is a replay. */
static void window(const uint8_t *data, size_t size)
{
    struct hbmsg_window w = {0};
    for (size_t i = 0; i + 8 <= size && i < 8 * 64; i += 8) {
        uint64_t seq;
        memcpy(&seq, data + i, 8);
        uint64_t top = w.top;
        int a = hbmsg_window_accept(&w, seq);
        FUZZ_CHECK(!a || seq != 0);
        if (seq > top)
            FUZZ_CHECK(a == 1 && w.top == seq);
        FUZZ_CHECK(hbmsg_window_accept(&w, seq) == 0);
    }
}

/* hbmsg_parse_uint against the obvious reading of a decimal string. */
static void number(const char *s, size_t len)
{
    static const uint64_t maxes[] = {0, 4096, INT32_MAX, HBMSG_MAX_GENERATION, UINT64_MAX};
    for (size_t i = 0; i < sizeof maxes / sizeof maxes[0]; i++) {
        uint64_t v = 12345;
        if (hbmsg_parse_uint(s, len, maxes[i], &v) != 0) {
            FUZZ_CHECK(v == 12345); /* untouched */
            continue;
        }
        FUZZ_CHECK(len >= 1 && len <= 20 && v <= maxes[i]);
        char back[24];
        snprintf(back, sizeof back, "%" PRIu64, v);
        size_t z = 0;
        while (z + 1 < len && s[z] == '0')
            z++;
        FUZZ_CHECK(strlen(back) == len - z && memcmp(back, s + z, len - z) == 0);
    }
}

/* Short inputs as the strings of the environment and the command line. */
static void strings(const uint8_t *data, size_t size)
{
    char *s = fuzz_strndup(data, size);
    uint64_t g;
    if (hbmsg_parse_generation(s, &g) == 0)
        FUZZ_CHECK(g >= 1 && g <= HBMSG_MAX_GENERATION);
    struct hbmsg_key k;
    if (hbmsg_key_parse(s, &k) == 0) {
        char hex[HBMSG_KEY_HEX + 1];
        hbmsg_key_hex(&k, hex);
        FUZZ_CHECK(strcmp(hex, s) == 0);
    }
    for (int optional = 0; optional < 2; optional++) {
        static const size_t caps[] = {8, 256};
        for (size_t c = 0; c < 2; c++) {
            char host[256];
            int port = -2;
            if (hbmsg_parse_addr(s, optional, host, caps[c], &port) != 0)
                continue;
            size_t n = strnlen(host, caps[c]);
            FUZZ_CHECK(n < caps[c]);
            for (size_t i = 0; i < n; i++)
                FUZZ_CHECK(value_char(host[i]) || host[i] == ':' || host[i] == '%');
            FUZZ_CHECK(port >= -1 && port <= 65535 && (port >= 0 || optional));
            FUZZ_CHECK(n > 0 || optional);
        }
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    datagram(data, size);
    body(data, size);
    window(data, size);
    if (size <= 32)
        number((const char *)data, size);
    if (size <= 300)
        strings(data, size);
    return 0;
}
