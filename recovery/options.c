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

#include "opts.h"
#include "util.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STR_(x) #x
#define XSTR(x) STR_(x)

/* ---- options --------------------------------------------------------------- */

/* What the flags give: super_opts (a struct of its own for AT, which the
 * table's rows share with the other programs' tables) */
struct super_given {
    struct super_opts o;
};

#define AT(field) offsetof(struct super_given, field)

/* Every option; the usage text is this table in this order. */
static const struct opt super_flags[] = {
    {"--np", OPT_INT, AT(o.np), .min = 1, .max = SUPER_MAX_RANKS, .arg = "N",
     .help = "ranks to run (default: the host file's capacity)"},
    {"--min-np", OPT_INT, AT(o.min_np), .min = 1, .max = SUPER_MAX_RANKS, .arg = "M",
     .help = "fewest ranks worth running (default 1)"},
    {"--hosts", OPT_STR, AT(o.hosts), .arg = "FILE",
     .help = "'host slots' lines, re-read before every launch"},
    {"--capacity-timeout", OPT_NUM, AT(o.capacity_timeout), .lo = 0, .hi = 1e7, .arg = "S",
     .help = "give up when the host file offers fewer than --min-np\n"
             "slots for this long (default 300)"},
    {"--max-restarts", OPT_INT, AT(o.max_restarts), .min = 0, .max = 1000000, .arg = "K",
     .help = "give up after K failures in a row that recur: a launch\n"
             "that trains no new step, or fails at the same step for\n"
             "the same cause (default 10; 0: never relaunch)"},
    {"--heartbeat-timeout", OPT_NUM, AT(o.hb_timeout), .lo = 0.5, .hi = 86400, .arg = "S",
     .help = "a rank silent or without progress this long is hung (30)"},
    {"--listen", OPT_STR, AT(o.listen), .arg = "HOST[:PORT]",
     .help = "where the ranks' heartbeats arrive (default: every\n"
             "interface, any port; the ranks are given the address\n"
             "that routes to the first remote host, or 127.0.0.1)"},
    {"--rank-silence", OPT_NUM, AT(o.rank_silence), .lo = 2, .hi = 1e6, .arg = "S",
     .help = "a rank that hears nothing from fsdp-super this long\n"
             "stops itself (default 3 x --heartbeat-timeout, >= 5)"},
    {"--startup-timeout", OPT_NUM, AT(o.startup_timeout), .lo = 1, .hi = 86400, .arg = "S",
     .help = "time to the first heartbeat (default 120)"},
    {"--probe-timeout", OPT_NUM, AT(o.probe_timeout), .lo = 0, .hi = 600, .arg = "S",
     .help = "before each launch every remote host must answer\n"
             "'AGENT HOST true' within S (default 5; 0: no probe);\n"
             "AGENT is Open MPI's plm_rsh_agent, else ssh"},
    {"--grace", OPT_NUM, AT(o.grace), .lo = 0, .hi = 600, .arg = "S",
     .help = "SIGTERM to SIGKILL (default 5)"},
    {"--restart-backoff", OPT_NUM, AT(o.backoff), .lo = 0, .hi = 600, .arg = "S",
     .help = "first wait before relaunching after a failure that\n"
             "recurs, doubling to 30 (default 1); a failure after\n"
             "progress relaunches at once"},
    {"--healthy-after", OPT_NUM, AT(o.healthy_after), .lo = 0, .hi = 1e6, .arg = "S",
     .help = "progress this long resets the recurring count (60)"},
    {"--set-aside", OPT_NUM, AT(o.set_aside), .lo = 0, .hi = 1e7, .arg = "S",
     .help = "a host of --hosts that fails twice in a row (no\n"
             "--healthy-after stretch between) is left out this long\n"
             "(default 600; 0: never), unless the others offer fewer\n"
             "than --min-np slots"},
    {"--preempt-url", OPT_STR, AT(o.preempt_url), .arg = "URL",
     .help = "poll an AWS spot/instance-action style notice; with\n"
             "{host} in it, one per host of the launch (a host\n"
             "with a notice is left out while it stands)"},
    {"--preempt-poll", OPT_NUM, AT(o.preempt_poll), .lo = 0.1, .hi = 600, .arg = "S",
     .help = "how often (default 2)"},
    {"--preempt-deadline", OPT_NUM, AT(o.preempt_deadline), .lo = 1, .hi = 3600,
     .help = NULL}, /* not listed */
    {"--events", OPT_STR, AT(o.events), .arg = "FILE", .help = "JSON lines of every event"},
    {"--chaos", OPT_STR, AT(o.chaos), .arg = "SPEC",
     .help = "inject faults on training steps (see recovery/chaos.c;\n"
             "needs the trainer's --steps)"},
    {"--mpirun", OPT_STR, AT(o.mpirun), .arg = "PATH", .help = "(default mpirun)"},
    {"--metrics", OPT_STR, AT(o.metrics), .arg = "ADDR:PORT",
     .help = "serve Prometheus metrics at http://ADDR:PORT/metrics\n"
             "(a numeric address: 127.0.0.1:9464, [::1]:9464)"},
    {"--help", OPT_HELP, .help = NULL},
};

