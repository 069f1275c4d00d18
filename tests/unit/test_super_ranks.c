/*
 * test_super_ranks.c - how fsdp-super sees ranks wherever they run
 * (recovery/ranks.c, and mpirun's word on them: mpiout.c) and where it
 * listens and what address it gives them (recovery/net.c).
 *
 * The rank tests inject the supervisor's view of its own host (its name,
 * the job's session, what /proc says of a pid, and a kill() that only
 * records), so that a rank "on another host" can be one whose pid happens
 * to be alive here, exactly the case that must never be signalled or judged
 * by /proc. The network tests use 127.0.0.1 and ::1 only; addresses that
 * are not this host's are numeric and never sent to.
 */
#include "check.h"
#include "hbmsg.h"
#include "super.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the injected view of this host ----------------------------------------------- */

#define SESSION 100

static struct {
    char state[64];    /* per pid: 0 gone, else the letter */
    pid_t session[64]; /* per pid */
    int signals, last_pid, last_sig;
} fake;

static char fake_state(pid_t pid) { return pid > 0 && pid < 64 ? fake.state[pid] : 0; }
static pid_t fake_session(pid_t pid) { return pid > 0 && pid < 64 ? fake.session[pid] : 0; }
static int fake_kill(pid_t pid, int sig)
{
    fake.signals++;
    fake.last_pid = pid;
    fake.last_sig = sig;
    return 0;
}

/* pids 1..9 are live processes of the job's session here */
static struct rank_env here(void)
{
    memset(&fake, 0, sizeof fake);
    for (int p = 1; p < 10; p++) {
        fake.state[p] = 'S';
        fake.session[p] = SESSION;
    }
    struct rank_env e = {
        .session = SESSION, .state = fake_state, .session_of = fake_session, .signal = fake_kill};
    snprintf(e.host, sizeof e.host, "ctl");
    return e;
}

static struct hbmsg beat(const char *host, int pid, uint64_t seq)
{
    struct hbmsg m;
    memset(&m, 0, sizeof m);
    m.kind = HBMSG_BEAT;
    m.generation = 1;
    m.pid = pid;
    m.phase = HB_TRAIN;
    m.seq = seq;
    snprintf(m.host, sizeof m.host, "%s", host);
    return m;
}

/* A rank admitted by its first beat and seen at time 0. */
static struct rank_state admitted(const struct rank_env *e, const char *host, int pid)
{
    struct rank_state rs;
    memset(&rs, 0, sizeof rs);
    struct hbmsg m = beat(host, pid, 1);
    if (rank_admit(&rs, e, &m) != ADMIT_OK)
        rs.pid = -1;
    rs.seen = 1;
    rs.phase = HB_TRAIN;
    return rs;
}

/* ---- identity ------------------------------------------------------------------------ */

static void a_rank_on_another_host_is_remote_even_when_its_pid_lives_here(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "node1", 5); /* pid 5 is in the session here */
    CHECK(rs.pid == 5 && !rs.local && strcmp(rs.host, "node1") == 0, "local %d", rs.local);
}

static void a_rank_of_this_host_outside_the_jobs_session_is_remote(void)
{
    struct rank_env e = here();
    fake.session[6] = 4242; /* another PID namespace, or another job */
    struct rank_state rs = admitted(&e, "ctl", 6);
    CHECK(!rs.local, "a pid outside the session was taken for the rank");
    rs = admitted(&e, "ctl", 50); /* no such process here at all */
    CHECK(!rs.local, "a pid that does not exist here was taken for the rank");
    rs = admitted(&e, "ctl", 5);
    CHECK(rs.local, "the rank of this host in the session");
}

static void a_rank_keeps_the_identity_of_its_first_heartbeat(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "node1", 5);
    struct hbmsg m = beat("node2", 5, 2);
    CHECK(rank_admit(&rs, &e, &m) == ADMIT_CONFLICT, "another host");
    m = beat("node1", 6, 3);
    CHECK(rank_admit(&rs, &e, &m) == ADMIT_CONFLICT, "another pid");
    m = beat("node1", 5, 4);
    m.kind = HBMSG_EVENT;
    snprintf(m.host, sizeof m.host, "node9");
    CHECK(rank_admit(&rs, &e, &m) == ADMIT_CONFLICT, "an event from another host");
    m = beat("node1", 5, 5);
    CHECK(rank_admit(&rs, &e, &m) == ADMIT_OK, "itself");
    CHECK(rank_admit(&rs, &e, &m) == ADMIT_REPLAY, "itself again: a replay");
    m.seq = 1;
    CHECK(rank_admit(&rs, &e, &m) == ADMIT_REPLAY, "its first seq again");
    CHECK(strcmp(rs.host, "node1") == 0 && rs.pid == 5, "the identity moved");
}

