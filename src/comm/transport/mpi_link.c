/*
 * MPI transport (DTRAIN_TRANSPORT=mpi): every link of a communicator is a
 * stream of MPI point-to-point messages on the communicator's own MPI
 * communicator (c->mpi), whose ranks are the communicator's. Messages of
 * different dtrain communicators can therefore never match each other.
 *
 * Messages. A dtrain message is its 64-byte header (tag MPI_LINK_TAG_HDR)
 * followed by its payload in chunks of MPI_LINK_CHUNK bytes (tag
 * MPI_LINK_TAG_DATA; the last one shorter), all posted with
 * MPI_Isend/MPI_Irecv and completed with MPI_Test. MPI keeps messages of
 * one sender, tag and communicator in order, and a link runs one message
 * per direction at a time (p2p.c), so message k's chunks always meet
 * message k's receives. The receiver posts the header's receive with the
 * first chunks' (so a large payload's rendezvous starts at once) and checks
 * the header (dt_p2p_check_hdr, as every link does) before it uses a byte
 * of payload: mismatched collectives fail with a clear message (a plain
 * receive's buffer may hold payload by then, as with TCP). Up to
 * MPI_LINK_WINDOW chunks are in flight per direction; a plain receive
 * lands in the user's buffer, a receive-and-reduce in one of two per-link
 * buffers (one reduces while the other fills).
 *
 * Waiting: MPI moves data only inside its calls, and nothing rings a
 * doorbell for these links, so pollfd() says -1 and p2p.c naps between
 * polls instead of sleeping on the communicator's doorbell.
 */
#include "comm/comm_internal.h"
#include "comm/mpi.h"
#include "comm/transport/transport.h"

#ifndef DTRAIN_HAVE_MPI

int dt_mpi_link_setup(dt_comm *c, const int *peers, int npeers)
{
    (void)peers;
    if (npeers == 0) return 0;
    return dt_comm_fail(c, DT_ERR_INVALID, -1, "DTRAIN_TRANSPORT=mpi: dtrain was built "
                        "without MPI");
}

#else /* DTRAIN_HAVE_MPI */

#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"

#define HDR_BYTES ((int)sizeof(dt_msg_hdr))
#define MPI_LINK_TAG_HDR 0x4448  /* "DH" */
#define MPI_LINK_TAG_DATA 0x4444 /* "DD" */
#define MPI_LINK_CHUNK ((size_t)1 << 20)
#define MPI_LINK_WINDOW 4 /* chunks in flight per direction (2 for receive-and-reduce) */

/* One direction of a link: the message in progress. */
typedef struct {
    MPI_Request hdr;
    MPI_Request data[MPI_LINK_WINDOW]; /* a ring, oldest at head */
    int head, inflight;
    size_t posted; /* payload bytes posted so far */
} mpi_dir;

typedef struct {
    dt_link base;
    MPI_Comm comm;
    mpi_dir tx, rx;
    unsigned char *buf[2]; /* receive-and-reduce landing areas, made on first use */
    /* The next message's header, received by a peek: the receive that
     * takes the message starts from it. */
    dt_msg_hdr held;
    int has_held;
} mpi_link;

static void dir_reset(mpi_dir *d)
{
    d->hdr = MPI_REQUEST_NULL;
    for (int i = 0; i < MPI_LINK_WINDOW; i++) d->data[i] = MPI_REQUEST_NULL;
    d->head = d->inflight = 0;
    d->posted = 0;
}

static const char *op_verb(const dt_p2p *op)
{
    return op->kind == DT_P2P_SEND ? "sending to" : "receiving from";
}

static int link_fail(dt_comm *c, const dt_p2p *op, int mpi_rc, const char *call)
{
    char what[96];
    snprintf(what, sizeof what, "%s %s rank %d over MPI", call, op_verb(op), op->peer);
    return dt_mpi_fail(c, mpi_rc, op->peer, what);
}

static size_t chunk_len(const dt_p2p *op, size_t off)
{
    return op->bytes - off < MPI_LINK_CHUNK ? op->bytes - off : MPI_LINK_CHUNK;
}

/* Post payload chunks while the window has room. For receive-and-reduce
 * (bufs set) chunk k lands in bufs[k % 2]. */
static int post_chunks(dt_comm *c, mpi_link *l, mpi_dir *d, dt_p2p *op, int window,
                       unsigned char **bufs)
{
    while (d->inflight < window && d->posted < op->bytes) {
        size_t len = chunk_len(op, d->posted);
        MPI_Request *r = &d->data[(d->head + d->inflight) % MPI_LINK_WINDOW];
        int rc;
        if (op->kind == DT_P2P_SEND)
            rc = MPI_Isend((const char *)op->src + d->posted, (int)len, MPI_BYTE, op->peer,
                           MPI_LINK_TAG_DATA, l->comm, r);
        else
            rc = MPI_Irecv(bufs ? bufs[(d->posted / MPI_LINK_CHUNK) % 2]
                                : (unsigned char *)op->dst + d->posted,
                           (int)len, MPI_BYTE, op->peer, MPI_LINK_TAG_DATA, l->comm, r);
        if (rc != MPI_SUCCESS)
            return link_fail(c, op, rc, op->kind == DT_P2P_SEND ? "MPI_Isend" : "MPI_Irecv");
        d->posted += len;
        d->inflight++;
    }
    return 0;
}

