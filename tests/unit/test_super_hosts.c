/*
 * test_super_hosts.c - how fsdp-super reaches other hosts before and at a
 * launch (recovery/agent.c, recovery/mpiargs.c): which launch agent it
 * takes from Open MPI's settings, probing hosts through it (all at once,
 * each bounded, killed with everything it started), leaving out the hosts
 * that do not answer and taking them back when they do, the OOB keepalive
 * derived from the heartbeat timeout, and the environment carried to
 * every host by name only.
 *
 * The agent in the probe tests is `sh -c SCRIPT`, which sees the host
 * name as $0: it answers, refuses, hangs or leaves a child behind by name,
 * so nothing is sent anywhere. Addresses that are not this host's are
 * numeric (198.51.100.0/24, documentation only) and only ever handed to
 * that script.
 */
#include "check.h"
#include "super.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The script agent: `sh -c SCRIPT HOST true`, its files in dir (a test's
 * own directory). Hosts named ok* answer;
 * down* (or any host with DIR/HOST.down) refuse like ssh; slow* never
 * answer; spawn* never answer and leave a background child holding the
 * pipe. Each writes its pid (and the child's) to DIR/HOST.pid. */
static void script_agent(struct agent *a, const char *dir)
{
    static char script[1024];
    snprintf(script, sizeof script,
             "echo $$ > %s/$0.pid; [ -e %s/$0.down ] && { echo \"agent: connect to host $0: "
             "Connection refused\" >&2; exit 255; }; case $0 in ok*|198.*) exit 0;; "
             "down*) echo \"agent: connect to host $0: Connection refused\" >&2; exit 255;; "
             "slow*) exec sleep 60;; spawn*) sleep 60 & echo $! >> %s/$0.pid; exec sleep 60;; "
             "esac; exit 3",
             dir, dir, dir);
    memset(a, 0, sizeof *a);
    a->word[0] = "sh";
    a->word[1] = "-c";
    a->word[2] = script;
    a->nwords = 3;
}

/* 1 if pid is running or sleeping (not gone, not a zombie). */
static int running(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* ---- the agent ------------------------------------------------------------------- */

static void the_agent_is_ssh_unless_open_mpi_is_told_otherwise(void)
{
    struct agent a;
    char err[256];
    REQUIRE(agent_init(&a, NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(a.nwords == 1 && strcmp(a.word[0], "ssh") == 0 && a.is_ssh, "%s", a.word[0]);
    REQUIRE(agent_init(&a, "", "", err, sizeof err) == 0, "%s", err);
    CHECK(a.nwords == 1 && a.is_ssh, "an empty setting is the default");
    REQUIRE(agent_init(&a, "/usr/bin/ssh -p 2222", "-o ServerAliveInterval=1", err, sizeof err) ==
                0,
            "%s", err);
    CHECK(a.nwords == 5 && a.is_ssh && strcmp(a.word[2], "2222") == 0 &&
              strcmp(a.word[4], "ServerAliveInterval=1") == 0,
          "words of the agent, then of plm_rsh_args");
    REQUIRE(agent_init(&a, "/opt/mh-rsh", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(a.nwords == 1 && !a.is_ssh, "another agent gets no ssh options");
}

static void the_first_alternative_found_is_the_agent(void)
{
    struct agent a;
    char err[256];
    REQUIRE(agent_init(&a, "/nonexistent/agent -v : sh -e", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(a.nwords == 2 && strcmp(a.word[0], "sh") == 0 && strcmp(a.word[1], "-e") == 0, "took %s",
          a.word[0]);
    REQUIRE(agent_init(&a, " /nonexistent/a : /nonexistent/b", NULL, err, sizeof err) == 0, "%s",
            err);
    CHECK(a.nwords == 1 && strcmp(a.word[0], "/nonexistent/a") == 0,
          "none found: the first (its probes say it cannot be run), took %s", a.word[0]);
    CHECK(agent_init(&a, " : ", NULL, err, sizeof err) == -1 && strstr(err, "names no command"),
          "%s", err);
    char many[400] = "ssh";
    for (int i = 0; i < AGENT_MAX_WORDS; i++)
        strcat(many, " -v");
    CHECK(agent_init(&a, many, NULL, err, sizeof err) == -1 && strstr(err, "too long"), "%s", err);
}

/* ---- probes ------------------------------------------------------------------------- */

static void probes_run_at_once_and_say_why_a_host_does_not_answer_body(const char *dir)
{
    struct agent a;
    script_agent(&a, dir);
    const char *names[] = {"ok1", "down1", "ok2", "slow1", "spawn1", "ok3"};
    struct probe p[6];
    double t0 = fsdp_now();
    agent_probe(&a, names, 6, 1, p);
    double took = fsdp_now() - t0;
    CHECK(p[0].ok && p[2].ok && p[5].ok && !p[0].why[0], "the hosts that answer");
    CHECK(!p[1].ok && strcmp(p[1].why, "sh exited 255: agent: connect to host down1: Connection "
                                       "refused") == 0,
          "%s", p[1].why);
    CHECK(!p[3].ok && strcmp(p[3].why, "no answer through sh within 1 s") == 0, "%s", p[3].why);
    CHECK(!p[4].ok && strstr(p[4].why, "no answer"), "%s", p[4].why);
    CHECK(p[0].took < 1.5 && p[1].took < 1.5, "a quick answer is not held up: %.2f %.2f", p[0].took,
          p[1].took);
    /* in parallel and bounded: the two that hang are killed a second after
     * the bound, together */
    CHECK(took >= 1.9 && took < 3.5, "the round took %.2f s", took);
    CHECK(p[3].took >= 1.9 && p[3].took < 3.5, "%.2f", p[3].took);
}

static void probes_run_at_once_and_say_why_a_host_does_not_answer(void)
{
    check_in_tmpdir("hosts", probes_run_at_once_and_say_why_a_host_does_not_answer_body);
}

static void a_probe_that_hangs_is_killed_with_what_it_started_body(const char *dir)
{
    struct agent a;
    script_agent(&a, dir);
    const char *names[] = {"spawn2"};
    struct probe p;
    agent_probe(&a, names, 1, 1, &p);
    CHECK(!p.ok, "it never answered");
    char path[128];
    snprintf(path, sizeof path, "%s/spawn2.pid", dir);
    FILE *f = fopen(path, "r");
    REQUIRE(f, "the agent never ran");
    int pids[2], n = 0;
    while (n < 2 && fscanf(f, "%d", &pids[n]) == 1)
        n++;
    fclose(f);
    REQUIRE(n == 2, "the agent's pid and its child's");
    double until = fsdp_now() + 5;
    while ((running(pids[0]) || running(pids[1])) && fsdp_now() < until)
        usleep(20000);
    CHECK(!running(pids[0]) && !running(pids[1]), "left running: %d %d", pids[0], pids[1]);
}

static void a_probe_that_hangs_is_killed_with_what_it_started(void)
{
    check_in_tmpdir("hosts", a_probe_that_hangs_is_killed_with_what_it_started_body);
}

static void an_agent_that_cannot_be_run_is_a_reason(void)
{
    struct agent a;
    char err[256];
    REQUIRE(agent_init(&a, "/nonexistent/agent", NULL, err, sizeof err) == 0, "%s", err);
    const char *names[] = {"ok1"};
    struct probe p;
    agent_probe(&a, names, 1, 1, &p);
    CHECK(!p.ok && strstr(p.why, "exited 127: cannot run /nonexistent/agent"), "%s", p.why);
}

/* The probe that clears a host: an agent that runs the command here (as
 * ssh would run it there) finds a stopped process of an earlier launch
 * of this job by its environment, kills it, says so, and leaves the
 * processes of other jobs alone. */
static void the_probe_kills_what_an_earlier_launch_left_on_the_host(void)
{
    struct agent a;
    memset(&a, 0, sizeof a);
    a.word[0] = "sh";
    a.word[1] = "-c";
    a.word[2] = "exec /bin/sh -c \"$1\""; /* $0: the host, $1: the command */
    a.nwords = 3;
    /* ids of this run only: two test runs at once must not clear each other */
    char job[33], other_job[33];
    snprintf(job, sizeof job, "%08x%08x0000000000000000", (unsigned)getpid(), (unsigned)time(NULL));
    snprintf(other_job, sizeof other_job, "%08x%08x0000000000000001", (unsigned)getpid(),
             (unsigned)time(NULL));
    agent_probe_clears(&a, job);
    pid_t ours = fork(), other = -1;
    if (ours == 0) {
        setenv("FSDP_SUPER_JOB", job, 1);
        execlp("sleep", "sleep", "60", (char *)NULL);
        _exit(127);
    }
    other = fork();
    if (other == 0) {
        setenv("FSDP_SUPER_JOB", other_job, 1); /* another job */
        execlp("sleep", "sleep", "60", (char *)NULL);
        _exit(127);
    }
    /* the event: both have exec'd sleep (the probe reads /proc/PID/environ) */
    for (pid_t *pp = (pid_t[]){ours, other, 0}; *pp; pp++) {
        char path[64], comm[32] = "";
        snprintf(path, sizeof path, "/proc/%d/comm", (int)*pp);
        for (double until = fsdp_now() + 10; strncmp(comm, "sleep", 5) && fsdp_now() < until;) {
            FILE *f = fopen(path, "r");
            if (!f || !fgets(comm, sizeof comm, f))
                comm[0] = 0;
            if (f)
                fclose(f);
        }
        REQUIRE(strncmp(comm, "sleep", 5) == 0, "pid %d never ran sleep", (int)*pp);
    }
    kill(ours, SIGSTOP);
    const char *names[] = {"h1"};
    struct probe p;
    agent_probe(&a, names, 1, 5, &p);
    int st = 0;
    CHECK(p.ok && p.cleaned == 1, "ok %d cleaned %d why %s", p.ok, p.cleaned, p.why);
    CHECK(waitpid(ours, &st, WNOHANG) == ours && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
          "the stale process was not killed");
    CHECK(running(other), "another job's process was killed");
    agent_probe(&a, names, 1, 5, &p);
    CHECK(p.ok && p.cleaned == 0, "second probe: ok %d cleaned %d", p.ok, p.cleaned);
    kill(other, SIGKILL);
    waitpid(other, &st, 0);
}

static void hosts_that_do_not_answer_are_left_out_until_they_do_body(const char *dir)
{
    struct agent a;
    script_agent(&a, dir);
    char flag[128];
    snprintf(flag, sizeof flag, "%s/198.51.100.2.down", dir);
    FILE *f = fopen(flag, "w");
    REQUIRE(f, "%s", flag);
    fclose(f);
    struct suspects sp = {0};
    struct host h[3] = {{"198.51.100.1", 2}, {"198.51.100.2", 3}, {"localhost", 1}}, left[3];
    int nh = 3, nleft = -1;
    int slots = hosts_reachable(&sp, &a, 1, h, &nh, left, &nleft);
    CHECK(slots == 3 && nh == 2 && strcmp(h[0].name, "198.51.100.1") == 0 &&
              strcmp(h[1].name, "localhost") == 0,
          "kept %d hosts, %d slots", nh, slots);
    CHECK(nleft == 1 && strcmp(left[0].name, "198.51.100.2") == 0 && left[0].slots == 3,
          "left out %d", nleft);
    CHECK(sp.n == 1 && strcmp(sp.host[0].name, "198.51.100.2") == 0 &&
              strstr(sp.host[0].why, "exited 255"),
          "suspects %d", sp.n);
    snprintf(flag, sizeof flag, "%s/localhost.pid", dir);
    CHECK(access(flag, F_OK) != 0, "this host was probed");
    /* it answers again: back in the next launch, no longer suspect */
    snprintf(flag, sizeof flag, "%s/198.51.100.2.down", dir);
    unlink(flag);
    struct host h2[3] = {{"198.51.100.1", 2}, {"198.51.100.2", 3}, {"localhost", 1}};
    nh = 3;
    slots = hosts_reachable(&sp, &a, 1, h2, &nh, left, &nleft);
    CHECK(slots == 6 && nh == 3 && nleft == 0 && sp.n == 0, "%d slots, %d suspects", slots, sp.n);
    /* --probe-timeout 0: nobody is probed */
    unlink(flag);
    snprintf(flag, sizeof flag, "%s/198.51.100.1.pid", dir);
    unlink(flag);
    nh = 3;
    slots = hosts_reachable(&sp, &a, 0, h2, &nh, left, &nleft);
    CHECK(slots == 6 && nleft == 0 && access(flag, F_OK) != 0, "probed without a timeout");
}

static void hosts_that_do_not_answer_are_left_out_until_they_do(void)
{
    check_in_tmpdir("hosts", hosts_that_do_not_answer_are_left_out_until_they_do_body);
}

/* ---- what every launch tells mpirun ------------------------------------------------------ */

static void the_oob_keepalive_adds_up_to_the_heartbeat_timeout(void)
{
    struct keepalive k;
    mpi_keepalive(3, &k);
    CHECK(k.time == 1 && k.intvl == 1 && k.probes == 2, "%d/%d/%d", k.time, k.intvl, k.probes);
    mpi_keepalive(30, &k);
    CHECK(k.time == 18 && k.intvl == 6 && k.probes == 2, "%d/%d/%d", k.time, k.intvl, k.probes);
    mpi_keepalive(0.5, &k);
    CHECK(k.time == 1 && k.intvl == 1 && k.probes == 2, "never below 1 s");
    for (double t = 3; t <= 86400; t = t * 1.37 + 0.1) {
        mpi_keepalive(t, &k);
        double total = k.time + k.intvl * k.probes;
        CHECK(k.time >= 1 && k.intvl >= 1 && total > t - 1.01 && total < t + 1.01,
              "T %.1f: %d/%d/%d", t, k.time, k.intvl, k.probes);
    }
}

static int has_pair(const struct mpiargs *m, const char *a, const char *b)
{
    for (int i = 0; i + 1 < m->argc; i++)
        if (strcmp(m->argv[i], a) == 0 && strcmp(m->argv[i + 1], b) == 0)
            return 1;
    return 0;
}

static void every_host_gets_the_environment_its_bits_depend_on_by_name_only(void)
{
    char *env[] = {"OPENBLAS_CORETYPE=Haswell",
                   "OMP_NUM_THREADS=1",
                   "PATH=/bin",
                   "FSDP_SUPER_TOKEN=00ff",
                   "FSDP_DIRECT_IO=0",
                   "FSDP_DIRECT_IOX=1",
                   "MKL_CBWR=AVX2",
                   "XOPENBLAS_CORETYPE=x",
                   "OMPI_MCA_oob_tcp_keepalive_time=7",
                   NULL};
    static struct mpiargs m;
    mpiargs_build(&m, 10, env);
    CHECK(has_pair(&m, "-x", "OPENBLAS_CORETYPE") && has_pair(&m, "-x", "OMP_NUM_THREADS") &&
              has_pair(&m, "-x", "FSDP_DIRECT_IO") && has_pair(&m, "-x", "MKL_CBWR"),
          "forwarded");
    CHECK(m.nforward == 4, "only those: %d", m.nforward);
    for (int i = 0; i < m.argc; i++)
        CHECK(!strchr(m.argv[i], '=') && !strstr(m.argv[i], "00ff"), "a value on the line: %s",
              m.argv[i]);
    CHECK(has_pair(&m, "oob_tcp_keepalive_intvl", "2") &&
              has_pair(&m, "oob_tcp_keepalive_probes", "2"),
          "the keepalive");
    CHECK(m.keepalive_set == 2, "the user's oob_tcp_keepalive_time is kept");
    for (int i = 0; i < m.argc; i++)
        CHECK(strcmp(m.argv[i], "oob_tcp_keepalive_time") != 0, "overrode the user's setting");
}

/* Open MPI refuses -x beside its own list (OMPI_MCA_mca_base_env_list):
 * with the list set, ours are appended to it and no -x is used. */
static void a_users_env_list_gets_ours_appended_instead_of_x(void)
{
    char *env[] = {"OMP_NUM_THREADS=1", "OMPI_MCA_mca_base_env_list=SITE_A;SITE_B=x", NULL};
    static struct mpiargs m;
    mpiargs_build(&m, 10, env);
    CHECK(m.use_env_list, "the list was not noticed");
    CHECK(mpiargs_export(&m, "FSDP_SUPER_TOKEN") == 0, "export");
    for (int i = 0; i < m.argc; i++)
        CHECK(strcmp(m.argv[i], "-x") != 0, "-x beside the list: %s", m.argv[i + 1]);
    /* ours first: Open MPI stops at a name it cannot find, which the
     * user's list may hold */
    CHECK(strcmp(m.env_list, "OMP_NUM_THREADS;FSDP_SUPER_TOKEN;SITE_A;SITE_B=x") == 0,
          "env_list: %s", m.env_list);
    CHECK(!m.overflow, "overflow");
    char *env2[] = {"OMPI_MCA_mca_base_env_list=A:B",
                    "OMPI_MCA_mca_base_env_list_delimiter=:", NULL};
    mpiargs_build(&m, 10, env2);
    mpiargs_export(&m, "X");
    CHECK(strcmp(m.env_list, "X:A:B") == 0, "delimiter: %s", m.env_list);
    char *env3[] = {"OMPI_MCA_mca_base_env_list=", NULL};
    mpiargs_build(&m, 10, env3);
    mpiargs_export(&m, "X");
    mpiargs_export(&m, "Y");
    CHECK(strcmp(m.env_list, "X;Y") == 0, "empty list: %s", m.env_list);
    static char huge[5000];
    memset(huge, 'A', sizeof huge - 1);
    memcpy(huge, "OMPI_MCA_mca_base_env_list=", 27);
    char *env4[] = {huge, NULL};
    mpiargs_build(&m, 10, env4);
    CHECK(m.overflow, "a list that does not fit is not cut short silently");
}

CHECK_MAIN(TEST(the_agent_is_ssh_unless_open_mpi_is_told_otherwise),
           TEST(the_first_alternative_found_is_the_agent),
           TEST(probes_run_at_once_and_say_why_a_host_does_not_answer),
           TEST(a_probe_that_hangs_is_killed_with_what_it_started),
           TEST(an_agent_that_cannot_be_run_is_a_reason),
           TEST(the_probe_kills_what_an_earlier_launch_left_on_the_host),
           TEST(hosts_that_do_not_answer_are_left_out_until_they_do),
           TEST(the_oob_keepalive_adds_up_to_the_heartbeat_timeout),
           TEST(every_host_gets_the_environment_its_bits_depend_on_by_name_only),
           TEST(a_users_env_list_gets_ours_appended_instead_of_x))