/* ---- verdicts --------------------------------------------------------------------------- */

static int verdict(const struct rank_state *rs, const struct rank_env *e, int pass, double now,
                   char *st)
{
    return rank_verdict(rs, e, pass, now, 3.0, st);
}

static void a_local_rank_whose_process_is_gone_has_died(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "ctl", 5);
    char st;
    CHECK(verdict(&rs, &e, 0, 0, &st) == RV_OK && st == 'S', "alive: %c", st);
    fake.state[5] = 'Z';
    CHECK(verdict(&rs, &e, 0, 0, &st) == RV_DIED, "a zombie");
    fake.state[5] = 0;
    CHECK(verdict(&rs, &e, 0, 0, &st) == RV_DIED, "gone");
    fake.state[5] = 'S';
    fake.session[5] = 777; /* the pid was reused by someone else */
    CHECK(verdict(&rs, &e, 0, 0, &st) == RV_DIED, "a reused pid");
    fake.session[5] = SESSION;
    fake.state[5] = 'T';
    CHECK(verdict(&rs, &e, 0, 1, &st) == RV_OK && verdict(&rs, &e, 1, 4, &st) == RV_SILENT &&
              st == 'T',
          "stopped, then silent: %c", st);
}

static void a_remote_rank_dies_only_by_silence(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "node1", 5);
    fake.state[5] = 0; /* whatever /proc says here is about another process */
    char st;
    for (int pass = 0; pass < 3; pass++)
        CHECK(verdict(&rs, &e, pass, 2.9, &st) == RV_OK, "pass %d at 2.9 s", pass);
    CHECK(verdict(&rs, &e, 1, 3.1, &st) == RV_SILENT && st == '?', "silent: %c", st);
    CHECK(verdict(&rs, &e, 0, 100, &st) == RV_OK, "never 'died' from here");
}

static void a_frozen_counter_is_a_hang_anywhere(void)
{
    struct rank_env e = here();
    for (int local = 0; local < 2; local++) {
        struct rank_state rs = admitted(&e, local ? "ctl" : "node1", 5);
        rs.last_seen = 10;  /* beating, */
        rs.last_change = 0; /* but no progress since 0 */
        char st;
        CHECK(verdict(&rs, &e, 1, 10, &st) == RV_OK, "beating");
        CHECK(verdict(&rs, &e, 2, 10, &st) == RV_STALLED, "local %d: stalled", local);
    }
}

static void ranks_that_ended_are_never_failed(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "ctl", 5);
    fake.state[5] = 0;
    enum hb_phase ended[] = {HB_DONE, HB_PREEMPTED};
    for (int i = 0; i < 2; i++) {
        rs.phase = ended[i];
        char st;
        for (int pass = 0; pass < 3; pass++)
            CHECK(verdict(&rs, &e, pass, 100, &st) == RV_OK, "phase %d pass %d", ended[i], pass);
    }
    struct rank_state unseen;
    memset(&unseen, 0, sizeof unseen);
    char st;
    CHECK(verdict(&unseen, &e, 1, 100, &st) == RV_OK, "never seen: the startup timeout's");
}

/* ---- orders ------------------------------------------------------------------------------ */

static void orders_to_a_remote_rank_go_in_answers_never_to_kill(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "node1", 5); /* pid 5 lives here: a trap */
    enum hb_ctl a[] = {HBCTL_PREEMPT, HBCTL_STOP, HBCTL_KILL};
    for (int i = 0; i < 3; i++) {
        CHECK(rank_order(&rs, &e, a[i]) == 0, "signalled");
        CHECK(rs.order == a[i] && rs.order_due, "order %d", rs.order);
    }
    CHECK(fake.signals == 0, "kill(%d, %d) of a remote rank's pid", fake.last_pid, fake.last_sig);
    rs.order_due = 0;
    CHECK(rank_order(&rs, &e, HBCTL_PREEMPT) == 0 && rs.order == HBCTL_KILL && rs.order_due,
          "an order never softens");
}

static void orders_to_a_local_rank_are_signals_too(void)
{
    struct rank_env e = here();
    struct rank_state rs = admitted(&e, "ctl", 5);
    int sig[] = {SIGUSR1, SIGSTOP, SIGKILL};
    for (int a = HBCTL_PREEMPT; a <= HBCTL_KILL; a++) {
        CHECK(rank_order(&rs, &e, (enum hb_ctl)a) == 1, "order %d", a);
        CHECK(fake.last_pid == 5 && fake.last_sig == sig[a - HBCTL_PREEMPT], "kill(%d, %d)",
              fake.last_pid, fake.last_sig);
    }
    fake.signals = 0;
    fake.session[5] = 999; /* gone, and the pid reused */
    CHECK(rank_order(&rs, &e, HBCTL_KILL) == 0 && fake.signals == 0, "a reused pid was signalled");
    struct rank_state unseen;
    memset(&unseen, 0, sizeof unseen);
    CHECK(rank_order(&unseen, &e, HBCTL_KILL) == 0 && !unseen.order_due, "a rank never seen");
}

