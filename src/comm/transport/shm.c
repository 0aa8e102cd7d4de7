/*
 * Shared-memory transport between ranks on one host: moving messages, and
 * waiting for them (the segments are set up by shm_setup.c).
 *
 * Each rank of a communicator owns one segment, its inbox: a doorbell and,
 * for every local peer, a byte ring that only that peer writes into. Ring
 * positions are monotonic byte counters; the sender owns `head`, the
 * receiver `tail`, each on its own cache line, so a small message costs a
 * copy and two cache-line transfers: no syscall, no lock.
 *
 * Large messages are not streamed through the ring (two copies): the
 * sender posts only a header with its buffer address and the receiver
 * pulls the payload straight from the sender's memory with
 * process_vm_readv (cross-memory attach, one copy), then acknowledges its
 * ticket, which completes the send. A payload in the sender's
 * communication memory (dt_comm_mem_alloc) is pulled the same way, but
 * copied by the receiver out of its mapping of that memory
 * (shm_peer_mem.c): no system call, no pinning. The ring is free for the next message
 * once such a header is out, and a point-to-point message whose receive
 * has not come may leave the ring as its header alone (detach), pulled
 * when that receive comes: tickets are acknowledged one by one, in any
 * order. Where CMA is refused (containers, ptrace restrictions)
 * everything streams through the ring.
 *
 * Blocking: a waiter publishes `sleeping` (arms), looks once more, and
 * sleeps on its doorbell futex; whoever makes progress it could be
 * waiting for (new data, freed space, an acknowledgement) moves the
 * doorbell and calls futex_wake only when the waiter is armed, so the fast
 * path has neither a syscall nor a write to a shared line.
 */
#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/shared_mem.h"
#include "comm/reduce_ops.h"
#include "comm/transport/shm_layout.h"
#include "comm/transport/shm_peer_mem.h"
#include "comm/transport/transport.h"

#define CMA_PIECE (4u << 20)   /* a plain CMA receive moves this much per call */
/* Mapped pulls from here up. A 2-rank all-to-all-v of 16 KiB took 0.8 us
 * mapped against 2.7 through the ring; at 4 ranks on 2 cores blocks of
 * about 1 KiB were slower mapped (the acknowledgement waits for a rank
 * that is not running), 2 KiB and up faster. */
#define MAPPED_MIN (2u << 10)
#define TICKET_BITS 48         /* a pull's aux[1]: its ticket, and above it a mapped region's fd */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* After publishing: ring only a waiter that may sleep. The fence pairs
 * with bell_arm's (Dekker): either the waiter's re-check after arming
 * sees what we published, or we see it armed and move the doorbell, so
 * its futex wait returns. A spinning peer thus costs no shared write. */
static void ring_notify(shm_inbox *target)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&target->sleeping, memory_order_relaxed)) return;
    atomic_fetch_add(&target->doorbell, 1);
    futex(&target->doorbell, FUTEX_WAKE, 1, NULL);
}

static void ring_wake(shm_inbox *target)
{
    atomic_fetch_add(&target->doorbell, 1);
    futex(&target->doorbell, FUTEX_WAKE, 1, NULL);
}

/* ---- sending ------------------------------------------------------------ */

static uint64_t ring_free(shm_link *l, uint64_t ring_bytes)
{
    uint64_t used = l->head - l->tail_seen;
    if (used + LINE > ring_bytes) {
        l->tail_seen = atomic_load_explicit(&l->out->tail, memory_order_acquire);
        used = l->head - l->tail_seen;
    }
    return ring_bytes - used;
}

static void ring_write(shm_ring *r, uint64_t ring_bytes, uint64_t pos, const void *src, size_t n)
{
    size_t off = pos & (ring_bytes - 1);
    size_t first = n < ring_bytes - off ? n : ring_bytes - off;
    memcpy(r->data + off, src, first);
    if (first < n) memcpy(r->data, (const char *)src + first, n - first);
}

static void publish_head(shm_link *l)
{
    atomic_store_explicit(&l->out->head, l->head, memory_order_release);
    l->head_pub = l->head;
    ring_notify(l->peer_inbox);
}

