/*
 * s3_http.c - configuration, signed requests over libcurl, retries, the
 * XML of S3's answers (expat) and of our request bodies.
 *
 * Request bodies are built in a growing buffer (struct s3_buf) by appends
 * that check every size themselves, key text through one escaping append:
 * no caller computes a capacity, so none can miscount one. Paths are sent
 * exactly as signed (CURLOPT_PATH_AS_IS: curl must not remove dot
 * segments; the backend refuses keys that have them anyway).
 *
 * Retry policy: exponential backoff with full jitter (sleep a uniform
 * random time in [0, min(cap, base * 2^attempt))) on HTTP 500, 502, 503,
 * 504, on the S3 codes SlowDown, RequestTimeout and InternalError, on
 * connection resets, timeouts and bodies cut short; at most max_attempts
 * tries; any other 4xx is final. Secrets are read from the environment or
 * the credentials file only, used only to sign, and never printed.
 */
#include "s3_internal.h"

#include "sigv4.h"

#include <ctype.h>
#include <errno.h>
#include <expat.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- configuration ------------------------------------------------------- */

static long env_long(const char *name, long def, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < lo || x > hi ? def : x;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    size_t i = 0;
    while (isspace((unsigned char)s[i]))
        i++;
    memmove(s, s + i, strlen(s + i) + 1);
}

/* [profile] key = value lines of ~/.aws/credentials */
static void read_profile(struct s3_config *c)
{
    const char *profile = getenv("AWS_PROFILE");
    char path[1024];
    const char *file = getenv("AWS_SHARED_CREDENTIALS_FILE");
    if (!file) {
        const char *home = getenv("HOME");
        if (!home)
            return;
        snprintf(path, sizeof path, "%s/.aws/credentials", home);
        file = path;
    }
    FILE *f = fopen(file, "r");
    if (!f)
        return;
    char line[4608], want[128], section[128] = "";
    snprintf(want, sizeof want, "%s", profile && *profile ? profile : "default");
    while (fgets(line, sizeof line, f)) {
        trim(line);
        if (line[0] == '[') {
            char *end = strchr(line, ']');
            if (end) {
                *end = 0;
                snprintf(section, sizeof section, "%s", line + 1);
                trim(section);
            }
            continue;
        }
        char *eq = strchr(line, '=');
        if (!eq || strcmp(section, want) != 0)
            continue;
        *eq = 0;
        char *k = line, *v = eq + 1;
        trim(k);
        trim(v);
        if (strcmp(k, "aws_access_key_id") == 0 && !c->access_key[0])
            snprintf(c->access_key, sizeof c->access_key, "%s", v);
        else if (strcmp(k, "aws_secret_access_key") == 0 && !c->secret_key[0])
            snprintf(c->secret_key, sizeof c->secret_key, "%s", v);
        else if (strcmp(k, "aws_session_token") == 0 && !c->session_token[0])
            snprintf(c->session_token, sizeof c->session_token, "%s", v);
        else if (strcmp(k, "region") == 0 && !c->region[0])
            snprintf(c->region, sizeof c->region, "%s", v);
    }
    memset(line, 0, sizeof line);
    fclose(f);
}

/* The offset of the first byte of s that may not stand in an HTTP header
 * value (a control character: CR and LF would start headers of their own;
 * DEL), or -1. */
static long control_char_at(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return (long)(p - (const unsigned char *)s);
    return -1;
}

/* Every credential and setting that reaches a request line or a header,
 * checked once: a control character is refused by name and offset, never
 * with the value (it may be a secret). */
static int check_header_values(const struct s3_config *c, int from_env, char *err)
{
    const struct {
        const char *env, *file, *value;
    } v[] = {{"AWS_ACCESS_KEY_ID", "aws_access_key_id", c->access_key},
             {"AWS_SECRET_ACCESS_KEY", "aws_secret_access_key", c->secret_key},
             {"AWS_SESSION_TOKEN", "aws_session_token", c->session_token},
             {"AWS_REGION", "region", c->region}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        long at = control_char_at(v[i].value);
        if (at >= 0) {
            fsdp_err(err,
                     "s3: %s%s holds a control character (byte %ld, 0x%02x): refused, it would "
                     "change the request's headers",
                     from_env || i == 3 ? v[i].env : v[i].file,
                     from_env || i == 3 ? "" : " in the credentials file", at,
                     (unsigned)(unsigned char)v[i].value[at]);
            return FSDP_ERROR;
        }
    }
    return 0;
}

