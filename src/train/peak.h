/* The peak FLOP/s that MFU is measured against: the rate of the fastest
 * register-only FMA loop (kernels/peak.h) this CPU runs in the run's
 * precision, timed at start on the run's own threads and cached per CPU.
 *
 * Timing: every thread of the process runs the loop at once, as they will
 * run the matrix products, so what the cores share (SMT siblings' FMA units,
 * the all-core clock) is in the figure. Each thread is timed on its own CPU
 * clock (CLOCK_THREAD_CPUTIME_ID), best of several runs of ~4 ms: time the
 * thread spent descheduled by other processes on a shared machine does not
 * count, so a busy machine cannot make the peak look low (and MFU high).
 *
 * Cache: <cache dir>/peak/<hash of the CPU>.txt (cache dir as for the
 * corpus: $DTRAIN_CACHE, $XDG_CACHE_HOME/dtrain or ~/.cache/dtrain), one
 * line per (loop, thread count), written atomically; a file that does not
 * parse or names another CPU is ignored and rewritten.
 *
 * DTRAIN_PEAK_GFLOPS (per thread) overrides it all. */
#ifndef DT_TRAIN_PEAK_H
#define DT_TRAIN_PEAK_H

#include <stddef.h>

#include "kernels/peak.h"

typedef enum { DT_PEAK_UNKNOWN, DT_PEAK_MEASURED, DT_PEAK_CACHED, DT_PEAK_ENV } dt_peak_source;

typedef struct {
    double per_thread;     /* FLOP/s of one thread while `threads` run at once; 0: unknown */
    int threads;           /* this process's threads it holds for */
    dt_peak_source source;
    dt_peak_loop loop;     /* the loop it comes from (MEASURED, CACHED) */
    int bf16_in_fp32;      /* a bf16 run whose products run as fp32 on this CPU */
    char cpu[192];         /* dt_cpu_identity */
} dt_peak;

/* The peak of one of `threads` threads in fp32 (bf16 = 0) or bf16. For bf16
 * it is the bf16 loop's rate when the matrix products run on a bf16 kernel
 * (dt_matmul_bf16_native) and the CPU has AVX512-BF16, else the fp32 rate:
 * that is the speed bf16 products run at there. Measures what the cache
 * lacks (some tens of ms) and caches it. 0, or -1 when DTRAIN_PEAK_GFLOPS
 * is malformed (message in err). */
int dt_peak_get(int threads, int bf16, dt_peak *p, char *err, size_t errlen);

/* What the trainer calls once at start, on every rank (ranks time their
 * loops at the same moment, as they will run): the peak FLOP/s of `ranks`
 * processes of `threads` threads each, and in desc one line saying what it
 * is, e.g. "MFU against a measured peak of 95.1 GFLOP/s x 2 threads (fp32
 * AVX2 FMA loop on AMD EPYC (family 25 ...); cached)". *peak is 0 when no
 * loop runs on this CPU (desc says to set DTRAIN_PEAK_GFLOPS): show no MFU
 * then. Returns -1 only for a malformed DTRAIN_PEAK_GFLOPS (desc holds the
 * error; stop the run). */
int dt_mfu_peak(int threads, int ranks, int bf16, double *peak, char *desc, size_t desclen);

/* The rates (FLOP/s of one of `threads` threads) of the fp32 and bf16
 * AVX-512 loops, which choose how bf16 products run (kernels/matmul.h),
 * from the cache or measured now and cached: the same figures, so the same
 * choice, for every run on this CPU. Both 0 where rates do not matter. */
void dt_peak_bf16_rates(int threads, double rates[2]);

/* GFLOP/s of one thread running loop l while `threads` threads run it at
 * once (see above); 0 when the CPU cannot run it. */
double dt_peak_measure(dt_peak_loop l, int threads);
/* A rate measured outside a run (`dtrain bench peak`), offered to the
 * cache: it is kept when it beats the cached one, or when there is none.
 * A peak is the best its loop does, so a slower figure (a busy moment)
 * never lowers it, and a faster one corrects a first measurement that a
 * busy moment slowed, which would make every later MFU read high. */
void dt_peak_offer(dt_peak_loop l, int threads, double gflops);

/* ---- the cache (exposed for `dtrain bench peak` and the tests) ---------- */

#define DT_PEAK_CACHE_MAX 64

typedef struct {
    dt_peak_loop loop;
    int threads;
    double gflops; /* per thread */
} dt_peak_entry;

/* <cache dir>/<kind>/<hash of the CPU identity>.txt: a file of figures
 * measured on this CPU (cache dir as for the corpus). */
int dt_cpu_cache_path(const char *kind, const char *cpu, char *path, size_t len, char *err,
                      size_t errlen);
/* The cache file's path for this CPU identity (kind "peak"). */
int dt_peak_cache_path(const char *cpu, char *path, size_t len, char *err, size_t errlen);
/* The entries of the file at path for cpu: their count (0 when there is no
 * file), or -1 when the file does not parse or is another CPU's (why in
 * err); such a file is to be ignored and rewritten. */
int dt_peak_cache_read(const char *path, const char *cpu, dt_peak_entry *e, int max, char *err,
                       size_t errlen);
/* Writes all n entries atomically (the directory is created). */
int dt_peak_cache_write(const char *path, const char *cpu, const dt_peak_entry *e, int n,
                        char *err, size_t errlen);

#endif
