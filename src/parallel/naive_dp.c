/* Naive data parallelism: devices as threads, one main device. See naive_dp.h. */
#include "parallel/naive_dp.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "core/timer.h"
#include "parallel/registry.h"

typedef struct {
    dt_naive_dp *d;
    int dev;
} device_arg;

static dt_gpt *device_model(dt_naive_dp *d, int dev)
{
    return dev == 0 ? d->main : &d->replicas[dev - 1];
}

static size_t batch_ints(const dt_naive_dp *d) { return (size_t)d->B * (size_t)d->T; }

int32_t *dt_naive_dp_inputs(dt_naive_dp *d, int dev, int j)
{
    return d->tokens + ((size_t)dev * d->accum + (size_t)j) * 2 * batch_ints(d);
}

int32_t *dt_naive_dp_targets(dt_naive_dp *d, int dev, int j)
{
    return dt_naive_dp_inputs(d, dev, j) + batch_ints(d);
}

/* A device's share of a step: forward and backward over its micro-batches,
 * accumulating into its own gradients. */
static void run_device(dt_naive_dp *d, int dev)
{
    dt_gpt *m = device_model(d, dev);
    double sum = 0;
    d->failed[dev] = 0;
    dt_gpt_zero_grads(m);
    for (int j = 0; j < d->accum; j++) {
        const int32_t *in = dt_naive_dp_inputs(d, dev, j);
        double loss = dt_gpt_forward(m, in, dt_naive_dp_targets(d, dev, j), d->B, d->T);
        if (loss < 0 || dt_gpt_backward(m, in, d->B, d->T, d->grad_scale)) {
            d->failed[dev] = 1;
            return;
        }
        sum += loss;
    }
    d->loss[dev] = sum;
}

static void *device_main(void *arg)
{
    device_arg *a = arg;
    dt_naive_dp *d = a->d;
    long seen = 0;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && d->generation == seen) pthread_cond_wait(&d->go, &d->mu);
        if (d->stop) break;
        seen = d->generation;
        pthread_mutex_unlock(&d->mu);
        run_device(d, a->dev);
        pthread_mutex_lock(&d->mu);
        if (--d->pending == 0) pthread_cond_signal(&d->done);
    }
    pthread_mutex_unlock(&d->mu);
    free(a);
    return NULL;
}

static void stop_threads(dt_naive_dp *d)
{
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < d->nthreads; i++) pthread_join(d->threads[i], NULL);
    d->nthreads = 0;
}

static int create_replicas(dt_naive_dp *d, char *err, size_t errlen)
{
    for (int i = 0; i < d->ndev - 1; i++) {
        dt_gpt *r = &d->replicas[i];
        if (dt_gpt_create(r, &d->main->cfg, d->main->prec, err, errlen)) return -1;
        r->acts.recompute = d->main->acts.recompute; /* each device keeps what the main one does */
        if (dt_gpt_alloc_grads(r) || dt_gpt_alloc_acts(r, d->B, d->T)) {
            dt_strf(err, errlen, "device %d: %s", i + 1, r->error);
            return -1;
        }
    }
    return 0;
}

static int start_threads(dt_naive_dp *d, char *err, size_t errlen)
{
    for (int dev = 1; dev < d->ndev; dev++) {
        device_arg *a = malloc(sizeof *a);
        if (a) *a = (device_arg){d, dev};
        if (!a || pthread_create(&d->threads[dev - 1], NULL, device_main, a) != 0) {
            free(a);
            dt_strf(err, errlen, "cannot start the thread of device %d", dev);
            return -1;
        }
        d->nthreads++;
    }
    return 0;
}

int dt_naive_dp_init(dt_naive_dp *d, dt_gpt *main, int ndev, int B, int T, int accum,
                     char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->ndev = ndev;
    d->main = main;
    d->B = B, d->T = T, d->accum = accum;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->go, NULL);
    pthread_cond_init(&d->done, NULL);
    d->replicas = calloc((size_t)ndev, sizeof *d->replicas);
    d->threads = calloc((size_t)ndev, sizeof *d->threads);
    d->tokens = malloc((size_t)ndev * accum * 2 * batch_ints(d) * sizeof(int32_t));
    d->loss = calloc((size_t)ndev, sizeof *d->loss);
    d->failed = calloc((size_t)ndev, sizeof *d->failed);
    if (!d->replicas || !d->threads || !d->tokens || !d->loss || !d->failed) {
        dt_strf(err, errlen, "naive data parallelism: out of memory for %d devices", ndev);
        dt_naive_dp_free(d);
        return -1;
    }
    if (create_replicas(d, err, errlen) || start_threads(d, err, errlen)) {
        dt_naive_dp_free(d);
        return -1;
    }
    return 0;
}

void dt_naive_dp_free(dt_naive_dp *d)
{
    if (d->ndev == 0) return; /* never set up */
    if (d->nthreads) stop_threads(d);
    if (d->replicas)
        for (int i = 0; i < d->ndev - 1; i++) dt_gpt_destroy(&d->replicas[i]);
    free(d->replicas);
    free(d->threads);
    free(d->tokens);
    free(d->loss);
    free(d->failed);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->go);
    pthread_cond_destroy(&d->done);
    memset(d, 0, sizeof *d);
}

