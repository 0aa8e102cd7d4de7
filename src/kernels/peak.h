/* Register-only multiply-add loops that keep a core's FMA units as busy as
 * its ISA allows: the rate no matrix product on that core can beat, and so
 * the peak MFU is measured against (train/peak.h times them and caches the
 * result). Each loop runs on vectors held in registers only, never touching
 * memory, with enough independent accumulators to hide the FMA latency on
 * every x86 core seen (4-6 cycles, 2 pipes).
 *
 * The ISA-specific loops are compiled with function-level target attributes
 * and chosen at run time, so one binary runs on a CPU without them. */
#ifndef DT_KERNELS_PEAK_H
#define DT_KERNELS_PEAK_H

#include <stddef.h>

typedef enum {
    DT_PEAK_F32_AVX2,    /* vfmadd231ps on 8 floats (AVX2 + FMA) */
    DT_PEAK_F32_AVX512,  /* vfmadd231ps on 16 floats (AVX-512F) */
    DT_PEAK_BF16_AVX512, /* vdpbf16ps: 32 bf16 products summed into 16 floats */
    DT_PEAK_BF16_AMX,    /* tdpbf16ps: a 16 x 32 by 32 x 16 bf16 tile product into fp32 */
    DT_PEAK_LOOPS
} dt_peak_loop;

/* 1 when this CPU and OS can run the loop (for AMX this asks the kernel
 * for the tile state, once per process). */
int dt_peak_loop_supported(dt_peak_loop l);
/* A short name for files and options ("f32-avx512"), and one for people
 * ("fp32 AVX-512 FMA loop"). */
const char *dt_peak_loop_id(dt_peak_loop l);
const char *dt_peak_loop_desc(dt_peak_loop l);
/* 1 for a loop whose products are bf16. */
int dt_peak_loop_is_bf16(dt_peak_loop l);
/* FLOPs done by `iters` iterations (a multiply and an add count 2). */
double dt_peak_loop_flops(dt_peak_loop l, long iters);

/* Runs `iters` iterations of a supported loop and returns the sum of its
 * accumulators, so the work cannot be optimized away and a test can check
 * the arithmetic. The accumulators start at 0, 1, ..., A - 1 (the same in
 * every lane). Per iteration each does, in every lane:
 *   fp32:  acc = acc * 0.5 + 1
 *   bf16:  acc = acc + 0.5 * 0.5 + ... (P bf16 products: 2 for vdpbf16ps,
 *          32 for tdpbf16ps; all sums exact)
 * dt_peak_loop_accumulators, dt_peak_loop_lanes and dt_peak_loop_products
 * say A, the lanes (a tile's elements for AMX) and P.
 * Returns 0 for a loop the CPU cannot run (it is not run). */
double dt_peak_loop_run(dt_peak_loop l, long iters);
/* This thread's best rate at loop l, in FLOP/s of its own CPU time (a busy
 * machine slows the wall clock, not this): the best of five runs of about
 * 4 ms, after one that wakes the vector units up. 0 for a loop the CPU
 * cannot run. */
double dt_peak_loop_rate(dt_peak_loop l);
/* The same for n loops timed in turns (a run of each, then again), so a
 * spell of slowness on the machine falls on all of them rather than on the
 * one being timed: rates to compare with each other. */
void dt_peak_loop_rates(const dt_peak_loop *l, int n, double *rates);
int dt_peak_loop_accumulators(dt_peak_loop l);
int dt_peak_loop_lanes(dt_peak_loop l);
int dt_peak_loop_products(dt_peak_loop l);

/* This CPU, as the peak's cache key and description: the brand string,
 * family, model and stepping, and the loops' ISA extensions it has, e.g.
 * "AMD EPYC 9B45, family 26 model 17 stepping 0, avx2 fma avx512f avx512bf16"
 * (and " amx-bf16" where the tiles are usable). */
void dt_cpu_identity(char *buf, size_t len);
/* The brand string alone ("AMD EPYC 9B45"). */
void dt_cpu_brand(char *buf, size_t len);

#endif
