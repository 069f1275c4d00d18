/*
 * hbmsg.c - formatting and parsing the trainer <-> supervisor datagrams
 * (grammar in hbmsg.h). The parser splits the buffer into tokens at single
 * spaces, checks every byte against the grammar first, and then reads each
 * field with one strict number parser; there is no sscanf here, so no
 * field can be wider, signed, or followed by garbage without the whole
 * datagram being dropped.
 *
 * The envelope's MAC is HMAC-SHA256 from OpenSSL, compared in constant
 * time (CRYPTO_memcmp) before any byte of what it covers is parsed.
 */
#include "hbmsg.h"
#include "util.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static const char *phase_names[HB_NPHASES] = {"start", "train",     "save", "load",
                                              "done",  "preempted", "hold", "stopped"};

static const char *ctl_names[HBCTL_N] = {"ack", "preempt", "stop", "kill"};

const char *hbmsg_phase_name(enum hb_phase p)
{
    return (int)p >= 0 && p < HB_NPHASES ? phase_names[p] : NULL;
}

const char *hbmsg_ctl_name(enum hb_ctl a)
{
    return (int)a >= 0 && a < HBCTL_N ? ctl_names[a] : NULL;
}

int hbmsg_parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (!s || len == 0 || len > 20)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

int hbmsg_parse_generation(const char *s, uint64_t *gen)
{
    uint64_t g;
    if (!s || hbmsg_parse_uint(s, strlen(s), HBMSG_MAX_GENERATION, &g) || g == 0)
        return -1;
    *gen = g;
    return 0;
}

int hbmsg_format_beat(char *buf, size_t cap, uint64_t gen, int rank, int pid, uint64_t step,
                      enum hb_phase phase, uint64_t progress)
{
    const char *ph = hbmsg_phase_name(phase);
    if (!ph)
        return -1;
    int n = snprintf(buf, cap, "fsdp-hb %llu %d %d %llu %s %llu", (unsigned long long)gen, rank,
                     pid, (unsigned long long)step, ph, (unsigned long long)progress);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int hbmsg_format_event(char *buf, size_t cap, uint64_t gen, int rank, const char *text)
{
    if (cap > HBMSG_MAX_LEN + 1)
        cap = HBMSG_MAX_LEN + 1;
    int n = snprintf(buf, cap, "fsdp-ev %llu %d %s", (unsigned long long)gen, rank, text);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int hbmsg_format_ctl(char *buf, size_t cap, uint64_t gen, int rank, enum hb_ctl action,
                     uint64_t echo)
{
    const char *a = hbmsg_ctl_name(action);
    if (!a)
        return -1;
    int n = snprintf(buf, cap, "fsdp-ctl %llu %d %s %llu", (unsigned long long)gen, rank, a,
                     (unsigned long long)echo);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

/* ---- parsing ------------------------------------------------------------------ */

struct tok {
    const char *p;
    size_t n;
};

/* Splits at single spaces; -1 on any byte outside printable ASCII, on an
 * empty token (leading, trailing or double space) or on too many tokens. */
static int split(const char *buf, size_t len, struct tok *t, int max)
{
    int nt = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && buf[i] != ' ') {
            if ((unsigned char)buf[i] < 0x21 || (unsigned char)buf[i] > 0x7e)
                return -1;
            continue;
        }
        if (i == start || nt == max)
            return -1;
        t[nt].p = buf + start;
        t[nt].n = i - start;
        nt++;
        start = i + 1;
    }
    return nt;
}

static int tok_is(const struct tok *t, const char *s)
{
    return t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}

static int tok_int(const struct tok *t, int lo, int *out)
{
    uint64_t v;
    if (hbmsg_parse_uint(t->p, t->n, INT_MAX, &v) || v < (uint64_t)lo)
        return -1;
    *out = (int)v;
    return 0;
}

/* [a-z_]+ shorter than HBMSG_NAME_LEN, copied NUL-terminated into out */
static int copy_name(const char *p, size_t n, char *out)
{
    if (n == 0 || n >= HBMSG_NAME_LEN)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= 'a' && p[i] <= 'z') || p[i] == '_'))
            return -1;
    memcpy(out, p, n);
    out[n] = 0;
    return 0;
}

static int is_value_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

static int parse_beat(const struct tok *t, int nt, struct hbmsg *m)
{
    if (nt != 7 || tok_int(&t[3], 1, &m->pid) ||
        hbmsg_parse_uint(t[4].p, t[4].n, HBMSG_MAX_GENERATION, &m->step) ||
        hbmsg_parse_uint(t[6].p, t[6].n, UINT64_MAX, &m->progress))
        return -1;
    for (int p = 0; p < HB_NPHASES; p++) {
        if (tok_is(&t[5], phase_names[p])) {
            m->phase = (enum hb_phase)p;
            m->kind = HBMSG_BEAT;
            return 0;
        }
    }
    return -1;
}

