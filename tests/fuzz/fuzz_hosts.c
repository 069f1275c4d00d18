/*
 * fuzz_hosts.c - fsdp-super's host-file parser (super_parse_hosts,
 * recovery/options.c), which re-reads `host slots` lines before every
 * launch.
 *
 * Accepted: at most max hosts, each a non-empty name of letters, digits and
 * . - _ : that does not begin with '-' (the launch agent would take it for
 * an option), with 1..SUPER_MAX_SLOTS slots (0-slot hosts are left out),
 * and a total that is their sum. Refused: one line "NAME:LINE: what", where LINE
 * is a line of the input. Run with the supervisor's limit and with a small
 * one, so that "more than N hosts" is reached too.
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

static void parse(const char *buf, size_t len, int max)
{
    struct host h[SUPER_MAX_HOSTS];
    int nh = -1, total = -1;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (super_parse_hosts(buf, len, "hosts", h, max, &nh, &total, err, sizeof err) != 0) {
        FUZZ_CHECK(strncmp(err, "hosts:", 6) == 0 && strchr(err, '\n') == NULL);
        size_t lines = 1;
        for (size_t i = 0; i < len; i++)
            lines += buf[i] == '\n';
        long line = strtol(err + 6, NULL, 10);
        FUZZ_CHECK(line >= 1 && (size_t)line <= lines);
        return;
    }
    FUZZ_CHECK(nh >= 0 && nh <= max);
    long sum = 0;
    for (int i = 0; i < nh; i++) {
        FUZZ_CHECK(h[i].slots >= 1 && h[i].slots <= SUPER_MAX_SLOTS);
        size_t n = strlen(h[i].name);
        FUZZ_CHECK(n >= 1 && n < sizeof h[i].name && h[i].name[0] != '-');
        for (size_t k = 0; k < n; k++) {
            char c = h[i].name[k];
            FUZZ_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '-' || c == '_' || c == ':');
        }
        sum += h[i].slots;
    }
    FUZZ_CHECK(sum == total);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse((const char *)data, size, SUPER_MAX_HOSTS);
    parse((const char *)data, size, 2);
    return 0;
}
