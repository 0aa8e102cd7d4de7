/*
 * Receives of point-to-point calls matched by source and tag, as MPI and
 * gloo match them (dt_irecv_tag, dt_irecv_any): a receive takes the
 * earliest message from its source (or from any) that has its tag, even
 * when messages with other tags were sent before it; messages of one tag
 * between a pair keep the order they were sent in.
 *
 * A link carries a pair's messages in the order they were sent. When a
 * receive without its message may take from a link whose next message no
 * posted receive wants, that message is taken off the link into the
 * communicator's queue of unexpected messages, so that what follows it
 * can be seen: its payload is copied out, unless the link pulls payloads
 * (shared memory's cross-memory attach), where the queue keeps the header
 * alone and the receive that matches it later pulls the payload from the
 * sender, whose send completes then. Each pass of the step executor
 * (p2p.c) first hands queued messages to receives without one, in posting
 * order; then each link's next message goes to the first posted receive
 * it matches, or into the queue. So every message goes to the first
 * receive posted that can take it. The queue holds at most
 * DTRAIN_P2P_QUEUE_MB (bytes copied, and a small record per message); a
 * message past that fails the communicator, naming it.
 *
 * Collectives' messages are never queued nor taken by a receive of a
 * call: a receive from a peer whose next message is a collective's can
 * never be matched (what follows comes after that collective, which runs
 * after this step), and fails at once, listing what it passed over; a
 * receive from any source looks at the other peers. The look at peers
 * starts after the last one chosen from any source, so that a peer which
 * always has a message ready cannot starve the others.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/alloc.h"

/* A message taken off its link before its receive came. */
typedef struct dt_unexpected dt_unexpected;
struct dt_unexpected {
    dt_unexpected *next; /* arrival order */
    int peer;
    int taken;           /* a receive has it: no longer matched */
    int whole;           /* copied out, or left with the sender */
    dt_msg_hdr hdr;
    void *payload;       /* the copy; NULL: the payload stays with the sender */
    size_t held;         /* bytes counted against the limit */
    dt_coll_args call;   /* the header's own call, which `copy` receives as */
    dt_p2p copy;         /* the receive copying it off the link */
};

struct dt_p2p_queue {
    dt_unexpected *head;
    size_t bytes;
    dt_unexpected **copying; /* [size]: the message coming off each link */
    int ncopying;
};

/* The most messages one pass takes off a link into the queue: the others
 * get their turn. */
#define QUEUE_PER_PASS 64

struct dt_p2p_queue *dt_p2p_queue_new(int size)
{
    struct dt_p2p_queue *q = calloc(1, sizeof *q);
    if (q && !(q->copying = calloc((size_t)size, sizeof *q->copying))) {
        free(q);
        q = NULL;
    }
    return q;
}