int s3_config_load(struct s3_config *c, char *err)
{
    memset(c, 0, sizeof *c);
    const char *v;
    if ((v = getenv("AWS_ACCESS_KEY_ID")))
        snprintf(c->access_key, sizeof c->access_key, "%s", v);
    if ((v = getenv("AWS_SECRET_ACCESS_KEY")))
        snprintf(c->secret_key, sizeof c->secret_key, "%s", v);
    if ((v = getenv("AWS_SESSION_TOKEN")))
        snprintf(c->session_token, sizeof c->session_token, "%s", v);
    if ((v = getenv("AWS_REGION")) || (v = getenv("AWS_DEFAULT_REGION")))
        snprintf(c->region, sizeof c->region, "%s", v);
    int from_env = c->access_key[0] && c->secret_key[0];
    if (!from_env) {
        c->access_key[0] = c->secret_key[0] = c->session_token[0] = 0;
        read_profile(c);
    }
    if (!c->region[0])
        snprintf(c->region, sizeof c->region, "us-east-1");
    if (!c->access_key[0] || !c->secret_key[0]) {
        fsdp_err(err, "s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                      "AWS_PROFILE with ~/.aws/credentials");
        return FSDP_ERROR;
    }
    if (check_header_values(c, from_env, err))
        return FSDP_ERROR;
    const char *ep = getenv("AWS_ENDPOINT_URL_S3"), *ep_name = "AWS_ENDPOINT_URL_S3";
    if (!ep || !*ep)
        ep = getenv("AWS_ENDPOINT_URL"), ep_name = "AWS_ENDPOINT_URL";
    char def[128], shown[300];
    if (!ep || !*ep) {
        snprintf(def, sizeof def, "https://s3.%s.amazonaws.com", c->region);
        ep = def;
    }
    /* the endpoint is printed in messages: never with a password in it */
    fsdp_url_redact(ep, shown, sizeof shown);
    const char *sep = strstr(ep, "://");
    if (!sep || (size_t)(sep - ep) >= sizeof c->scheme || (strncmp(ep, "http", 4) != 0)) {
        fsdp_err(err, "s3: endpoint '%s' is not http://HOST[:PORT] or https://", shown);
        return FSDP_ERROR;
    }
    for (const unsigned char *p = (const unsigned char *)ep; *p; p++)
        if (*p <= 0x20 || *p == 0x7f) {
            fsdp_err(err, "s3: %s holds a space or a control character (byte %ld): refused",
                     ep_name, (long)(p - (const unsigned char *)ep));
            return FSDP_ERROR;
        }
    if (strchr(sep + 3, '@')) {
        /* S3 signs every request with the keys: a user:password@ would only
         * be sent along as HTTP basic authentication, and printed */
        fsdp_err(err,
                 "s3: %s '%s' holds user information (user:password@): refused; S3 "
                 "authenticates with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                 ep_name, shown);
        return FSDP_ERROR;
    }
    snprintf(c->scheme, sizeof c->scheme, "%.*s", (int)(sep - ep), ep);
    snprintf(c->host, sizeof c->host, "%s", sep + 3);
    char *slash = strchr(c->host, '/');
    if (slash)
        *slash = 0;
    if (!c->host[0] || (strcmp(c->scheme, "http") && strcmp(c->scheme, "https"))) {
        fsdp_err(err, "s3: endpoint '%s' is not http:// or https://", shown);
        return FSDP_ERROR;
    }
    if ((v = getenv("AWS_CA_BUNDLE")))
        snprintf(c->ca_bundle, sizeof c->ca_bundle, "%s", v);
    c->virtual_hosted = (int)env_long("FSDP_S3_VIRTUAL_HOSTED", 0, 0, 1);
    c->max_attempts = (int)env_long("FSDP_S3_MAX_ATTEMPTS", 6, 1, 100);
    c->retry_base_ms = (int)env_long("FSDP_S3_RETRY_BASE_MS", 100, 1, 60000);
    c->retry_cap_ms = (int)env_long("FSDP_S3_RETRY_CAP_MS", 5000, 1, 600000);
    c->timeout_s = env_long("FSDP_S3_TIMEOUT_S", 30, 1, 3600);
    c->part_size = (size_t)env_long("FSDP_S3_PART_MIB", 8, 5, 5120) << 20;
    c->parallel_parts = (int)env_long("FSDP_S3_PARALLEL", 4, 1, 64);
    c->list_max_keys = (int)env_long("FSDP_S3_LIST_MAX_KEYS", 0, 0, 1000);
    c->list_max_pages = env_long("FSDP_S3_LIST_MAX_PAGES", 100000, 1, 10000000);
    return 0;
}

/* ---- XML ------------------------------------------------------------------- */

struct xml_state {
    XML_Parser p;
    struct s3_xml *x;
    char stack[8][48];
    int depth;
    struct s3_buf text;
    int failed, over; /* out of memory; past S3_XML_MAX_* */
};

static void xml_stop(struct xml_state *s, int over)
{
    if (!s->failed && !s->over)
        XML_StopParser(s->p, XML_FALSE);
    if (over)
        s->over = 1;
    else
        s->failed = 1;
}

static void xml_start(void *ud, const char *name, const char **attrs)
{
    (void)attrs;
    struct xml_state *s = ud;
    if (s->depth >= S3_XML_MAX_DEPTH) {
        xml_stop(s, 1);
        return;
    }
    if (s->depth < 8)
        snprintf(s->stack[s->depth], sizeof s->stack[0], "%s", name);
    s->depth++;
    s->text.len = 0;
}

static void xml_chars(void *ud, const char *t, int n)
{
    struct xml_state *s = ud;
    if (s->text.len + (size_t)n + 1 > s->text.cap) {
        size_t cap = (s->text.cap ? s->text.cap * 2 : 256) + (size_t)n;
        char *p = realloc(s->text.p, cap);
        if (!p) {
            xml_stop(s, 0);
            return;
        }
        s->text.p = p;
        s->text.cap = cap;
    }
    memcpy(s->text.p + s->text.len, t, (size_t)n);
    s->text.len += (size_t)n;
}

static void xml_end(void *ud, const char *name)
{
    struct xml_state *s = ud;
    s->depth--;
    struct s3_xml *x = s->x;
    if (x->n >= S3_XML_MAX_ITEMS) {
        xml_stop(s, 1);
        return;
    }
    if (x->n == x->cap) { /* geometric: 20,000 elements are 12 reallocs, not 20,000 */
        int cap = x->cap ? 2 * x->cap : 64;
        struct s3_xml_item *v = realloc(x->v, (size_t)cap * sizeof *v);
        if (!v) {
            xml_stop(s, 0);
            return;
        }
        x->v = v;
        x->cap = cap;
    }
    struct s3_xml_item *it = &x->v[x->n++];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, "%s", name);
    if (s->depth > 0 && s->depth <= 8)
        snprintf(it->parent, sizeof it->parent, "%s", s->stack[s->depth - 1]);
    it->text = malloc(s->text.len + 1);
    if (!it->text) {
        xml_stop(s, 0); /* readers use text unchecked */
        return;
    }
    memcpy(it->text, s->text.p ? s->text.p : "", s->text.len);
    it->text[s->text.len] = 0;
    s->text.len = 0;
}

int s3_xml_parse(const char *doc, size_t len, struct s3_xml *x)
{
    memset(x, 0, sizeof *x);
    XML_Parser p = XML_ParserCreate("UTF-8");
    if (!p)
        return -1;
    struct xml_state s = {.p = p, .x = x};
    XML_SetUserData(p, &s);
    XML_SetElementHandler(p, xml_start, xml_end);
    XML_SetCharacterDataHandler(p, xml_chars);
    int ok =
        len <= INT_MAX && XML_Parse(p, doc, (int)len, 1) == XML_STATUS_OK && !s.failed && !s.over;
    XML_ParserFree(p);
    free(s.text.p);
    if (!ok) {
        s3_xml_free(x);
        return s.over && !s.failed ? -2 : -1;
    }
    return 0;
}

void s3_xml_free(struct s3_xml *x)
{
    for (int i = 0; i < x->n; i++)
        free(x->v[i].text);
    free(x->v);
    memset(x, 0, sizeof *x);
}

const char *s3_xml_first(const struct s3_xml *x, const char *name)
{
    for (int i = 0; i < x->n; i++)
        if (strcmp(x->v[i].name, name) == 0)
            return x->v[i].text ? x->v[i].text : "";
    return NULL;
}

/* ---- requests -------------------------------------------------------------- */

void s3_buf_free(struct s3_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int s3_client_init(struct s3_client *c, char *err)
{
    memset(c, 0, sizeof *c);
    if (s3_config_load(&c->cfg, err))
        return FSDP_ERROR;
    static int global;
    if (!global && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        s3_client_free(c);
        fsdp_err(err, "s3: cannot initialise libcurl");
        return FSDP_ERROR;
    }
    global = 1;
    pthread_mutex_init(&c->mu, NULL);
    c->idle[0] = curl_easy_init();
    c->nidle = c->idle[0] != NULL;
    c->multi = curl_multi_init();
    if (!c->nidle || !c->multi) {
        s3_client_free(c);
        fsdp_err(err, "s3: cannot initialise libcurl");
        return FSDP_ERROR;
    }
    curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)c->cfg.parallel_parts);
    return 0;
}

