/* The peak FMA loops and what the CPU is. See peak.h.
 *
 * Accumulators: a chain acc = fma(acc, ...) can issue once per FMA latency,
 * so a core with P pipes of latency Lc needs P * Lc independent chains to
 * stay full: 2 x 4 on Zen 3-5, 2 x 5 on Haswell-era Intel, 2 x 6 for
 * vdpbf16ps on Zen 4. AVX2 has 16 registers (12 chains + 2 operands);
 * AVX-512 has 32 (16 chains).
 *
 * AMX (Sapphire Rapids and later Intel): one tdpbf16ps multiplies a 16 x 32
 * bf16 tile by a 32 x 16 one into a 16 x 16 fp32 tile, 16384 FLOPs, one
 * every 16 cycles on the core's one matrix unit, with a latency of about
 * 50 cycles: 6 accumulator tiles (of the 8) keep it busy. oneDNN runs the
 * bf16 products there when the CPU has it, so it is the bf16 peak. The
 * kernel hands out the tile state only on request (arch_prctl), once per
 * process; oneDNN asks the same. */
#include "kernels/peak.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DT_PEAK_X86 1
#endif

enum { ACC_AVX2 = 12, ACC_AVX512 = 16, ACC_AMX = 6, AMX_LANES = 256 };

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define REP16(X) REP12(X) X(12) X(13) X(14) X(15)

#ifdef DT_PEAK_X86

/* The loops are written in assembly, the whole loop in one statement on
 * named registers, so that no build can slow them down: at -O1 or under a
 * sanitizer the compiler keeps intrinsics' vectors on the stack, and the
 * "peak" came out at a quarter of the real one. Accumulator k lives in
 * register k (ymm0-11 or zmm0-15), the operands in the next ones; the
 * accumulators are loaded from acc[] and stored back into it. */

#define LOAD_Y(k) "vmovups " #k "*32(%[acc]), %%ymm" #k "\n\t"
#define SAVE_Y(k) "vmovups %%ymm" #k ", " #k "*32(%[acc])\n\t"
#define LOAD_Z(k) "vmovups " #k "*64(%[acc]), %%zmm" #k "\n\t"
#define SAVE_Z(k) "vmovups %%zmm" #k ", " #k "*64(%[acc])\n\t"
#define FMA_Y(k) "vfmadd132ps %%ymm12, %%ymm13, %%ymm" #k "\n\t"
#define FMA_Z(k) "vfmadd132ps %%zmm16, %%zmm17, %%zmm" #k "\n\t"
#define DOT_Z(k) "vdpbf16ps %%zmm16, %%zmm16, %%zmm" #k "\n\t"
#define LOOP(body) "1:\n\t" body "dec %[n]\n\tjnz 1b\n\t"
#define CLOBBER_Y                                                                           \
    "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",   \
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13"
#define CLOBBER_Z                                                                           \
    "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",   \
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17"

/* acc[A * lanes]: accumulator k starts at k in every lane. */
static void start_values(float *acc, int accumulators, int lanes)
{
    for (int k = 0; k < accumulators; k++)
        for (int i = 0; i < lanes; i++) acc[k * lanes + i] = (float)k;
}