/* Whether op's payload is to be pulled by cross-memory attach: from
 * cma_min up (small rings, or forced), and from pull_min up (measured)
 * in a collective that only moves data. Not in a reduction: its receiver
 * takes a pulled payload through a buffer, so the pull saves it no copy,
 * only moves the sender's onto it (2-rank all-reduces of 64-256 MiB ran
 * 20% slower pulled, on the Xeon where all-to-alls gained 1.4-2x). Not a
 * point-to-point send (op->call): a pulled send completes only when its
 * receive comes, which its caller may post after a blocking send of its
 * own, and an eager send of these sizes never waited for that. */
static int pull_by_cma(const dt_comm *c, const shm_link *l, const dt_p2p *op)
{
    if (!l->use_cma) return 0;
    return op->bytes >= l->sc->cma_min ||
           (op->bytes >= l->sc->pull_min && !op->call && !dt_coll_reduces(c->cur.kind));
}

/* Whether op's payload is to be pulled from our communication memory
 * (memory.c) through the peer's mapping of it: one user copy, no system
 * call, so from MAPPED_MIN up, reductions included (the receiver reduces
 * straight out of the mapping). Not a point-to-point send, as above. */
static int pull_mapped(const shm_link *l, const dt_p2p *op, dt_mem_ref *ref)
{
    return l->can_pull && !op->call && op->bytes >= MAPPED_MIN &&
           dt_shared_find(op->src, op->bytes, ref) && ref->fd >= 0 && ref->fd < (1 << 16);
}

static int send_header(dt_comm *c, shm_link *l, dt_p2p *op)
{
    uint64_t rb = l->out_bytes;
    if (ring_free(l, rb) < LINE) return 0; /* before the region lookup: it takes a lock */
    dt_mem_ref ref;
    int mapped = pull_mapped(l, op, &ref);
    int pulled = mapped || pull_by_cma(c, l, op);
    dt_p2p_fill_hdr(c, op, &op->hdr);
    if (pulled) {
        op->hdr.flags |= DT_MSG_FLAG_CMA;
        op->hdr.aux[0] = (uint64_t)(uintptr_t)op->src;
        op->hdr.aux[1] = op->ticket = ++l->cma_sent;
    }
    if (mapped) {
        op->hdr.flags |= DT_MSG_FLAG_MAPPED;
        op->hdr.aux[1] |= (uint64_t)ref.fd << TICKET_BITS;
        op->hdr.region = ref.id;
    }
    ring_write(l->out, rb, l->head, &op->hdr, sizeof op->hdr);
    l->head += LINE;
    if (pulled) publish_head(l); /* a streamed header goes out with its payload */
    op->hdr_done = 1;
    op->link_free = pulled; /* the next message may follow while this one waits */
    return 1;
}

/* Stream payload into the ring. Pieces are multiples of 64 bytes except the
 * last, so the receiver always sees whole elements. */
static int send_stream(shm_link *l, dt_p2p *op, int *progressed)
{
    uint64_t rb = l->out_bytes;
    while (op->done < op->bytes) {
        uint64_t free_bytes = ring_free(l, rb);
        size_t left = op->bytes - op->done;
        size_t n = left < free_bytes ? left : (size_t)free_bytes;
        if (n < left) n &= ~(size_t)(LINE - 1);
        if (n == 0) return 0;
        ring_write(l->out, rb, l->head, (const char *)op->src + op->done, n);
        l->head += n;
        op->done += n;
        /* The last piece is published padded, so that every header starts
         * 64-byte aligned and the receiver's tail never passes our head. */
        if (op->done == op->bytes) l->head = (l->head + LINE - 1) & ~(uint64_t)(LINE - 1);
        publish_head(l);
        *progressed = 1;
    }
    return 1;
}

static int shm_send_progress(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    if (!op->hdr_done) {
        if (!send_header(c, l, op)) return 0;
        *progressed = 1;
    }
    if (op->hdr.flags & DT_MSG_FLAG_CMA)
        return atomic_load_explicit(&l->out->cma_done[op->ticket % SHM_CMA_SLOTS],
                                    memory_order_acquire) >= op->ticket;
    int rc = send_stream(l, op, progressed);
    if (l->head != l->head_pub) publish_head(l); /* no payload, or no room for it yet */
    return rc;
}

/* ---- receiving ---------------------------------------------------------- */

static void publish_tail(shm_link *l)
{
    atomic_store_explicit(&l->in->tail, l->tail, memory_order_release);
    l->tail_pub = l->tail;
    ring_notify(l->peer_inbox);
}

