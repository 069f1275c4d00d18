/*
 * options.c - fsdp-super's command line and the host file.
 */
#include "super.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- options --------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: fsdp-super [options] -- fsdp-train ARGS...\n"
           "  --np N                  ranks to run (default: the host file's capacity)\n"
           "  --min-np M              fewest ranks worth running (default 1)\n"
           "  --hosts FILE            'host slots' lines, re-read before every launch\n"
           "  --max-restarts K        give up after K restarts in a row (default 10)\n"
           "  --heartbeat-timeout S   a rank silent or without progress this long is hung (30)\n"
           "  --startup-timeout S     time to the first heartbeat (default 120)\n"
           "  --grace S               SIGTERM to SIGKILL (default 5)\n"
           "  --restart-backoff S     first wait before a relaunch, doubling (default 1)\n"
           "  --healthy-after S       progress this long resets the restart count (60)\n"
           "  --preempt-url URL       poll an AWS spot/instance-action style notice\n"
           "  --preempt-poll S        how often (default 2)\n"
           "  --events FILE           JSON lines of every event\n"
           "  --chaos SPEC            inject faults (see recovery/chaos.c)\n"
           "  --mpirun PATH           (default mpirun)\n");
}

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "fsdp-super: %s '%s' is not a number in %g..%g (see fsdp-super --help)\n",
                flag, v ? v : "", lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int super_parse(struct super_opts *o, int argc, char **argv)
{
    *o = (struct super_opts){.min_np = 1, .max_restarts = 10, .mpirun = "mpirun",
                             .hb_timeout = 30, .startup_timeout = 120, .grace = 5,
                             .backoff = 1, .healthy_after = 60, .preempt_poll = 2,
                             .preempt_deadline = 110};
    int i;
    for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (strcmp(f, "--help") == 0) {
            usage();
            exit(0);
        }
#define NUM(name, lo, hi, dst)                                                                    \
    else if (strcmp(f, name) == 0) {                                                               \
        if (num(f, v, lo, hi, &x))                                                                 \
            return -1;                                                                             \
        dst;                                                                                       \
        i++;                                                                                       \
    }
#define STR(name, dst)                                                                            \
    else if (strcmp(f, name) == 0) {                                                               \
        if (!v) {                                                                                  \
            fprintf(stderr, "fsdp-super: %s needs a value (see fsdp-super --help)\n", f);          \
            return -1;                                                                             \
        }                                                                                          \
        dst = v;                                                                                   \
        i++;                                                                                       \
    }
        NUM("--np", 1, SUPER_MAX_RANKS, o->np = (int)x)
        NUM("--min-np", 1, SUPER_MAX_RANKS, o->min_np = (int)x)
        NUM("--max-restarts", 0, 1e6, o->max_restarts = (int)x)
        NUM("--heartbeat-timeout", 0.5, 86400, o->hb_timeout = x)
        NUM("--startup-timeout", 1, 86400, o->startup_timeout = x)
        NUM("--grace", 0, 600, o->grace = x)
        NUM("--restart-backoff", 0, 600, o->backoff = x)
        NUM("--healthy-after", 0, 1e6, o->healthy_after = x)
        NUM("--preempt-poll", 0.1, 600, o->preempt_poll = x)
        NUM("--preempt-deadline", 1, 3600, o->preempt_deadline = x)
        STR("--hosts", o->hosts)
        STR("--preempt-url", o->preempt_url)
        STR("--events", o->events)
        STR("--chaos", o->chaos)
        STR("--mpirun", o->mpirun)
        else
        {
            fprintf(stderr, "fsdp-super: unknown option '%s' (see fsdp-super --help)\n", f);
            return -1;
        }
#undef NUM
#undef STR
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "fsdp-super: expected -- fsdp-train ARGS... (see fsdp-super --help)\n");
        return -1;
    }
    o->targc = argc - i - 1;
    o->targv = argv + i + 1;
    for (int k = 0; k + 1 < o->targc; k++)
        if (strcmp(o->targv[k], "--ckpt") == 0)
            o->ckpt = o->targv[k + 1];
    if (!o->np && !o->hosts) {
        fprintf(stderr, "fsdp-super: give --np N or --hosts FILE (see fsdp-super --help)\n");
        return -1;
    }
    if (o->np && o->min_np > o->np) {
        fprintf(stderr, "fsdp-super: --min-np %d exceeds --np %d\n", o->min_np, o->np);
        return -1;
    }
    return 0;
}

/* ---- capacity ---------------------------------------------------------------- */

/* Reads `host slots` (or `host slots=N`) lines; returns the slot total. */
int super_read_hosts(const char *path, struct host *h, int max, int *nh)
{
    *nh = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int total = 0;
    while (fgets(line, sizeof line, f) && *nh < max) {
        char name[128];
        int slots = 1;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        if (sscanf(line, "%127s slots=%d", name, &slots) != 2 &&
            sscanf(line, "%127s %d", name, &slots) < 1)
            continue;
        if (slots < 1)
            continue;
        snprintf(h[*nh].name, sizeof h[0].name, "%s", name);
        h[*nh].slots = slots;
        total += slots;
        (*nh)++;
    }
    fclose(f);
    return total;
}

