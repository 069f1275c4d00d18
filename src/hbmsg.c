/*
 * hbmsg.c - formatting and parsing the trainer <-> supervisor datagrams
 * (grammar in hbmsg.h). The parser splits the buffer into tokens at single
 * spaces, checks every byte against the grammar first, and then reads each
 * field with one strict number parser; there is no sscanf here, so no
 * field can be wider, signed, or followed by garbage without the whole
 * datagram being dropped.
 */
#include "hbmsg.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *phase_names[HB_NPHASES] = {"start", "train",     "save", "load",
                                              "done",  "preempted", "hold"};

const char *hbmsg_phase_name(enum hb_phase p)
{
    return (int)p >= 0 && p < HB_NPHASES ? phase_names[p] : NULL;
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
