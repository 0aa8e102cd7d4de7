/* Timing the peak loops, the per-CPU cache, and the line that says what MFU
 * is measured against. See peak.h. */
#include "train/peak.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/env.h"
#include "core/file.h"
#include "core/hash.h"
#include "core/parse.h"
#include "core/str.h"
#include "kernels/matmul.h"
#include "train/data/corpus.h"

#define CACHE_MAGIC "dtrain-peak 1"
#define MAX_THREADS 1024 /* measured with at most this many threads */

/* GFLOP/s of one thread at each of the n <= 2 loops l, `threads` threads
 * running them at once, each thread timing them in turns. */
static void measure_together(const dt_peak_loop *l, int n, int threads, double *gflops)
{
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    double sum0 = 0, sum1 = 0;
    int ran = 0; /* OpenMP may give fewer threads than asked (OMP_THREAD_LIMIT) */
#pragma omp parallel num_threads(threads) reduction(+ : sum0, sum1, ran)
    {
        double r[2] = {0, 0};
        dt_peak_loop_rates(l, n, r);
        sum0 += r[0];
        sum1 += r[1];
        ran += 1;
    }
    gflops[0] = ran > 0 ? sum0 / ran * 1e-9 : 0;
    if (n > 1) gflops[1] = ran > 0 ? sum1 / ran * 1e-9 : 0;
}

double dt_peak_measure(dt_peak_loop l, int threads)
{
    double gflops = 0;
    if (dt_peak_loop_supported(l)) measure_together(&l, 1, threads, &gflops);
    return gflops;
}

/* ---- the cache file ----------------------------------------------------- */

int dt_cpu_cache_path(const char *kind, const char *cpu, char *path, size_t len, char *err,
                      size_t errlen)
{
    char dir[DT_PATH_MAX];
    if (dt_cache_dir(dir, sizeof dir, err, errlen) != 0) return -1;
    int n = snprintf(path, len, "%s/%s/%016" PRIx64 ".txt", dir, kind, dt_fnv1a64_str(cpu));
    if (n < 0 || (size_t)n >= len) {
        dt_strf(err, errlen, "%s cache path too long (cache directory '%.64s...')", kind, dir);
        return -1;
    }
    return 0;
}

int dt_peak_cache_path(const char *cpu, char *path, size_t len, char *err, size_t errlen)
{
    return dt_cpu_cache_path("peak", cpu, path, len, err, errlen);
}

static int loop_by_id(const char *id, dt_peak_loop *out)
{
    for (int l = 0; l < DT_PEAK_LOOPS; l++)
        if (!strcmp(id, dt_peak_loop_id((dt_peak_loop)l))) return *out = (dt_peak_loop)l, 0;
    return -1;
}

/* "<loop id> <threads> <GFLOP/s per thread>" */
static int parse_entry(char *line, dt_peak_entry *e)
{
    char *save = NULL, *id = strtok_r(line, " ", &save), *th = strtok_r(NULL, " ", &save);
    char *gf = strtok_r(NULL, " ", &save);
    long threads;
    if (!id || !th || !gf || strtok_r(NULL, " ", &save)) return -1;
    if (loop_by_id(id, &e->loop) != 0) return -1;
    if (dt_parse_long(th, 1, MAX_THREADS, &threads) != 0) return -1;
    if (dt_parse_double(gf, 1e-3, 1e6, &e->gflops) != 0) return -1;
    e->threads = (int)threads;
    return 0;
}

static int parse_cache(char *text, const char *cpu, dt_peak_entry *e, int max, char *err,
                       size_t errlen)
{
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, CACHE_MAGIC) != 0) {
        dt_strf(err, errlen, "it does not start with '%s'", CACHE_MAGIC);
        return -1;
    }
    line = strtok_r(NULL, "\n", &save);
    if (!line || strncmp(line, "cpu ", 4) != 0 || strcmp(line + 4, cpu) != 0) {
        dt_strf(err, errlen, "it is not this CPU's ('%.80s')", line ? line : "");
        return -1;
    }
    int n = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        int lineno = n + 3;
        if (n == max || parse_entry(line, &e[n]) != 0) {
            dt_strf(err, errlen, "line %d is not '<loop> <threads> <GFLOP/s>'", lineno);
            return -1;
        }
        n++;
    }
    return n;
}

int dt_peak_cache_read(const char *path, const char *cpu, dt_peak_entry *e, int max, char *err,
                       size_t errlen)
{
    char why[200];
    if (access(path, F_OK) != 0 && errno == ENOENT) return 0;
    char *text = dt_read_file(path, 64 * 1024, NULL, why, sizeof why);
    if (!text) {
        dt_strf(err, errlen, "%s", why);
        return -1;
    }
    int n = parse_cache(text, cpu, e, max, why, sizeof why);
    free(text);
    if (n < 0) dt_strf(err, errlen, "peak cache %s: %s", path, why);
    return n;
}