void s3_client_free(struct s3_client *c)
{
    for (int i = 0; i < c->nidle; i++)
        curl_easy_cleanup(c->idle[i]);
    if (c->multi)
        curl_multi_cleanup(c->multi);
    if (c->nidle || c->multi)
        pthread_mutex_destroy(&c->mu);
    memset(&c->cfg, 0, sizeof c->cfg); /* the secret goes with it */
    c->nidle = 0;
    c->multi = NULL;
}

/* An idle handle (its connection kept alive), or a new one. */
static CURL *take_handle(struct s3_client *c)
{
    CURL *h = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->nidle > 0)
        h = c->idle[--c->nidle];
    pthread_mutex_unlock(&c->mu);
    return h ? h : curl_easy_init();
}

static void give_handle(struct s3_client *c, CURL *h)
{
    pthread_mutex_lock(&c->mu);
    if (c->nidle < S3_IDLE_HANDLES) {
        c->idle[c->nidle++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (h)
        curl_easy_cleanup(h);
}

int s3_buf_append(struct s3_buf *b, const void *data, size_t n)
{
    size_t limit = b->limit ? b->limit : S3_BUF_LIMIT;
    if (b->len >= limit || n >= limit - b->len) /* len + n + 1 <= limit, without overflow */
        return -1;
    size_t need = b->len + n + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < need)
            cap = cap > limit / 2 ? limit : cap * 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int s3_buf_append_str(struct s3_buf *b, const char *s) { return s3_buf_append(b, s, strlen(s)); }

int s3_buf_append_xml_text(struct s3_buf *b, const char *s)
{
    const size_t start = b->len; /* all of s or nothing */
    for (const char *run = s;; s++) {
        unsigned char c = (unsigned char)*s;
        const char *e = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '"'  ? "&quot;"
                        : c == '\'' ? "&apos;"
                        : c == '\t' ? "&#9;"
                        : c == '\n' ? "&#10;" /* a parser would fold a raw CR LF into LF */
                        : c == '\r' ? "&#13;"
                                    : NULL;
        int bad = !e && c != 0 && c < 0x20; /* XML 1.0 cannot carry one at all */
        if (!bad && !e && c != 0)
            continue;
        if (bad || s3_buf_append(b, run, (size_t)(s - run)) || (e && s3_buf_append_str(b, e))) {
            b->len = start;
            if (b->p)
                b->p[start] = 0;
            return -1;
        }
        if (c == 0)
            return 0;
        run = s + 1;
    }
}

/* Body bytes: into the caller's buffer for a successful ranged GET (never
 * beyond it), otherwise into resp (bounded). */
static size_t on_body(char *data, size_t size, size_t n, void *ud)
{
    struct s3_request *r = ud;
    size_t bytes = size * n;
    long status = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
    if (r->into && status >= 200 && status < 300) {
        if (r->received + bytes > r->into_len) {
            r->overflow = 1;
            return 0;
        }
        memcpy((char *)r->into + r->received, data, bytes);
        r->received += bytes;
        return bytes;
    }
    r->received += bytes;
    if (s3_buf_append(&r->resp, data, bytes) == 0)
        return bytes;
    size_t limit = r->resp.limit ? r->resp.limit : S3_BUF_LIMIT;
    r->too_large = bytes >= limit - r->resp.len; /* not out of memory: past the limit */
    return 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *ud)
{
    struct s3_request *r = ud;
    size_t bytes = size * n;
    if (bytes > 5 && strncasecmp(data, "etag:", 5) == 0) {
        const char *v = data + 5;
        while (*v == ' ')
            v++;
        size_t len = bytes - (size_t)(v - data);
        while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
            len--;
        snprintf(r->etag, sizeof r->etag, "%.*s", (int)len, v);
    } else if (bytes > 15 && strncasecmp(data, "content-length:", 15) == 0) {
        r->content_length = strtoull(data + 15, NULL, 10);
    }
    return bytes;
}

static size_t on_send(char *out, size_t size, size_t n, void *ud)
{
    struct s3_request *r = ud;
    size_t left = r->body_len - r->sent, take = size * n < left ? size * n : left;
    memcpy(out, (const char *)r->body + r->sent, take);
    r->sent += take;
    return take;
}

static void amz_now(char out[17])
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* Appends line to *l; on failure frees the whole list (*l = NULL). */
static int header_add(struct curl_slist **l, const char *line)
{
    struct curl_slist *n = curl_slist_append(*l, line);
    if (!n) {
        curl_slist_free_all(*l);
        *l = NULL;
        return -1;
    }
    *l = n;
    return 0;
}

int s3_prepare(struct s3_client *c, CURL *h, struct s3_request *r, struct curl_slist **hdrs,
               char *err)
{
    const struct s3_config *cfg = &c->cfg;
    char path[2048], epath[6200], host[400], url[7000], date[17], sha[65];
    if (cfg->virtual_hosted) {
        snprintf(host, sizeof host, "%s.%s", r->bucket, cfg->host);
        snprintf(path, sizeof path, "/%s", r->key ? r->key : "");
    } else {
        snprintf(host, sizeof host, "%s", cfg->host);
        snprintf(path, sizeof path, "/%s%s%s", r->bucket, r->key ? "/" : "", r->key ? r->key : "");
    }
    if (sigv4_uri_encode(path, strlen(path), 1, epath, sizeof epath) < 0) {
        fsdp_err(err, "s3: key too long: %s", path);
        return FSDP_ERROR;
    }
    snprintf(url, sizeof url, "%s://%s%s%s%s", cfg->scheme, host, epath,
             r->query && *r->query ? "?" : "", r->query ? r->query : "");
    amz_now(date);
    /* the real payload hash on every request; UNSIGNED-PAYLOAD is never used */
    if (fsdp_sha256_hex(r->body ? r->body : "", r->body ? r->body_len : 0, sha)) {
        fsdp_err(err, "s3: cannot hash a request body (OpenSSL failed)");
        return FSDP_ERROR;
    }

    struct sigv4_kv kv[6];
    char names[6][64], values[6][512];
    int nkv = 0;
    snprintf(names[nkv], 64, "host");
    snprintf(values[nkv], 512, "%s", host);
    nkv++;
    for (int i = 0; i < 4 && r->extra[i]; i++) {
        const char *colon = strchr(r->extra[i], ':');
        if (!colon)
            continue;
        snprintf(names[nkv], 64, "%.*s", (int)(colon - r->extra[i]), r->extra[i]);
        snprintf(values[nkv], 512, "%s", colon + 1);
        nkv++;
    }
    for (int i = 0; i < nkv; i++)
        kv[i] = (struct sigv4_kv){names[i], values[i]};
    struct sigv4_input in = {r->method,
                             path,
                             r->query ? r->query : "",
                             kv,
                             nkv,
                             sha,
                             date,
                             cfg->region,
                             "s3",
                             cfg->access_key,
                             cfg->secret_key,
                             cfg->session_token[0] ? cfg->session_token : NULL,
                             1};
    static __thread struct sigv4_output out;
    if (sigv4_sign(&in, &out)) {
        fsdp_err(err, "s3: cannot sign a request (too large, or OpenSSL failed)");
        return FSDP_ERROR;
    }
    char line[8192];
    struct curl_slist *l = NULL;
    *hdrs = NULL;
    snprintf(line, sizeof line, "Host: %s", host);
    int bad = header_add(&l, line);
    snprintf(line, sizeof line, "x-amz-date: %s", date);
    bad = bad || header_add(&l, line);
    snprintf(line, sizeof line, "x-amz-content-sha256: %s", sha);
    bad = bad || header_add(&l, line);
    if (cfg->session_token[0]) {
        snprintf(line, sizeof line, "x-amz-security-token: %s", cfg->session_token);
        bad = bad || header_add(&l, line);
    }
    for (int i = 0; i < 4 && r->extra[i]; i++)
        bad = bad || header_add(&l, r->extra[i]);
    snprintf(line, sizeof line, "Authorization: %s", out.authorization);
    bad = bad || header_add(&l, line);
    bad = bad || header_add(&l, "Expect:"); /* no 100-continue round trip */
    memset(&out, 0, sizeof out);
    memset(line, 0, sizeof line);
    if (bad)
        goto oom;

    curl_easy_reset(h);
    r->h = h;
    r->sent = r->received = 0;
    r->overflow = r->too_large = 0;
    r->resp.len = 0;
    r->etag[0] = r->code[0] = 0;
    r->content_length = 0;
    r->status = 0;
    /* options that copy a string can fail (out of memory) */
    if (curl_easy_setopt(h, CURLOPT_URL, url) != CURLE_OK ||
        (cfg->ca_bundle[0] && curl_easy_setopt(h, CURLOPT_CAINFO, cfg->ca_bundle) != CURLE_OK))
        goto oom;
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L); /* the path as signed, dot segments and all */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, cfg->timeout_s);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    if (strcmp(r->method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(h, CURLOPT_READDATA, r);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->body ? (const char *)r->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(r->method, "GET") != 0 &&
               curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method) != CURLE_OK) {
        goto oom;
    }
    *hdrs = l;
    return 0;
oom:
    curl_easy_reset(h); /* it must not keep a pointer to the list freed here */
    curl_slist_free_all(l);
    fsdp_err(err, "s3: out of memory for a request");
    return FSDP_ERROR;
}

