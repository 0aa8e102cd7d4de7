/*
 * The event loop (engine.h). Time moves from event to event; between
 * two instants the network settles the bandwidth shares of the links that
 * changed (net.h), once, however many messages started or ended at the
 * instant. Work that follows at once from an event (a stream's next
 * operations, the sends they match) runs inside its handler; anything
 * later goes through the heap.
 */
#include "sim/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/heap.h"
#include "sim/match.h"
#include "sim/net.h"

enum { EV_WAKE, EV_START, EV_END, EV_REDUCED }; /* id: stream, transfer, flow, post */
enum { S_READY, S_COMPUTE, S_LOCAL, S_OPS, S_SIGNAL, S_DONE };

typedef struct {
    const dt_sim_prog *prog;
    int pc, state, wait_on, pending;
    int coll; /* the collective under way, -1 none */
    int cls;  /* its class, or the receive's */
    const dt_sim_sched *sched; /* the collective's recording for this rank */
    const int *members;        /* its group's ranks by member index; NULL: the world */
    dt_sim_cursor cur;
    const char *label;
    double t_begin, reduce_free;
} stream;

/* A collective the programs run: over the world, or over groups. */
typedef struct {
    const dt_sim_sched *world;
    const dt_sim_group_coll *groups;
} coll_entry;

typedef struct {
    int stream; /* index of the waiting stream; -1 for a nonblocking send */
    int rank, peer, kind, next_free;
    double bytes;
} post;

typedef struct {
    int send, recv, src, dst, next_free;
    double bytes;
} xfer;

typedef struct {
    int ncompute, ncomm, streams_left;
    int ncls[DT_SIM_CLASSES];
    double last;
    dt_sim_rank_stats st;
} rank_state;

struct dt_sim_engine {
    const dt_sim_world *w;
    dt_sim_net net;
    dt_sim_heap heap;
    dt_sim_match match;
    int S, nevents;
    stream *st;           /* [ranks * S] */
    unsigned char *fired; /* [ranks * nevents] */
    rank_state *rk;       /* [ranks] */
    coll_entry *coll;
    int ncoll, coll_alloc;
    post *post;
    int npost, post_alloc, free_post;
    xfer *xf;
    int nxf, xf_alloc, free_xf;
    dt_sim_span_fn span;
    void *span_ctx;
    double now, makespan;
    long long events, messages;
    double played, work; /* for progress: operations begun and recorded bytes read, of all */
    int oom;
};

/* ---- small helpers ------------------------------------------------------- */

static void push(dt_sim_engine *e, double t, int type, int id, uint32_t version)
{
    if (dt_sim_heap_push(&e->heap, dt_sim_event_make(t, type, id, version))) e->oom = 1;
}

static void on_flow(void *ctx, int flow, double t_end, uint32_t version)
{
    push(ctx, t_end, EV_END, flow, version);
}

/* A slot of a pool of `size`-byte items with a free list threaded through
 * the int at offset `link`: its index, or -1 out of memory. */
static int pool_take(void **items, int *n, int *alloc, int *free_head, size_t size, size_t link)
{
    if (*free_head >= 0) {
        int i = *free_head;
        memcpy(free_head, (char *)*items + (size_t)i * size + link, sizeof(int));
        return i;
    }
    if (*n == *alloc) {
        int a = *alloc ? 2 * *alloc : 1024;
        void *p = realloc(*items, (size_t)a * size);
        if (!p) return -1;
        *items = p;
        *alloc = a;
    }
    return (*n)++;
}

static void pool_give(void *items, int *free_head, int i, size_t size, size_t link)
{
    memcpy((char *)items + (size_t)i * size + link, free_head, sizeof(int));
    *free_head = i;
}

#define TAKE(e, arr, n, alloc, fr, T) \
    pool_take((void **)&(e)->arr, &(e)->n, &(e)->alloc, &(e)->fr, sizeof(T), offsetof(T, next_free))
#define GIVE(e, arr, fr, i, T) pool_give((e)->arr, &(e)->fr, (i), sizeof(T), offsetof(T, next_free))

/* ---- accounting ------------------------------------------------------------ */

/* Time since the last change goes to compute, exposed communication
 * (split among the classes under way) or idle; then the counts change:
 * dcomm communications of class cls. */
