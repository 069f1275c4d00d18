/*
 * notice.c - polling a spot-instance preemption notice (AWS's
 * meta-data/spot/instance-action form: 200 with {"action": "terminate",
 * "time": "...Z"} when the instance is going away, 404 otherwise).
 */
#include "super.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* ---- preemption notices ----------------------------------------------------------- */

static size_t collect(char *d, size_t sz, size_t n, void *ud)
{
    char *buf = ud;
    size_t have = strlen(buf), add = sz * n;
    if (have + add < 1024) {
        memcpy(buf + have, d, add);
        buf[have + add] = 0;
    }
    return sz * n;
}

/* 1 with the notice's time when the URL says terminate/stop/hibernate. */
int super_poll_notice(const char *url, char *when, size_t n)
{
    CURL *h = curl_easy_init();
    if (!h)
        return 0;
    char body[1024] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, (void *)body);
    long status = 0;
    int found = 0;
    if (curl_easy_perform(h) == CURLE_OK &&
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK && status == 200) {
        json_t *j = json_loads(body, 0, NULL);
        const char *action = json_string_value(json_object_get(j, "action"));
        const char *t = json_string_value(json_object_get(j, "time"));
        if (action && (!strcmp(action, "terminate") || !strcmp(action, "stop") ||
                       !strcmp(action, "hibernate"))) {
            snprintf(when, n, "%s", t ? t : "");
            found = 1;
        }
        json_decref(j);
    }
    curl_easy_cleanup(h);
    return found;
}