static int retryable_code(const char *code)
{
    return strcmp(code, "SlowDown") == 0 || strcmp(code, "RequestTimeout") == 0 ||
           strcmp(code, "InternalError") == 0 || strcmp(code, "ServiceUnavailable") == 0;
}

int s3_finish(struct s3_client *c, CURL *h, struct s3_request *r, CURLcode cc, int *retry,
              char *why, size_t why_len)
{
    *retry = 0;
    if (cc != CURLE_OK) {
        if (r->overflow) {
            snprintf(why, why_len, "the server sent more than the %zu bytes asked for",
                     r->into_len);
            return -1;
        }
        if (r->too_large) { /* the same answer again would be as large: final */
            size_t limit = r->resp.limit ? r->resp.limit : S3_BUF_LIMIT;
            snprintf(why, why_len, "the answer is larger than the %zu MiB this client reads for it",
                     limit >> 20);
            return -1;
        }
        *retry = cc == CURLE_COULDNT_CONNECT || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
                 cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_GOT_NOTHING ||
                 cc == CURLE_PARTIAL_FILE || cc == CURLE_WRITE_ERROR ||
                 cc == CURLE_SSL_CONNECT_ERROR || cc == CURLE_HTTP2 || cc == CURLE_HTTP2_STREAM;
        /* name the endpoint: "Couldn't connect" is only useful with it */
        snprintf(why, why_len, "%s (%s://%s)", curl_easy_strerror(cc), c->cfg.scheme, c->cfg.host);
        return -1;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->status >= 300 && r->resp.len) {
        struct s3_xml x;
        if (s3_xml_parse(r->resp.p, r->resp.len, &x) == 0) {
            const char *code = s3_xml_first(&x, "Code");
            if (code)
                snprintf(r->code, sizeof r->code, "%s", code);
            s3_xml_free(&x);
        }
    }
    if (r->status == 500 || r->status == 502 || r->status == 503 || r->status == 504 ||
        (r->status >= 400 && retryable_code(r->code))) {
        *retry = 1;
        snprintf(why, why_len, "HTTP %ld %s", r->status, r->code);
        return -1;
    }
    if (r->into && r->status >= 200 && r->status < 300 && r->received != r->into_len) {
        *retry = 1;
        snprintf(why, why_len, "body cut short: %zu of %zu bytes", r->received, r->into_len);
        return -1;
    }
    return 0;
}

