/* The per-part profile's counters (see profile.h). */
#include "kernels/profile.h"

#include <pthread.h>
#include <string.h>

#include "core/timer.h"

atomic_int dt_prof_enabled;

/* Nanoseconds and calls are integers; FLOPs and bytes are kept in units
 * of 1 (fractions never arise: they are counted from shapes). */
static atomic_ullong part_ns[DT_PROF_NKINDS], part_flops[DT_PROF_NKINDS],
    part_bytes[DT_PROF_NKINDS];
static atomic_long part_calls[DT_PROF_NKINDS];

void dt_prof_enable(int on) { atomic_store(&dt_prof_enabled, on); }

uint64_t dt_prof_begin(void)
{
    return atomic_load_explicit(&dt_prof_enabled, memory_order_relaxed) ? dt_now_ns() : 0;
}

uint64_t dt_prof_end(dt_prof_kind k, uint64_t t0, double flops, double bytes)
{
    if (!t0) return 0;
    const uint64_t ns = dt_now_ns() - t0;
    atomic_fetch_add_explicit(&part_ns[k], ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&part_flops[k], (unsigned long long)flops, memory_order_relaxed);
    atomic_fetch_add_explicit(&part_bytes[k], (unsigned long long)bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&part_calls[k], 1, memory_order_relaxed);
    return ns;
}

void dt_prof_take(dt_prof_part out[DT_PROF_NKINDS])
{
    for (int k = 0; k < DT_PROF_NKINDS; k++) {
        out[k].ns = atomic_exchange(&part_ns[k], 0);
        out[k].flops = (double)atomic_exchange(&part_flops[k], 0);
        out[k].bytes = (double)atomic_exchange(&part_bytes[k], 0);
        out[k].calls = atomic_exchange(&part_calls[k], 0);
    }
}

const char *dt_prof_name(dt_prof_kind k)
{
    static const char *const names[DT_PROF_NKINDS] = {
        "matrix products", "attention",  "layer norms", "activations", "cross-entropy",
        "embeddings",      "routing",    "optimizer",   "gradient norm", "bias gradients"};
    return k >= 0 && k < DT_PROF_NKINDS ? names[k] : "?";
}

/* ---- the products by shape ---------------------------------------------- */

/* A few dozen shapes a step, each call milliseconds: a lock costs nothing
 * beside them, and only while the profile is on. */
static pthread_mutex_t shapes_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_prof_shape shapes[DT_PROF_SHAPES];
static int nshapes;

static int same_shape(const dt_prof_shape *a, const dt_prof_shape *b)
{
    return a->M == b->M && a->N == b->N && a->K == b->K && a->transA == b->transA &&
           a->transB == b->transB && strcmp(a->path, b->path) == 0;
}

void dt_prof_shapes_add(dt_prof_shape *table, int *n, const dt_prof_shape *key, uint64_t ns,
                        double flops, long calls)
{
    int i = 0;
    while (i < *n && !same_shape(&table[i], key)) i++;
    if (i == *n && *n < DT_PROF_SHAPES) {
        table[(*n)++] = (dt_prof_shape){key->M, key->N, key->K, key->transA, key->transB,
                                        key->path, 0, 0, 0};
    } else if (i == *n) { /* full: the last entry becomes, and stays, the others' */
        i = DT_PROF_SHAPES - 1;
        table[i].M = table[i].N = table[i].K = 0;
        table[i].path = "other shapes";
    }
    table[i].ns += ns;
    table[i].flops += flops;
    table[i].calls += calls;
}

void dt_prof_shape_add(const dt_prof_shape *key, uint64_t t0, uint64_t ns, double flops)
{
    if (!t0) return;
    pthread_mutex_lock(&shapes_lock);
    dt_prof_shapes_add(shapes, &nshapes, key, ns, flops, 1);
    pthread_mutex_unlock(&shapes_lock);
}

int dt_prof_take_shapes(dt_prof_shape out[DT_PROF_SHAPES])
{
    pthread_mutex_lock(&shapes_lock);
    const int n = nshapes;
    memcpy(out, shapes, (size_t)n * sizeof *out);
    nshapes = 0;
    pthread_mutex_unlock(&shapes_lock);
    return n;
}