static void drop(struct dt_p2p_queue *q, dt_unexpected *e)
{
    for (dt_unexpected **p = &q->head; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    q->bytes -= e->held;
    dt_free(e->payload);
    free(e);
}

void dt_p2p_queue_free(struct dt_p2p_queue *q)
{
    if (!q) return;
    while (q->head) drop(q, q->head);
    free(q->copying);
    free(q);
}

/* ---- who wants what ------------------------------------------------------ */

static int is_call_recv(const dt_p2p *op) { return op->call && op->kind != DT_P2P_SEND; }

static int waiting(const dt_p2p *ops, const unsigned char *done, int i)
{
    return !done[i] && is_call_recv(&ops[i]) && ops[i].match == DT_MATCH_NONE;
}

static int takes_from(const dt_p2p *op, int peer)
{
    return op->peer == DT_P2P_ANY || op->peer == peer;
}

static int is_collectives(const dt_comm *c, const dt_msg_hdr *h)
{
    return h->magic == DT_MSG_MAGIC && h->comm_tag == c->tag && h->coll != DT_COLL_SEND;
}

static int is_malformed(const dt_comm *c, const dt_msg_hdr *h)
{
    return h->magic != DT_MSG_MAGIC || h->comm_tag != c->tag;
}

/* The first waiting receive, in posting order, that takes peer's message
 * with this tag (any tag: tag_any); -1 if none. */
static int first_wanting(const dt_p2p *ops, const unsigned char *done, int n, int peer, int tag,
                         int tag_any)
{
    for (int i = 0; i < n; i++)
        if (waiting(ops, done, i) && takes_from(&ops[i], peer) &&
            (tag_any || ops[i].call->tag == tag))
            return i;
    return -1;
}

/* Whether peer's link is carrying a message: to a receive, or into the
 * queue. Its next header is not in sight until that one is off. */
static int link_busy(const dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n,
                     int peer)
{
    if (c->queue->copying[peer]) return 1;
    for (int i = 0; i < n; i++)
        if (!done[i] && ops[i].match == DT_MATCH_LINK && ops[i].peer == peer) return 1;
    return 0;
}

const dt_p2p *dt_p2p_copying(const dt_comm *c, int peer)
{
    dt_unexpected *e = c->queue && c->queue->ncopying ? c->queue->copying[peer] : NULL;
    return e ? &e->copy : NULL;
}

/* ---- taking a message ---------------------------------------------------- */

static void chosen(dt_comm *c, dt_p2p *op, int peer)
{
    if (op->peer == DT_P2P_ANY) c->any_next = (peer + 1) % c->size;
    op->peer = peer;
    if (op->call->source) *op->call->source = peer;
}

/* op takes the link's next message: the link's progress reads it off and
 * checks its header, numbered next in the pair's stream. */
static void take_next(dt_comm *c, dt_p2p *op, int peer)
{
    chosen(c, op, peer);
    op->p2p_seq = c->p2p_recv_seq[peer]++;
    op->seq_taken = 1;
    op->match = DT_MATCH_LINK;
}

/* op takes queued message e, checked against it now (a size that differs
 * fails here). A payload left with the sender is pulled by the link's
 * progress from then on, as if its header had just been read. */
static int take_queued(dt_comm *c, dt_p2p *op, dt_unexpected *e)
{
    e->taken = 1;
    chosen(c, op, e->peer);
    op->p2p_seq = e->hdr.seq;
    op->seq_taken = 1;
    op->match = DT_MATCH_QUEUED;
    int rc = dt_p2p_check_hdr(c, op, &e->hdr);
    if (rc < 0) return rc;
    if (e->payload) {
        op->from = e;
        return 0;
    }
    op->hdr = e->hdr;
    op->hdr_done = 1;
    drop(c->queue, e);
    return 0;
}

int dt_p2p_take_queued(dt_comm *c, dt_p2p *op, int *progressed)
{
    dt_unexpected *e = op->from;
    if (!e->whole) return 0;
    if (op->bytes) memcpy(op->dst, e->payload, op->bytes);
    op->done = op->bytes;
    op->from = NULL;
    drop(c->queue, e);
    *progressed = 1;
    return 1;
}

/* ---- the queue ----------------------------------------------------------- */

static int queue_full(dt_comm *c, int peer, const dt_msg_hdr *h)
{
    int held = 0;
    for (const dt_unexpected *e = c->queue->head; e; e = e->next) held++;
    return dt_comm_fail(c, DT_ERR_NOMEM, peer,
                        "rank %d's message tagged %d (%llu bytes) came before its receive, and "
                        "the queue of such messages is full: %d held in %zu bytes, of %zu MiB "
                        "allowed (DTRAIN_P2P_QUEUE_MB raises it; or post the receive earlier)",
                        peer, h->tag, (unsigned long long)h->bytes, held, c->queue->bytes,
                        c->p2p_queue_limit >> 20);
}

static int room_for(const dt_comm *c, size_t need)
{
    return need <= c->p2p_queue_limit && c->queue->bytes <= c->p2p_queue_limit - need;
}

static void append(struct dt_p2p_queue *q, dt_unexpected *e)
{
    dt_unexpected **p = &q->head;
    while (*p) p = &(*p)->next;
    *p = e;
    q->bytes += e->held;
}

/* Advance e's copy off its link. */
static int copy_some(dt_comm *c, dt_unexpected *e, int *progressed)
{
    dt_link *l = c->links[e->peer];
    int rc = l->ops->progress(c, l, &e->copy, progressed);
    if (rc == 1) {
        e->whole = 1;
        c->queue->copying[e->peer] = NULL;
        c->queue->ncopying--;
    }
    return rc < 0 ? rc : 0;
}

static int advance_copies(dt_comm *c, int *progressed)
{
    for (dt_unexpected *e = c->queue->head; e && c->queue->ncopying; e = e->next) {
        if (e->whole) continue;
        int rc = copy_some(c, e, progressed);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Take peer's next message (header h) into the queue: its header alone
 * where the link leaves the payload with the sender, else a copy. */
static int queue_next(dt_comm *c, int peer, const dt_msg_hdr *h, int *progressed)
{
    dt_link *l = c->links[peer];
    size_t record = sizeof(dt_unexpected);
    if (!room_for(c, record)) return queue_full(c, peer, h);
    dt_unexpected *e = calloc(1, sizeof *e);
    if (!e) return dt_comm_fail(c, DT_ERR_NOMEM, peer, "out of memory for a queued message");
    e->peer = peer;
    e->hdr = *h;
    e->held = record;
    e->call = (dt_coll_args){.kind = DT_COLL_SEND, .count = h->count, .dtype = h->dtype,
                             .root = peer, .is_recv = 1, .tag = h->tag};
    e->copy = dt_p2p_recv(peer, NULL, h->bytes);
    e->copy.call = &e->call;
    e->copy.p2p_seq = c->p2p_recv_seq[peer]++;
    e->copy.seq_taken = 1;
    int rc = dt_p2p_check_hdr(c, &e->copy, h); /* the stream's order, the sender */
    if (rc == 0 && l->ops->detach) rc = l->ops->detach(c, l, h);
    if (rc < 0) {
        free(e);
        return rc;
    }
    if (rc > 0) { /* the header alone: the payload waits with the sender */
        e->whole = 1;
        append(c->queue, e);
        return 0;
    }
    if (!room_for(c, record + h->bytes)) {
        free(e);
        return queue_full(c, peer, h);
    }
    e->held += h->bytes;
    e->payload = dt_alloc(h->bytes ? h->bytes : 1, DT_MEM_COMM);
    if (!e->payload) {
        free(e);
        return dt_comm_fail(c, DT_ERR_NOMEM, peer, "out of memory for a queued message of "
                            "%llu bytes from rank %d", (unsigned long long)h->bytes, peer);
    }
    e->copy.dst = e->payload;
    append(c->queue, e);
    c->queue->copying[peer] = e;
    c->queue->ncopying++;
    return copy_some(c, e, progressed);
}

/* ---- matching ------------------------------------------------------------ */

static dt_unexpected *first_queued(const dt_comm *c, const dt_p2p *op)
{
    for (dt_unexpected *e = c->queue->head; e; e = e->next)
        if (!e->taken && takes_from(op, e->peer) && e->hdr.tag == op->call->tag) return e;
    return NULL;
}

/* ops[i], a receive from peer, whose next message is a collective's (h). */
static int fail_never(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n, int i,
                      int peer, const dt_msg_hdr *h)
{
    const dt_p2p *op = &ops[i];
    char passed[256];
    dt_p2p_passed_over(c, ops, done, n, i, passed, sizeof passed);
    return dt_comm_fail(c, DT_ERR_MISMATCH, peer,
                        "ranks disagree on the order of calls: rank %d called %s #%llu before it "
                        "sent a message tagged %d for this receive%s",
                        peer, h->coll < DT_COLL_KIND_COUNT ? dt_coll_name(h->coll) : "?",
                        (unsigned long long)h->seq, op->call->tag, passed);
}

/* Hand peer's next messages to the receives waiting for them, or to the
 * queue while some waiting receive may take what follows them. */
static int match_link(dt_comm *c, dt_p2p *ops, const unsigned char *done, int n, int peer,
                      int *progressed)
{
    if (peer == c->rank) return 0;
    for (int k = 0; k < QUEUE_PER_PASS; k++) {
        int first = first_wanting(ops, done, n, peer, 0, 1);
        if (first < 0 || link_busy(c, ops, done, n, peer)) return 0;
        dt_msg_hdr h;
        dt_link *l = c->links[peer];
        int rc = l->ops->peek(c, l, &h);
        if (rc <= 0) return rc;
        if (is_collectives(c, &h)) {
            for (int i = first; i < n; i++)
                if (waiting(ops, done, i) && ops[i].peer == peer)
                    return fail_never(c, ops, done, n, i, peer, &h);
            return 0; /* from any source: another peer may have it */
        }
        /* A malformed message goes to a receive, whose check then fails
         * naming the peer, where queueing it would be blind. */
        int i = is_malformed(c, &h) ? first : first_wanting(ops, done, n, peer, h.tag, 0);
        *progressed = 1;
        if (i >= 0) {
            take_next(c, &ops[i], peer);
            return 0;
        }
        if ((rc = queue_next(c, peer, &h, progressed)) < 0) return rc;
    }
    return 0;
}

int dt_p2p_match(dt_comm *c, dt_p2p *ops, const unsigned char *done, int n, int *progressed)
{
    int rc = c->queue->ncopying ? advance_copies(c, progressed) : 0;
    int waits = 0, any = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!waiting(ops, done, i)) continue;
        dt_unexpected *e = first_queued(c, &ops[i]);
        if (e) {
            rc = take_queued(c, &ops[i], e);
            *progressed = 1;
        } else {
            waits = 1;
            any |= ops[i].peer == DT_P2P_ANY;
        }
    }
    if (rc < 0 || !waits) return rc;
    if (any) {
        int start = c->any_next;
        for (int k = 0; rc == 0 && k < c->size; k++)
            rc = match_link(c, ops, done, n, (start + k) % c->size, progressed);
        return rc;
    }
    for (int i = 0; rc == 0 && i < n; i++)
        if (waiting(ops, done, i)) rc = match_link(c, ops, done, n, ops[i].peer, progressed);
    return rc;
}

int dt_p2p_match_waits_on(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n,
                          int i, int peer)
{
    if (peer == c->rank || !takes_from(&ops[i], peer) || link_busy(c, ops, done, n, peer))
        return 0;
    dt_msg_hdr h;
    dt_link *l = c->links[peer];
    return l->ops->peek(c, l, &h) != 1 || !is_collectives(c, &h);
}

/* ---- what a receive passed over ------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, o;
    int shown, more;
} listing;

static void list_one(listing *w, const char *intro, const char *one)
{
    if (w->o + strlen(intro) + strlen(one) + 24 >= w->len) {
        w->more++;
        return;
    }
    int k = snprintf(w->buf + w->o, w->len - w->o, "%s%s", w->shown ? ", " : intro, one);
    w->o += k > 0 ? (size_t)k : 0;
    w->shown++;
}

void dt_p2p_passed_over(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n, int i,
                        char *buf, size_t len)
{
    const dt_p2p *op = &ops[i];
    int any = op->peer == DT_P2P_ANY;
    char intro[64], one[96];
    listing w = {buf, len, 0, 0, 0};
    buf[0] = '\0';
    if (any)
        snprintf(intro, sizeof intro, "; messages passed over: ");
    else
        snprintf(intro, sizeof intro, "; messages from rank %d passed over: ", op->peer);
    for (const dt_unexpected *e = c->queue->head; e; e = e->next) {
        if (e->taken || !takes_from(op, e->peer)) continue;
        int k = any ? snprintf(one, sizeof one, "rank %d's ", e->peer) : 0;
        snprintf(one + k, sizeof one - (size_t)k, "tagged %d (%llu bytes)", e->hdr.tag,
                 (unsigned long long)e->hdr.bytes);
        list_one(&w, intro, one);
    }
    for (int p = 0; any && p < c->size; p++) {
        dt_msg_hdr h;
        if (p == c->rank || link_busy(c, ops, done, n, p)) continue;
        dt_link *l = c->links[p];
        if (l->ops->peek(c, l, &h) != 1 || !is_collectives(c, &h)) continue;
        snprintf(one, sizeof one, "rank %d's next is a %s's", p,
                 h.coll < DT_COLL_KIND_COUNT ? dt_coll_name(h.coll) : "?");
        list_one(&w, intro, one);
    }
    if (w.more) snprintf(buf + w.o, len - w.o, " and %d more", w.more);
}