void s3_backoff(struct s3_client *c, int attempt)
{
    static __thread uint64_t rng;
    if (!rng)
        rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&rng;
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    long cap = c->cfg.retry_base_ms;
    for (int i = 0; i < attempt && cap < c->cfg.retry_cap_ms; i++)
        cap *= 2;
    if (cap > c->cfg.retry_cap_ms)
        cap = c->cfg.retry_cap_ms;
    long ms = (long)((rng >> 33) % (uint64_t)(cap + 1)); /* full jitter */
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
    __atomic_fetch_add(&c->retries, 1, __ATOMIC_RELAXED);
}

static const char *what(const struct s3_request *r, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s", r->bucket, r->key ? "/" : "", r->key ? r->key : "");
    return buf;
}

int s3_perform(struct s3_client *c, struct s3_request *r, const char *op, char *err)
{
    char why[256] = "", obj[1200];
    CURL *h = take_handle(c);
    if (!h) {
        fsdp_err(err, "s3 %s %s: out of memory for a curl handle", op, what(r, obj, sizeof obj));
        return FSDP_ERROR;
    }
    for (int attempt = 0; attempt < c->cfg.max_attempts; attempt++) {
        if (attempt)
            s3_backoff(c, attempt);
        r->attempts = attempt + 1;
        struct curl_slist *hdrs = NULL;
        if (s3_prepare(c, h, r, &hdrs, err)) {
            give_handle(c, h);
            return FSDP_ERROR;
        }
        CURLcode cc = curl_easy_perform(h);
        int retry;
        int rc = s3_finish(c, h, r, cc, &retry, why, sizeof why);
        curl_slist_free_all(hdrs);
        if (rc == 0) {
            give_handle(c, h);
            return 0;
        }
        if (!retry)
            break;
    }
    give_handle(c, h);
    fsdp_err(err, "s3 %s %s: %s (after %d attempt%s)", op, what(r, obj, sizeof obj), why,
             r->attempts, r->attempts > 1 ? "s" : "");
    return FSDP_ERROR;
}

int s3_http_error(const struct s3_request *r, const char *op, char *err)
{
    char obj[1200], msg[256] = "";
    if (r->resp.len) {
        struct s3_xml x;
        if (s3_xml_parse(r->resp.p, r->resp.len, &x) == 0) {
            const char *m = s3_xml_first(&x, "Message");
            if (m && *m)
                snprintf(msg, sizeof msg, ": %s", m);
            s3_xml_free(&x);
        }
    }
    const char *code = r->code[0]                       ? r->code
                       : strcmp(r->method, "HEAD") == 0 ? "(a HEAD answer has no error body)"
                                                        : "(no S3 error code)";
    fsdp_err(err, "s3 %s %s: HTTP %ld %s%s", op, what(r, obj, sizeof obj), r->status, code, msg);
    return FSDP_ERROR;
}
