/*
 * Calibrating the cost model (cost_model.h) on the machine at hand.
 *
 * For each kind of link the communicator uses, one pair of ranks plays
 * ping-pong with dt_send/dt_recv at sizes from 8 B to 4 MiB while the
 * others wait at a barrier: alpha is the one-way time of the smallest
 * message, beta the least-squares slope of one-way time against bytes over
 * the larger sizes. The pair is the first one, in rank order, whose link
 * is of that kind (rank 0 and the lowest rank it reaches that way, when
 * rank 0 has such a link); every rank computes the same pair from host_of.
 * Rank 0 then times, alone, a float sum (dt_reduce_elems) and a memcpy over
 * 16 MiB buffers, out of cache: gamma (seconds per byte reduced, the same
 * for every link kind: it is the CPU's, not the link's) and copy. Every
 * figure is the median of several repetitions. Link kinds the
 * communicator does not use keep their alpha and beta.
 *
 * Rank 0's model is broadcast, so every rank holds the same one and auto
 * keeps choosing the same algorithm everywhere; the model version is
 * bumped so that cached choices are made again. The whole takes a few
 * hundred milliseconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "comm/reduce_ops.h"
#include "comm/topo.h"
#include "core/timer.h"

#define REPS 5
#define LOCAL_BYTES (16u << 20)
/* Ping-pong sizes; beta is fitted over those from FIT_FROM on. */
static const size_t sizes[] = {8, 512, 4096, 32768, 131072, 524288, 1u << 20, 4u << 20};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))
#define FIT_FROM 3
#define MAX_BYTES (4u << 20)

