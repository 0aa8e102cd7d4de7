/*
 * The step executor: every algorithm is a sequence of steps, each a few
 * point-to-point operations posted together. dt_p2p_run advances all of
 * them over their links until they are done, so a rank can send to its
 * right neighbour while receiving from its left one without deadlock.
 * The receives of point-to-point calls find their messages by source
 * and tag in the passes (p2p_match.c), and a send takes its number in its
 * pair's stream as it starts.
 *
 * Waiting: spin a little (the peer is usually about to deliver: up to
 * spin_limit polls, and by default no longer than DT_SPIN_NS), then
 * block as the links say (dt_link_ops.pollfd): on the communicator's
 * doorbell (shared memory's futex), or in poll() on their descriptors
 * (TCP's sockets); links that move only when polled (MPI's) nap instead.
 * With more ranks than cores the spin is short, because a spinning rank
 * steals the core from the rank it waits for, and the rank then yields
 * the core for a while (DT_YIELD_NS) before it sleeps. Every wakeup
 * checks the job's abort flag and the deadline: no progress for
 * DTRAIN_TIMEOUT seconds fails the communicator, naming the peer.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm/reduce_ops.h"
#include "core/timer.h"

#define DT_BLOCK_SLICE_MS 100 /* longest single sleep: bounds abort latency */
/* A peer that left the job (dt_comm_destroy) may have sent its last
 * message just before: it gets this long without progress before a wait
 * on it fails. */
#define DT_LEFT_GRACE_NS 500000000ull

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int is_send(const dt_p2p *op) { return op->kind == DT_P2P_SEND; }

static int is_call_recv(const dt_p2p *op) { return op->call && !is_send(op); }

/* Ops with the same peer and direction run one at a time, in array order,
 * because a link carries one message stream per direction (a send whose
 * payload the receiver pulls lets the next one go once its header is
 * out), and a receive waits while its link carries a message into the
 * queue. A receive of a point-to-point call runs once it has its message
 * (p2p_match.c). */
static int is_head(const dt_comm *c, const dt_p2p *ops, const unsigned char *done, int i)
{
    if (is_call_recv(&ops[i])) return ops[i].match != DT_MATCH_NONE;
    if (!is_send(&ops[i]) && dt_p2p_copying(c, ops[i].peer)) return 0;
    for (int j = 0; j < i; j++) {
        if (done[j] || is_send(&ops[j]) != is_send(&ops[i]) || ops[j].peer != ops[i].peer)
            continue;
        if (!ops[j].link_free) return 0;
    }
    return 1;
}

/* A send's number in its pair's stream, taken as it starts: a pair's
 * sends start in the order they were issued. */
static void take_seq(dt_comm *c, dt_p2p *op)
{
    op->p2p_seq = c->p2p_send_seq[op->peer]++;
    op->seq_taken = 1;
}

/* One pass over the ops. Returns the number still pending, or an error. */
static int progress_pass(dt_comm *c, dt_p2p *ops, unsigned char *done, int n, int *progressed)
{
    int pending = 0;
    int rc = dt_p2p_match(c, ops, done, n, progressed);
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        if (!is_head(c, ops, done, i)) {
            pending++;
            continue;
        }
        if (ops[i].call && !ops[i].seq_taken) take_seq(c, &ops[i]);
        dt_link *l = c->links[ops[i].peer];
        rc = ops[i].from ? dt_p2p_take_queued(c, &ops[i], progressed)
                         : l->ops->progress(c, l, &ops[i], progressed);
        if (rc < 0) return rc;
        if (rc == 1) {
            done[i] = 1;
            *progressed = 1;
            if (is_send(&ops[i])) {
                atomic_fetch_add(&c->bytes_sent, ops[i].bytes);
                if (c->host_of[ops[i].peer] != c->host_of[c->rank])
                    atomic_fetch_add(&c->bytes_off_host, ops[i].bytes);
            }
        } else {
            pending++;
        }
    }
    return pending;
}

#define DT_NAP_YIELD_NS 50000ull  /* idle this long: yield only */
#define DT_NAP_MAX_NS 250000ull    /* longest nap */

