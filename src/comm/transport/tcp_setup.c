/*
 * Setting up the TCP transport (tcp.c): one connection per pair of ranks.
 *
 * Every rank listens on an ephemeral port and publishes "address:port" in
 * the store. The rank with the higher communicator rank of each pair
 * connects, so every pair makes exactly one connection and nobody waits on
 * a cycle: rank r connects to its lower peers (who only need to be
 * listening; the kernel queues the connection), then accepts its higher
 * ones. Each connection is authenticated with the job's secret, then both
 * sides exchange a hello {magic, communicator tag, rank}, so a connection
 * that reached the wrong communicator or process (a stale port reused by
 * someone else) is refused rather than carrying messages.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/auth.h"
#include "comm/transport/net.h"
#include "comm/transport/tcp.h"
#include "comm/transport/transport.h"
#include "core/log.h"
#include "core/parse.h"
#include "core/str.h"
#include "core/timer.h"

#define TCP_HELLO_MAGIC 0x4c485444u /* "DTHL" */
/* One incoming handshake may take at most this long, so that a stray
 * connection that sends nothing cannot hold up the setup until the
 * deadline. Genuine peers answer within milliseconds. */
#define TCP_HANDSHAKE_NS 10000000000ull
/* Waits for connections are cut into slices to notice a job abort. */
#define TCP_WAIT_SLICE_NS 200000000ull

typedef struct {
    uint32_t magic;
    uint32_t tag;
    int32_t rank;
} tcp_hello;


static int aborted(dt_comm *c)
{
    if (!atomic_load(&c->job->aborted)) return 0;
    return dt_comm_fail_from_abort(c, " while setting up TCP links");
}


static int publish_endpoint(dt_comm *c, int port)
{
    const char *addr = c->job->advertise_addr[0] ? c->job->advertise_addr : "127.0.0.1";
    char ep[96], key[32];
    dt_net_host_port(ep, sizeof ep, addr, port);
    dt_strf(key, sizeof key, "tcp/%d", c->rank);
    return dt_comm_store_set(c, key, ep, strlen(ep));
}

/* Split "host:port" or "[v6 host]:port" at the last colon. */
static int parse_endpoint(const char *ep, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(ep, ':');
    if (!colon || colon == ep) return -1;
    const char *h = ep;
    size_t n = (size_t)(colon - ep);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    if (n == 0 || n >= hostlen) return -1;
    memcpy(host, h, n);
    host[n] = '\0';
    long p;
    if (dt_parse_long(colon + 1, 1, 65535, &p)) return -1;
    *port = (int)p;
    return 0;
}

