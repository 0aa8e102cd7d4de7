/*
 * Shared-memory transport between ranks on one host.
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
 * process_vm_readv (cross-memory attach, one copy), then bumps an
 * acknowledgement counter that completes the send. Where CMA is refused
 * (containers, ptrace restrictions) everything streams through the ring.
 *
 * Blocking: a waiter publishes `sleeping` (arms), looks once more, and
 * sleeps on its doorbell futex; whoever makes progress it could be
 * waiting for (new data, freed space, an acknowledgement) moves the
 * doorbell and calls futex_wake only when the waiter is armed, so the fast
 * path has neither a syscall nor a write to a shared line.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm/reduce_ops.h"
#include "core/env.h"
#include "core/log.h"

#define SHM_MAGIC 0x4d485354445452ull /* "RTDTSHM" */
#define LINE 64
#define CMA_PIECE (4u << 20)     /* a plain CMA receive moves this much per call */
#define REDUCE_PIECE (256u << 10) /* CMA reductions go through a cache-sized buffer */
#define STREAM_MIN (32u << 20)     /* reductions this large store past the cache */

typedef struct {
    _Alignas(LINE) _Atomic uint64_t head; /* bytes written by the sender */
    _Alignas(LINE) _Atomic uint64_t tail; /* bytes consumed by the receiver */
    _Alignas(LINE) _Atomic uint64_t cma_done; /* last CMA ticket the receiver finished */
    _Alignas(LINE) unsigned char data[];   /* ring_bytes follow */
} shm_ring;

typedef struct {
    _Atomic uint64_t magic; /* written last: the segment is ready */
    uint64_t segment_bytes;
    uint64_t ring_bytes;
    int32_t pid;
    int32_t nlocal;
    uint64_t probe_addr; /* address of a known value, for the CMA check */
    _Alignas(LINE) _Atomic uint32_t doorbell;
    _Alignas(LINE) _Atomic uint32_t sleeping;
    _Alignas(LINE) unsigned char cma_ok[256]; /* [sender local index]: we can pull from it */
} shm_inbox;

typedef struct {
    dt_link base;
    struct dt_shm_comm *sc;
    int peer_local;          /* peer's index among local members */
    shm_ring *out;           /* our ring inside the peer's inbox */
    shm_ring *in;            /* the peer's ring inside our inbox */
    shm_inbox *peer_inbox;
    pid_t peer_pid;
    int use_cma;             /* we may post CMA sends to the peer */
    uint64_t head, tail_seen; /* sender side: our head, last tail we read */
    uint64_t tail;            /* receiver side: our tail */
    uint64_t cma_sent;        /* tickets handed out */
} shm_link;

struct dt_shm_comm {
    char name[128];
    shm_inbox *me;
    /* `me` once it is mapped, for dt_shm_wake: the store's monitor thread
     * may wake a communicator that is still being set up or torn down, so
     * this and c->shm change only under job->lock, which the waker holds. */
    shm_inbox *wake_me;
    size_t seg_bytes;
    uint64_t ring_bytes;
    size_t cma_min;
    int my_local;
    int nlocal;
    void **maps;   /* [nlocal] mapped inboxes, ours included */
    size_t *map_bytes;
    void *reduce_buf;
};

static const uint64_t probe_value = 0x6474726169e5c0deull;

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static size_t ring_stride(uint64_t ring_bytes) { return sizeof(shm_ring) + ring_bytes; }

static shm_ring *inbox_ring(void *inbox, uint64_t ring_bytes, int sender_local)
{
    size_t first = (sizeof(shm_inbox) + LINE - 1) / LINE * LINE;
    return (shm_ring *)((char *)inbox + first + (size_t)sender_local * ring_stride(ring_bytes));
}

static size_t segment_size(uint64_t ring_bytes, int nlocal)
{
    size_t first = (sizeof(shm_inbox) + LINE - 1) / LINE * LINE;
    return first + (size_t)nlocal * ring_stride(ring_bytes);
}