/* The header at our tail, once the sender has published it. */
static int peek_header(shm_link *l, dt_msg_hdr *h)
{
    uint64_t head = atomic_load_explicit(&l->in->head, memory_order_acquire);
    if (head - l->tail < LINE) return 0;
    memcpy(h, l->in->data + (l->tail & (l->in_bytes - 1)), sizeof *h);
    return 1;
}

static int recv_header(dt_comm *c, shm_link *l, dt_p2p *op)
{
    if (!peek_header(l, &op->hdr)) return 0;
    l->tail += LINE;
    int rc = dt_p2p_check_hdr(c, op, &op->hdr);
    return rc < 0 ? rc : 1;
}

static void consume(dt_comm *c, dt_p2p *op, const void *from, size_t n)
{
    int stream = op->bytes >= DT_STREAM_MIN || c->cur.stream_out; /* past the cache */
    if (op->kind == DT_P2P_RECV && stream)
        dt_copy_stream((char *)op->dst + op->done, from, n);
    else if (op->kind == DT_P2P_RECV)
        memcpy((char *)op->dst + op->done, from, n);
    else if (stream)
        dt_reduce_elems_stream(c->cur.dtype, c->cur.op, (char *)op->dst + op->done,
                               (const char *)op->src + op->done, from, n / dt_dtype_size(c->cur.dtype));
    else
        dt_p2p_reduce_chunk(c, op, op->done, from, n);
    op->done += n;
}

static int recv_stream(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    uint64_t rb = l->in_bytes;
    while (op->done < op->bytes) {
        uint64_t head = atomic_load_explicit(&l->in->head, memory_order_acquire);
        size_t avail = (size_t)(head - l->tail);
        if (avail == 0) return 0;
        size_t off = l->tail & (rb - 1);
        size_t n = op->bytes - op->done;
        if (n > avail) n = avail;
        if (n > rb - off) n = rb - off; /* up to the wrap; elements never straddle it */
        consume(c, op, l->in->data + off, n);
        l->tail += n;
        if (op->done < op->bytes) publish_tail(l); /* room for the rest */
        *progressed = 1;
    }
    l->tail = (l->tail + LINE - 1) & ~(uint64_t)(LINE - 1);
    return 1;
}

static int cma_read(dt_comm *c, shm_link *l, dt_p2p *op, void *to, uint64_t from, size_t n)
{
    struct iovec local = {to, n}, remote = {(void *)(uintptr_t)from, n};
    while (local.iov_len) {
        ssize_t got = process_vm_readv(l->peer_pid, &local, 1, &remote, 1, 0);
        if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            return dt_comm_fail(c, got < 0 && errno == ESRCH ? DT_ERR_PEER : DT_ERR_SYSTEM,
                                op->peer, "reading %zu bytes from rank %d (pid %d): %s", n,
                                op->peer, (int)l->peer_pid,
                                got < 0 ? strerror(errno) : "no progress");
        }
        local.iov_base = (char *)local.iov_base + got;
        local.iov_len -= (size_t)got;
        remote.iov_base = (char *)remote.iov_base + got;
        remote.iov_len -= (size_t)got;
    }
    return 0;
}

/* The payload in our mapping of the sender's region, NULL when it is not
 * mapped (plain memory, or a mapping refused: then pulled by CMA). */
static const char *mapped_payload(shm_link *l, const dt_p2p *op)
{
    if (!(op->hdr.flags & DT_MSG_FLAG_MAPPED) || l->sc->no_maps) return NULL;
    return shm_peer_mem(&l->peer_mem, l->peer_pid, op->hdr.region,
                        (int)(op->hdr.aux[1] >> TICKET_BITS), op->hdr.aux[0], op->bytes);
}

/* One piece of a pulled receive per call, so the executor can interleave
 * the other ops of the step. */
