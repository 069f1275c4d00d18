/*
 * net.c - the heartbeat socket and the address the ranks are given.
 *
 * --listen HOST[:PORT] (hbmsg_parse_addr's forms: a name, A.B.C.D, [V6],
 * a bare V6 address, or ":PORT"). Without it, or with a wildcard HOST
 * (0.0.0.0, ::, or empty as in ":PORT"), the socket takes every interface: "::" with
 * IPV6_V6ONLY off, so IPv4 arrives too, or 0.0.0.0 where the machine has
 * no IPv6. The port is any free one unless given.
 *
 * What the ranks are told (FSDP_SUPER_ADDR, per launch, since the host
 * file may change between launches): the address the socket is bound to,
 * for a HOST given to --listen (as an address, even when HOST is a name:
 * a name that resolves to several addresses, say an IPv6 and an IPv4 one,
 * could lead a rank's resolver to the one that is not listening), or for a
 * wildcard the address of the interface that routes to the first host of
 * the launch that is not this one - found by connect() of a UDP socket to
 * it and getsockname(), which sends no packet - and 127.0.0.1 when every
 * host is this one. (On a controller whose workers sit on several
 * networks, one address may not reach them all: give --listen ADDR then.)
 * The ranks resolve names too (getaddrinfo), should a name ever be set.
 *
 * A host is this one when it is localhost, 127.x, ::1 or this host's name,
 * or when every address it resolves to is loopback or bindable here (an
 * address of one of this host's interfaces). Numeric names are looked up
 * without DNS.
 */
#include "super.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

void net_format(const struct sockaddr *a, socklen_t len, char *out, size_t n)
{
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (getnameinfo(a, len, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV)) {
        snprintf(out, n, "?");
        return;
    }
    const char *v4 = strncmp(h, "::ffff:", 7) == 0 && strchr(h + 7, '.') ? h + 7 : NULL;
    if (v4)
        snprintf(out, n, "%s:%s", v4, p);
    else if (strchr(h, ':'))
        snprintf(out, n, "[%s]:%s", h, p);
    else
        snprintf(out, n, "%s:%s", h, p);
}

static int is_wildcard(const char *h) { return !h[0] || !strcmp(h, "0.0.0.0") || !strcmp(h, "::"); }

static int bind_wildcard(struct super_net *n)
{
    int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s >= 0) {
        int off = 0;
        struct sockaddr_in6 a = {.sin6_family = AF_INET6,
                                 .sin6_port = htons((uint16_t)n->port),
                                 .sin6_addr = in6addr_any};
        if (setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) == 0 &&
            bind(s, (struct sockaddr *)&a, sizeof a) == 0) {
            n->sock = s;
            n->family = AF_INET6;
            return 0;
        }
        close(s);
    }
    s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)n->port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a)) {
        if (s >= 0)
            close(s);
        return -1;
    }
    n->sock = s;
    n->family = AF_INET;
    return 0;
}

static int bind_host(struct super_net *n, char *err, size_t errlen)
{
    char port[8];
    snprintf(port, sizeof port, "%d", n->port);
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int rc = getaddrinfo(n->host, port, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "--listen %s: %s", n->host, gai_strerror(rc));
        return -1;
    }
    int e = 0;
    for (struct addrinfo *a = res; a && n->sock < 0; a = a->ai_next) {
        int s = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && bind(s, a->ai_addr, a->ai_addrlen) == 0) {
            n->sock = s;
            n->family = a->ai_family;
        } else {
            e = errno;
            if (s >= 0)
                close(s);
        }
    }
    freeaddrinfo(res);
    if (n->sock < 0)
        snprintf(err, errlen, "cannot listen on %s: %s", n->host, strerror(e));
    return n->sock < 0 ? -1 : 0;
}

int net_listen(struct super_net *n, const char *spec, char *err, size_t errlen)
{
    *n = (struct super_net){.sock = -1};
    int port = -1;
    if (spec && hbmsg_parse_addr(spec, 1, n->host, sizeof n->host, &port)) {
        snprintf(err, errlen,
                 "--listen '%s' is not HOST, HOST:PORT, [V6]:PORT or :PORT (see fsdp-super --help)",
                 spec);
        return -1;
    }
    n->port = port < 0 ? 0 : port;
    n->wildcard = is_wildcard(n->host);
    if (n->wildcard ? bind_wildcard(n) : bind_host(n, err, errlen)) {
        if (n->wildcard)
            snprintf(err, errlen, "cannot listen on every interface: %s", strerror(errno));
        return -1;
    }
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(n->sock, (struct sockaddr *)&a, &len)) {
        snprintf(err, errlen, "getsockname: %s", strerror(errno));
        close(n->sock);
        n->sock = -1;
        return -1;
    }
    n->port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                            : ((struct sockaddr_in *)&a)->sin_port);
    net_format((struct sockaddr *)&a, len, n->bound, sizeof n->bound);
    int big = 1 << 20;
    setsockopt(n->sock, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    return 0;
}