/* Complete payload chunks in order; receive-and-reduce reduces each as it
 * lands. op->done counts completed (and reduced) bytes. */
static int complete_chunks(dt_comm *c, mpi_link *l, mpi_dir *d, dt_p2p *op, unsigned char **bufs,
                           int *progressed)
{
    while (d->inflight > 0) {
        MPI_Status st;
        int done = 0, rc = MPI_Test(&d->data[d->head], &done, &st);
        if (rc != MPI_SUCCESS) return link_fail(c, op, rc, "MPI_Test");
        if (!done) return 0;
        size_t len = chunk_len(op, op->done);
        if (op->kind != DT_P2P_SEND) {
            int got = -1;
            MPI_Get_count(&st, MPI_BYTE, &got);
            if (got < 0 || (size_t)got != len)
                return dt_comm_fail(c, DT_ERR_PROTOCOL, op->peer, "a payload chunk from rank %d "
                                    "over MPI has %d bytes, expected %zu", op->peer, got, len);
            if (bufs)
                dt_p2p_reduce_chunk(c, op, op->done, bufs[(op->done / MPI_LINK_CHUNK) % 2], len);
        }
        op->done += len;
        d->head = (d->head + 1) % MPI_LINK_WINDOW;
        d->inflight--;
        *progressed = 1;
    }
    (void)l;
    return 0;
}