int dt_peak_cache_write(const char *path, const char *cpu, const dt_peak_entry *e, int n,
                        char *err, size_t errlen)
{
    char dir[DT_PATH_MAX];
    dt_strf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        if (dt_mkdir_p(dir, err, errlen) != 0) return -1;
    }
    size_t cap = 256 + (size_t)n * 64, len = 0;
    char *text = malloc(cap);
    if (!text) {
        dt_strf(err, errlen, "peak cache %s: out of memory", path);
        return -1;
    }
    len += (size_t)snprintf(text + len, cap - len, "%s\ncpu %.180s\n", CACHE_MAGIC, cpu);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s %d %.17g\n", dt_peak_loop_id(e[i].loop),
                                e[i].threads, e[i].gflops);
    int rc = dt_afile_write_file(path, text, len, err, errlen);
    free(text);
    return rc;
}

/* ---- choosing and filling in the peak ----------------------------------- */

/* The loops whose rate bounds the run's matrix products. */
static int candidate_loops(int bf16, dt_peak_loop *out, int *bf16_in_fp32)
{
    int n = 0;
    *bf16_in_fp32 = 0;
    /* oneDNN's bf16 kernels use the fastest unit the CPU has (AMX's tiles
     * where present): the fastest bf16 loop bounds them. */
    for (int l = 0; bf16 && dt_matmul_bf16_native() && l < DT_PEAK_LOOPS; l++)
        if (dt_peak_loop_is_bf16((dt_peak_loop)l) && dt_peak_loop_supported((dt_peak_loop)l))
            out[n++] = (dt_peak_loop)l;
    if (n > 0) return n;
    *bf16_in_fp32 = bf16;
    for (int l = 0; l < DT_PEAK_LOOPS; l++)
        if (!dt_peak_loop_is_bf16((dt_peak_loop)l) && dt_peak_loop_supported((dt_peak_loop)l))
            out[n++] = (dt_peak_loop)l;
    return n;
}

/* The cache file of this CPU, read in full; closed by writing it back when
 * a rate was added. */
typedef struct {
    dt_peak_entry e[DT_PEAK_CACHE_MAX];
    char path[DT_PATH_MAX];
    int n, dirty, measured, have_path;
} peak_cache;

static void cache_open(peak_cache *pc, const char *cpu)
{
    char why[DT_PATH_MAX + 256];
    pc->n = pc->dirty = pc->measured = 0;
    pc->have_path = dt_peak_cache_path(cpu, pc->path, sizeof pc->path, why, sizeof why) == 0;
    if (pc->have_path) pc->n = dt_peak_cache_read(pc->path, cpu, pc->e, DT_PEAK_CACHE_MAX, why,
                                                  sizeof why);
    if (pc->n < 0) pc->n = 0, pc->dirty = 1; /* corrupt: rewritten on close */
}

/* A cache that cannot be written costs a measurement next time, no more. */
static void cache_close(peak_cache *pc, const char *cpu)
{
    char why[DT_PATH_MAX + 256];
    if (pc->have_path && pc->dirty && pc->n > 0)
        (void)dt_peak_cache_write(pc->path, cpu, pc->e, pc->n, why, sizeof why);
}

/* The entry of (l, threads), or -1. */
static int cache_find(const peak_cache *pc, dt_peak_loop l, int threads)
{
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].loop == l && pc->e[i].threads == threads) return i;
    return -1;
}

/* Replaces (or adds) the entry of (l, threads); a rate of 0 (the loop did
 * not run) is not kept. */
static void cache_set(peak_cache *pc, dt_peak_loop l, int threads, double gflops)
{
    if (gflops <= 0) return;
    int i = cache_find(pc, l, threads);
    if (i < 0 && pc->n == DT_PEAK_CACHE_MAX) pc->n = 0; /* full: start over rather than grow */
    if (i < 0) i = pc->n++;
    pc->e[i] = (dt_peak_entry){l, threads, gflops};
    pc->dirty = 1;
}

/* The cached rate of (loop, threads), or measured now and added. */
static double cached_rate(peak_cache *pc, dt_peak_loop l, int threads)
{
    const int i = cache_find(pc, l, threads);
    if (i >= 0) return pc->e[i].gflops;
    const double gf = dt_peak_measure(l, threads);
    pc->measured = 1;
    cache_set(pc, l, threads, gf);
    return gf > 0 ? gf : 0;
}