void dt_poll_nap(uint64_t idle_ns)
{
    if (idle_ns < DT_NAP_YIELD_NS) {
        sched_yield();
        return;
    }
    uint64_t ns = idle_ns / 4 < DT_NAP_MAX_NS ? idle_ns / 4 : DT_NAP_MAX_NS;
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

/* What a wait watches: descriptors for poll(), and whether a link waits
 * on the doorbell or must be polled. */
#define DT_WAIT_FDS (DT_P2P_MAX_OPS + 64)
typedef struct {
    struct pollfd pfds[DT_WAIT_FDS + 1]; /* and the job's wake fd */
    int npfd, bell, polled;
} wait_set;

/* How op's link waits (dt_link_ops.pollfd). More descriptors than the
 * set holds (a receive from any source of many TCP peers) are polled. */
static void wait_on(dt_comm *c, const dt_p2p *op, wait_set *w)
{
    if (w->npfd == DT_WAIT_FDS) {
        w->polled = 1;
        return;
    }
    dt_link *l = c->links[op->peer];
    int how = l->ops->pollfd(l, op, &w->pfds[w->npfd]);
    if (how > 0)
        w->npfd++;
    else if (how < 0)
        w->polled = 1;
    else
        w->bell = 1;
}

/* What a receive without its message waits on: the links it may take
 * from (p2p_match.c). */
static void wait_for_match(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n,
                           int i, wait_set *w)
{
    int from = ops[i].peer == DT_P2P_ANY ? 0 : ops[i].peer;
    int to = ops[i].peer == DT_P2P_ANY ? c->size : ops[i].peer + 1;
    for (int p = from; p < to; p++) {
        if (!dt_p2p_match_waits_on(c, ops, done, n, i, p)) continue;
        dt_p2p look = dt_p2p_recv(p, NULL, 0);
        wait_on(c, &look, w);
    }
}

/* Sleep until a link may have moved, the job aborted, or a time slice
 * passed. Ops with a descriptor wait in poll() (with the job's wake fd so
 * that an abort interrupts); the others on the doorbell, from the count
 * `bell` read before the last pass; polled links nap briefly, since nobody
 * rings for them. So do the copies of messages into the queue. */
static void block_once(dt_comm *c, dt_p2p *ops, const unsigned char *done, int n, uint32_t bell,
                       int ms, uint64_t idle_ns)
{
    wait_set w = {.npfd = 0};
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        if (is_call_recv(&ops[i]) && ops[i].match == DT_MATCH_NONE)
            wait_for_match(c, ops, done, n, i, &w);
        else if (is_head(c, ops, done, i))
            wait_on(c, &ops[i], &w);
    }
    for (int p = 0; p < c->size; p++) {
        const dt_p2p *copy = dt_p2p_copying(c, p);
        if (copy) wait_on(c, copy, &w);
    }
    if (w.polled) {
        dt_poll_nap(idle_ns);
        return;
    }
    if (w.npfd == 0) {
        c->doorbell->sleep(c, bell, ms);
        return;
    }
    w.pfds[w.npfd].fd = c->job->wake_fd;
    w.pfds[w.npfd].events = POLLIN;
    /* Descriptors and the doorbell both (TCP and shared memory in
     * hierarchical steps): poll briefly so the doorbell's side is checked
     * often. */
    poll(w.pfds, (nfds_t)w.npfd + 1, w.bell ? 1 : ms);
}

/* The deadline passed: fail c, naming what the first pending op waits for
 * (and what a receive without its message passed over). */
static int fail_timeout(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n)
{
    int i = 0;
    while (i < n - 1 && done[i]) i++;
    double s = c->job->timeout_s;
    if (is_call_recv(&ops[i]) && ops[i].match == DT_MATCH_NONE) {
        char passed[256];
        dt_p2p_passed_over(c, ops, done, n, i, passed, sizeof passed);
        if (ops[i].peer == DT_P2P_ANY)
            return dt_comm_fail(c, DT_ERR_TIMEOUT, -1, "timed out after %.1f s waiting for a "
                                "message tagged %d from any rank (DTRAIN_TIMEOUT)%s", s,
                                ops[i].call->tag, passed);
        return dt_comm_fail(c, DT_ERR_TIMEOUT, ops[i].peer, "timed out after %.1f s waiting for "
                            "rank %d to send a message tagged %d (DTRAIN_TIMEOUT)%s", s,
                            ops[i].peer, ops[i].call->tag, passed);
    }
    return dt_comm_fail(c, DT_ERR_TIMEOUT, ops[i].peer,
                        "timed out after %.1f s waiting for rank %d %s (DTRAIN_TIMEOUT)", s,
                        ops[i].peer, is_send(&ops[i]) ? "to take our send" : "to send");
}

/* A pending op whose peer left the job over DT_LEFT_GRACE_NS ago, with no
 * progress since (stalled: when progress stopped); -1 if none. */
static int op_on_gone_peer(const dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n,
                           uint64_t stalled, uint64_t now)
{
    if (!atomic_load(&c->job->nleft)) return -1;
    for (int i = 0; i < n; i++) {
        if (done[i] || ops[i].peer == DT_P2P_ANY) continue;
        uint64_t left = atomic_load(&c->job->left_ns[c->world_rank[ops[i].peer]]);
        uint64_t since = left > stalled ? left : stalled;
        if (left && now > since && now - since >= DT_LEFT_GRACE_NS) return i;
    }
    return -1;
}

