/*
 * link.c - fsdp-super's end of the datagrams: the heartbeat socket, each
 * launch's secret, the answers, and the count of what was dropped.
 *
 * Each launch draws a fresh secret (32 bytes from getrandom) and works out
 * the address its ranks are given (net.c). Every datagram that arrives is
 * opened with the secret (src/hbmsg.h: the MAC first); one sealed with the
 * previous launch's secret is a straggler of that launch (counted as
 * stale), anything else that fails the MAC is unauthenticated (counted;
 * the first of each launch is named by its source address in an
 * unauthenticated_datagram event, never by its content). An authentic one
 * must be a heartbeat or an event of a rank of the running launch, from
 * that rank's (host, pid) and with a SEQ not seen before (ranks.c), or it
 * is dropped and counted too. Every heartbeat admitted is answered at once
 * with a sealed fsdp-ctl that echoes its SEQ and carries the rank's
 * standing order (ack, preempt, stop, kill): the rank's proof that this
 * process is alive, and the only way an order reaches a rank of another
 * host. Answers go to the address the rank's datagrams come from.
 */
#include "super.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int link_launch(struct link *l, const struct host *h, int nh)
{
    struct hbmsg_key k;
    if (hbmsg_key_new(&k)) {
        fprintf(stderr, "fsdp-super: cannot draw a secret for the launch (getrandom: %s)\n",
                strerror(errno));
        return -1;
    }
    if (l->launches++)
        l->prev_key = l->key;
    l->key = k;
    l->unauth_said = 0;
    l->job_order = HBCTL_ACK;
    const char *note;
    net_advertise(&l->net, h, nh, l->addr, sizeof l->addr, &note);
    ev_emit("advertise", "{s:o, s:s}", "addr", ev_text(l->addr), "how", note);
    return 0;
}

/* The answer to rank r's datagram echo: its standing order. */
static void answer(struct link *l, struct job *j, int r, uint64_t echo)
{
    struct rank_state *rs = &j->ranks[r];
    char body[HBMSG_MAX_LEN + 1], dgram[HBMSG_DGRAM_MAX + 1];
    enum hb_ctl order = rs->order > l->job_order ? rs->order : l->job_order;
    int n = hbmsg_format_ctl(body, sizeof body, j->generation, r, order, echo);
    int len = n > 0
                  ? hbmsg_seal(dgram, sizeof dgram, &l->key, j->env.host, ++l->seq, body, (size_t)n)
                  : -1;
    if (len > 0 && rs->fromlen)
        sendto(l->net.sock, dgram, (size_t)len, MSG_DONTWAIT, (struct sockaddr *)&rs->from,
               rs->fromlen);
    rs->order_due = 0;
}

void link_send_orders(struct link *l, struct job *j)
{
    for (int r = 0; r < j->np; r++)
        if (j->ranks[r].order_due)
            answer(l, j, r, j->ranks[r].win.top);
}

void link_order_all(struct link *l, struct job *j, enum hb_ctl action)
{
    l->job_order = action;
    for (int r = 0; r < j->np; r++)
        rank_order(&j->ranks[r], &j->env, action);
    link_send_orders(l, j);
}

static void unauthenticated(struct link *l, const struct job *j,
                            const struct sockaddr_storage *from, socklen_t len)
{
    l->unauthenticated++;
    if (l->unauth_said)
        return;
    char src[300];
    net_format((const struct sockaddr *)from, len, src, sizeof src);
    ev_emit("unauthenticated_datagram", "{s:s, s:I}", "from", src, "generation",
            (json_int_t)j->generation);
    l->unauth_said = 1;
}

static void on_datagram(struct link *l, struct job *j, const char *buf, size_t n,
                        const struct sockaddr_storage *from, socklen_t fromlen,
                        void (*on_msg)(void *ctx, const struct hbmsg *m), void *ctx)
{
    struct hbmsg m;
    int rc = l->launches ? hbmsg_open(buf, n, &l->key, &m) : HBMSG_EAUTH;
    if (rc == HBMSG_EAUTH) {
        if (l->launches > 1 && hbmsg_open(buf, n, &l->prev_key, &m) != HBMSG_EAUTH)
            l->stale++;
        else
            unauthenticated(l, j, from, fromlen);
        return;
    }
    if (rc || m.kind == HBMSG_CTL || m.generation != j->generation || m.rank >= j->np) {
        l->dropped++; /* not the grammar, or of no rank of this launch */
        return;
    }
    struct rank_state *rs = &j->ranks[m.rank];
    int admit = rank_admit(rs, &j->env, &m);
    if (admit != ADMIT_OK) {
        if (admit == ADMIT_REPLAY)
            l->replayed++;
        else
            l->conflicts++;
        return;
    }
    memcpy(&rs->from, from, fromlen);
    rs->fromlen = fromlen;
    on_msg(ctx, &m);
    if (m.kind == HBMSG_BEAT)
        answer(l, j, m.rank, m.seq);
}

void link_drain(struct link *l, struct job *j, void (*on_msg)(void *ctx, const struct hbmsg *m),
                void *ctx)
{
    char buf[HBMSG_DGRAM_MAX + 1];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t len = sizeof from;
        ssize_t n =
            recvfrom(l->net.sock, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from, &len);
        if (n < 0)
            return;
        if (len <= sizeof from)
            on_datagram(l, j, buf, (size_t)n, &from, len, on_msg, ctx);
    }
}
