/*
 * options.c - fsdp-super's command line, the host file, and small line
 * buffers.
 *
 * The host file is re-read before every launch (capacity comes and goes),
 * so its parser takes a buffer: anything it does not understand is an
 * error naming the file and line, never a line silently skipped, and no
 * count read from it can overflow (slots per line are bounded, hosts are
 * bounded, so the total is too).
 */
#include "super.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR_(x) #x
#define XSTR(x) STR_(x)

/* ---- options --------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: fsdp-super [options] -- fsdp-train ARGS...\n"
           "  --np N                  ranks to run (default: the host file's capacity)\n"
           "  --min-np M              fewest ranks worth running (default 1)\n"
           "  --hosts FILE            'host slots' lines, re-read before every launch\n"
           "  --capacity-timeout S    give up when the host file offers fewer than --min-np\n"
           "                          slots for this long (default 300)\n"
           "  --max-restarts K        give up after K restarts in a row (default 10)\n"
           "  --heartbeat-timeout S   a rank silent or without progress this long is hung (30)\n"
           "  --listen HOST[:PORT]    where the ranks' heartbeats arrive (default: every\n"
           "                          interface, any port; the ranks are given the address\n"
           "                          that routes to the first remote host, or 127.0.0.1)\n"
           "  --rank-silence S        a rank that hears nothing from fsdp-super this long\n"
           "                          stops itself (default 3 x --heartbeat-timeout, >= 5)\n"
           "  --startup-timeout S     time to the first heartbeat (default 120)\n"
           "  --probe-timeout S       before each launch every remote host must answer\n"
           "                          'AGENT HOST true' within S (default 5; 0: no probe);\n"
           "                          AGENT is Open MPI's plm_rsh_agent, else ssh\n"
           "  --grace S               SIGTERM to SIGKILL (default 5)\n"
           "  --restart-backoff S     first wait before a relaunch, doubling (default 1)\n"
           "  --healthy-after S       progress this long resets the restart count (60)\n"
           "  --preempt-url URL       poll an AWS spot/instance-action style notice; with\n"
           "                          {host} in it, one per host of the launch (a host\n"
           "                          with a notice is left out while it stands)\n"
           "  --preempt-poll S        how often (default 2)\n"
           "  --events FILE           JSON lines of every event\n"
           "  --chaos SPEC            inject faults on training steps (see recovery/chaos.c;\n"
           "                          needs the trainer's --steps)\n"
           "  --mpirun PATH           (default mpirun)\n"
           "  --metrics ADDR:PORT     serve Prometheus metrics at http://ADDR:PORT/metrics\n"
           "                          (a numeric address: 127.0.0.1:9464, [::1]:9464)\n");
}

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "fsdp-super: %s '%s' is not a number in %g..%g (see fsdp-super --help)\n",
                flag, v ? v : "", lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* The trainer's --ckpt and --steps (the last of each, as its parser does). */
static int trainer_args(struct super_opts *o)
{
    for (int k = 0; k + 1 < o->targc; k++) {
        const char *f = o->targv[k], *v = o->targv[k + 1];
        if (strcmp(f, "--ckpt") == 0)
            o->ckpt = v;
        if (strcmp(f, "--steps") == 0 &&
            hbmsg_parse_uint(v, strlen(v), (uint64_t)1 << 40, &o->train_steps)) {
            fprintf(stderr, "fsdp-super: the trainer's --steps '%s' is not a step count\n", v);
            return -1;
        }
    }
    return 0;
}

enum { O_INT, O_NUM, O_STR };