static int progress_send(dt_comm *c, mpi_link *l, dt_p2p *op, int *progressed)
{
    mpi_dir *d = &l->tx;
    if (op->hdr_off == 0) {
        dir_reset(d);
        dt_p2p_fill_hdr(c, op, &op->hdr);
        int rc = MPI_Isend(&op->hdr, HDR_BYTES, MPI_BYTE, op->peer, MPI_LINK_TAG_HDR, l->comm,
                           &d->hdr);
        if (rc != MPI_SUCCESS) return link_fail(c, op, rc, "MPI_Isend");
        op->hdr_off = (size_t)HDR_BYTES;
        *progressed = 1;
    }
    int rc = post_chunks(c, l, d, op, MPI_LINK_WINDOW, NULL);
    if (rc == 0) rc = complete_chunks(c, l, d, op, NULL, progressed);
    if (rc == 0) rc = post_chunks(c, l, d, op, MPI_LINK_WINDOW, NULL);
    if (rc < 0) return rc;
    if (!op->hdr_done) {
        int done = 0;
        rc = MPI_Test(&d->hdr, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return link_fail(c, op, rc, "MPI_Test");
        op->hdr_done = done;
        if (done) *progressed = 1;
    }
    return op->hdr_done && op->done == op->bytes;
}

/* A received header's size, which must be a header's. */
static int check_hdr_size(dt_comm *c, int peer, MPI_Status *st)
{
    int got = -1;
    MPI_Get_count(st, MPI_BYTE, &got);
    if (got == HDR_BYTES) return 0;
    return dt_comm_fail(c, DT_ERR_PROTOCOL, peer, "malformed message header from rank %d over "
                        "MPI (%d bytes)", peer, got);
}

static int progress_recv(dt_comm *c, mpi_link *l, dt_p2p *op, int *progressed)
{
    mpi_dir *d = &l->rx;
    /* Receive-and-reduce lands in the link's buffers, two chunks at a time. */
    unsigned char **bufs = NULL;
    int window = MPI_LINK_WINDOW, rc;
    if (op->kind == DT_P2P_RECV_REDUCE && op->bytes) {
        for (int i = 0; i < 2; i++)
            if (!l->buf[i] && !(l->buf[i] = dt_alloc(MPI_LINK_CHUNK, DT_MEM_COMM)))
                return dt_comm_fail(c, DT_ERR_NOMEM, op->peer, "out of memory for an MPI "
                                    "link buffer");
        bufs = l->buf;
        window = 2;
    }
    if (op->hdr_off == 0) {
        dir_reset(d);
        if (l->has_held) { /* d->hdr stays null: the header is here */
            op->hdr = l->held;
            l->has_held = 0;
        } else if ((rc = MPI_Irecv(&op->hdr, HDR_BYTES, MPI_BYTE, op->peer, MPI_LINK_TAG_HDR,
                                   l->comm, &d->hdr)) != MPI_SUCCESS) {
            return link_fail(c, op, rc, "MPI_Irecv");
        }
        op->hdr_off = (size_t)HDR_BYTES;
        /* The first chunks are posted with the header, so that a large
         * payload's rendezvous starts at once; nothing of them is used (or
         * reduced) before the header has been checked. */
        if ((rc = post_chunks(c, l, d, op, window, bufs)) < 0) return rc;
    }
    if (!op->hdr_done && d->hdr != MPI_REQUEST_NULL) {
        MPI_Status st;
        int done = 0;
        rc = MPI_Test(&d->hdr, &done, &st);
        if (rc != MPI_SUCCESS) return link_fail(c, op, rc, "MPI_Test");
        if (!done) return 0;
        if ((rc = check_hdr_size(c, op->peer, &st)) < 0) return rc;
    }
    if (!op->hdr_done) {
        *progressed = 1;
        if ((rc = dt_p2p_check_hdr(c, op, &op->hdr)) < 0) return rc;
        op->hdr_done = 1;
    }
    rc = complete_chunks(c, l, d, op, bufs, progressed);
    if (rc == 0) rc = post_chunks(c, l, d, op, window, bufs);
    if (rc < 0) return rc;
    return op->done == op->bytes;
}

static int mpi_progress(dt_comm *c, dt_link *base, dt_p2p *op, int *progressed)
{
    mpi_link *l = (mpi_link *)base;
    switch (op->kind) {
    case DT_P2P_SEND: return progress_send(c, l, op, progressed);
    case DT_P2P_RECV:
    case DT_P2P_RECV_REDUCE: return progress_recv(c, l, op, progressed);
    }
    return dt_comm_fail(c, DT_ERR_INVALID, op->peer, "unknown operation kind %d", (int)op->kind);
}

static int mpi_pollfd(dt_link *base, const dt_p2p *op, struct pollfd *pfd)
{
    (void)base, (void)op, (void)pfd;
    return -1; /* nothing to sleep on: p2p.c polls, napping */
}

/* MPI shows that a header has come (MPI_Improbe), not what it says: it is
 * received into the link, where the next receive finds it. */
static int mpi_peek(dt_comm *c, dt_link *base, dt_msg_hdr *h)
{
    mpi_link *l = (mpi_link *)base;
    dt_p2p op = dt_p2p_recv(base->peer, NULL, 0);
    if (!l->has_held) {
        int found = 0, rc;
        MPI_Message m;
        MPI_Status st;
        rc = MPI_Improbe(base->peer, MPI_LINK_TAG_HDR, l->comm, &found, &m, &st);
        if (rc != MPI_SUCCESS) return link_fail(c, &op, rc, "MPI_Improbe");
        if (!found) return 0;
        rc = MPI_Mrecv(&l->held, HDR_BYTES, MPI_BYTE, &m, &st);
        if (rc != MPI_SUCCESS) return link_fail(c, &op, rc, "MPI_Mrecv");
        if ((rc = check_hdr_size(c, base->peer, &st)) < 0) return rc;
        l->has_held = 1;
    }
    *h = l->held;
    return 1;
}

/* A request left behind by a failed call: a receive must not land in a
 * buffer its owner has freed since, so it is cancelled first. */
static void drop(MPI_Request *r)
{
    if (*r == MPI_REQUEST_NULL) return;
    MPI_Cancel(r);
    MPI_Request_free(r);
}

static void mpi_destroy(dt_link *base)
{
    mpi_link *l = (mpi_link *)base;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        mpi_dir *dirs[2] = {&l->rx, &l->tx};
        for (int i = 0; i < 2; i++) {
            drop(&dirs[i]->hdr);
            for (int k = 0; k < MPI_LINK_WINDOW; k++) drop(&dirs[i]->data[k]);
        }
    }
    dt_free(l->buf[0]);
    dt_free(l->buf[1]);
    free(l);
}

static const dt_link_ops mpi_link_ops = {
    .name = "mpi",
    .progress = mpi_progress,
    .pollfd = mpi_pollfd,
    .peek = mpi_peek,
    .destroy = mpi_destroy,
};

int dt_mpi_link_setup(dt_comm *c, const int *peers, int npeers)
{
    if (npeers == 0) return 0;
    if (!c->mpi)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "DTRAIN_TRANSPORT=mpi: communicator %s has "
                            "no MPI communicator (not started by mpirun?)", c->id);
    MPI_Comm m = dt_mpi_comm(c);
    int mrank = -1, msize = -1;
    MPI_Comm_rank(m, &mrank);
    MPI_Comm_size(m, &msize);
    if (mrank != c->rank || msize != c->size)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "communicator %s is rank %d of %d, but its "
                            "MPI communicator says %d of %d", c->id, c->rank, c->size, mrank,
                            msize);
    for (int i = 0; i < npeers; i++) {
        int p = peers[i];
        if (p < 0 || p >= c->size || p == c->rank)
            return dt_comm_fail(c, DT_ERR_INVALID, -1, "MPI setup: bad peer rank %d", p);
        mpi_link *l = calloc(1, sizeof *l);
        if (!l) return dt_comm_fail(c, DT_ERR_NOMEM, p, "out of memory for an MPI link");
        l->base.ops = &mpi_link_ops;
        l->base.peer = p;
        l->comm = m;
        dir_reset(&l->tx);
        dir_reset(&l->rx);
        c->links[p] = &l->base;
    }
    return 0;
}

#endif /* DTRAIN_HAVE_MPI */
