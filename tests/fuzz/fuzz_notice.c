/*
 * fuzz_notice.c - fsdp-super's reading of a spot-instance notice body
 * (super_parse_notice, recovery/notice.c: AWS's spot/instance-action JSON),
 * and ev_text (recovery/events.c), through which such strings reach the
 * event log.
 *
 * The notice's time is printed on the terminal: whatever the body, it comes
 * out as printable ASCII shorter than the buffer, or empty. ev_text must
 * turn any bytes into a JSON string that dumps and loads back.
 */
#include "fuzz_common.h"
#include "super.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    return 0;
}

static void notice(const char *body, size_t len, size_t n)
{
    char when[80];
    memset(when, 'X', sizeof when);
    int rc = super_parse_notice(body, len, when, n);
    FUZZ_CHECK(rc >= -1 && rc <= 1);
    if (rc < 0 || n == 0)
        return;
    size_t w = strnlen(when, n);
    FUZZ_CHECK(w < n);
    for (size_t i = 0; i < w; i++)
        FUZZ_CHECK(when[i] >= 0x20 && when[i] < 0x7f);
}

static void event_text(const char *s)
{
    json_t *t = ev_text(s);
    FUZZ_CHECK(t != NULL && json_is_string(t));
    FUZZ_CHECK(json_string_length(t) <= strlen(s));
    json_t *line = json_pack("{s:o}", "error", t);
    FUZZ_CHECK(line != NULL);
    char *txt = json_dumps(line, JSON_COMPACT);
    FUZZ_CHECK(txt != NULL && strchr(txt, '\n') == NULL);
    json_t *back = json_loads(txt, 0, NULL);
    FUZZ_CHECK(back != NULL && json_equal(back, line));
    json_decref(back);
    free(txt);
    json_decref(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    notice((const char *)data, size, 64);
    notice((const char *)data, size, 8);
    notice((const char *)data, size, 0);
    char *s = fuzz_strndup(data, size);
    event_text(s);
    free(s);
    return 0;
}