/* Every option: its flag, kind, bounds and field. */
static const struct opt {
    const char *flag;
    int kind;
    double lo, hi;
    size_t off;
} opts[] = {
    {"--np", O_INT, 1, SUPER_MAX_RANKS, offsetof(struct super_opts, np)},
    {"--min-np", O_INT, 1, SUPER_MAX_RANKS, offsetof(struct super_opts, min_np)},
    {"--max-restarts", O_INT, 0, 1e6, offsetof(struct super_opts, max_restarts)},
    {"--heartbeat-timeout", O_NUM, 0.5, 86400, offsetof(struct super_opts, hb_timeout)},
    {"--startup-timeout", O_NUM, 1, 86400, offsetof(struct super_opts, startup_timeout)},
    {"--grace", O_NUM, 0, 600, offsetof(struct super_opts, grace)},
    {"--restart-backoff", O_NUM, 0, 600, offsetof(struct super_opts, backoff)},
    {"--healthy-after", O_NUM, 0, 1e6, offsetof(struct super_opts, healthy_after)},
    {"--preempt-poll", O_NUM, 0.1, 600, offsetof(struct super_opts, preempt_poll)},
    {"--preempt-deadline", O_NUM, 1, 3600, offsetof(struct super_opts, preempt_deadline)},
    {"--capacity-timeout", O_NUM, 0, 1e7, offsetof(struct super_opts, capacity_timeout)},
    {"--probe-timeout", O_NUM, 0, 600, offsetof(struct super_opts, probe_timeout)},
    {"--rank-silence", O_NUM, 2, 1e6, offsetof(struct super_opts, rank_silence)},
    {"--listen", O_STR, 0, 0, offsetof(struct super_opts, listen)},
    {"--hosts", O_STR, 0, 0, offsetof(struct super_opts, hosts)},
    {"--preempt-url", O_STR, 0, 0, offsetof(struct super_opts, preempt_url)},
    {"--events", O_STR, 0, 0, offsetof(struct super_opts, events)},
    {"--chaos", O_STR, 0, 0, offsetof(struct super_opts, chaos)},
    {"--mpirun", O_STR, 0, 0, offsetof(struct super_opts, mpirun)},
    {"--metrics", O_STR, 0, 0, offsetof(struct super_opts, metrics)},
};

static int set_option(struct super_opts *o, const struct opt *op, const char *v)
{
    char *field = (char *)o + op->off;
    double x;
    if (!v) {
        fprintf(stderr, "fsdp-super: %s needs a value (see fsdp-super --help)\n", op->flag);
        return -1;
    }
    if (op->kind == O_STR) {
        memcpy(field, &v, sizeof v);
        return 0;
    }
    if (num(op->flag, v, op->lo, op->hi, &x))
        return -1;
    if (op->kind == O_INT) {
        int n = (int)x;
        memcpy(field, &n, sizeof n);
    } else {
        memcpy(field, &x, sizeof x);
    }
    return 0;
}

int super_parse(struct super_opts *o, int argc, char **argv)
{
    *o = (struct super_opts){
        .min_np = 1,
        .max_restarts = 10,
        .mpirun = "mpirun",
        .hb_timeout = 30,
        .startup_timeout = 120,
        .grace = 5,
        .backoff = 1,
        .healthy_after = 60,
        .preempt_poll = 2,
        .preempt_deadline = 110,
        .capacity_timeout = 300,
        .probe_timeout = 5,
    };
    int i;
    for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            usage();
            return 1;
        }
        size_t k = 0;
        while (k < sizeof opts / sizeof opts[0] && strcmp(argv[i], opts[k].flag) != 0)
            k++;
        if (k == sizeof opts / sizeof opts[0]) {
            fprintf(stderr, "fsdp-super: unknown option '%s' (see fsdp-super --help)\n", argv[i]);
            return -1;
        }
        if (set_option(o, &opts[k], i + 1 < argc ? argv[i + 1] : NULL))
            return -1;
        i++;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "fsdp-super: expected -- fsdp-train ARGS... (see fsdp-super --help)\n");
        return -1;
    }
    o->targc = argc - i - 1;
    o->targv = argv + i + 1;
    if (trainer_args(o))
        return -1;
    if (!o->np && !o->hosts) {
        fprintf(stderr, "fsdp-super: give --np N or --hosts FILE (see fsdp-super --help)\n");
        return -1;
    }
    char host[256];
    int port;
    if (o->listen && hbmsg_parse_addr(o->listen, 1, host, sizeof host, &port)) {
        fprintf(stderr,
                "fsdp-super: --listen '%s' is not HOST, HOST:PORT, [V6]:PORT or :PORT "
                "(see fsdp-super --help)\n",
                o->listen);
        return -1;
    }
    if (!o->rank_silence)
        o->rank_silence = o->hb_timeout * 3 > 5 ? o->hb_timeout * 3 : 5;
    if (o->np && o->min_np > o->np) {
        fprintf(stderr, "fsdp-super: --min-np %d exceeds --np %d\n", o->min_np, o->np);
        return -1;
    }
    if (o->preempt_url && strstr(o->preempt_url, "{host}") && !o->hosts) {
        fprintf(stderr, "fsdp-super: --preempt-url with {host} needs --hosts (a notice per host "
                "of a host file; without one, use a URL for this host alone)\n");
        return -1;
    }
    return 0;
}