/* After publishing: ring only a waiter that may sleep. The fence pairs
 * with dt_shm_arm's (Dekker): either the waiter's re-check after arming
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
    ring_notify(l->peer_inbox);
}

static int send_header(dt_comm *c, shm_link *l, dt_p2p *op)
{
    uint64_t rb = l->sc->ring_bytes;
    if (ring_free(l, rb) < LINE) return 0;
    dt_p2p_fill_hdr(c, op, &op->hdr);
    if (l->use_cma && op->bytes >= l->sc->cma_min) {
        op->hdr.flags |= DT_MSG_FLAG_CMA;
        op->hdr.aux[0] = (uint64_t)(uintptr_t)op->src;
        op->hdr.aux[1] = op->ticket = ++l->cma_sent;
    }
    ring_write(l->out, rb, l->head, &op->hdr, sizeof op->hdr);
    l->head += LINE;
    publish_head(l);
    op->hdr_done = 1;
    return 1;
}

/* Stream payload into the ring. Pieces are multiples of 64 bytes except the
 * last, so the receiver always sees whole elements. */
static int send_stream(shm_link *l, dt_p2p *op, int *progressed)
{
    uint64_t rb = l->sc->ring_bytes;
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
        return atomic_load_explicit(&l->out->cma_done, memory_order_acquire) >= op->ticket;
    return send_stream(l, op, progressed);
}

/* ---- receiving ---------------------------------------------------------- */

static void publish_tail(shm_link *l)
{
    atomic_store_explicit(&l->in->tail, l->tail, memory_order_release);
    ring_notify(l->peer_inbox);
}

static int recv_header(dt_comm *c, shm_link *l, dt_p2p *op)
{
    uint64_t head = atomic_load_explicit(&l->in->head, memory_order_acquire);
    if (head - l->tail < LINE) return 0;
    size_t off = l->tail & (l->sc->ring_bytes - 1);
    memcpy(&op->hdr, l->in->data + off, sizeof op->hdr);
    l->tail += LINE;
    int rc = dt_p2p_check_hdr(c, op, &op->hdr);
    if (rc < 0) return rc;
    op->hdr_done = 1;
    return 1;
}

static void consume(dt_comm *c, dt_p2p *op, const void *from, size_t n)
{
    if (op->kind == DT_P2P_RECV && op->bytes >= STREAM_MIN)
        dt_copy_stream((char *)op->dst + op->done, from, n);
    else if (op->kind == DT_P2P_RECV)
        memcpy((char *)op->dst + op->done, from, n);
    else if (op->bytes >= STREAM_MIN) /* far beyond the cache: stream the result out */
        dt_reduce_elems_stream(c->cur.dtype, c->cur.op, (char *)op->dst + op->done,
                               (const char *)op->src + op->done, from, n / dt_dtype_size(c->cur.dtype));
    else
        dt_p2p_reduce_chunk(c, op, op->done, from, n);
    op->done += n;
}

static int recv_stream(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    uint64_t rb = l->sc->ring_bytes;
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
        publish_tail(l);
        *progressed = 1;
    }
    l->tail = (l->tail + LINE - 1) & ~(uint64_t)(LINE - 1);
    publish_tail(l);
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

/* One piece of a CMA receive per call, so the executor can interleave the
 * other ops of the step. */
static int recv_cma(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    if (op->done < op->bytes) {
        size_t piece = op->kind == DT_P2P_RECV ? CMA_PIECE : REDUCE_PIECE;
        size_t n = op->bytes - op->done < piece ? op->bytes - op->done : piece;
        uint64_t from = op->hdr.aux[0] + op->done;
        void *to = op->kind == DT_P2P_RECV ? (char *)op->dst + op->done : l->sc->reduce_buf;
        int rc = cma_read(c, l, op, to, from, n);
        if (rc < 0) return rc;
        if (op->kind == DT_P2P_RECV)
            op->done += n;
        else
            consume(c, op, l->sc->reduce_buf, n);
        *progressed = 1;
        if (op->done < op->bytes) return 0;
    }
    atomic_store_explicit(&l->in->cma_done, op->hdr.aux[1], memory_order_release);
    publish_tail(l); /* also wakes the sender waiting for the acknowledgement */
    return 1;
}