static void usage(void)
{
    printf("usage: fsdp-super [options] -- fsdp-train ARGS...\n");
    opts_usage(stdout, super_flags, OPTS_LEN(super_flags), 23);
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

/* The options up to "--": 0, 1 after --help, -1 after a message. */
static int parse_flags(struct super_opts *out, int argc, char **argv, int *sep)
{
    struct super_given g = {
        .o = {.mpirun = "mpirun",
              .hb_timeout = 30,
              .startup_timeout = 120,
              .grace = 5,
              .backoff = 1,
              .healthy_after = 60,
              .set_aside = 600,
              .preempt_poll = 2,
              .preempt_deadline = 110,
              .capacity_timeout = 300,
              .probe_timeout = 5,
              .min_np = 1,
              .max_restarts = 10},
    };
    char err[FSDP_ERR_LEN];
    *sep = 1;
    int rc = opts_parse(super_flags, OPTS_LEN(super_flags), &g, argc, argv, sep, err);
    if (rc == OPTS_HELP) {
        usage();
        return 1;
    }
    if (!rc && *sep < argc && strcmp(argv[*sep], "--") != 0)
        rc = fsdp_err(err, "unknown option '%s'", argv[*sep]);
    if (!rc && *sep + 1 >= argc)
        rc = fsdp_err(err, "expected -- fsdp-train ARGS...");
    if (rc) {
        fprintf(stderr, "fsdp-super: %s (see fsdp-super --help)\n", err);
        return -1;
    }
    *out = g.o;
    return 0;
}

int super_parse(struct super_opts *o, int argc, char **argv)
{
    int i;
    int rc = parse_flags(o, argc, argv, &i);
    if (rc)
        return rc;
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

/* A host name of the file as a message may show it: printable ASCII as it
 * is, anything else (a control character, a byte of UTF-8, a quote) as
 * \xNN, the first 64 bytes at most. */
static void shown_name(const char *p, size_t n, char *out, size_t outlen)
{
    size_t k = 0;
    for (size_t i = 0; i < n && i < 64 && k + 5 < outlen; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c > 0x20 && c < 0x7f && c != '\'' && c != '\\')
            out[k++] = (char)c;
        else
            k += (size_t)snprintf(out + k, outlen - k, "\\x%02x", c);
    }
    if (n > 64 && k + 4 < outlen)
        k += (size_t)snprintf(out + k, outlen - k, "...");
    out[k] = 0;
}

/* One line without its comment, [p, p+n): 0 with *slots (-1: blank line),
 * or -1 with what is wrong in why.
 *
 * A host name reaches the launch agent as the word before the command
 * (agent.c's probe: `ssh [OPTIONS] HOST true`; Open MPI's `AGENT HOST
 * orted ...`, no `--` before it): one that begins with '-' would be taken
 * for an option (`-Fevil` is ssh's -F evil, a config file of the
 * attacker's), so it is refused. And the names go on to the other hosts'
 * login shells inside double quotes (orted's `-mca orte_node_regex
 * "vm,node-a@0(2)"`), and into Open MPI's hostfile: so only letters,
 * digits and . - _ : (IPv6 addresses have colons) are allowed, never a
 * blank, a control character, a quote, $, ` or \. */
static int parse_host_line(const char *p, size_t n, char *name, int *slots, char *why,
                           size_t whylen)
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
            snprintf(why, whylen, "expected 'HOST [SLOTS]' or 'HOST slots=SLOTS'");
            return -1;
        }
        tok[nt] = p + s;
        len[nt++] = i - s;
    }
    *slots = -1;
    if (nt == 0)
        return 0;
    if (nt == 3) {
        snprintf(why, whylen, "expected 'HOST [SLOTS]' or 'HOST slots=SLOTS'");
        return -1;
    }
    char shown[64 * 4 + 8];
    shown_name(tok[0], len[0], shown, sizeof shown);
    if (len[0] >= sizeof((struct host *)0)->name) {
        snprintf(why, whylen, "host name '%s' too long (at most %zu characters)", shown,
                 sizeof((struct host *)0)->name - 1);
        return -1;
    }
    for (size_t k = 0; k < len[0]; k++) {
        if (!host_char(tok[0][k])) {
            snprintf(why, whylen, "a host name is letters, digits and . - _ :, not '%s'", shown);
            return -1;
        }
    }
    if (tok[0][0] == '-') {
        snprintf(why, whylen,
                 "host name '%s' begins with '-': the launch agent (ssh) would take it for an "
                 "option",
                 shown);
        return -1;
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
            snprintf(why, whylen, "slots must be a whole number in 0.." XSTR(SUPER_MAX_SLOTS));
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
        char why[FSDP_ERR_LEN] = "";
        char host[sizeof h->name];
        int slots = -1;
        if (memchr(buf + at, 0, n))
            snprintf(why, sizeof why, "a NUL byte");
        else
            parse_host_line(buf + at, n, host, &slots, why, sizeof why);
        if (!why[0] && slots > 0 && *nh == max) {
            snprintf(err, errlen, "%s:%d: more than %d hosts", name, lineno, max);
            return -1;
        }
        if (why[0]) {
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
    char why[FSDP_ERR_LEN];
    int fd, rc = fsdp_open_regular(path, "a host file", &fd, NULL, why);
    if (rc == FSDP_NOT_REGULAR) {
        snprintf(err, errlen, "%s", why);
        return rc;
    }
    if (rc) {
        snprintf(err, errlen, "cannot read the host file %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(SUPER_HOSTS_MAX + 1);
    size_t n = 0;
    int e = 0;
    while (buf && n < SUPER_HOSTS_MAX + 1) {
        ssize_t r = read(fd, buf + n, SUPER_HOSTS_MAX + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            e = r < 0 ? errno : 0;
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    rc = -1;
    if (!buf)
        snprintf(err, errlen, "%s: out of memory", path);
    else if (e)
        snprintf(err, errlen, "cannot read the host file %s: %s", path, strerror(e));
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