static void account(dt_sim_engine *e, int rank, int dcompute, int dcomm, int cls)
{
    rank_state *r = &e->rk[rank];
    double dt = e->now - r->last;
    if (r->ncompute) {
        r->st.compute += dt;
    } else if (r->ncomm) {
        r->st.exposed += dt;
        int active = 0;
        for (int k = 0; k < DT_SIM_CLASSES; k++) active += r->ncls[k] > 0;
        for (int k = 0; k < DT_SIM_CLASSES; k++)
            if (r->ncls[k] > 0) r->st.exposed_cls[k] += dt / active;
    } else {
        r->st.idle += dt;
    }
    r->last = e->now;
    r->ncompute += dcompute;
    r->ncomm += dcomm;
    r->ncls[cls] += dcomm;
}

static void emit(dt_sim_engine *e, int si, dt_trace_lane lane, const char *name, double bytes)
{
    if (e->span) e->span(e->span_ctx, si / e->S, lane, name, e->st[si].t_begin, e->now, bytes);
}

/* ---- messages ----------------------------------------------------------------- */

static void begin_xfer(dt_sim_engine *e, int sp, int rp)
{
    int x = TAKE(e, xf, nxf, xf_alloc, free_xf, xfer);
    if (x < 0) {
        e->oom = 1;
        return;
    }
    const post *s = &e->post[sp];
    e->xf[x] = (xfer){sp, rp, s->rank, s->peer, -1, s->bytes};
    e->messages++;
    int rs = e->post[rp].stream;
    if (rs >= 0 && e->st[rs].coll < 0) { /* a program's receive: the wait is over */
        e->st[rs].t_begin = e->now;
        account(e, rs / e->S, 0, 1, e->st[rs].cls);
    }
    push(e, e->now + dt_sim_world_cost(e->w, s->rank, s->peer)->alpha, EV_START, x, 0);
}

/* Posts one side of a message under `space` (a collective's id * 2, or a
 * channel's * 2 + 1) for stream si (-1: nobody waits for it). */
static void post_op(dt_sim_engine *e, int si, int rank, int peer, int kind, double bytes,
                    int space)
{
    int p = TAKE(e, post, npost, post_alloc, free_post, post);
    if (p < 0) {
        e->oom = 1;
        return;
    }
    e->post[p] = (post){si, rank, peer, kind, -1, bytes};
    int send = kind == DT_P2P_SEND;
    uint64_t key = dt_sim_match_key(space, send ? rank : peer, send ? peer : rank);
    int other = dt_sim_match_pair(&e->match, key, !send, p);
    if (other == -2) e->oom = 1;
    if (other >= 0) begin_xfer(e, send ? p : other, send ? other : p);
}

static void advance(dt_sim_engine *e, int si);

/* One of stream si's posts is done: the stream goes on once all are. */
static void post_done(dt_sim_engine *e, int p)
{
    int si = e->post[p].stream;
    GIVE(e, post, free_post, p, post);
    if (si < 0) return;
    stream *s = &e->st[si];
    if (--s->pending > 0) return;
    s->state = S_READY;
    if (s->coll < 0) { /* a RECV of the program */
        emit(e, si, DT_TRACE_COMM, s->label, -1);
        account(e, si / e->S, 0, -1, s->cls);
    }
    advance(e, si);
}

/* The last byte arrived: the sender is done; the receiver too, or after
 * reducing what came (its stream's reductions one at a time). */
static void xfer_done(dt_sim_engine *e, int x)
{
    xfer t = e->xf[x];
    GIVE(e, xf, free_xf, x, xfer);
    int reduce = e->post[t.recv].kind == DT_P2P_RECV_REDUCE;
    int rs = e->post[t.recv].stream;
    post_done(e, t.send);
    if (!reduce) {
        post_done(e, t.recv);
        return;
    }
    stream *s = &e->st[rs];
    double at = s->reduce_free > e->now ? s->reduce_free : e->now;
    s->reduce_free = at + dt_sim_world_cost(e->w, t.dst, t.src)->gamma * t.bytes;
    push(e, s->reduce_free, EV_REDUCED, t.recv, 0);
}

static void start_flow(dt_sim_engine *e, int x)
{
    xfer *t = &e->xf[x];
    if (t->bytes <= 0) {
        xfer_done(e, x);
        return;
    }
    if (dt_sim_net_add(&e->net, t->src, t->dst, t->bytes, e->now, x) < 0) e->oom = 1;
}

/* ---- streams ----------------------------------------------------------------- */

