/* The per-part profile's counters (see profile.h). */
#include "kernels/profile.h"

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

void dt_prof_end(dt_prof_kind k, uint64_t t0, double flops, double bytes)
{
    if (!t0) return;
    atomic_fetch_add_explicit(&part_ns[k], dt_now_ns() - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(&part_flops[k], (unsigned long long)flops, memory_order_relaxed);
    atomic_fetch_add_explicit(&part_bytes[k], (unsigned long long)bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&part_calls[k], 1, memory_order_relaxed);
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
        "embeddings",      "routing",    "optimizer",   "gradient norm"};
    return k >= 0 && k < DT_PROF_NKINDS ? names[k] : "?";
}