static int shm_recv_progress(dt_comm *c, shm_link *l, dt_p2p *op, int *progressed)
{
    if (!op->hdr_done) {
        int rc = recv_header(c, l, op);
        if (rc <= 0) return rc;
        *progressed = 1;
        if (op->hdr.flags & DT_MSG_FLAG_CMA) return recv_cma(c, l, op, progressed);
        publish_tail(l);
    }
    if (op->hdr.flags & DT_MSG_FLAG_CMA) return recv_cma(c, l, op, progressed);
    return recv_stream(c, l, op, progressed);
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

static void shm_link_destroy(dt_link *l) { free(l); }

static const dt_link_ops shm_ops = {"shm", shm_progress, shm_pollfd, shm_link_destroy};

/* ---- waiting ------------------------------------------------------------ */

uint32_t dt_shm_bell(const dt_comm *c) { return c->shm ? atomic_load(&c->shm->me->doorbell) : 0; }

void dt_shm_arm(dt_comm *c)
{
    if (!c->shm) return;
    atomic_store(&c->shm->me->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
}

void dt_shm_disarm(dt_comm *c)
{
    if (c->shm) atomic_store(&c->shm->me->sleeping, 0);
}

void dt_shm_wait(dt_comm *c, uint32_t bell, int timeout_ms)
{
    struct dt_shm_comm *sc = c->shm;
    if (!sc) {
        usleep((useconds_t)timeout_ms * 1000);
        return;
    }
    /* Armed before `bell` was read and the last pass ran: anything
     * published since moved the doorbell, and the futex returns at once. */
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    if (!atomic_load(&c->job->aborted)) futex(&sc->me->doorbell, FUTEX_WAIT, bell, &ts);
    atomic_store(&sc->me->sleeping, 0);
}

void dt_shm_wake(dt_comm *c)
{
    if (c->shm && c->shm->wake_me) ring_wake(c->shm->wake_me);
}

static void publish(dt_comm *c, struct dt_shm_comm *sc, shm_inbox *wake_me)
{
    pthread_mutex_lock(&c->job->lock);
    c->shm = sc;
    if (sc) sc->wake_me = wake_me;
    pthread_mutex_unlock(&c->job->lock);
}

/* ---- setup -------------------------------------------------------------- */

static int create_inbox(dt_comm *c, struct dt_shm_comm *sc)
{
    snprintf(sc->name, sizeof sc->name, "/dtrain-%s-%08x-%d", c->job->job_id, c->tag,
             c->world_rank[c->rank]);
    int fd = shm_open(sc->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) { /* left by a crashed run with the same job id */
        shm_unlink(sc->name);
        fd = shm_open(sc->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0)
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "shm_open(%s): %s", sc->name, strerror(errno));
    if (ftruncate(fd, (off_t)sc->seg_bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(sc->name);
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "sizing %s to %zu bytes: %s (is /dev/shm full?)",
                            sc->name, sc->seg_bytes, strerror(e));
    }
    void *p = mmap(NULL, sc->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(sc->name);
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "mmap(%s): %s", sc->name, strerror(errno));
    }
    sc->me = p;
    sc->me->segment_bytes = sc->seg_bytes;
    sc->me->ring_bytes = sc->ring_bytes;
    sc->me->pid = (int32_t)getpid();
    sc->me->nlocal = sc->nlocal;
    sc->me->probe_addr = (uint64_t)(uintptr_t)&probe_value;
    atomic_store_explicit(&sc->me->magic, SHM_MAGIC, memory_order_release);
    return 0;
}

static int open_inbox(dt_comm *c, struct dt_shm_comm *sc, int peer, int peer_local)
{
    char name[128];
    snprintf(name, sizeof name, "/dtrain-%s-%08x-%d", c->job->job_id, c->tag,
             c->world_rank[peer]);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return dt_comm_fail(c, DT_ERR_SYSTEM, peer, "opening rank %d's segment %s: %s", peer,
                            name, strerror(errno));
    void *p = mmap(NULL, sc->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return dt_comm_fail(c, DT_ERR_SYSTEM, peer, "mmap(%s): %s", name, strerror(errno));
    shm_inbox *in = p;
    if (in->magic != SHM_MAGIC || in->segment_bytes != sc->seg_bytes ||
        in->nlocal != sc->nlocal) {
        munmap(p, sc->seg_bytes);
        return dt_comm_fail(c, DT_ERR_PROTOCOL, peer,
                            "rank %d's segment %s has a different layout (another dtrain "
                            "version or DTRAIN_SHM_RING_KB setting?)",
                            peer, name);
    }
    sc->maps[peer_local] = p;
    return 0;
}

/* Can we read the peer's memory? The peer's verdict about us is what
 * decides whether we may post CMA sends to it. */
static int cma_works(pid_t pid, uint64_t addr)
{
    uint64_t v = 0;
    struct iovec local = {&v, sizeof v}, remote = {(void *)(uintptr_t)addr, sizeof v};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof v &&
           v == probe_value;
}

/* Ring size: streaming through a ring that stays in cache beats pulling
 * by cross-memory attach (whose kernel copy and page pinning cost more
 * than the second copy saves), so rings are as large as a budget of
 * 16 MiB per rank and communicator allows, at most 2 MiB each. Cross-
 * memory attach is kept (auto) for when many local peers leave each ring
 * small; DTRAIN_SHM_CMA=1 or 0 forces it on or off. */
#define RING_BUDGET (16u << 20)
#define RING_MAX (2u << 20)
#define RING_MIN (64u << 10)
#define CMA_AUTO_BELOW (512u << 10) /* auto: CMA when rings are smaller than this */

static uint64_t default_ring_bytes(int npeers)
{
    uint64_t r = RING_MAX;
    while (r > RING_MIN && r * (uint64_t)npeers > RING_BUDGET) r /= 2;
    return r;
}

static int read_settings(dt_comm *c, struct dt_shm_comm *sc, int npeers)
{
    char err[256];
    long ring_kb = (long)(default_ring_bytes(npeers) >> 10), cma_min = 1 << 20, cma = -1;
    if (dt_env_long("DTRAIN_SHM_RING_KB", 4, 1 << 20, &ring_kb, err, sizeof err) < 0 ||
        dt_env_long("DTRAIN_SHM_CMA_MIN", 0, 1L << 40, &cma_min, err, sizeof err) < 0 ||
        dt_env_long("DTRAIN_SHM_CMA", 0, 1, &cma, err, sizeof err) < 0)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "%s", err);
    if (ring_kb & (ring_kb - 1))
        return dt_comm_fail(c, DT_ERR_INVALID, -1,
                            "DTRAIN_SHM_RING_KB=%ld must be a power of two", ring_kb);
    sc->ring_bytes = (uint64_t)ring_kb << 10;
    if (cma < 0) cma = sc->ring_bytes < CMA_AUTO_BELOW;
    sc->cma_min = cma ? (size_t)cma_min : SIZE_MAX;
    return 0;
}

static int link_peers(dt_comm *c, struct dt_shm_comm *sc, const int *local_ranks)
{
    for (int i = 0; i < sc->nlocal; i++) {
        if (i == sc->my_local) continue;
        shm_link *l = calloc(1, sizeof *l);
        if (!l) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
        l->base.ops = &shm_ops;
        l->base.peer = local_ranks[i];
        l->sc = sc;
        l->peer_local = i;
        l->peer_inbox = sc->maps[i];
        l->peer_pid = l->peer_inbox->pid;
        l->out = inbox_ring(sc->maps[i], sc->ring_bytes, sc->my_local);
        l->in = inbox_ring(sc->me, sc->ring_bytes, i);
        l->use_cma = sc->cma_min != SIZE_MAX && l->peer_inbox->cma_ok[sc->my_local];
        c->links[local_ranks[i]] = &l->base;
    }
    return 0;
}

/* Whether any host holds two members of c, which then set up shared
 * memory; its store barriers count every member. */
static int anyone_shares_memory(const dt_comm *c)
{
    if (c->job->force_tcp) return 0;
    for (int r = 0; r < c->size; r++)
        for (int q = 0; q < r; q++)
            if (c->host_of[q] == c->host_of[r]) return 1;
    return 0;
}

/* peers: communicator ranks on this host other than us, ascending. */
int dt_shm_setup(dt_comm *c, const int *peers, int npeers)
{
    if (npeers == 0) {
        /* Alone on our host: we still count in the others' barriers (a
         * host of one beside hosts of several used to hang here). */
        if (!anyone_shares_memory(c)) return 0;
        int rc = dt_comm_store_barrier(c, "shm-created");
        return rc < 0 ? rc : dt_comm_store_barrier(c, "shm-mapped");
    }
    if (npeers + 1 > 256)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "more than 256 ranks on one host");
    struct dt_shm_comm *sc = calloc(1, sizeof *sc);
    if (!sc) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    publish(c, sc, NULL);
    int rc = read_settings(c, sc, npeers);
    if (rc < 0) return rc;
    /* Yama may restrict process_vm_readv to ancestors; allow our peers. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

    int local_ranks[256], n = 0;
    for (int i = 0, placed = 0; i < npeers || !placed; n++) {
        if (!placed && (i == npeers || peers[i] > c->rank)) {
            sc->my_local = n;
            local_ranks[n] = c->rank;
            placed = 1;
        } else {
            local_ranks[n] = peers[i++];
        }
    }
    sc->nlocal = n;
    sc->seg_bytes = segment_size(sc->ring_bytes, n);
    sc->maps = calloc((size_t)n, sizeof *sc->maps);
    sc->reduce_buf = malloc(REDUCE_PIECE);
    if (!sc->maps || !sc->reduce_buf) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    if ((rc = create_inbox(c, sc)) < 0) return rc;
    publish(c, sc, sc->me);
    sc->maps[sc->my_local] = sc->me;
    if ((rc = dt_comm_store_barrier(c, "shm-created")) < 0) goto out;
    for (int i = 0; i < n && rc == 0; i++)
        if (i != sc->my_local) rc = open_inbox(c, sc, local_ranks[i], i);
    if (rc < 0) goto out;
    for (int i = 0; i < n; i++)
        if (i != sc->my_local) {
            shm_inbox *in = sc->maps[i];
            sc->me->cma_ok[i] = (unsigned char)cma_works((pid_t)in->pid, in->probe_addr);
        }
    rc = dt_comm_store_barrier(c, "shm-mapped");
    if (rc == 0) rc = link_peers(c, sc, local_ranks);
out:
    /* Every peer has mapped it (or setup failed): the name is no longer needed. */
    shm_unlink(sc->name);
    return rc;
}

void dt_shm_teardown(dt_comm *c)
{
    struct dt_shm_comm *sc = c->shm;
    if (!sc) return;
    publish(c, NULL, NULL);
    for (int i = 0; i < sc->nlocal; i++)
        if (sc->maps && sc->maps[i]) munmap(sc->maps[i], sc->seg_bytes);
    free(sc->maps);
    free(sc->reduce_buf);
    free(sc);
}
