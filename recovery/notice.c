/*
 * notice.c - polling a spot-instance preemption notice (AWS's
 * meta-data/spot/instance-action form: 200 with {"action": "terminate",
 * "time": "...Z"} when the instance is going away, 404 otherwise).
 *
 * The body comes off the network: it is read into a bounded buffer (a
 * longer one is not a notice), parsed by jansson from (buffer, length),
 * and the time is kept only when it is short printable ASCII, because it
 * is printed on the terminal.
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

/* 1 with the notice's time when the URL says terminate/stop/hibernate. */
int super_poll_notice(const char *url, char *when, size_t n)
{
    CURL *h = curl_easy_init();
    if (!h)
        return 0;
    struct body b = {.len = 0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, (void *)&b);
    long status = 0;
    int found = 0;
    if (curl_easy_perform(h) == CURLE_OK &&
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK && status == 200 &&
        !b.overflow)
        found = super_parse_notice(b.buf, b.len, when, n) == 1;
    curl_easy_cleanup(h);
    return found;
}