static double sum_floats(const float *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

__attribute__((target("avx2,fma"), noinline)) static double loop_f32_avx2(long iters)
{
    float acc[ACC_AVX2 * 8];
    const float a = 0.5f, b = 1.0f;
    start_values(acc, ACC_AVX2, 8);
    if (iters > 0)
        __asm__ volatile("vbroadcastss %[a], %%ymm12\n\t"
                         "vbroadcastss %[b], %%ymm13\n\t" REP12(LOAD_Y) LOOP(REP12(FMA_Y))
                             REP12(SAVE_Y) "vzeroupper\n\t"
                         : [n] "+r"(iters)
                         : [acc] "r"(acc), [a] "m"(a), [b] "m"(b)
                         : CLOBBER_Y);
    return sum_floats(acc, ACC_AVX2 * 8);
}

__attribute__((target("avx512f"), noinline)) static double loop_f32_avx512(long iters)
{
    float acc[ACC_AVX512 * 16];
    const float a = 0.5f, b = 1.0f;
    start_values(acc, ACC_AVX512, 16);
    if (iters > 0)
        __asm__ volatile("vbroadcastss %[a], %%zmm16\n\t"
                         "vbroadcastss %[b], %%zmm17\n\t" REP16(LOAD_Z) LOOP(REP16(FMA_Z))
                             REP16(SAVE_Z) "vzeroupper\n\t"
                         : [n] "+r"(iters)
                         : [acc] "r"(acc), [a] "m"(a), [b] "m"(b)
                         : CLOBBER_Z);
    return sum_floats(acc, ACC_AVX512 * 16);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) static double loop_bf16_avx512(long iters)
{
    float acc[ACC_AVX512 * 16];
    const unsigned halves = 0x3F003F00u; /* two bf16 0.5s (the top half of the float 0.5) */
    start_values(acc, ACC_AVX512, 16);
    if (iters > 0)
        __asm__ volatile("vpbroadcastd %[h], %%zmm16\n\t" REP16(LOAD_Z) LOOP(REP16(DOT_Z))
                             REP16(SAVE_Z) "vzeroupper\n\t"
                         : [n] "+r"(iters)
                         : [acc] "r"(acc), [h] "m"(halves)
                         : CLOBBER_Z);
    return sum_floats(acc, ACC_AVX512 * 16);
}

/* AMX: the tile layout (palette 1): accumulators 0-5 are 16 rows of 16
 * floats, tiles 6 and 7 16 rows of 32 bf16 (every row 64 bytes). Every
 * operand element is bf16 0.5, so each tdpbf16ps adds 32 x 0.25 = 8 to every
 * accumulator element. */
#define TILE_LOAD(k) "tileloadd " #k "*1024(%[acc],%[stride],1), %%tmm" #k "\n\t"
#define TILE_SAVE(k) "tilestored %%tmm" #k ", " #k "*1024(%[acc],%[stride],1)\n\t"
#define TILE_DOT(k) "tdpbf16ps %%tmm7, %%tmm6, %%tmm" #k "\n\t"
#define REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)

__attribute__((noinline)) static double loop_bf16_amx(long iters)
{
    /* Each thread's own (the peak runs a loop on every thread at once). */
    float acc[ACC_AMX * AMX_LANES] __attribute__((aligned(64)));
    uint16_t halves[16 * 32] __attribute__((aligned(64)));
    unsigned char cfg[64] __attribute__((aligned(64))) = {0};
    cfg[0] = 1; /* palette 1 */
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64; /* bytes per row (little-endian uint16) */
        cfg[48 + t] = 16;     /* rows */
    }
    for (int i = 0; i < 16 * 32; i++) halves[i] = 0x3F00; /* bf16 0.5 */
    start_values(acc, ACC_AMX, AMX_LANES);
    long stride = 64;
    if (iters > 0)
        __asm__ volatile("ldtilecfg %[cfg]\n\t" REP6(TILE_LOAD)
                         "tileloadd (%[ab],%[stride],1), %%tmm6\n\t"
                         "tileloadd (%[ab],%[stride],1), %%tmm7\n\t" LOOP(REP6(TILE_DOT))
                             REP6(TILE_SAVE) "tilerelease\n\t"
                         : [n] "+r"(iters)
                         : [acc] "r"(acc), [ab] "r"(halves), [stride] "r"(stride), [cfg] "m"(cfg)
                         : "memory", "cc");
    return sum_floats(acc, ACC_AMX * AMX_LANES);
}

/* Whether the CPU has AMX's bf16 tiles and the kernel lets this process
 * use them (Linux 5.16 and later, on request). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int amx_usable;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void probe_amx(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    amx_usable = tile && bf16 && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM,
                                         XFEATURE_XTILEDATA) == 0;
}

int dt_peak_loop_supported(dt_peak_loop l)
{
    __builtin_cpu_init();
    switch (l) {
    case DT_PEAK_F32_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DT_PEAK_F32_AVX512: return __builtin_cpu_supports("avx512f") != 0;
    case DT_PEAK_BF16_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    case DT_PEAK_BF16_AMX: pthread_once(&amx_once, probe_amx); return amx_usable;
    default: return 0;
    }
}

double dt_peak_loop_run(dt_peak_loop l, long iters)
{
    if (!dt_peak_loop_supported(l)) return 0;
    switch (l) {
    case DT_PEAK_F32_AVX2: return loop_f32_avx2(iters);
    case DT_PEAK_F32_AVX512: return loop_f32_avx512(iters);
    case DT_PEAK_BF16_AVX512: return loop_bf16_avx512(iters);
    case DT_PEAK_BF16_AMX: return loop_bf16_amx(iters);
    default: return 0;
    }
}

void dt_cpu_brand(char *buf, size_t len)
{
    unsigned r[12] = {0};
    unsigned max_ext = __get_cpuid_max(0x80000000u, NULL);
    if (len == 0) return;
    if (max_ext < 0x80000004u) {
        snprintf(buf, len, "unknown x86 CPU");
        return;
    }
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    char brand[49];
    memcpy(brand, r, 48);
    brand[48] = 0;
    /* Vendors pad the string with spaces on either side. */
    char *s = brand;
    while (*s == ' ') s++;
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == ' ') s[--n] = 0;
    snprintf(buf, len, "%s", *s ? s : "unknown x86 CPU");
}

void dt_cpu_identity(char *buf, size_t len)
{
    char brand[64];
    unsigned a = 0, b, c, d;
    dt_cpu_brand(brand, sizeof brand);
    __get_cpuid(1, &a, &b, &c, &d);
    unsigned family = (a >> 8) & 0xf, model = (a >> 4) & 0xf, stepping = a & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    if (family == 0x6 || family >= 0xf) model += ((a >> 16) & 0xf) << 4;
    __builtin_cpu_init();
    snprintf(buf, len, "%s, family %u model %u stepping %u,%s%s%s%s%s", brand, family, model,
             stepping, __builtin_cpu_supports("avx2") ? " avx2" : "",
             __builtin_cpu_supports("fma") ? " fma" : "",
             __builtin_cpu_supports("avx512f") ? " avx512f" : "",
             __builtin_cpu_supports("avx512bf16") ? " avx512bf16" : "",
             dt_peak_loop_supported(DT_PEAK_BF16_AMX) ? " amx-bf16" : "");
}