/* ---- the host file --------------------------------------------------------------- */

static int host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_' || c == ':';
}

/* One line without its comment, [p, p+n): 0 with *slots (-1: blank line),
 * or -1 with what is wrong in why. */
static int parse_host_line(const char *p, size_t n, char *name, int *slots, const char **why)
{
    const char *tok[3];
    size_t len[3];
    int nt = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] == ' ' || p[i] == '\t' || p[i] == '\r') {
            i++;
            continue;
        }
        size_t s = i;
        while (i < n && p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
            i++;
        if (nt == 3) {
            *why = "expected 'HOST [SLOTS]' or 'HOST slots=SLOTS'";
            return -1;
        }
        tok[nt] = p + s;
        len[nt++] = i - s;
    }
    *slots = -1;
    if (nt == 0)
        return 0;
    if (nt == 3 || len[0] >= sizeof((struct host *)0)->name) {
        *why = nt == 3 ? "expected 'HOST [SLOTS]' or 'HOST slots=SLOTS'" : "host name too long";
        return -1;
    }
    for (size_t k = 0; k < len[0]; k++) {
        if (!host_char(tok[0][k])) {
            *why = "a host name is letters, digits and . - _ :";
            return -1;
        }
    }
    memcpy(name, tok[0], len[0]);
    name[len[0]] = 0;
    uint64_t v = 1;
    if (nt == 2) {
        const char *s = tok[1];
        size_t sl = len[1];
        if (sl > 6 && memcmp(s, "slots=", 6) == 0) {
            s += 6;
            sl -= 6;
        }
        if (hbmsg_parse_uint(s, sl, SUPER_MAX_SLOTS, &v)) {
            *why = "slots must be a whole number in 0.." XSTR(SUPER_MAX_SLOTS);
            return -1;
        }
    }
    *slots = (int)v;
    return 0;
}

int super_parse_hosts(const char *buf, size_t len, const char *name, struct host *h, int max,
                      int *nh, int *total, char *err, size_t errlen)
{
    *nh = 0;
    *total = 0;
    int lineno = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - buf) : len, n = end - at;
        lineno++;
        const char *hash = memchr(buf + at, '#', n);
        if (hash)
            n = (size_t)(hash - (buf + at));
        const char *why = NULL;
        char host[sizeof h->name];
        int slots;
        if (memchr(buf + at, 0, n))
            why = "a NUL byte";
        else
            parse_host_line(buf + at, n, host, &slots, &why);
        if (!why && slots > 0 && *nh == max) {
            snprintf(err, errlen, "%s:%d: more than %d hosts", name, lineno, max);
            return -1;
        }
        if (why) {
            snprintf(err, errlen, "%s:%d: %s", name, lineno, why);
            return -1;
        }
        if (slots > 0) {
            snprintf(h[*nh].name, sizeof h->name, "%s", host);
            h[*nh].slots = slots;
            *total += slots; /* at most 64 x 4096 */
            (*nh)++;
        }
        at = end + 1;
    }
    return 0;
}

int super_read_hosts(const char *path, struct host *h, int max, int *nh, int *total, char *err,
                     size_t errlen)
{
    *nh = *total = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot read the host file %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(SUPER_HOSTS_MAX + 1);
    size_t n = buf ? fread(buf, 1, SUPER_HOSTS_MAX + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    int rc = -1;
    if (!buf)
        snprintf(err, errlen, "%s: out of memory", path);
    else if (bad)
        snprintf(err, errlen, "%s: read error", path);
    else if (n > SUPER_HOSTS_MAX)
        snprintf(err, errlen, "%s: larger than %d bytes; is it a host file?", path,
                 SUPER_HOSTS_MAX);
    else
        rc = super_parse_hosts(buf, n, path, h, max, nh, total, err, errlen);
    free(buf);
    return rc;
}

/* ---- line tails ------------------------------------------------------------------- */

void line_tail_add(struct line_tail *t, const char *line)
{
    snprintf(t->line[t->next], sizeof t->line[0], "%s", line);
    t->next = (t->next + 1) % SUPER_TAIL_KEEP;
    if (t->count < SUPER_TAIL_KEEP)
        t->count++;
}

const char *line_tail_get(const struct line_tail *t, int i)
{
    if (i < 0 || i >= t->count)
        return NULL;
    return t->line[(t->next - t->count + i + SUPER_TAIL_KEEP) % SUPER_TAIL_KEEP];
}