static int recv_pulled(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    if (op->done < op->bytes) {
        const char *mapped = mapped_payload(l, op);
        size_t piece = op->kind == DT_P2P_RECV || mapped ? CMA_PIECE : REDUCE_PIECE;
        size_t n = op->bytes - op->done < piece ? op->bytes - op->done : piece;
        if (mapped) {
            consume(c, op, mapped + op->done, n);
        } else {
            uint64_t from = op->hdr.aux[0] + op->done;
            void *to = op->kind == DT_P2P_RECV ? (char *)op->dst + op->done : l->sc->reduce_buf;
            int rc = cma_read(c, l, op, to, from, n);
            if (rc < 0) return rc;
            if (op->kind == DT_P2P_RECV)
                op->done += n;
            else
                consume(c, op, l->sc->reduce_buf, n);
        }
        *progressed = 1;
        if (op->done < op->bytes) return 0;
    }
    uint64_t ticket = op->hdr.aux[1] & ((1ull << TICKET_BITS) - 1);
    atomic_store_explicit(&l->in->cma_done[ticket % SHM_CMA_SLOTS], ticket,
                          memory_order_release);
    publish_tail(l); /* also wakes the sender waiting for the acknowledgement */
    return 1;
}

static int shm_recv_progress(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    int rc = op->hdr_done ? 1 : recv_header(c, l, op);
    if (rc > 0 && !op->hdr_done) *progressed = op->hdr_done = 1;
    if (rc > 0) rc = op->hdr.flags & DT_MSG_FLAG_CMA ? recv_pulled(c, l, op, progressed)
                                                     : recv_stream(c, l, op, progressed);
    /* The tail goes out once a message, or before a wait: the sender may
     * need the room. */
    if (rc >= 0 && l->tail != l->tail_pub) publish_tail(l);
    return rc;
}

static int shm_progress(dt_comm *c, dt_link *base, dt_p2p *op, int *progressed)
{
    shm_link *l = (shm_link *)base;
    if (op->kind == DT_P2P_SEND) return shm_send_progress(c, l, op, progressed);
    return shm_recv_progress(c, l, op, progressed);
}

/* Shared-memory ops wait on the doorbell, not on a file descriptor. */
static int shm_pollfd(dt_link *l, const dt_p2p *op, struct pollfd *pfd)
{
    (void)l, (void)op, (void)pfd;
    return 0;
}

static int shm_peek(dt_comm *c, dt_link *l, dt_msg_hdr *h)
{
    (void)c;
    return peek_header((shm_link *)l, h);
}

/* A message to be pulled leaves the ring as its header; the receive that
 * matches it pulls the payload (recv_pulled) from the address it gives. */
static int shm_detach(dt_comm *c, dt_link *base, const dt_msg_hdr *h)
{
    shm_link *l = (shm_link *)base;
    (void)c;
    if (!(h->flags & DT_MSG_FLAG_CMA)) return 0;
    l->tail += LINE;
    publish_tail(l);
    return 1;
}

static void shm_link_destroy(dt_link *l)
{
    shm_peer_mem_release(((shm_link *)l)->peer_mem);
    free(l);
}

const dt_link_ops dt_shm_link_ops = {"shm", shm_progress, shm_pollfd, shm_peek, shm_detach,
                                     shm_link_destroy};

/* ---- waiting: the transport's doorbell (transport.h) -------------------- */

static uint32_t bell_read(const dt_comm *c)
{
    return c->shm ? atomic_load(&c->shm->me->doorbell) : 0;
}

static void bell_arm(dt_comm *c)
{
    if (!c->shm) return;
    atomic_store(&c->shm->me->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
}

static void bell_disarm(dt_comm *c)
{
    if (c->shm) atomic_store(&c->shm->me->sleeping, 0);
}

static void bell_sleep(dt_comm *c, uint32_t seen, int timeout_ms)
{
    struct dt_shm_comm *sc = c->shm;
    if (!sc) {
        usleep((useconds_t)timeout_ms * 1000);
        return;
    }
    /* Armed before `seen` was read and the last pass ran: anything
     * published since moved the doorbell, and the futex returns at once. */
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    if (!atomic_load(&c->job->aborted)) futex(&sc->me->doorbell, FUTEX_WAIT, seen, &ts);
    atomic_store(&sc->me->sleeping, 0);
}

static void bell_wake(dt_comm *c)
{
    if (c->shm && c->shm->wake_me) ring_wake(c->shm->wake_me);
}

const dt_doorbell dt_shm_doorbell = {bell_read, bell_arm, bell_disarm, bell_sleep, bell_wake};

int dt_shm_peer_pid(const dt_comm *c, int rank)
{
    const dt_link *l = rank >= 0 && rank < c->size ? c->links[rank] : NULL;
    return l && l->ops == &dt_shm_link_ops ? (int)((const shm_link *)l)->peer_pid : 0;
}