static int parse_event(const struct tok *t, int nt, struct hbmsg *m)
{
    if (nt < 4 || nt > 4 + HBMSG_MAX_KV || copy_name(t[3].p, t[3].n, m->name))
        return -1;
    for (int i = 4; i < nt; i++) {
        const char *eq = memchr(t[i].p, '=', t[i].n);
        if (!eq)
            return -1;
        size_t kn = (size_t)(eq - t[i].p), vn = t[i].n - kn - 1;
        if (copy_name(t[i].p, kn, m->key[m->nkv]) || vn == 0 || vn >= HBMSG_VAL_LEN)
            return -1;
        for (size_t k = 0; k < vn; k++)
            if (!is_value_char(eq[1 + k]))
                return -1;
        memcpy(m->val[m->nkv], eq + 1, vn);
        m->val[m->nkv][vn] = 0;
        m->nkv++;
    }
    m->kind = HBMSG_EVENT;
    return 0;
}

static int parse_ctl(const struct tok *t, int nt, struct hbmsg *m)
{
    if (nt != 5 || hbmsg_parse_uint(t[4].p, t[4].n, UINT64_MAX, &m->echo))
        return -1;
    for (int a = 0; a < HBCTL_N; a++) {
        if (tok_is(&t[3], ctl_names[a])) {
            m->action = (enum hb_ctl)a;
            m->kind = HBMSG_CTL;
            return 0;
        }
    }
    return -1;
}

int hbmsg_parse(const char *buf, size_t len, struct hbmsg *m)
{
    struct tok t[4 + HBMSG_MAX_KV];
    memset(m, 0, sizeof *m);
    if (!buf || len > HBMSG_MAX_LEN)
        return -1;
    int nt = split(buf, len, t, 4 + HBMSG_MAX_KV), rc = -1;
    if (nt < 4 || hbmsg_parse_uint(t[1].p, t[1].n, HBMSG_MAX_GENERATION, &m->generation) ||
        tok_int(&t[2], 0, &m->rank))
        rc = -1;
    else if (tok_is(&t[0], "fsdp-hb"))
        rc = parse_beat(t, nt, m);
    else if (tok_is(&t[0], "fsdp-ev"))
        rc = parse_event(t, nt, m);
    else if (tok_is(&t[0], "fsdp-ctl"))
        rc = parse_ctl(t, nt, m);
    if (rc) /* nothing of a rejected message is left for a careless caller */
        memset(m, 0, sizeof *m);
    return rc;
}

const char *hbmsg_event_str(const struct hbmsg *m, const char *key)
{
    for (int i = 0; m->kind == HBMSG_EVENT && i < m->nkv; i++)
        if (strcmp(m->key[i], key) == 0)
            return m->val[i];
    return NULL;
}

int hbmsg_event_u64(const struct hbmsg *m, const char *key, uint64_t *out)
{
    const char *v = hbmsg_event_str(m, key);
    return v ? hbmsg_parse_uint(v, strlen(v), HBMSG_MAX_GENERATION, out) : -1;
}

/* ---- the envelope ---------------------------------------------------------------- */

#define SEAL_TAG     "fsdp1 "
#define SEAL_TAG_LEN 6
#define MAC_AT       SEAL_TAG_LEN
#define COVERED_AT   (SEAL_TAG_LEN + 64 + 1) /* HOST SEQ BODY */

int hbmsg_key_new(struct hbmsg_key *k)
{
    return getrandom(k->k, sizeof k->k, 0) == (ssize_t)sizeof k->k ? 0 : -1;
}

void hbmsg_key_hex(const struct hbmsg_key *k, char *hex) { fsdp_hex(k->k, sizeof k->k, hex); }

int hbmsg_key_parse(const char *s, struct hbmsg_key *k) { return fsdp_unhex(s, sizeof k->k, k->k); }

/* 64 hex digits of HMAC-SHA256(k, p[0..n)) into out (65 bytes); -1 if
 * OpenSSL fails. */
static int mac_hex(const struct hbmsg_key *k, const char *p, size_t n, char *out)
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (!HMAC(EVP_sha256(), k->k, (int)sizeof k->k, (const unsigned char *)p, n, md, &mdlen) ||
        mdlen != sizeof md)
        return -1;
    fsdp_hex(md, sizeof md, out);
    return 0;
}

static int host_ok(const char *p, size_t n)
{
    if (n == 0 || n >= HBMSG_HOST_LEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_value_char(p[i]))
            return 0;
    return 1;
}