static int read_endpoint(dt_comm *c, int peer, char *host, size_t hostlen, int *port)
{
    char key[32];
    dt_strf(key, sizeof key, "tcp/%d", peer);
    void *val = NULL;
    size_t len = 0;
    int rc = dt_comm_store_get(c, key, &val, &len);
    if (rc < 0) return rc;
    if (parse_endpoint(val, host, hostlen, port) != 0)
        rc = dt_comm_fail(c, DT_ERR_PROTOCOL, peer, "rank %d published a malformed TCP "
                          "endpoint '%.80s'", peer, (const char *)val);
    free(val);
    return rc;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* ---- setup: connecting side --------------------------------------------- */

/* Authenticate, say who we are, and check that the other end is the rank
 * we meant to reach. Returns 0 or a code, with the reason in err. */
static int client_handshake(dt_comm *c, int fd, int peer, uint64_t deadline, char *err,
                            size_t errlen)
{
    int rc = dt_auth_client(fd, c->job->secret, "tcp", deadline, err, errlen);
    if (rc) return rc;
    tcp_hello me = {TCP_HELLO_MAGIC, c->tag, c->rank}, them;
    rc = dt_net_write_all(fd, &me, sizeof me, deadline);
    if (rc == 0) rc = dt_net_read_all(fd, &them, sizeof them, deadline);
    if (rc) {
        dt_strf(err, errlen, "%s during the hello (the peer refused us?)",
                rc == DT_ERR_TIMEOUT ? "timed out" : "connection closed");
        return rc;
    }
    if (them.magic != TCP_HELLO_MAGIC || them.tag != c->tag || them.rank != peer) {
        dt_strf(err, errlen, "reached the wrong process (it says rank %d, communicator tag "
                "%08x; expected rank %d, tag %08x)", (int)them.rank, them.tag, peer, c->tag);
        return DT_ERR_PROTOCOL;
    }
    return 0;
}

/* dt_net_connect retries until its deadline while the peer is not yet
 * listening; in slices, so that a job abort ends the wait. */
static int connect_sliced(dt_comm *c, const char *host, int port, uint64_t deadline, int *fd,
                          char *err, size_t errlen)
{
    uint64_t start = dt_now_ns();
    for (;;) {
        int rc = aborted(c);
        if (rc) return rc;
        uint64_t slice = min_u64(deadline, dt_now_ns() + 5 * TCP_WAIT_SLICE_NS);
        rc = dt_net_connect(host, port, slice, fd, err, errlen);
        if (rc != DT_ERR_TIMEOUT) return rc;
        if (slice >= deadline) {
            char last[512];
            dt_strf(last, sizeof last, "%s", err);
            dt_strf(err, errlen, "no connection after %.1f s (DTRAIN_TIMEOUT); last try: %s",
                    (double)(dt_now_ns() - start) * 1e-9, last);
            return rc;
        }
    }
}

static int connect_peer(dt_comm *c, int peer, uint64_t deadline)
{
    char host[80], err[512] = "";
    int port = 0, fd = -1;
    int rc = read_endpoint(c, peer, host, sizeof host, &port);
    if (rc < 0) return rc;
    rc = connect_sliced(c, host, port, deadline, &fd, err, sizeof err);
    if (rc == 0) {
        rc = client_handshake(c, fd, peer, deadline, err, sizeof err);
        if (rc) close(fd);
    }
    if (rc) return dt_comm_fail(c, rc, peer, "TCP connection to rank %d at %s:%d: %s", peer,
                                host, port, err);
    return dt_tcp_link_add(c, peer, fd);
}

/* ---- setup: accepting side ---------------------------------------------- */

/* Authenticate an incoming connection (from who) and read its hello.
 * Returns the peer's rank, or -1 (reason in err) for anything that is not
 * a peer we still wait for. */
static int server_handshake(dt_comm *c, int fd, const char *who, const unsigned char *awaited,
                            uint64_t setup_deadline, char *err, size_t errlen)
{
    uint64_t deadline = min_u64(setup_deadline, dt_now_ns() + TCP_HANDSHAKE_NS);
    if (dt_auth_server(fd, c->job->secret, "tcp", deadline, err, errlen) != 0) return -1;
    tcp_hello them;
    if (dt_net_read_all(fd, &them, sizeof them, deadline) != 0) {
        dt_strf(err, errlen, "%s sent no hello after authenticating", who);
        return -1;
    }
    if (them.magic != TCP_HELLO_MAGIC || them.tag != c->tag) {
        dt_strf(err, errlen, "%s is for another communicator (tag %08x, ours %08x)", who,
                them.tag, c->tag);
        return -1;
    }
    if (them.rank < 0 || them.rank >= c->size || !awaited[them.rank]) {
        dt_strf(err, errlen, "%s says it is rank %d, which is not a peer we are waiting for",
                who, (int)them.rank);
        return -1;
    }
    tcp_hello me = {TCP_HELLO_MAGIC, c->tag, c->rank};
    if (dt_net_write_all(fd, &me, sizeof me, deadline) != 0) {
        dt_strf(err, errlen, "could not answer the hello of rank %d at %s", (int)them.rank,
                who);
        return -1;
    }
    return them.rank;
}

static int fail_missing(dt_comm *c, const unsigned char *awaited)
{
    char list[256] = "";
    size_t off = 0;
    int first = -1;
    for (int r = 0; r < c->size && off < sizeof list - 16; r++) {
        if (!awaited[r]) continue;
        if (first < 0) first = r;
        off += (size_t)dt_strf(list + off, sizeof list - off, "%s%d", off ? ", " : "", r);
    }
    return dt_comm_fail(c, DT_ERR_TIMEOUT, first,
                        "timed out after %.1f s waiting for TCP connections from rank(s) %s "
                        "(DTRAIN_TIMEOUT)",
                        c->job->timeout_s, list);
}

/* Accept until every awaited peer has arrived; strays are logged and
 * closed. awaited[r] is cleared as rank r connects. */
static int accept_peers(dt_comm *c, int lfd, unsigned char *awaited, int count,
                        uint64_t deadline)
{
    while (count > 0) {
        int rc = aborted(c);
        if (rc) return rc;
        if (dt_now_ns() >= deadline) return fail_missing(c, awaited);
        char err[512] = "";
        int fd = -1;
        rc = dt_net_accept(lfd, min_u64(deadline, dt_now_ns() + TCP_WAIT_SLICE_NS), &fd, err,
                           sizeof err);
        if (rc == DT_ERR_TIMEOUT) continue;
        if (rc) return dt_comm_fail(c, rc, -1, "TCP setup: %s", err);
        char who[96];
        dt_strf(who, sizeof who, "the connection from ");
        dt_net_peer_name(fd, who + strlen(who), sizeof who - strlen(who));
        int peer = server_handshake(c, fd, who, awaited, deadline, err, sizeof err);
        if (peer < 0) {
            DT_WARN("TCP setup of communicator %s: refused a connection: %s", c->id, err);
            close(fd);
            continue;
        }
        if ((rc = dt_tcp_link_add(c, peer, fd)) < 0) return rc;
        awaited[peer] = 0;
        count--;
    }
    return 0;
}

/* ---- setup -------------------------------------------------------------- */

static int connect_and_accept(dt_comm *c, int lfd, const int *peers, int npeers)
{
    unsigned char *awaited = calloc((size_t)c->size, 1);
    if (!awaited) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    int rc = 0, count = 0;
    uint64_t deadline = dt_comm_deadline(c);
    for (int i = 0; i < npeers && rc == 0; i++) {
        if (peers[i] < c->rank)
            rc = connect_peer(c, peers[i], deadline);
        else if (!awaited[peers[i]]) {
            awaited[peers[i]] = 1;
            count++;
        }
    }
    if (rc == 0) rc = accept_peers(c, lfd, awaited, count, deadline);
    free(awaited);
    return rc;
}

int dt_tcp_setup(dt_comm *c, const int *peers, int npeers)
{
    if (npeers == 0) return 0;
    for (int i = 0; i < npeers; i++)
        if (peers[i] < 0 || peers[i] >= c->size || peers[i] == c->rank)
            return dt_comm_fail(c, DT_ERR_INVALID, -1, "TCP setup: bad peer rank %d", peers[i]);
    char err[512] = "";
    int lfd = -1, port = 0;
    int rc = dt_net_listen_for(c->job->advertise_addr, 0, &lfd, &port, err, sizeof err);
    if (rc) return dt_comm_fail(c, rc, -1, "TCP setup: %s", err);
    /* Accepted sockets inherit the buffer sizes, in time for the
     * window negotiation. */
    dt_net_tune(lfd);
    rc = publish_endpoint(c, port);
    if (rc == 0) rc = connect_and_accept(c, lfd, peers, npeers);
    close(lfd);
    return rc;
}