/* Keep the compiler from dropping stores it believes nobody reads. */
static void clobber(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


/* The first pair (a < b, in rank order) joined by a link of kind k, or 0. */
static int pair_of_kind(const dt_comm *c, dt_link_kind k, int *a, int *b)
{
    for (int i = 0; i < c->size; i++)
        for (int j = i + 1; j < c->size; j++)
            if (dt_topo_link(c, i, j) == k) {
                *a = i;
                *b = j;
                return 1;
            }
    return 0;
}

/* Round trips per repetition: many for small messages, few for large. */
static int trips_for(size_t bytes)
{
    size_t t = (256u << 10) / bytes;
    return t < 2 ? 2 : t > 40 ? 40 : (int)t;
}

/* Ping-pong between a (which times) and b. On a, oneway[i] gets the median
 * one-way seconds of sizes[i]. */
static int ping_pong(dt_comm *c, int a, int b, char *buf, double *oneway)
{
    int me = c->rank, peer = me == a ? b : a;
    for (int s = 0; s < NSIZES; s++) {
        size_t n = sizes[s];
        int trips = trips_for(n);
        double rep[REPS];
        for (int r = -1; r < REPS; r++) { /* r == -1: a warm-up repetition */
            uint64_t t0 = dt_now_ns();
            for (int i = 0; i < trips; i++) {
                int rc = me == a ? dt_send(c, buf, n, DT_U8, peer) : dt_recv(c, buf, n, DT_U8, peer);
                if (rc == 0)
                    rc = me == a ? dt_recv(c, buf, n, DT_U8, peer) : dt_send(c, buf, n, DT_U8, peer);
                if (rc) return rc;
            }
            if (r >= 0) rep[r] = (double)(dt_now_ns() - t0) * 1e-9 / (2.0 * trips);
        }
        if (me == a) oneway[s] = median(rep, REPS);
    }
    return 0;
}

/* x within [lo, hi]. */
static double clamp(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Seconds per byte within the rates a model file may hold (model.h), so
 * that the file calibration writes always loads. */
static double per_byte(double s)
{
    return clamp(s, 1e-9 / DT_COST_GBPS_MAX, 1e-9 / DT_COST_GBPS_MIN);
}

/* alpha and beta from one-way times: the smallest message's time, and the
 * least-squares slope over the larger sizes (the smallest's time per byte
 * if noise made the slope non-positive). */
static void fit_link(const double *oneway, double *alpha, double *beta)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = 0;
    for (int s = FIT_FROM; s < NSIZES; s++, n++) {
        double x = (double)sizes[s], y = oneway[s];
        sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    double den = n * sxx - sx * sx;
    double slope = den > 0 ? (n * sxy - sx * sy) / den : 0;
    if (!(slope > 0)) slope = oneway[NSIZES - 1] / (double)sizes[NSIZES - 1];
    *alpha = clamp(oneway[0], DT_COST_ALPHA_US_MIN * 1e-6, DT_COST_ALPHA_US_MAX * 1e-6);
    *beta = per_byte(slope);
}

double dt_measure_copy(size_t bytes)
{
    char *src = malloc(bytes), *dst = malloc(bytes);
    double cp[REPS] = {0};
    int ok = src && dst;
    if (ok) {
        memset(src, 1, bytes);
        memset(dst, 0, bytes);
        for (int r = 0; r < REPS; r++) {
            uint64_t t0 = dt_now_ns();
            memcpy(dst, src, bytes);
            clobber(dst);
            cp[r] = (double)(dt_now_ns() - t0) * 1e-9 / (double)bytes;
        }
    }
    free(src), free(dst);
    return ok ? median(cp, REPS) : 0;
}

/* Median seconds per byte of a float sum and of a memcpy over buffers
 * that do not fit in cache. */
static int time_local(double *gamma, double *copy)
{
    size_t n = LOCAL_BYTES / sizeof(float);
    float *x = malloc(LOCAL_BYTES), *y = malloc(LOCAL_BYTES), *z = malloc(LOCAL_BYTES);
    if (!x || !y || !z) {
        free(x), free(y), free(z);
        return DT_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7), y[i] = 1, z[i] = 0;
    double red[REPS];
    dt_reduce_elems(DT_F32, DT_SUM, z, x, y, n); /* warm-up */
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = dt_now_ns();
        dt_reduce_elems(DT_F32, DT_SUM, z, x, y, n);
        clobber(z);
        red[r] = (double)(dt_now_ns() - t0) * 1e-9 / LOCAL_BYTES;
    }
    free(x), free(y), free(z);
    *copy = dt_measure_copy(LOCAL_BYTES);
    if (!(*copy > 0)) return DT_ERR_NOMEM;
    *copy = per_byte(*copy);
    *gamma = per_byte(median(red, REPS));
    return 0;
}

int dt_comm_calibrate(dt_comm *c, const char *save_path)
{
    if (!c) return DT_ERR_INVALID;
    if (atomic_load(&c->failed)) return c->failed_code;
    if (c->size != c->job->size) {
        /* The model is the job's: ranks outside c would keep the old one,
         * and auto would then choose differently on them. */
        pthread_mutex_lock(&c->err_lock);
        snprintf(c->err, sizeof c->err,
                 "dt_comm_calibrate: call it on a communicator of every rank of the job "
                 "(this one has %d of %d): the model is the job's, the same on every rank",
                 c->size, c->job->size);
        pthread_mutex_unlock(&c->err_lock);
        return DT_ERR_INVALID;
    }
    /* Measured link figures: [kind][0] alpha, [1] beta, [2] 1 when measured.
     * Only the timing rank of a pair fills its kind; a sum gathers them. */
    double meas[DT_LINK_KINDS][3] = {{0}}, all[DT_LINK_KINDS][3];
    char *buf = NULL;
    int rc = 0;
    for (int k = 0; k < DT_LINK_KINDS && rc == 0; k++) {
        int a, b;
        if (!pair_of_kind(c, (dt_link_kind)k, &a, &b)) continue;
        if (c->rank == a || c->rank == b) {
            if (!buf && !(buf = calloc(1, MAX_BYTES))) rc = DT_ERR_NOMEM;
            double oneway[NSIZES];
            if (rc == 0) rc = ping_pong(c, a, b, buf, oneway);
            if (rc == 0 && c->rank == a) {
                fit_link(oneway, &meas[k][0], &meas[k][1]);
                meas[k][2] = 1;
            }
        }
        if (rc == 0) rc = dt_barrier(c);
    }
    free(buf);
    if (rc == 0) rc = dt_allreduce(c, meas, all, DT_LINK_KINDS * 3, DT_F64, DT_SUM);
    dt_cost_model m = c->job->model;
    if (rc == 0 && c->rank == 0) {
        double gamma = 0, copy = 0;
        rc = time_local(&gamma, &copy);
        if (rc == DT_ERR_NOMEM)
            rc = dt_comm_fail(c, rc, -1, "dt_comm_calibrate: out of memory for %u-byte buffers",
                              LOCAL_BYTES);
        for (int k = 0; k < DT_LINK_KINDS && rc == 0; k++) {
            if (all[k][2] > 0) {
                m.link[k].alpha = all[k][0];
                m.link[k].beta = all[k][1];
            }
            m.link[k].gamma = gamma;
        }
        m.copy = copy;
        snprintf(m.source, sizeof m.source, "calibrated on %.150s (%d rank%s)",
                 c->job->hostname, c->size, c->size == 1 ? "" : "s");
    }
    if (rc == 0 && c->size > 1) rc = dt_broadcast(c, &m, &m, sizeof m, DT_U8, 0);
    if (rc) return rc;
    c->job->model = m;
    atomic_fetch_add(&c->job->model_version, 1u);
    char err[512];
    if (c->rank == 0 && save_path && dt_cost_model_save(&m, save_path, err, sizeof err) < 0) {
        pthread_mutex_lock(&c->err_lock);
        snprintf(c->err, sizeof c->err, "dt_comm_calibrate: %s", err);
        pthread_mutex_unlock(&c->err_lock);
        return DT_ERR_SYSTEM;
    }
    return 0;
}

void dt_comm_describe_model(const dt_comm *c, char *buf, size_t len)
{
    if (!buf || len == 0) return;
    if (!c) {
        snprintf(buf, len, "(no communicator)");
        return;
    }
    dt_cost_model_describe(&c->job->model, buf, len);
    /* Which of those lines this communicator's links use (the kinds
     * dt_comm_calibrate measures). */
    size_t o = strlen(buf);
    o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "\n  links of this communicator:");
    int any = 0;
    for (int k = 0; k < DT_LINK_KINDS && o < len; k++) {
        int a, b;
        if (!pair_of_kind(c, (dt_link_kind)k, &a, &b)) continue;
        o += (size_t)snprintf(buf + o, len - o, " %s", dt_link_kind_name((dt_link_kind)k));
        any = 1;
    }
    if (!any && o < len) snprintf(buf + o, len - o, " none (one rank)");
}