/* The main device's parameters to every replica (DataParallel's replicate). */
static void replicate(dt_naive_dp *d)
{
    size_t bytes = d->main->n_floats * sizeof(float);
    for (int i = 0; i < d->ndev - 1; i++) memcpy(d->replicas[i].params, d->main->params, bytes);
    d->bytes_moved += (uint64_t)bytes * (uint64_t)(d->ndev - 1);
}

/* Every replica's gradients summed into the main device's, in device order. */
static void gather_grads(dt_naive_dp *d)
{
    float *g = d->main->grads;
    size_t n = d->main->n_floats;
    for (int i = 0; i < d->ndev - 1; i++) {
        const float *r = d->replicas[i].grads;
        for (size_t k = 0; k < n; k++) g[k] += r[k];
    }
    d->bytes_moved += (uint64_t)n * sizeof(float) * (uint64_t)(d->ndev - 1);
}

int dt_naive_dp_step(dt_naive_dp *d, float grad_scale, double *loss, char *err, size_t errlen)
{
    uint64_t t0 = dt_now_ns();
    d->bytes_moved = 0;
    replicate(d);
    uint64_t copy_ns = dt_now_ns() - t0;
    d->grad_scale = grad_scale;
    pthread_mutex_lock(&d->mu);
    d->pending = d->ndev - 1;
    d->generation++;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    run_device(d, 0); /* the main device computes too */
    pthread_mutex_lock(&d->mu);
    while (d->pending > 0) pthread_cond_wait(&d->done, &d->mu);
    pthread_mutex_unlock(&d->mu);
    for (int dev = 0; dev < d->ndev; dev++) {
        if (d->failed[dev]) {
            dt_strf(err, errlen, "device %d: %s", dev, device_model(d, dev)->error);
            return -1;
        }
    }
    uint64_t t1 = dt_now_ns();
    gather_grads(d);
    copy_ns += dt_now_ns() - t1;
    d->copy_ms = (double)copy_ns * 1e-6;
    double sum = 0;
    for (int dev = 0; dev < d->ndev; dev++) sum += d->loss[dev];
    *loss = sum / ((double)d->ndev * d->accum);
    return 0;
}

/* ---- naive data parallelism as a strategy layer ---------------------------- */

typedef struct {
    dt_naive_dp d;
    dt_strategy *S;
    int ndev;
} ndp_layer;

static int ndp_start(void *self, dt_rank *r)
{
    ndp_layer *L = self;
    return dt_naive_dp_init(&L->d, r->model, L->ndev, r->B, r->T, r->accum, r->err,
                            sizeof r->err);
}

/* The main device hands each device the block of the batch a rank would
 * take, then all of them run. The scale makes the gathered sum the mean
 * over the global batch. */
static int ndp_grads(void *self, uint64_t first, double *loss)
{
    ndp_layer *L = self;
    dt_rank *r = L->S->rank;
    dt_naive_dp *d = &L->d;
    for (int dev = 0; dev < d->ndev; dev++) {
        uint64_t mine = first + (uint64_t)dev * (uint64_t)r->B * (uint64_t)r->accum;
        for (int j = 0; j < r->accum; j++)
            if (r->batch(r->batch_ctx, mine + (uint64_t)j * (uint64_t)r->B, r->B,
                         dt_naive_dp_inputs(d, dev, j), dt_naive_dp_targets(d, dev, j), r->err,
                         sizeof r->err))
                return -1;
    }
    return dt_naive_dp_step(d, dt_strategy_grad_scale(L->S, r->B, r->T, r->accum), loss, r->err,
                            sizeof r->err);
}

static void ndp_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    ndp_layer *L = self;
    *comm_ms = L->d.copy_ms;
    *bytes = L->d.bytes_moved;
}

static void ndp_describe(void *self, FILE *f)
{
    fprintf(f, " x %d devices (naive data parallelism: threads, device 0 is the main one)",
            ((ndp_layer *)self)->ndev);
}

static void ndp_destroy(void *self)
{
    ndp_layer *L = self;
    dt_naive_dp_free(&L->d);
    free(L);
}

static const dt_strategy_ops ndp_ops = {
    .name = "dp",
    .start = ndp_start,
    .grads = ndp_grads,
    .traffic = ndp_traffic,
    .describe = ndp_describe,
    .destroy = ndp_destroy,
};

/* The devices split each batch in one process: threads share its cores. */
int dt_naive_dp_strategy(dt_strategy *S, int devices)
{
    ndp_layer *L = calloc(1, sizeof *L);
    if (!L) return dt_strf(S->rank->err, sizeof S->rank->err, "dp: out of memory"), -1;
    L->S = S;
    L->ndev = devices;
    S->dp_index = 0;
    S->dp_size = devices;
    S->grad_ranks *= devices; /* the main device sums the devices' gradients */
    S->compute_streams = devices;
    return dt_strategy_add(S, &ndp_ops, L);
}