static void fire(dt_sim_engine *e, int rank, int ev)
{
    e->fired[(size_t)rank * (size_t)e->nevents + (size_t)ev] = 1;
    for (int k = 0; k < e->S; k++) {
        int si = rank * e->S + k;
        if (e->st[si].state == S_SIGNAL && e->st[si].wait_on == ev) {
            e->st[si].state = S_READY;
            push(e, e->now, EV_WAKE, si, 0);
        }
    }
}

/* The collective's next entry for stream si: 1 when it has no more. */
static int coll_next(dt_sim_engine *e, int si)
{
    stream *s = &e->st[si];
    const unsigned char *from = s->cur.p;
    dt_sim_entry en;
    if (!dt_sim_cursor_next(&s->cur, &en)) return 1;
    if (en.local) {
        s->state = S_LOCAL;
        push(e, e->now + en.seconds, EV_WAKE, si, 0);
    } else {
        s->state = S_OPS;
        s->pending = en.nops;
        for (int i = 0; i < en.nops; i++) {
            dt_sim_op_rec op;
            dt_sim_cursor_op(&s->cur, &op);
            int peer = s->members ? s->members[op.peer] : op.peer;
            post_op(e, si, si / e->S, peer, op.kind, (double)op.bytes, 2 * s->coll);
        }
    }
    e->played += (double)(s->cur.p - from);
    return 0;
}

static void coll_end(dt_sim_engine *e, int si)
{
    const dt_sim_sched *c = e->st[si].sched;
    emit(e, si, DT_TRACE_COMM, c->label, (double)c->bytes);
    account(e, si / e->S, 0, -1, e->st[si].cls);
    e->st[si].coll = -1;
}

/* Collective id's recording that `rank` plays, as member *member of
 * *members (the group's ranks; NULL: the world's). */
static const dt_sim_sched *rank_sched(const dt_sim_engine *e, int rank, int id, int *member,
                                      const int **members)
{
    const coll_entry *c = &e->coll[id];
    if (c->world) {
        *member = rank;
        *members = NULL;
        return c->world;
    }
    const dt_sim_groups *g = c->groups->g;
    int pos = g->pos[rank], grp = pos / g->n;
    *member = pos - grp * g->n;
    *members = g->members + (size_t)grp * (size_t)g->n;
    return &c->groups->by_shape[g->shape[grp]];
}

/* Stream si of `rank` enters collective id. */
static void coll_begin(dt_sim_engine *e, int si, int rank, int id)
{
    stream *s = &e->st[si];
    int member;
    s->coll = id;
    s->sched = rank_sched(e, rank, id, &member, &s->members);
    s->cur = dt_sim_cursor_at(s->sched, member);
}

static void stream_end(dt_sim_engine *e, int si)
{
    int rank = si / e->S;
    e->st[si].state = S_DONE;
    if (--e->rk[rank].streams_left == 0) {
        account(e, rank, 0, 0, 0);
        e->rk[rank].st.finish = e->now;
        if (e->now > e->makespan) e->makespan = e->now;
    }
}

/* Starts op, which stream si has just reached: 1 to go on to the next at
 * once, 0 when the stream now waits. */
static int start_op(dt_sim_engine *e, int si, const dt_sim_op *op)
{
    stream *s = &e->st[si];
    int rank = si / e->S;
    e->played++;
    switch (op->kind) {
    case DT_SIM_COMPUTE:
        s->state = S_COMPUTE;
        s->label = op->label;
        s->t_begin = e->now;
        account(e, rank, 1, 0, 0);
        if (!e->net.cpu_base) {
            push(e, e->now + op->amount, EV_WAKE, si, 0);
        } else if (op->amount <= 0) {
            push(e, e->now, EV_WAKE, si, 0);
        } else if (dt_sim_net_add_work(&e->net, rank, op->amount, e->now, si) < 0) {
            e->oom = 1;
        }
        return 0;
    case DT_SIM_COLL:
        coll_begin(e, si, rank, op->arg);
        s->cls = op->cls;
        s->t_begin = e->now;
        account(e, rank, 0, 1, s->cls);
        return 1;
    case DT_SIM_SEND:
        post_op(e, -1, rank, rank + op->arg, DT_P2P_SEND, op->amount, 2 * op->chan + 1);
        return 1;
    case DT_SIM_RECV:
        s->state = S_OPS;
        s->pending = 1;
        s->label = op->label;
        s->cls = op->cls;
        s->t_begin = e->now; /* accounted from when the message starts (begin_xfer) */
        post_op(e, si, rank, rank + op->arg, DT_P2P_RECV, op->amount, 2 * op->chan + 1);
        return 0;
    case DT_SIM_SIGNAL:
        fire(e, rank, op->arg);
        return 1;
    default: /* DT_SIM_WAIT */
        if (e->fired[(size_t)rank * (size_t)e->nevents + (size_t)op->arg]) return 1;
        s->state = S_SIGNAL;
        s->wait_on = op->arg;
        return 0;
    }
}

