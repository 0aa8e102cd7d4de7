/*
 * TCP transport: one connection per peer, used in both directions at once
 * (set up by tcp_setup.c).
 *
 * A message is the 64-byte header followed by its payload, moved with
 * non-blocking sendmsg/recvmsg straight between the socket and the user's
 * buffer; header and payload travel in one call where they fit.
 * Receive-and-reduce lands the payload in a per-link scratch buffer (small
 * enough to stay in cache) and reduces whole elements from there.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/transport/net.h"
#include "comm/transport/tcp.h"
#include "core/alloc.h"

#define HDR_BYTES sizeof(dt_msg_hdr)
#define TCP_SCRATCH_BYTES (256u << 10)
/* Most payload one progress call moves before returning, so that a long
 * receive does not starve a send on the same step (full duplex). */
#define TCP_BURST_BYTES (8u << 20)
/* How long a closed connection waits for the store's word that its peer
 * left (it ends at once when the job aborts: a crash). */
#define TCP_LEFT_WAIT_S 1.0

typedef struct {
    dt_link base;
    int fd;
    unsigned char *scratch; /* receive-and-reduce landing area, made on first use */
    size_t partial;         /* bytes of an incomplete element at the start of scratch */
    int closed;             /* a peek found the connection closed, every message taken */
    char where[80];         /* the peer's address, for messages */
} tcp_link;

/* ---- errors ------------------------------------------------------------- */

static const char *op_verb(const dt_p2p *op)
{
    return op->kind == DT_P2P_SEND ? "sending to" : "receiving from";
}

static int connection_lost(int err)
{
    return err == ECONNRESET || err == EPIPE || err == ETIMEDOUT || err == ECONNABORTED ||
           err == EHOSTUNREACH || err == ENETUNREACH || err == ENETDOWN;
}

/* err is an errno value, or 0 for an orderly close by the peer. */
static int io_fail(dt_comm *c, const tcp_link *l, const dt_p2p *op, int err)
{
    if (err != 0 && !connection_lost(err))
        return dt_comm_fail(c, DT_ERR_SYSTEM, op->peer, "%s rank %d (%s) over TCP failed: %s",
                            op_verb(op), op->peer, l->where, strerror(err));
    /* A peer that leaves says so to the store as it closes its links; its
     * word comes by another path, so it gets a moment to arrive. */
    if (dt_comm_peer_left(c, op->peer, TCP_LEFT_WAIT_S)) return dt_comm_fail_left(c, op, "");
    /* A closed connection is usually the echo of a failure elsewhere;
     * dt_comm_fail waits briefly for the job's verdict and names the cause. */
    if (err == 0)
        return dt_comm_fail(c, DT_ERR_PEER, op->peer,
                            "connection to rank %d (%s) closed by the peer while %s it "
                            "(did that rank exit or crash?)",
                            op->peer, l->where, op_verb(op));
    return dt_comm_fail(c, DT_ERR_PEER, op->peer, "connection to rank %d (%s) broke while %s "
                        "it: %s", op->peer, l->where, op_verb(op), strerror(err));
}

/* ---- send --------------------------------------------------------------- */

/* Account w written bytes: header first, then payload. */
static void advance(dt_p2p *op, size_t w)
{
    size_t h = HDR_BYTES - op->hdr_off;
    if (h > w) h = w;
    op->hdr_off += h;
    op->done += w - h;
}

