#include "comm/async.h"

#include <stdlib.h>

#include "core/log.h"
#include "core/timer.h"

struct dt_request {
    dt_comm *comm;
    dt_coll_args args;
    int status;
    int done;
    uint64_t start_ns, end_ns;
    struct dt_request *next;
};

struct dt_async {
    pthread_mutex_t mu;
    pthread_cond_t work; /* queue gained an op, or the inline runner finished */
    pthread_cond_t idle; /* an op finished */
    dt_request *head, *tail;
    int running; /* an op executes (on the thread or inline) */
    int started, stop;
    pthread_t thread;
};

struct dt_async *dt_async_create(void)
{
    struct dt_async *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_cond_init(&a->idle, NULL);
    return a;
}

static void *progress_main(void *arg)
{
    dt_comm *c = arg;
    struct dt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && (!a->head || a->running)) pthread_cond_wait(&a->work, &a->mu);
        if (a->stop && !a->head) break;
        dt_request *r = a->head;
        a->head = r->next;
        if (!a->head) a->tail = NULL;
        a->running = 1;
        pthread_mutex_unlock(&a->mu);

        r->start_ns = dt_now_ns();
        int status = dt_coll_execute(c, &r->args);
        uint64_t end = dt_now_ns();

        pthread_mutex_lock(&a->mu);
        r->status = status;
        r->end_ns = end;
        r->done = 1;
        a->running = 0;
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
    pthread_cond_broadcast(&a->work);
    pthread_mutex_unlock(&a->mu);
    if (out) {
        *out = r;
        return 0;
    }
    return dt_wait(r);
}

int dt_test(dt_request *r, int *done)
{
    if (!r || !done) return DT_ERR_INVALID;
    struct dt_async *a = r->comm->async;
    pthread_mutex_lock(&a->mu);
    *done = r->done;
    pthread_mutex_unlock(&a->mu);
    return *done ? dt_wait(r) : 0;
}

int dt_wait(dt_request *r)
{
    if (!r) return DT_ERR_INVALID;
    struct dt_async *a = r->comm->async;
    pthread_mutex_lock(&a->mu);
    while (!r->done) pthread_cond_wait(&a->idle, &a->mu);
    pthread_mutex_unlock(&a->mu);
    int status = r->status;
    free(r);
    return status;
}

void dt_request_times(const dt_request *r, uint64_t *start_ns, uint64_t *end_ns)
{
    if (start_ns) *start_ns = r ? r->start_ns : 0;
    if (end_ns) *end_ns = r ? r->end_ns : 0;
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
