/*
 * notice.c - polling a spot-instance preemption notice (AWS's
 * meta-data/spot/instance-action form: 200 with {"action": "terminate",
 * "time": "...Z"} when the instance is going away, 404 otherwise).
 *
 * The body comes off the network: it is read into a bounded buffer (a
 * longer one is not a notice), parsed by jansson from (buffer, length),
 * and the time is kept only when it is short printable ASCII, because it
 * is printed on the terminal.
 *
 * Per-host notices: a URL with "{host}" in it is polled once per host of
 * the launch (each name substituted, percent-encoded), all at once.
 */
#include "super.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define NOTICE_MAX 1024

struct body {
    char buf[NOTICE_MAX];
    size_t len;
    int overflow;
};

static size_t collect(char *d, size_t sz, size_t n, void *ud)
{
    struct body *b = ud;
    size_t add = sz * n;
    if (add > sizeof b->buf - b->len)
        b->overflow = 1;
    else {
        memcpy(b->buf + b->len, d, add);
        b->len += add;
    }
    return add;
}

int super_parse_notice(const char *body, size_t len, char *when, size_t n)
{
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    const char *action = json_string_value(json_object_get(j, "action"));
    const char *t = json_string_value(json_object_get(j, "time"));
    int rc = -1;
    if (action) {
        rc =
            !strcmp(action, "terminate") || !strcmp(action, "stop") || !strcmp(action, "hibernate");
        int printable = t && strlen(t) < 64;
        for (const char *p = t; printable && *p; p++)
            printable = *p >= 0x20 && *p < 0x7f;
        if (n)
            snprintf(when, n, "%s", printable ? t : "");
    }
    json_decref(j);
    return rc;
}

/* tmpl with every "{host}" replaced by host, percent-encoded outside
 * RFC 3986's unreserved characters (a name from the host file is not
 * trusted to be URL-safe); -1 when it does not fit. */
int super_notice_url(const char *tmpl, const char *host, char *out, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t at = 0;
    for (const char *p = tmpl; *p;) {
        if (strncmp(p, "{host}", 6) == 0) {
            for (const unsigned char *h = (const unsigned char *)host; *h; h++) {
                int plain = (*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') ||
                            (*h >= '0' && *h <= '9') || strchr("-._~", *h);
                if (at + 4 > n)
                    return -1;
                if (plain) {
                    out[at++] = (char)*h;
                } else {
                    out[at++] = '%';
                    out[at++] = hex[*h >> 4];
                    out[at++] = hex[*h & 15];
                }
            }
            p += 6;
            continue;
        }
        if (at + 2 > n)
            return -1;
        out[at++] = *p++;
    }
    out[at] = 0;
    return 0;
}

/* All the URLs at once (one curl multi handle, 1 s for all of them):
 * found[i] is 1 with when[i] when URL i says terminate/stop/hibernate, 0
 * when it says there is none (404, or another action), -1 when it cannot
 * be told (no answer in time, a transport error, another status, a body
 * that is not a notice): a standing notice is not lifted by a failed
 * poll. */
void super_poll_notices(const char *const *urls, int n, int *found, char (*when)[64])
{
    CURLM *multi = curl_multi_init();
    CURL *h[SUPER_MAX_HOSTS] = {0};
    static struct body b[SUPER_MAX_HOSTS];
    for (int i = 0; i < n; i++) {
        found[i] = -1;
        when[i][0] = 0;
    }
    if (!multi)
        return;
    for (int i = 0; i < n && i < SUPER_MAX_HOSTS; i++) {
        b[i].len = 0;
        b[i].overflow = 0;
        if (!(h[i] = curl_easy_init()))
            continue;
        curl_easy_setopt(h[i], CURLOPT_URL, urls[i]);
        curl_easy_setopt(h[i], CURLOPT_TIMEOUT_MS, 1000L);
        curl_easy_setopt(h[i], CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h[i], CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(h[i], CURLOPT_WRITEDATA, (void *)&b[i]);
        curl_multi_add_handle(multi, h[i]);
    }
    int running = 1;
    while (running) {
        if (curl_multi_perform(multi, &running) != CURLM_OK)
            break;
        if (running)
            curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi, &left))) {
        if (m->msg != CURLMSG_DONE || m->data.result != CURLE_OK)
            continue;
        for (int i = 0; i < n && i < SUPER_MAX_HOSTS; i++) {
            long status = 0;
            if (h[i] != m->easy_handle ||
                curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &status) != CURLE_OK)
                continue;
            if (status == 404)
                found[i] = 0;
            else if (status == 200 && !b[i].overflow)
                found[i] = super_parse_notice(b[i].buf, b[i].len, when[i], sizeof when[i]);
        }
    }
    for (int i = 0; i < n && i < SUPER_MAX_HOSTS; i++) {
        if (h[i]) {
            curl_multi_remove_handle(multi, h[i]);
            curl_easy_cleanup(h[i]);
        }
    }
    curl_multi_cleanup(multi);
}

/* 1 with the notice's time when the URL says terminate/stop/hibernate. */
int super_poll_notice(const char *url, char *when, size_t n)
{
    int found;
    char w[1][64];
    super_poll_notices(&url, 1, &found, w);
    found = found == 1;
    if (found && n)
        snprintf(when, n, "%s", w[0]);
    return found;
}