static int progress_send(dt_comm *c, tcp_link *l, dt_p2p *op, int *progressed)
{
    if (op->hdr_off == 0) dt_p2p_fill_hdr(c, op, &op->hdr);
    size_t moved = 0;
    while (op->hdr_off < HDR_BYTES || op->done < op->bytes) {
        if (moved >= TCP_BURST_BYTES) return 0;
        struct iovec iov[2];
        int n = 0;
        if (op->hdr_off < HDR_BYTES)
            iov[n++] = (struct iovec){(char *)&op->hdr + op->hdr_off, HDR_BYTES - op->hdr_off};
        if (op->done < op->bytes)
            iov[n++] = (struct iovec){(char *)op->src + op->done, op->bytes - op->done};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(l->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (w < 0) return io_fail(c, l, op, errno);
        if (w == 0) return 0;
        *progressed = 1;
        advance(op, (size_t)w);
        moved += (size_t)w;
    }
    op->hdr_done = 1;
    return 1;
}

/* ---- receive ------------------------------------------------------------ */

/* One recvmsg of what remains of the header plus up to room payload bytes
 * into payload, saving a system call per small message. The stream fills
 * the header first, and it is checked as soon as it is complete, before
 * any payload is reduced. (A plain receive may already have put payload
 * bytes into the user's buffer by then; a bad header fails the
 * communicator, after which the buffer's contents are undefined anyway.)
 * Returns 1 with *got payload bytes, 0 when nothing is there yet, or a
 * negative code after failing c. */
static int read_some(dt_comm *c, tcp_link *l, dt_p2p *op, void *payload, size_t room,
                     size_t *got, int *progressed)
{
    *got = 0;
    struct iovec iov[2];
    int n = 0;
    size_t hdr_left = HDR_BYTES - op->hdr_off;
    if (hdr_left) iov[n++] = (struct iovec){(char *)&op->hdr + op->hdr_off, hdr_left};
    if (room) iov[n++] = (struct iovec){payload, room};
    if (n == 0) return 1;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t r;
    do {
        r = recvmsg(l->fd, &m, MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r <= 0) return io_fail(c, l, op, r < 0 ? errno : 0);
    *progressed = 1;
    size_t h = hdr_left < (size_t)r ? hdr_left : (size_t)r;
    op->hdr_off += h;
    *got = (size_t)r - h;
    if (!op->hdr_done && op->hdr_off == HDR_BYTES) {
        int rc = dt_p2p_check_hdr(c, op, &op->hdr);
        if (rc < 0) return rc;
        op->hdr_done = 1;
    }
    return 1;
}

static int progress_recv(dt_comm *c, tcp_link *l, dt_p2p *op, int *progressed)
{
    size_t moved = 0;
    while (!op->hdr_done || op->done < op->bytes) {
        if (moved >= TCP_BURST_BYTES) return 0;
        size_t got;
        int rc = read_some(c, l, op, (char *)op->dst + op->done, op->bytes - op->done, &got,
                           progressed);
        if (rc <= 0) return rc;
        op->done += got;
        moved += got;
    }
    return 1;
}

/* Reduce the whole elements now in scratch; keep the bytes of a split
 * element at the front for the next read. */
static void reduce_received(dt_comm *c, tcp_link *l, dt_p2p *op, size_t got)
{
    size_t esz = dt_dtype_size(c->cur.dtype);
    size_t avail = l->partial + got;
    size_t whole = avail - avail % esz;
    if (whole) dt_p2p_reduce_chunk(c, op, op->done, l->scratch, whole);
    op->done += whole;
    l->partial = avail - whole;
    if (l->partial) memmove(l->scratch, l->scratch + whole, l->partial);
}

static int progress_recv_reduce(dt_comm *c, tcp_link *l, dt_p2p *op, int *progressed)
{
    if (!l->scratch) {
        l->scratch = dt_alloc(TCP_SCRATCH_BYTES, DT_MEM_COMM);
        if (!l->scratch)
            return dt_comm_fail(c, DT_ERR_NOMEM, op->peer, "out of memory for a TCP buffer");
    }
    if (op->hdr_off == 0) l->partial = 0;
    size_t moved = 0;
    /* done counts reduced bytes; the partial element is received, not yet reduced. */
    while (!op->hdr_done || op->done + l->partial < op->bytes) {
        if (moved >= TCP_BURST_BYTES) return 0;
        size_t room = op->bytes - op->done - l->partial;
        if (room > TCP_SCRATCH_BYTES - l->partial) room = TCP_SCRATCH_BYTES - l->partial;
        size_t got;
        int rc = read_some(c, l, op, l->scratch + l->partial, room, &got, progressed);
        if (rc <= 0) return rc;
        reduce_received(c, l, op, got);
        moved += got;
    }
    l->partial = 0; /* only left over when bytes is not whole elements */
    return 1;
}

/* ---- link operations ---------------------------------------------------- */

static int tcp_progress(dt_comm *c, dt_link *base, dt_p2p *op, int *progressed)
{
    tcp_link *l = (tcp_link *)base;
    switch (op->kind) {
    case DT_P2P_SEND: return progress_send(c, l, op, progressed);
    case DT_P2P_RECV: return progress_recv(c, l, op, progressed);
    case DT_P2P_RECV_REDUCE: return progress_recv_reduce(c, l, op, progressed);
    }
    return dt_comm_fail(c, DT_ERR_INVALID, op->peer, "unknown operation kind %d", (int)op->kind);
}

static int tcp_pollfd(dt_link *base, const dt_p2p *op, struct pollfd *pfd)
{
    const tcp_link *l = (const tcp_link *)base;
    if (l->closed) return -1; /* nothing more comes: poll it, napping (tcp_peek) */
    pfd->fd = l->fd;
    pfd->events = op->kind == DT_P2P_SEND ? POLLOUT : POLLIN;
    pfd->revents = 0;
    return 1;
}

/* The header in the socket's buffer, read with MSG_PEEK: the receive that
 * takes the message reads it again. A connection the peer closed after
 * its last message has nothing to give: a receive from any source looks
 * elsewhere (a peer that left is no failure of it), and its waits stop
 * watching the socket, which would wake them at once forever. */
static int tcp_peek(dt_comm *c, dt_link *base, dt_msg_hdr *h)
{
    tcp_link *l = (tcp_link *)base;
    ssize_t r;
    do {
        r = recv(l->fd, h, HDR_BYTES, MSG_PEEK | MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r == 0) {
        l->closed = 1;
        return 0;
    }
    if (r < 0) {
        dt_p2p op = dt_p2p_recv(l->base.peer, NULL, 0);
        return io_fail(c, l, &op, errno);
    }
    return (size_t)r == HDR_BYTES;
}

static void tcp_destroy(dt_link *base)
{
    tcp_link *l = (tcp_link *)base;
    if (l->fd >= 0) close(l->fd);
    dt_free(l->scratch);
    free(l);
}

static const dt_link_ops tcp_link_ops = {
    .name = "tcp",
    .progress = tcp_progress,
    .pollfd = tcp_pollfd,
    .peek = tcp_peek,
    .destroy = tcp_destroy,
};

/* ---- the link ----------------------------------------------------------- */

int dt_tcp_link_add(dt_comm *c, int peer, int fd)
{
    tcp_link *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return dt_comm_fail(c, DT_ERR_NOMEM, peer, "out of memory for a TCP link");
    }
    l->base.ops = &tcp_link_ops;
    l->base.peer = peer;
    l->fd = fd;
    dt_net_peer_name(fd, l->where, sizeof l->where);
    dt_net_tune(fd);
    if (dt_net_set_nonblock(fd, 1) != 0) {
        int e = errno;
        tcp_destroy(&l->base);
        return dt_comm_fail(c, DT_ERR_SYSTEM, peer, "cannot make the socket to rank %d "
                            "non-blocking: %s", peer, strerror(e));
    }
    c->links[peer] = &l->base;
    return 0;
}
