/*
 * `dtrain bench peak`: the peak FLOP/s of this CPU that MFU is measured
 * against (train/peak.h), measured now for every loop the CPU runs, per
 * thread on one thread and with N threads at once; then what a training
 * run would measure MFU against, and what the cache holds.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/atomic_file.h"
#include "core/parse.h"
#include "kernels/bandwidth.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"
#include "train/peak.h"

#define BENCH_PEAK "dtrain bench peak"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain bench peak [--threads N]\n"
            "\n"
            "Times each register-only FMA loop this CPU runs (fp32 AVX2, fp32 AVX-512,\n"
            "bf16 AVX512-BF16, bf16 AMX tiles) on 1 thread and on N threads at once\n"
            "(default: the CPUs this process may use), prints GFLOP/s per thread and\n"
            "for all threads, what `dtrain train --threads N` measures MFU against,\n"
            "and the cached peaks. A rate above the cached one replaces it: the cache\n"
            "keeps each loop's best, so a run's first measurement, slowed by a busy\n"
            "moment, is corrected by the next bench peak.\n"
            "\n"
            "  dtrain bench peak\n"
            "  dtrain bench peak --threads 4\n");
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

static void print_loops(int threads)
{
    printf("%-36s %8s %12s %12s\n", "loop", "threads", "GF/s/thread", "GF/s all");
    for (int l = 0; l < DT_PEAK_LOOPS; l++) {
        const char *desc = dt_peak_loop_desc((dt_peak_loop)l);
        if (!dt_peak_loop_supported((dt_peak_loop)l)) {
            printf("%-36s %8s   not on this CPU\n", desc, "-");
            continue;
        }
        int counts[2] = {1, threads};
        for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
            double gf = dt_peak_measure((dt_peak_loop)l, counts[k]);
            dt_peak_offer((dt_peak_loop)l, counts[k], gf); /* the cache keeps the best */
            printf("%-36s %8d %12.1f %12.1f\n", desc, counts[k], gf, gf * counts[k]);
        }
    }
}

/* The memory side of the roofline: what --profile bounds memory-bound
 * kernels with, at 1 thread and at `threads`. */
static void print_bandwidth(int threads)
{
    printf("\nmemory: a 128 MiB copy (bytes read and written), the best of 4:\n");
    const int counts[2] = {1, threads};
    for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
        dt_kernels_set_threads(counts[k]);
        printf("  %d thread%s: %.1f GB/s\n", counts[k], counts[k] == 1 ? "" : "s",
               dt_copy_bandwidth() * 1e-9);
    }
}

static int print_run_peaks(int threads)
{
    static const char *const names[2] = {"fp32", "bf16"};
    printf("\nbf16 matrix products here: %s\n", dt_matmul_bf16_how());
    printf("`dtrain train --threads %d` measures MFU against:\n", threads);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        double peak;
        char desc[512];
        if (dt_mfu_peak(threads, 1, bf16, &peak, desc, sizeof desc) != 0) {
            fprintf(stderr, BENCH_PEAK ": %s\n", desc);
            return 1;
        }
        printf("  %s: %s\n", names[bf16], desc);
    }
    return 0;
}

static void print_cache(void)
{
    char cpu[192], path[DT_PATH_MAX], err[DT_PATH_MAX + 256];
    dt_peak_entry e[DT_PEAK_CACHE_MAX];
    dt_cpu_identity(cpu, sizeof cpu);
    if (dt_peak_cache_path(cpu, path, sizeof path, err, sizeof err) != 0) {
        printf("\nno cache: %s\n", err);
        return;
    }
    int n = dt_peak_cache_read(path, cpu, e, DT_PEAK_CACHE_MAX, err, sizeof err);
    if (n < 0) {
        printf("\ncache: %s (a run rewrites it)\n", err);
        return;
    }
    printf("\ncache %s: %d entr%s\n", path, n, n == 1 ? "y" : "ies");
    for (int i = 0; i < n; i++)
        printf("  %-36s %8d %12.1f\n", dt_peak_loop_desc(e[i].loop), e[i].threads, e[i].gflops);
}

int cli_bench_peak(int argc, char **argv)
{
    long threads = usable_cpus();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        const char *v = NULL;
        if (!strncmp(argv[i], "--threads=", 10)) v = argv[i] + 10;
        else if (!strcmp(argv[i], "--threads")) {
            if (i + 1 == argc) {
                fprintf(stderr, BENCH_PEAK ": --threads needs a value\n");
                return CLI_EXIT_USAGE;
            }
            v = argv[++i];
        }
        if (v) {
            if (dt_parse_long(v, 1, 1024, &threads) != 0) {
                fprintf(stderr, BENCH_PEAK ": --threads '%s' is not a number in [1, 1024]\n", v);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        fprintf(stderr, BENCH_PEAK ": unknown option '%s'\n\n", argv[i]);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    char cpu[192];
    dt_cpu_identity(cpu, sizeof cpu);
    printf("CPU: %s\n", cpu);
    printf("peak of register-only FMA loops, each thread timed on its own CPU clock:\n\n");
    print_loops((int)threads);
    const char *env = getenv("DTRAIN_PEAK_GFLOPS");
    if (env && *env) printf("\nDTRAIN_PEAK_GFLOPS=%s replaces the measured peak per thread\n", env);
    print_bandwidth((int)threads);
    if (print_run_peaks((int)threads) != 0) return 1;
    print_cache();
    return 0;
}