/* ---- is a host this one? ------------------------------------------------------------ */

static int addr_is_here(const struct sockaddr *sa, socklen_t len)
{
    if (sa->sa_family == AF_INET &&
        (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127)
        return 1;
    if (sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr))
        return 1;
    /* an address of this host's interfaces can be bound; nothing is sent */
    struct sockaddr_storage a;
    if (len > sizeof a)
        return 0;
    memcpy(&a, sa, len);
    if (a.ss_family == AF_INET)
        ((struct sockaddr_in *)&a)->sin_port = 0;
    else if (a.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&a)->sin6_port = 0;
    else
        return 0;
    int s = socket(a.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int here = s >= 0 && bind(s, (struct sockaddr *)&a, len) == 0;
    if (s >= 0)
        close(s);
    return here;
}

static int resolve(const char *name, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICHOST};
    if (getaddrinfo(name, NULL, &hints, res) == 0)
        return 0;
    hints.ai_flags = 0;
    return getaddrinfo(name, NULL, &hints, res) == 0 ? 0 : -1;
}

int net_host_is_local(const char *name)
{
    char me[256] = "";
    gethostname(me, sizeof me - 1);
    if (!strcasecmp(name, "localhost") || !strncmp(name, "127.", 4) || !strcmp(name, "::1") ||
        (me[0] && !strcasecmp(name, me)))
        return 1;
    struct addrinfo *res = NULL;
    if (resolve(name, &res))
        return 0; /* unknown here: not this host */
    int here = res != NULL;
    for (struct addrinfo *a = res; a && here; a = a->ai_next)
        here = addr_is_here(a->ai_addr, a->ai_addrlen);
    freeaddrinfo(res);
    return here;
}

/* ---- the advertised address -------------------------------------------------------------- */

/* The local address that routes to name, on a socket this one can answer
 * from; -1 if none. */
static int route_to(const struct super_net *n, const char *name, char *out, size_t outlen)
{
    struct addrinfo *res = NULL;
    if (resolve(name, &res))
        return -1;
    int found = -1;
    for (struct addrinfo *a = res; a && found < 0; a = a->ai_next) {
        if (n->family == AF_INET && a->ai_family != AF_INET)
            continue;
        int s = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage me;
        socklen_t len = sizeof me;
        if (a->ai_family == AF_INET)
            ((struct sockaddr_in *)a->ai_addr)->sin_port = htons(9);
        else if (a->ai_family == AF_INET6)
            ((struct sockaddr_in6 *)a->ai_addr)->sin6_port = htons(9);
        /* a UDP connect() only picks the route and the source address */
        if (s >= 0 && connect(s, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(s, (struct sockaddr *)&me, &len) == 0) {
            if (me.ss_family == AF_INET)
                ((struct sockaddr_in *)&me)->sin_port = htons((uint16_t)n->port);
            else
                ((struct sockaddr_in6 *)&me)->sin6_port = htons((uint16_t)n->port);
            net_format((struct sockaddr *)&me, len, out, outlen);
            found = 0;
        }
        if (s >= 0)
            close(s);
    }
    freeaddrinfo(res);
    return found;
}

void net_advertise(const struct super_net *n, const struct host *h, int nh, char *out,
                   size_t outlen, const char **note)
{
    if (!n->wildcard) {
        snprintf(out, outlen, "%s", n->bound);
        *note = "--listen";
        return;
    }
    for (int i = 0; i < nh; i++) {
        if (net_host_is_local(h[i].name))
            continue;
        if (route_to(n, h[i].name, out, outlen) == 0) {
            *note = "the interface that routes to the first remote host";
            return;
        }
        char me[HBMSG_HOST_LEN];
        hbmsg_host_name(me, sizeof me);
        snprintf(out, outlen, "%s:%d", me, n->port);
        *note = "this host's name (no route to the first remote host was found; give --listen)";
        return;
    }
    snprintf(out, outlen, "127.0.0.1:%d", n->port);
    *note = "every host is this one";
}