/* Runs stream si from where it stands until it must wait. */
static void advance(dt_sim_engine *e, int si)
{
    stream *s = &e->st[si];
    while (s->state == S_READY && !e->oom) {
        if (s->coll >= 0) {
            if (!coll_next(e, si)) return;
            coll_end(e, si);
            continue;
        }
        if (!s->prog || s->pc >= s->prog->n) {
            stream_end(e, si);
            return;
        }
        if (!start_op(e, si, &s->prog->op[s->pc++])) return;
    }
}

/* A stream's timer (compute, local work) ran out, or its event fired. */
static void wake(dt_sim_engine *e, int si)
{
    stream *s = &e->st[si];
    if (s->state == S_COMPUTE) {
        emit(e, si, DT_TRACE_COMPUTE, s->label, -1);
        account(e, si / e->S, -1, 0, 0);
    }
    s->state = S_READY;
    advance(e, si);
}

/* ---- the loop ------------------------------------------------------------------ */

static void handle(dt_sim_engine *e, const dt_sim_event *ev)
{
    switch (dt_sim_event_type(ev)) {
    case EV_WAKE:
        wake(e, ev->id);
        break;
    case EV_START:
        start_flow(e, ev->id);
        break;
    case EV_END:
        if (!dt_sim_net_current(&e->net, ev->id, dt_sim_event_version(ev)))
            break; /* its rate changed since */
        int x = e->net.flow[ev->id].owner, work = e->net.flow[ev->id].work;
        dt_sim_net_remove(&e->net, ev->id);
        if (work) wake(e, x); /* a stream's shared compute ran out */
        else xfer_done(e, x);
        break;
    default: /* EV_REDUCED */
        post_done(e, ev->id);
    }
}

/* A rank that never finished, and what it waits on. */
static void describe_stuck(const dt_sim_engine *e, char *err, size_t len)
{
    for (int si = 0; si < e->w->ranks * e->S; si++) {
        const stream *s = &e->st[si];
        if (s->state == S_DONE) continue;
        int rank = si / e->S, k = si % e->S;
        if (s->coll >= 0)
            snprintf(err, len, "deadlock: rank %d stream %d is stuck in %s at operation %d "
                     "(a peer never posted the matching step)", rank, k, s->sched->label,
                     s->pc - 1);
        else if (s->state == S_SIGNAL)
            snprintf(err, len, "deadlock: rank %d stream %d waits at operation %d for event %d, "
                     "which no stream of the rank signals", rank, k, s->pc - 1, s->wait_on);
        else
            snprintf(err, len, "deadlock: rank %d stream %d waits at operation %d for a message "
                     "its peer never sends", rank, k, s->pc - 1);
        return;
    }
}

/* The run's work, for progress: every operation of every stream, and
 * every byte of the recordings its collectives read. */
static double work(const dt_sim_engine *e)
{
    double n = 0;
    for (int si = 0; si < e->w->ranks * e->S; si++) {
        const dt_sim_prog *p = e->st[si].prog;
        for (int i = 0; p && i < p->n; i++) {
            n++;
            if (p->op[i].kind != DT_SIM_COLL) continue;
            int m;
            const int *members;
            const dt_sim_sched *s = rank_sched(e, si / e->S, p->op[i].arg, &m, &members);
            n += (double)(s->start[m + 1] - s->start[m]);
        }
    }
    return n;
}

#define TELL_EVERY 65536 /* events between reports of progress */

int dt_sim_engine_run(dt_sim_engine *e, char *err, size_t len)
{
    static const char what[] = "running the simulation";
    e->now = 0;
    e->played = 0;
    e->work = e->w->progress.fn ? work(e) : 0;
    dt_sim_tell(e->w, what, 0, e->work);
    for (int si = 0; si < e->w->ranks * e->S; si++) advance(e, si);
    dt_sim_event ev;
    for (;;) {
        const dt_sim_event *top = dt_sim_heap_top(&e->heap);
        if (dt_sim_net_unsettled(&e->net) && (!top || top->t > e->now)) {
            dt_sim_net_settle(&e->net, e->now);
            continue;
        }
        if (e->oom || !dt_sim_heap_pop(&e->heap, &ev)) break;
        e->now = ev.t;
        if (++e->events % TELL_EVERY == 0) dt_sim_tell(e->w, what, e->played, e->work);
        handle(e, &ev);
    }
    if (e->oom) {
        snprintf(err, len, "out of memory simulating %d ranks", e->w->ranks);
        return -1;
    }
    for (int r = 0; r < e->w->ranks; r++) {
        if (e->rk[r].streams_left) {
            describe_stuck(e, err, len);
            return -1;
        }
        e->rk[r].st.idle += e->makespan - e->rk[r].st.finish;
    }
    dt_sim_tell(e->w, what, e->played, e->work);
    return 0;
}

