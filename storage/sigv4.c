/*
 * sigv4.c - AWS Signature Version 4.
 *
 *   canonical request = METHOD \n URI \n QUERY \n HEADERS \n SIGNED \n PAYLOAD-HASH
 *   string to sign    = AWS4-HMAC-SHA256 \n DATE \n SCOPE \n hex(sha256(canonical))
 *   signing key       = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, day), region), service),
 *                            "aws4_request")
 *   signature         = hex(HMAC(signing key, string to sign))
 *
 * URI: each byte outside the unreserved set is %XX-encoded, '/' kept, no
 * normalisation (S3). QUERY: each parameter decoded, then name and value
 * encoded, sorted by name then value, a valueless parameter as "name=".
 * HEADERS: names lower-cased, values trimmed with inner runs of spaces
 * collapsed, duplicates joined with ',' in order, sorted by name, each
 * "name:value\n"; the signer adds x-amz-date, x-amz-content-sha256 and
 * x-amz-security-token itself. The secret is used only inside HMAC keys and
 * never copied into any output.
 */
#include "sigv4.h"

#include "util.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int unreserved(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

int sigv4_uri_encode(const char *s, size_t len, int keep_slash, char *out, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            if (o + 1 >= n)
                return -1;
            out[o++] = (char)c;
        } else {
            if (o + 3 >= n)
                return -1;
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    if (o >= n)
        return -1;
    out[o] = 0;
    return (int)o;
}

static size_t uri_decode(const char *s, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%' && i + 2 < len && isxdigit((unsigned char)s[i + 1]) &&
            isxdigit((unsigned char)s[i + 2])) {
            char h[3] = {s[i + 1], s[i + 2], 0};
            out[o++] = (char)strtol(h, NULL, 16);
            i += 2;
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = 0;
    return o;
}

static int hmac(const unsigned char *key, size_t klen, const char *msg, unsigned char out[32])
{
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &len) ||
        len != 32)
        return -1;
    return 0;
}

/* ---- canonical query -------------------------------------------------- */

struct param {
    char name[512], value[1536];
};

static int by_param(const void *a, const void *b)
{
    const struct param *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

static int canonical_query(const char *q, char *out, size_t n)
{
    size_t cap = 1;
    for (const char *p = q; *p; p++)
        cap += *p == '&';
    struct param *ps = calloc(cap, sizeof *ps);
    if (!ps)
        return -1;
    size_t np = 0;
    const char *p = q;
    while (*p) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len) {
            const char *eq = memchr(p, '=', len);
            size_t nl = eq ? (size_t)(eq - p) : len;
            size_t vl = eq ? len - nl - 1 : 0;
            char raw[1536];
            if (nl >= 512 || vl >= 512) {
                free(ps);
                return -1;
            }
            uri_decode(p, nl, raw);
            if (sigv4_uri_encode(raw, strlen(raw), 0, ps[np].name, sizeof ps[np].name) < 0)
                goto fail;
            uri_decode(eq ? eq + 1 : "", vl, raw);
            if (sigv4_uri_encode(raw, strlen(raw), 0, ps[np].value, sizeof ps[np].value) < 0)
                goto fail;
            np++;
        }
        p += len + (amp ? 1 : 0);
    }
    qsort(ps, np, sizeof *ps, by_param);
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < np; i++) {
        int w = snprintf(out + o, n - o, "%s%s=%s", i ? "&" : "", ps[i].name, ps[i].value);
        if (w < 0 || (size_t)w >= n - o)
            goto fail;
        o += (size_t)w;
    }
    free(ps);
    return 0;
fail:
    free(ps);
    return -1;
}

/* ---- canonical headers ------------------------------------------------ */

struct header {
    char name[128];
    char value[2048];
    int order;
};

static int by_header(const void *a, const void *b)
{
    const struct header *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->order - y->order;
}

/* trim, and collapse runs of whitespace inside into one space */
static void trimall(const char *v, char *out, size_t n)
{
    size_t o = 0;
    int space = 0;
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r')
        v++;
    for (; *v && o + 1 < n; v++) {
        if (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') {
            space = 1;
            continue;
        }
        if (space && o + 2 < n)
            out[o++] = ' ';
        space = 0;
        out[o++] = *v;
    }
    out[o] = 0;
}