void dt_peak_offer(dt_peak_loop l, int threads, double gflops)
{
    char cpu[192];
    dt_cpu_identity(cpu, sizeof cpu);
    peak_cache pc;
    cache_open(&pc, cpu);
    const int i = cache_find(&pc, l, threads);
    if (i < 0 || pc.e[i].gflops < gflops) cache_set(&pc, l, threads, gflops);
    cache_close(&pc, cpu);
}

static int clamp_threads(int threads)
{
    return threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
}

int dt_peak_get(int threads, int bf16, dt_peak *p, char *err, size_t errlen)
{
    threads = clamp_threads(threads);
    *p = (dt_peak){.threads = threads, .source = DT_PEAK_UNKNOWN};
    dt_cpu_identity(p->cpu, sizeof p->cpu);
    double gflops;
    int env = dt_env_double("DTRAIN_PEAK_GFLOPS", 1e-3, 1e9, &gflops, err, errlen);
    if (env < 0) return -1;
    if (env == 1) {
        p->per_thread = gflops * 1e9;
        p->source = DT_PEAK_ENV;
        return 0;
    }
    dt_peak_loop cand[DT_PEAK_LOOPS];
    int ncand = candidate_loops(bf16, cand, &p->bf16_in_fp32);
    if (ncand == 0) return 0;
    peak_cache pc;
    cache_open(&pc, p->cpu);
    for (int i = 0; i < ncand; i++) {
        double gf = cached_rate(&pc, cand[i], threads);
        if (gf * 1e9 > p->per_thread) p->per_thread = gf * 1e9, p->loop = cand[i];
    }
    if (p->per_thread > 0) p->source = pc.measured ? DT_PEAK_MEASURED : DT_PEAK_CACHED;
    cache_close(&pc, p->cpu);
    return 0;
}

void dt_peak_bf16_rates(int threads, double rates[2])
{
    threads = clamp_threads(threads);
    rates[0] = rates[1] = 0;
    if (!dt_matmul_bf16_rates_matter()) return;
    char cpu[192];
    dt_cpu_identity(cpu, sizeof cpu);
    peak_cache pc;
    cache_open(&pc, cpu);
    /* Both timed together, in turns, when either is missing: compared
     * with each other, they must not come from two moments of a busy
     * machine (the choice is cached with them). */
    const dt_peak_loop pair[2] = {DT_PEAK_F32_AVX512, DT_PEAK_BF16_AVX512};
    if (cache_find(&pc, pair[0], threads) < 0 || cache_find(&pc, pair[1], threads) < 0) {
        double gf[2];
        measure_together(pair, 2, threads, gf);
        for (int i = 0; i < 2; i++) cache_set(&pc, pair[i], threads, gf[i]);
    }
    rates[0] = cached_rate(&pc, pair[0], threads) * 1e9;
    rates[1] = cached_rate(&pc, pair[1], threads) * 1e9;
    cache_close(&pc, cpu);
}

int dt_mfu_peak(int threads, int ranks, int bf16, double *peak, char *desc, size_t desclen)
{
    dt_peak p;
    char err[256];
    if (ranks < 1) ranks = 1;
    *peak = 0;
    if (dt_peak_get(threads, bf16, &p, err, sizeof err) != 0) {
        dt_strf(desc, desclen, "%s", err);
        return -1;
    }
    char who[48], brand[64];
    if (ranks > 1)
        dt_strf(who, sizeof who, "%d ranks x %d thread%s", ranks, p.threads, p.threads > 1 ? "s" : "");
    else
        dt_strf(who, sizeof who, "%d thread%s", p.threads, p.threads > 1 ? "s" : "");
    *peak = p.per_thread * p.threads * ranks;
    switch (p.source) {
    case DT_PEAK_ENV:
        dt_strf(desc, desclen, "MFU against DTRAIN_PEAK_GFLOPS=%.4g GFLOP/s x %s", p.per_thread * 1e-9,
                who);
        break;
    case DT_PEAK_MEASURED:
    case DT_PEAK_CACHED:
        dt_cpu_brand(brand, sizeof brand);
        dt_strf(desc, desclen, "MFU against a measured peak of %.1f GFLOP/s x %s (%s on %s%s%s)",
                p.per_thread * 1e-9, who, dt_peak_loop_desc(p.loop), brand,
                p.bf16_in_fp32 ? "; bf16 products run in fp32 on this CPU" : "",
                p.source == DT_PEAK_CACHED ? "; cached" : "");
        break;
    default:
        dt_strf(desc, desclen, "MFU not shown: no peak loop runs on %s (set DTRAIN_PEAK_GFLOPS to "
                "one thread's peak GFLOP/s)", p.cpu);
        break;
    }
    return 0;
}