/* ---- setup ------------------------------------------------------------------------ */

dt_sim_engine *dt_sim_engine_new(const dt_sim_world *w, int nics, int streams, int events,
                                 char *err, size_t len)
{
    dt_sim_engine *e = calloc(1, sizeof *e);
    if (!e) return snprintf(err, len, "out of memory"), NULL;
    e->w = w;
    e->S = streams;
    e->nevents = events > 0 ? events : 1;
    e->free_post = e->free_xf = -1;
    size_t ns = (size_t)w->ranks * (size_t)streams;
    e->st = calloc(ns, sizeof *e->st);
    e->fired = calloc((size_t)w->ranks * (size_t)e->nevents, 1);
    e->rk = calloc((size_t)w->ranks, sizeof *e->rk);
    if (!e->st || !e->fired || !e->rk) {
        dt_sim_engine_free(e);
        return snprintf(err, len, "out of memory for %d ranks", w->ranks), NULL;
    }
    if (dt_sim_net_init(&e->net, w, nics, on_flow, e, err, len)) {
        dt_sim_engine_free(e);
        return NULL;
    }
    for (size_t i = 0; i < ns; i++) e->st[i].coll = -1;
    for (int r = 0; r < w->ranks; r++) e->rk[r].streams_left = streams;
    return e;
}

void dt_sim_engine_free(dt_sim_engine *e)
{
    if (!e) return;
    dt_sim_net_free(&e->net);
    dt_sim_heap_free(&e->heap);
    dt_sim_match_free(&e->match);
    free(e->st);
    free(e->fired);
    free(e->rk);
    free(e->coll);
    free(e->post);
    free(e->xf);
    free(e);
}

static int add_entry(dt_sim_engine *e, coll_entry entry)
{
    if (e->ncoll >= (1 << 22)) return -1;
    if (e->ncoll == e->coll_alloc) {
        int a = e->coll_alloc ? 2 * e->coll_alloc : 16;
        coll_entry *c = realloc(e->coll, (size_t)a * sizeof *c);
        if (!c) return -1;
        e->coll = c;
        e->coll_alloc = a;
    }
    e->coll[e->ncoll] = entry;
    return e->ncoll++;
}

int dt_sim_engine_add_coll(dt_sim_engine *e, const dt_sim_sched *s)
{
    if (s->size != e->w->ranks) return -1;
    return add_entry(e, (coll_entry){s, NULL});
}

int dt_sim_engine_add_group_coll(dt_sim_engine *e, const dt_sim_group_coll *c)
{
    if (c->g->n * c->g->ngroups != e->w->ranks) return -1;
    for (int k = 0; k < c->g->nshapes; k++)
        if (c->by_shape[k].size != c->g->n) return -1;
    return add_entry(e, (coll_entry){NULL, c});
}

void dt_sim_engine_program(dt_sim_engine *e, int rank, int k, const dt_sim_prog *p)
{
    e->st[rank * e->S + k].prog = p;
}

int dt_sim_engine_share_cpu(dt_sim_engine *e, double ranks_worth)
{
    return dt_sim_net_share_cpu(&e->net, ranks_worth);
}

void dt_sim_engine_on_span(dt_sim_engine *e, dt_sim_span_fn fn, void *ctx)
{
    e->span = fn;
    e->span_ctx = ctx;
}

double dt_sim_engine_makespan(const dt_sim_engine *e) { return e->makespan; }

const dt_sim_rank_stats *dt_sim_engine_stats(const dt_sim_engine *e, int rank)
{
    return &e->rk[rank].st;
}

void dt_sim_engine_counts(const dt_sim_engine *e, long long *events, long long *messages,
                          long long *rate_changes)
{
    *events = e->events;
    *messages = e->messages;
    *rate_changes = e->net.rate_changes;
}