/* ---- what mpirun says ------------------------------------------------------------------------ */

static void mpirun_lines_name_the_rank_and_host(void)
{
    struct mpirun_report r;
    mpirun_report_parse("mpirun noticed that process rank 1 with PID 0 on node node-2 exited on "
                        "signal 9 (Killed).",
                        &r);
    CHECK(r.kind == MPIRUN_RANK_SIGNALED && r.rank == 1 && r.pid == 0 &&
              strcmp(r.host, "node-2") == 0,
          "Open MPI 4.1's PID 0");
    mpirun_report_parse("mpirun noticed that process rank 3 with PID 4711 on node node-2 exited on "
                        "signal 9 (Killed).",
                        &r);
    CHECK(r.kind == MPIRUN_RANK_SIGNALED && r.rank == 3 && r.pid == 4711 && r.signal == 9 &&
              strcmp(r.host, "node-2") == 0,
          "%d %d %d %s", r.kind, r.rank, r.pid, r.host);
    mpirun_report_parse("  Remote daemon: [[41772,0],1] on node host2", &r);
    CHECK(r.kind == MPIRUN_DAEMON_LOST && strcmp(r.host, "host2") == 0, "%s", r.host);
    mpirun_report_parse("  Remote daemon: [[41772,0],1] on node host2.example.", &r);
    CHECK(r.kind == MPIRUN_DAEMON_LOST && strcmp(r.host, "host2.example") == 0, "%s", r.host);
    mpirun_report_parse("  Peer host:  10.213.77.12", &r);
    CHECK(r.kind == MPIRUN_PEER_LOST && strcmp(r.host, "10.213.77.12") == 0, "%s", r.host);
    /* the launch agent names the host when Open MPI does not */
    mpirun_report_parse("mh-rsh: connection to 10.213.77.12 closed by remote host", &r);
    CHECK(r.kind == MPIRUN_DAEMON_LOST && strcmp(r.host, "10.213.77.12") == 0, "%s", r.host);
    mpirun_report_parse("Connection to node-2.example closed by remote host.", &r);
    CHECK(r.kind == MPIRUN_DAEMON_LOST && strcmp(r.host, "node-2.example") == 0, "%s", r.host);
    static const char *nothing[] = {
        "",
        "  Peer host:  ",
        "  Peer host:  a;b",
        "Connection to node-2 closed.",
        "mh-rsh: connection to 10.213.77.12 lost: Connection refused",
        "Connection to a;b closed by remote host.",
        "Reconnection to x closed by remote host",
        "fsdp-train: done",
        "mpirun noticed that process rank x with PID 1 on node n exited on signal 9",
        "mpirun noticed that process rank 1 with PID 1 on node n",
        "mpirun noticed that process rank 1 with PID 1 on node n;rm exited on signal 9",
        "mpirun noticed that process rank 99999999999 with PID 1 on node n exited on signal 9",
        "mpirun noticed that process rank 1 with PID 99999999999 on node n exited on signal 9",
        "mpirun noticed that process rank 1 with PID 1 on node  exited on signal 9",
        "  Remote daemon: [[41772,0],1] on node ",
        "  Remote daemon: [[41772,0],1] on node h\"x",
        "  Remote daemon: [[41772,0],1] on node "
        "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh",
    };
    for (size_t i = 0; i < sizeof nothing / sizeof nothing[0]; i++) {
        mpirun_report_parse(nothing[i], &r);
        CHECK(r.kind == MPIRUN_NOTHING, "'%s': %d %s", nothing[i], r.kind, r.host);
    }
}

/* ---- where fsdp-super listens ------------------------------------------------------------------
 */

static int has_ipv6_loopback(void)
{
    int s = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    int ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    if (s >= 0)
        close(s);
    return ok;
}