int sigv4_sign(const struct sigv4_input *in, struct sigv4_output *out)
{
    int nh = in->nheaders + 3, n = 0;
    struct header *h = calloc((size_t)nh, sizeof *h);
    if (!h)
        return -1;
    for (int i = 0; i < in->nheaders; i++, n++) {
        size_t j;
        for (j = 0; in->headers[i].name[j] && j + 1 < sizeof h[n].name; j++)
            h[n].name[j] = (char)tolower((unsigned char)in->headers[i].name[j]);
        trimall(in->headers[i].value, h[n].value, sizeof h[n].value);
        h[n].order = n;
    }
    snprintf(h[n].name, sizeof h[n].name, "x-amz-date");
    snprintf(h[n].value, sizeof h[n].value, "%s", in->amz_date);
    h[n].order = n;
    n++;
    if (in->sign_content_sha256) {
        snprintf(h[n].name, sizeof h[n].name, "x-amz-content-sha256");
        snprintf(h[n].value, sizeof h[n].value, "%s", in->payload_sha256);
        h[n].order = n;
        n++;
    }
    if (in->session_token && *in->session_token) {
        snprintf(h[n].name, sizeof h[n].name, "x-amz-security-token");
        snprintf(h[n].value, sizeof h[n].value, "%s", in->session_token);
        h[n].order = n;
        n++;
    }
    qsort(h, (size_t)n, sizeof *h, by_header);

    char *canon_headers = malloc(8192), *query = malloc(8192), *uri = malloc(4096);
    int rc = -1;
    if (!canon_headers || !query || !uri)
        goto out;
    size_t ch = 0, sh = 0;
    canon_headers[0] = out->signed_headers[0] = 0;
    for (int i = 0; i < n; i++) {
        int dup = i > 0 && strcmp(h[i].name, h[i - 1].name) == 0;
        int w = dup ? snprintf(canon_headers + ch - 1, 8192 - ch + 1, ",%s\n", h[i].value)
                    : snprintf(canon_headers + ch, 8192 - ch, "%s:%s\n", h[i].name, h[i].value);
        if (w < 0 || (size_t)w >= 8192 - ch)
            goto out;
        ch += (size_t)w - (dup ? 1 : 0);
        if (!dup) {
            w = snprintf(out->signed_headers + sh, sizeof out->signed_headers - sh, "%s%s",
                         sh ? ";" : "", h[i].name);
            if (w < 0 || (size_t)w >= sizeof out->signed_headers - sh)
                goto out;
            sh += (size_t)w;
        }
    }
    if (sigv4_uri_encode(in->path, strlen(in->path), 1, uri, 4096) < 0 ||
        canonical_query(in->query ? in->query : "", query, 8192))
        goto out;
    int w =
        snprintf(out->canonical_request, sizeof out->canonical_request, "%s\n%s\n%s\n%s\n%s\n%s",
                 in->method, uri, query, canon_headers, out->signed_headers, in->payload_sha256);
    if (w < 0 || (size_t)w >= sizeof out->canonical_request)
        goto out;
    char day[9], scope[160], creq_hash[65];
    snprintf(day, sizeof day, "%.8s", in->amz_date);
    snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", day, in->region, in->service);
    if (fsdp_sha256_hex(out->canonical_request, strlen(out->canonical_request), creq_hash))
        goto out;
    snprintf(out->string_to_sign, sizeof out->string_to_sign, "AWS4-HMAC-SHA256\n%s\n%s\n%s",
             in->amz_date, scope, creq_hash);

    unsigned char k[32], k2[32];
    char secret[256];
    if (snprintf(secret, sizeof secret, "AWS4%s", in->secret_key) >= (int)sizeof secret) {
        memset(secret, 0, sizeof secret);
        goto out;
    }
    unsigned char sig[32];
    int bad = hmac((unsigned char *)secret, strlen(secret), day, k);
    memset(secret, 0, sizeof secret);
    bad = bad || hmac(k, 32, in->region, k2) || hmac(k2, 32, in->service, k) ||
          hmac(k, 32, "aws4_request", k2) || hmac(k2, 32, out->string_to_sign, sig);
    memset(k, 0, sizeof k);
    memset(k2, 0, sizeof k2);
    if (bad)
        goto out;
    fsdp_hex(sig, 32, out->signature);
    snprintf(out->authorization, sizeof out->authorization,
             "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", in->access_key,
             scope, out->signed_headers, out->signature);
    rc = 0;
out:
    free(canon_headers);
    free(query);
    free(uri);
    free(h);
    return rc;
}