int hbmsg_seal(char *buf, size_t cap, const struct hbmsg_key *k, const char *host, uint64_t seq,
               const char *body, size_t blen)
{
    if (!host || !host_ok(host, strlen(host)) || seq == 0 || blen > HBMSG_MAX_LEN)
        return -1;
    if (cap > HBMSG_DGRAM_MAX + 1) /* what the other side would refuse is not sent */
        cap = HBMSG_DGRAM_MAX + 1;
    /* the MAC's place is held by zeros, then filled in */
    int n = snprintf(buf, cap, SEAL_TAG "%064d %s %llu %.*s", 0, host, (unsigned long long)seq,
                     (int)blen, body);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    char mac[65];
    if (mac_hex(k, buf + COVERED_AT, (size_t)n - COVERED_AT, mac))
        return -1;
    memcpy(buf + MAC_AT, mac, 64);
    return n;
}

int hbmsg_open(const char *buf, size_t len, const struct hbmsg_key *k, struct hbmsg *m)
{
    memset(m, 0, sizeof *m);
    char mac[65];
    if (!buf || len <= COVERED_AT || len > HBMSG_DGRAM_MAX ||
        memcmp(buf, SEAL_TAG, SEAL_TAG_LEN) != 0 || buf[COVERED_AT - 1] != ' ' ||
        mac_hex(k, buf + COVERED_AT, len - COVERED_AT, mac) ||
        CRYPTO_memcmp(mac, buf + MAC_AT, 64) != 0)
        return HBMSG_EAUTH;
    /* authentic: HOST SEQ BODY */
    const char *p = buf + COVERED_AT, *end = buf + len;
    const char *sp1 = memchr(p, ' ', (size_t)(end - p));
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1)) : NULL;
    uint64_t seq;
    struct hbmsg body;
    if (!sp2 || !host_ok(p, (size_t)(sp1 - p)) ||
        hbmsg_parse_uint(sp1 + 1, (size_t)(sp2 - sp1 - 1), UINT64_MAX, &seq) || seq == 0 ||
        hbmsg_parse(sp2 + 1, (size_t)(end - sp2 - 1), &body))
        return HBMSG_EBAD;
    *m = body;
    memcpy(m->host, p, (size_t)(sp1 - p));
    m->host[sp1 - p] = 0;
    m->seq = seq;
    return 0;
}

int hbmsg_window_accept(struct hbmsg_window *w, uint64_t seq)
{
    if (seq == 0)
        return 0;
    if (seq > w->top) {
        uint64_t shift = seq - w->top;
        w->seen = shift >= 64 ? 0 : w->seen << shift;
        w->seen |= 1; /* bit i: top - i was seen */
        w->top = seq;
        return 1;
    }
    uint64_t back = w->top - seq;
    if (back >= 64 || (w->seen >> back & 1))
        return 0;
    w->seen |= UINT64_C(1) << back;
    return 1;
}

/* ---- addresses --------------------------------------------------------------------- */

static int addr_host_ok(const char *p, size_t n, size_t hn)
{
    if (n >= hn)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_value_char(p[i]) && p[i] != ':' && p[i] != '%')
            return 0;
    return 1;
}

int hbmsg_parse_addr(const char *s, int port_optional, char *host, size_t hn, int *port)
{
    if (!s || hn == 0)
        return -1;
    size_t len = strlen(s);
    const char *h = s, *ps = NULL; /* the host [h, h+n), the port after ps */
    size_t n;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close || close == s + 1 || !memchr(s, ':', (size_t)(close - s)))
            return -1;
        h = s + 1;
        n = (size_t)(close - h);
        if (close[1] == ':')
            ps = close + 2;
        else if (close[1])
            return -1;
    } else {
        const char *colon = strchr(s, ':');
        if (colon && strchr(colon + 1, ':')) { /* a bare V6 address: no port */
            n = len;
        } else {
            n = colon ? (size_t)(colon - s) : len;
            ps = colon ? colon + 1 : NULL;
        }
        if (n == 0 && !(port_optional && ps)) /* ":PORT" only for --listen */
            return -1;
    }
    uint64_t v = 0;
    if ((ps && hbmsg_parse_uint(ps, strlen(ps), 65535, &v)) || (!ps && !port_optional) ||
        !addr_host_ok(h, n, hn))
        return -1;
    memcpy(host, h, n);
    host[n] = 0;
    *port = ps ? (int)v : -1;
    return 0;
}

void hbmsg_host_name(char *out, size_t n)
{
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) || !h[0])
        snprintf(h, sizeof h, "unknown");
    h[sizeof h - 1] = 0;
    size_t len = strlen(h);
    if (len > HBMSG_HOST_LEN - 1)
        len = HBMSG_HOST_LEN - 1;
    for (size_t i = 0; i < len; i++)
        if (!is_value_char(h[i]))
            h[i] = '_';
    h[len] = 0;
    snprintf(out, n, "%s", h);
}
