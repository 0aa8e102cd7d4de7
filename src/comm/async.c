#include "comm/async.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/timer.h"

struct dt_request {
    dt_comm *comm;
    dt_coll_args args;
    int status;
    _Atomic unsigned done; /* set last, after status and the times */
    uint64_t start_ns, end_ns;
    struct dt_request *next;
};

struct dt_async {
    pthread_mutex_t mu;
    pthread_cond_t work; /* queue gained an op, or the inline runner finished */
    pthread_cond_t idle; /* an op finished */
    dt_request *head, *tail;
    int running;  /* an op executes (on the thread or inline) */
    int p2p_open; /* the running op is a send/recv step that takes more */
    int started, stop;
    _Atomic unsigned submitted; /* requests queued so far: what an idle thread polls */
    pthread_t thread;
};

/* How long a thread that waits for an operation (dt_wait) or for work (the
 * progress thread) polls before it sleeps on its condition: longer than a
 * small operation's round trip, so that handing one over costs no wake-up
 * (on a virtual machine waking a sleeping thread took 50-150 us, three
 * times an 8-byte all-reduce from PyTorch), and short beside a step. The
 * poll yields the core between looks, so a thread with work takes it. On
 * a crowded host (more ranks than cores: comm.c's yield_ns) a waiter
 * sleeps at once: the core is better spent on another rank. */
#define DT_ASYNC_POLL_NS 100000ull

/* Polls until *v differs from seen (1) or the time is up (0). */
static int poll_change(const dt_comm *c, const _Atomic unsigned *v, unsigned seen)
{
    const uint64_t t0 = dt_now_ns();
    do {
        if (atomic_load_explicit(v, memory_order_acquire) != seen) return 1;
        if (c->yield_ns) return 0;
        sched_yield();
    } while (dt_now_ns() - t0 < DT_ASYNC_POLL_NS);
    return 0;
}

struct dt_async *dt_async_create(void)
{
    struct dt_async *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_cond_init(&a->idle, NULL);
    return a;
}

/* A send/recv step in flight on the progress thread. Requests queued while
 * it runs join it when they are send/recv too: run one after another, an
 * isend and an irecv that two ranks both issue in that order would each
 * wait for the other's receive. */
typedef struct {
    dt_comm *c;
    dt_request *reqs[DT_P2P_BATCH];
    dt_coll_args calls[DT_P2P_BATCH];
    int n;
} p2p_step;

static int is_p2p(const dt_request *r) { return r && r->args.kind == DT_COLL_SEND; }

/* Called with a->mu held. */
static void take_p2p(struct dt_async *a, p2p_step *st, dt_p2p *ops)
{
    while (is_p2p(a->head) && st->n < DT_P2P_BATCH) {
        dt_request *r = a->head;
        a->head = r->next;
        if (!a->head) a->tail = NULL;
        st->reqs[st->n] = r;
        st->calls[st->n] = r->args;
        ops[st->n] = dt_p2p_from_call(&st->calls[st->n]);
        st->n++;
    }
}

static int refill_p2p(void *arg, dt_p2p *ops, int n, int cap)
{
    p2p_step *st = arg;
    struct dt_async *a = st->c->async;
    (void)n, (void)cap;
    pthread_mutex_lock(&a->mu);
    take_p2p(a, st, ops);
    a->p2p_open = st->n < DT_P2P_BATCH;
    pthread_mutex_unlock(&a->mu);
    return st->n;
}

static _Atomic uint64_t background_ns;

uint64_t dt_comm_background_ns(void) { return background_ns; }

/* Called with a->mu held; returns with it held. */
static void run_next(dt_comm *c, struct dt_async *a)
{
    dt_request *single[1];
    dt_request **done = single;
    int ndone = 1, status;
    p2p_step st = {.c = c};
    dt_p2p ops[DT_P2P_BATCH];
    uint64_t start = dt_now_ns();
    a->running = 1;
    if (is_p2p(a->head)) {
        take_p2p(a, &st, ops);
        a->p2p_open = 1;
        pthread_mutex_unlock(&a->mu);
        c->cur = st.calls[0];
        status = dt_p2p_run_growing(c, ops, st.n, DT_P2P_BATCH, refill_p2p, &st);
        c->cur.kind = DT_COLL_NONE;
        pthread_mutex_lock(&a->mu);
        a->p2p_open = 0;
        done = st.reqs;
        ndone = st.n;
    } else {
        single[0] = a->head;
        a->head = single[0]->next;
        if (!a->head) a->tail = NULL;
        pthread_mutex_unlock(&a->mu);
        status = dt_coll_execute(c, &single[0]->args);
        pthread_mutex_lock(&a->mu);
    }
    uint64_t end = dt_now_ns();
    background_ns += end - start;
    for (int i = 0; i < ndone; i++) {
        done[i]->status = status;
        done[i]->start_ns = start;
        done[i]->end_ns = end;
        atomic_store_explicit(&done[i]->done, 1, memory_order_release);
    }
    a->running = 0;
}