#else /* not x86-64: no loop, so MFU needs DTRAIN_PEAK_GFLOPS */

int dt_peak_loop_supported(dt_peak_loop l)
{
    (void)l;
    return 0;
}

double dt_peak_loop_run(dt_peak_loop l, long iters)
{
    (void)l, (void)iters;
    return 0;
}

void dt_cpu_brand(char *buf, size_t len) { snprintf(buf, len, "unknown CPU"); }
void dt_cpu_identity(char *buf, size_t len) { snprintf(buf, len, "unknown CPU, not x86-64"); }

#endif

static const struct {
    const char *id, *desc;
    int bf16, accumulators, lanes, products; /* bf16 products summed per lane and step */
} loops[DT_PEAK_LOOPS] = {
    [DT_PEAK_F32_AVX2] = {"f32-avx2", "fp32 AVX2 FMA loop", 0, ACC_AVX2, 8, 1},
    [DT_PEAK_F32_AVX512] = {"f32-avx512", "fp32 AVX-512 FMA loop", 0, ACC_AVX512, 16, 1},
    /* each float lane sums two bf16 products */
    [DT_PEAK_BF16_AVX512] = {"bf16-avx512", "bf16 AVX512-BF16 dot-product loop", 1, ACC_AVX512,
                             16, 2},
    /* each element of a 16 x 16 tile sums 32 */
    [DT_PEAK_BF16_AMX] = {"bf16-amx", "bf16 AMX tile loop", 1, ACC_AMX, AMX_LANES, 32},
};

static int valid(dt_peak_loop l) { return (int)l >= 0 && l < DT_PEAK_LOOPS; }

const char *dt_peak_loop_id(dt_peak_loop l) { return valid(l) ? loops[l].id : "?"; }
const char *dt_peak_loop_desc(dt_peak_loop l) { return valid(l) ? loops[l].desc : "?"; }
int dt_peak_loop_is_bf16(dt_peak_loop l) { return valid(l) && loops[l].bf16; }
int dt_peak_loop_accumulators(dt_peak_loop l) { return valid(l) ? loops[l].accumulators : 0; }
int dt_peak_loop_lanes(dt_peak_loop l) { return valid(l) ? loops[l].lanes : 0; }
int dt_peak_loop_products(dt_peak_loop l) { return valid(l) ? loops[l].products : 0; }

/* A product and its addition: 2 FLOPs. */
double dt_peak_loop_flops(dt_peak_loop l, long iters)
{
    if (!valid(l)) return 0;
    return (double)iters * loops[l].accumulators * loops[l].lanes * loops[l].products * 2;
}

/* ---- timing ------------------------------------------------------------- */

#define RUN_SECONDS 4e-3 /* one timed run */
#define RUNS 5           /* after one warm-up run; the best counts */

static double thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Iterations for about RUN_SECONDS on this thread. The first runs also wake
 * the vector units up (AVX-512 clocks, Zen's upper halves). */
static long iterations_for_a_run(dt_peak_loop l)
{
    long iters = 1024;
    for (;;) {
        double t0 = thread_cpu_seconds();
        volatile double sink = dt_peak_loop_run(l, iters);
        (void)sink;
        double dt = thread_cpu_seconds() - t0;
        if (dt >= RUN_SECONDS / 4 || iters > (1L << 40)) {
            double scaled = (double)iters * RUN_SECONDS / (dt > 0 ? dt : RUN_SECONDS);
            return scaled < 1024 ? 1024 : (long)scaled;
        }
        iters *= 4;
    }
}

void dt_peak_loop_rates(const dt_peak_loop *l, int n, double *rates)
{
    long iters[DT_PEAK_LOOPS];
    volatile double sink = 0;
    for (int i = 0; i < n && i < DT_PEAK_LOOPS; i++) {
        rates[i] = 0;
        iters[i] = dt_peak_loop_supported(l[i]) ? iterations_for_a_run(l[i]) : 0;
        if (iters[i]) sink = dt_peak_loop_run(l[i], iters[i]); /* warm-up */
    }
    for (int r = 0; r < RUNS; r++)
        for (int i = 0; i < n && i < DT_PEAK_LOOPS; i++) {
            if (!iters[i]) continue;
            double t0 = thread_cpu_seconds();
            sink = dt_peak_loop_run(l[i], iters[i]);
            double dt = thread_cpu_seconds() - t0;
            double rate = dt > 0 ? dt_peak_loop_flops(l[i], iters[i]) / dt : 0;
            if (rate > rates[i]) rates[i] = rate;
        }
    (void)sink;
}

double dt_peak_loop_rate(dt_peak_loop l)
{
    double rate;
    dt_peak_loop_rates(&l, 1, &rate);
    return rate;
}