/* ops[i]'s peer left: a receive without its message says what it passed
 * over. */
static int fail_left(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n, int i)
{
    char passed[256] = "";
    if (is_call_recv(&ops[i]) && ops[i].match == DT_MATCH_NONE)
        dt_p2p_passed_over(c, ops, done, n, i, passed, sizeof passed);
    return dt_comm_fail_left(c, &ops[i], passed);
}

int dt_p2p_run(dt_comm *c, dt_p2p *ops, int n) { return dt_p2p_run_growing(c, ops, n, n, NULL, NULL); }

int dt_p2p_run_growing(dt_comm *c, dt_p2p *ops, int n, int cap, dt_p2p_refill_fn refill,
                       void *arg)
{
    if (cap > DT_P2P_MAX_OPS) return dt_comm_fail(c, DT_ERR_INVALID, -1, "step of %d ops", cap);
    if (c->dry) { /* a dry run's stand-in: the cost model takes the step */
        c->dry->step(c->dry, c, ops, n);
        return 0;
    }
    if (atomic_load(&c->failed)) return c->failed_code;
    unsigned char done[DT_P2P_MAX_OPS] = {0};
    uint64_t timeout_ns = (uint64_t)(c->job->timeout_s * 1e9);
    uint64_t last_progress = 0;
    const dt_doorbell *db = c->doorbell;
    int spins = 0, armed = 0;
    uint64_t spin_start = 0;
    for (;;) {
        int progressed = 0;
        if (refill) n = refill(arg, ops, n, cap);
        uint32_t bell = db->read(c);
        int pending = progress_pass(c, ops, done, n, &progressed);
        if (armed && (pending <= 0 || progressed)) db->disarm(c), armed = 0;
        if (pending <= 0) return pending;
        if (progressed) {
            spins = 0;
            last_progress = 0;
            continue;
        }
        if (atomic_load(&c->job->aborted)) return dt_comm_fail_from_abort(c, "");
        if (spins == 0) spin_start = dt_now_ns();
        /* the clock read every 64 polls: a pass over shared memory takes
         * tens of nanoseconds */
        if (++spins < c->spin_limit &&
            ((spins & 63) || dt_now_ns() - spin_start < c->spin_ns)) {
            cpu_relax();
            continue;
        }
        uint64_t now = dt_now_ns();
        if (!last_progress) last_progress = now;
        if (now - last_progress >= timeout_ns) return fail_timeout(c, ops, done, n);
        int gone = op_on_gone_peer(c, ops, done, n, last_progress, now);
        if (gone >= 0) return fail_left(c, ops, done, n, gone);
        if (now - last_progress < c->yield_ns) {
            sched_yield();
            continue;
        }
        if (!armed) { /* one more pass after arming, so no wake-up is lost */
            db->arm(c);
            armed = 1;
            continue;
        }
        uint64_t left_ms = (timeout_ns - (now - last_progress)) / 1000000 + 1;
        block_once(c, ops, done, n, bell,
                   left_ms < DT_BLOCK_SLICE_MS ? (int)left_ms : DT_BLOCK_SLICE_MS,
                   now - last_progress);
        db->disarm(c);
        armed = 0;
        /* after a sleep, spin half as long before the next */
        spins = c->spin_limit / 2;
        spin_start = dt_now_ns() - c->spin_ns / 2;
    }
}

void dt_p2p_fill_hdr(const dt_comm *c, const dt_p2p *op, dt_msg_hdr *h)
{
    const dt_coll_args *call = op->call ? op->call : &c->cur;
    memset(h, 0, sizeof *h);
    h->magic = DT_MSG_MAGIC;
    h->comm_tag = c->tag;
    h->coll = (uint8_t)call->kind;
    h->dtype = (uint8_t)call->dtype;
    h->op = (uint8_t)call->op;
    h->root = call->root;
    h->count = call->count;
    h->bytes = op->bytes;
    if (call->kind == DT_COLL_SEND) {
        /* Point-to-point messages are numbered per pair, not per collective. */
        h->seq = op->p2p_seq;
        h->root = c->rank; /* the receiver expects its peer here */
        h->tag = call->tag;
    } else {
        h->seq = c->cur_seq;
    }
    /* An all-to-all-v's pair checks its counts both ways: a message says
     * what its sender sends (bytes) and what it expects back (count), so
     * each side of a pair that disagrees sees it in the call itself. For a
     * receive this is the header the peer's must match. */
    if (call->kind == DT_COLL_ALLTOALLV)
        h->count = dt_coll_v_count(call, op->peer, op->kind != DT_P2P_SEND);
}

static const char *coll_name_of(uint8_t k)
{
    return k < DT_COLL_KIND_COUNT ? dt_coll_name((dt_coll_kind)k) : "unknown";
}