static void listening_on_an_address_advertises_it(void)
{
    struct super_net n;
    char err[FSDP_ERR_LEN] = "", addr[300];
    const char *note;
    struct host h[1] = {{"node1", 1}};
    REQUIRE(net_listen(&n, "127.0.0.1:0", err, sizeof err) == 0, "%s", err);
    CHECK(!n.wildcard && n.port > 0 && n.family == AF_INET, "port %d", n.port);
    net_advertise(&n, h, 1, addr, sizeof addr, &note);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", n.port);
    CHECK(strcmp(addr, want) == 0, "%s (%s)", addr, note);
    close(n.sock);
    REQUIRE(net_listen(&n, "localhost:0", err, sizeof err) == 0, "%s", err);
    net_advertise(&n, h, 1, addr, sizeof addr, &note);
    CHECK(strcmp(addr, n.bound) == 0 &&
              (strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0),
          "a name is advertised as the address bound: %s", addr);
    close(n.sock);
    if (!has_ipv6_loopback()) {
        printf("  (no IPv6 loopback here: [::1] not tried)\n");
        return;
    }
    REQUIRE(net_listen(&n, "[::1]:0", err, sizeof err) == 0, "%s", err);
    net_advertise(&n, h, 1, addr, sizeof addr, &note);
    snprintf(want, sizeof want, "[::1]:%d", n.port);
    CHECK(n.family == AF_INET6 && strcmp(addr, want) == 0, "%s", addr);
    close(n.sock);
}

static void every_interface_advertises_loopback_when_every_host_is_this_one(void)
{
    struct super_net n;
    char err[FSDP_ERR_LEN] = "", addr[300], me[256] = "";
    const char *note;
    gethostname(me, sizeof me - 1);
    REQUIRE(net_listen(&n, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(n.wildcard && n.port > 0, "wildcard %d port %d", n.wildcard, n.port);
    struct host h[4] = {{"localhost", 2}, {"127.0.0.5", 1}, {"", 1}, {"::1", 1}};
    snprintf(h[2].name, sizeof h[2].name, "%s", me);
    net_advertise(&n, h, 4, addr, sizeof addr, &note);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", n.port);
    CHECK(strcmp(addr, want) == 0, "%s (%s)", addr, note);
    /* the wildcard socket takes what is sent to 127.0.0.1 */
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)n.port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    sendto(s, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    struct timeval tv = {2, 0};
    setsockopt(n.sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[8];
    struct sockaddr_storage from;
    socklen_t len = sizeof from;
    CHECK(recvfrom(n.sock, buf, sizeof buf, 0, (struct sockaddr *)&from, &len) == 1, "nothing");
    net_format((struct sockaddr *)&from, len, addr, sizeof addr);
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0, "from %s", addr);
    close(s);
    close(n.sock);
    static const char *wild[] = {":0", "0.0.0.0:0", "0.0.0.0", "::", "[::]:0"};
    for (size_t i = 0; i < sizeof wild / sizeof wild[0]; i++) {
        CHECK(net_listen(&n, wild[i], err, sizeof err) == 0 && n.wildcard, "%s: %s", wild[i], err);
        if (n.sock >= 0)
            close(n.sock);
    }
}

static void hosts_of_this_machine_are_told_apart_from_others(void)
{
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    static const char *local[] = {"localhost", "LocalHost", "127.0.0.1", "127.1.2.3", "::1"};
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        CHECK(net_host_is_local(local[i]), "%s", local[i]);
    CHECK(net_host_is_local(me), "its own name %s", me);
    /* numeric, so no lookup leaves the machine; bind() says they are not here */
    static const char *other[] = {"192.0.2.1", "198.51.100.7", "2001:db8::1"};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        CHECK(!net_host_is_local(other[i]), "%s", other[i]);
}

static void a_bad_listen_address_is_refused(void)
{
    struct super_net n;
    char err[FSDP_ERR_LEN] = "";
    CHECK(net_listen(&n, "ctl:99999", err, sizeof err) == -1 && strstr(err, "--listen"), "%s", err);
    CHECK(net_listen(&n, "192.0.2.1:0", err, sizeof err) == -1 && strstr(err, "192.0.2.1"),
          "an address not of this host: %s", err);
}

CHECK_MAIN(TEST(a_rank_on_another_host_is_remote_even_when_its_pid_lives_here),
           TEST(a_rank_of_this_host_outside_the_jobs_session_is_remote),
           TEST(a_rank_keeps_the_identity_of_its_first_heartbeat),
           TEST(a_local_rank_whose_process_is_gone_has_died),
           TEST(a_remote_rank_dies_only_by_silence), TEST(a_frozen_counter_is_a_hang_anywhere),
           TEST(ranks_that_ended_are_never_failed),
           TEST(orders_to_a_remote_rank_go_in_answers_never_to_kill),
           TEST(orders_to_a_local_rank_are_signals_too), TEST(mpirun_lines_name_the_rank_and_host),
           TEST(listening_on_an_address_advertises_it),
           TEST(every_interface_advertises_loopback_when_every_host_is_this_one),
           TEST(hosts_of_this_machine_are_told_apart_from_others),
           TEST(a_bad_listen_address_is_refused))