static void *progress_main(void *arg)
{
    dt_comm *c = arg;
    struct dt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        if (!a->stop && !a->head && !a->running) { /* idle: poll a while, then sleep */
            const unsigned seen = atomic_load(&a->submitted);
            pthread_mutex_unlock(&a->mu);
            poll_change(c, &a->submitted, seen);
            pthread_mutex_lock(&a->mu);
        }
        while (!a->stop && (!a->head || a->running)) pthread_cond_wait(&a->work, &a->mu);
        if (a->stop && !a->head) break;
        run_next(c, a);
        pthread_cond_broadcast(&a->idle);
        pthread_cond_broadcast(&a->work);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int ensure_thread(dt_comm *c)
{
    struct dt_async *a = c->async;
    if (a->started) return 0;
    if (pthread_create(&a->thread, NULL, progress_main, c) != 0)
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "cannot start the progress thread");
    a->started = 1;
    return 0;
}

static int run_inline(dt_comm *c, const dt_coll_args *args)
{
    struct dt_async *a = c->async;
    a->running = 1;
    pthread_mutex_unlock(&a->mu);
    int rc = dt_coll_execute(c, args);
    pthread_mutex_lock(&a->mu);
    a->running = 0;
    pthread_cond_broadcast(&a->work);
    pthread_cond_broadcast(&a->idle);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int dt_async_submit(dt_comm *c, const dt_coll_args *args, dt_request **out)
{
    struct dt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    if (!out && !a->head && !a->running) return run_inline(c, args);

    dt_request *r = calloc(1, sizeof *r);
    int rc = r ? ensure_thread(c) : DT_ERR_NOMEM;
    if (rc < 0) {
        pthread_mutex_unlock(&a->mu);
        free(r);
        return rc;
    }
    r->comm = c;
    r->args = *args;
    if (a->tail)
        a->tail->next = r;
    else
        a->head = r;
    a->tail = r;
    atomic_fetch_add_explicit(&a->submitted, 1, memory_order_release);
    int join = a->p2p_open && is_p2p(r);
    pthread_cond_broadcast(&a->work);
    pthread_mutex_unlock(&a->mu);
    if (join) c->doorbell->wake(c); /* the running step may sleep on its doorbell */
    if (out) {
        *out = r;
        return 0;
    }
    return dt_wait(r);
}

int dt_test_timed(dt_request *r, int *done, uint64_t *start_ns, uint64_t *end_ns)
{
    if (!r || !done) return DT_ERR_INVALID;
    struct dt_async *a = r->comm->async;
    pthread_mutex_lock(&a->mu);
    *done = (int)atomic_load(&r->done);
    pthread_mutex_unlock(&a->mu);
    return *done ? dt_wait_timed(r, start_ns, end_ns) : 0;
}

int dt_test(dt_request *r, int *done) { return dt_test_timed(r, done, NULL, NULL); }

int dt_wait(dt_request *r)
{
    return dt_wait_timed(r, NULL, NULL);
}

int dt_wait_timed(dt_request *r, uint64_t *start_ns, uint64_t *end_ns)
{
    if (!r) return DT_ERR_INVALID;
    struct dt_async *a = r->comm->async;
    if (!poll_change(r->comm, &r->done, 0)) {
        pthread_mutex_lock(&a->mu);
        while (!atomic_load(&r->done)) pthread_cond_wait(&a->idle, &a->mu);
        pthread_mutex_unlock(&a->mu);
    }
    /* Read only after done was seen (acquire): the progress thread writes
     * the status and the times before it sets done (release). */
    if (start_ns) *start_ns = r->start_ns;
    if (end_ns) *end_ns = r->end_ns;
    int status = r->status;
    free(r);
    return status;
}

void dt_async_drain(dt_comm *c)
{
    struct dt_async *a = c ? c->async : NULL;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    while (a->head || a->running) pthread_cond_wait(&a->idle, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

void dt_async_destroy(struct dt_async *a)
{
    if (!a) return;
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->stop = 1;
        pthread_cond_broadcast(&a->work);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
    }
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->idle);
    free(a);
}