static int describe_dtype(const dt_msg_hdr *want, const dt_msg_hdr *got, char *buf, size_t len)
{
    return snprintf(buf, len, "dtype: ours %s, rank %%d's %s",
                    dt_dtype_name((dt_dtype)want->dtype),
                    got->dtype < DT_DTYPE_COUNT ? dt_dtype_name((dt_dtype)got->dtype) : "?");
}

/* An all-to-all-v's pair (see dt_p2p_fill_hdr): the peer sends got->bytes
 * and expects got->count elements back; we expect want->bytes and send
 * want->count. Both sides of a disagreement say the same sentence. */
static int describe_v_mismatch(const dt_comm *c, const dt_msg_hdr *want, const dt_msg_hdr *got,
                               char *buf, size_t len)
{
    if (got->dtype != want->dtype) return describe_dtype(want, got, buf, len);
    unsigned long long esz = dt_dtype_size((dt_dtype)want->dtype);
    if (got->bytes != want->bytes)
        return snprintf(buf, len, "alltoallv counts: rank %%d sends %llu elements to rank %d, "
                        "which expects %llu from it", (unsigned long long)got->bytes / esz,
                        c->rank, (unsigned long long)want->bytes / esz);
    if (got->count != want->count)
        return snprintf(buf, len, "alltoallv counts: rank %d sends %llu elements to rank %%d, "
                        "which expects %llu from it", c->rank, (unsigned long long)want->count,
                        (unsigned long long)got->count);
    return 0;
}

/* The first field that differs, described for both sides. */
static int describe_mismatch(const dt_comm *c, const dt_msg_hdr *want, const dt_msg_hdr *got,
                             char *buf, size_t len)
{
    if (got->coll != want->coll)
        return snprintf(buf, len, "collective: we called %s, rank %%d called %s",
                        coll_name_of(want->coll), coll_name_of(got->coll));
    if (got->seq != want->seq)
        return snprintf(buf, len, "sequence: we are at #%llu, rank %%d at #%llu",
                        (unsigned long long)want->seq, (unsigned long long)got->seq);
    if (want->coll == DT_COLL_ALLTOALLV) return describe_v_mismatch(c, want, got, buf, len);
    if (got->count != want->count)
        return snprintf(buf, len, "count: ours %llu, rank %%d's %llu",
                        (unsigned long long)want->count, (unsigned long long)got->count);
    if (got->dtype != want->dtype) return describe_dtype(want, got, buf, len);
    if (got->op != want->op)
        return snprintf(buf, len, "op: ours %s, rank %%d's %s", dt_op_name((dt_op)want->op),
                        got->op < DT_OP_COUNT ? dt_op_name((dt_op)got->op) : "?");
    if (got->root != want->root) {
        if (want->coll == DT_COLL_SEND && got->coll == DT_COLL_SEND)
            return snprintf(buf, len, "sender: expected rank %d, got rank %d", want->root,
                            got->root);
        return snprintf(buf, len, "root: ours %d, rank %%d's %d", want->root, got->root);
    }
    if (got->tag != want->tag)
        return snprintf(buf, len, "tag: ours %d, rank %%d's %d", want->tag, got->tag);
    if (got->bytes != want->bytes)
        return snprintf(buf, len, "message size: expected %llu bytes, rank %%d sent %llu",
                        (unsigned long long)want->bytes, (unsigned long long)got->bytes);
    return 0;
}

int dt_p2p_check_hdr(dt_comm *c, const dt_p2p *op, const dt_msg_hdr *h)
{
    if (h->magic != DT_MSG_MAGIC || h->comm_tag != c->tag)
        return dt_comm_fail(c, DT_ERR_PROTOCOL, op->peer,
                            "malformed message from rank %d (magic %08x, communicator tag %08x, "
                            "expected %08x)",
                            op->peer, h->magic, h->comm_tag, c->tag);
    dt_msg_hdr want;
    dt_p2p_fill_hdr(c, op, &want);
    if (want.coll == DT_COLL_SEND) want.root = op->peer;
    char fmt[256];
    if (!describe_mismatch(c, &want, h, fmt, sizeof fmt)) return 0;
    char msg[300];
    snprintf(msg, sizeof msg, fmt, op->peer);
    return dt_comm_fail(c, DT_ERR_MISMATCH, op->peer, "ranks disagree on the %s", msg);
}

void dt_p2p_reduce_chunk(const dt_comm *c, dt_p2p *op, size_t off, const void *in, size_t bytes)
{
    size_t esz = dt_dtype_size(c->cur.dtype);
    dt_reduce_elems(c->cur.dtype, c->cur.op, (char *)op->dst + off, (const char *)op->src + off, in,
              bytes / esz);
}
