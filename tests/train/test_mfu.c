/* MFU's parts: the FLOP count per token against hand computations, the
 * peak cache (round trip, every kind of corrupt file refused, a cached
 * figure used rather than measured again, a corrupt file rewritten), the
 * DTRAIN_PEAK_GFLOPS override, the peak chosen for bf16, and the cap at
 * 100% with its marker. No timing is asserted.
 *   test_mfu DIR   (a scratch directory: the cache goes there) */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/file.h"
#include "kernels/matmul.h"
#include "model/gpt.h"
#include "train/metrics.h"
#include "train/peak.h"

static char dir[512];

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static void test_flops(void)
{
    /* "bench": L 6, C 384, V 256, T 256.
     *   matmul weights N = V C + 12 L C^2 = 98,304 + 72 x 147,456
     *                    = 98,304 + 10,616,832 = 10,715,136
     *   6 N = 64,290,816;  6 L T C = 6 x 6 x 256 x 384 = 3,538,944
     *   total 67,829,760 FLOPs per token */
    dt_gpt_config bench = {.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256,
                           .vocab_size = 256};
    CHECK(dt_gpt_flops_per_token(&bench, 256) == 67829760.0, "bench: %.0f, want 67829760",
          dt_gpt_flops_per_token(&bench, 256));
    /* GPT-2 small at T 1024: L 12, C 768, V 50257.
     *   N = 50,257 x 768 + 144 x 589,824 = 38,597,376 + 84,934,656 = 123,532,032
     *   6 N = 741,192,192;  6 L T C = 6 x 12 x 1024 x 768 = 56,623,104
     *   total 797,815,296 */
    dt_gpt_config small = {.n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024,
                           .vocab_size = 50257};
    CHECK(dt_gpt_flops_per_token(&small, 1024) == 797815296.0, "gpt2: %.0f, want 797815296",
          dt_gpt_flops_per_token(&small, 1024));
    /* The attention term follows the sequence trained on, not block_size:
     * T 128 instead of 1024 takes 6 x 12 x 896 x 768 = 49,545,216 off. */
    CHECK(dt_gpt_flops_per_token(&small, 128) == 797815296.0 - 49545216.0, "gpt2 at T 128: %.0f",
          dt_gpt_flops_per_token(&small, 128));
}

static void test_cache_file(void)
{
    char path[600], err[1024];
    dt_peak_entry e[4] = {{DT_PEAK_F32_AVX2, 1, 101.5}, {DT_PEAK_BF16_AVX512, 16, 480.25}}, r[8];
    snprintf(path, sizeof path, "%s/sub/dir/c.txt", dir);
    remove(path); /* left by an earlier run */
    CHECK(dt_peak_cache_read(path, "cpu A", r, 8, err, sizeof err) == 0, "no file: 0 entries");
    CHECK(dt_peak_cache_write(path, "cpu A", e, 2, err, sizeof err) == 0, "write: %s", err);
    int n = dt_peak_cache_read(path, "cpu A", r, 8, err, sizeof err);
    CHECK(n == 2, "read back %d entries (%s)", n, err);
    CHECK(n == 2 && r[0].loop == DT_PEAK_F32_AVX2 && r[0].threads == 1 && r[0].gflops == 101.5 &&
              r[1].loop == DT_PEAK_BF16_AVX512 && r[1].threads == 16 && r[1].gflops == 480.25,
          "round trip");
    char *text = dt_read_file(path, 4096, NULL, err, sizeof err);
    CHECK(text && !strcmp(text, "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 101.5\nbf16-avx512 16 480.25\n"),
          "file text: '%s'", text ? text : err);
    free(text);
    CHECK(dt_peak_cache_read(path, "cpu B", r, 8, err, sizeof err) == -1 &&
              strstr(err, "not this CPU"), "another CPU's file: '%s'", err);
    CHECK(dt_peak_cache_read(path, "cpu A", r, 1, err, sizeof err) == -1, "more entries than room");

    static const char *const corrupt[] = {
        "",
        "garbage\n",
        "dtrain-peak 2\ncpu cpu A\n",
        "dtrain-peak 1\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 100 7\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx9 1 100\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 0 100\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 -3 100\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 nan\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 -5\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 1e300\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 100x\n",
        "dtrain-peak 1\ncpu cpu A\nf32-avx2 1 100\n\x01\xff\n",
    };
    for (size_t i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) {
        write_text(path, corrupt[i]);
        err[0] = 0;
        CHECK(dt_peak_cache_read(path, "cpu A", r, 8, err, sizeof err) == -1 && err[0],
              "corrupt file %zu accepted", i);
    }
}

static void unsetenv_all(void)
{
    unsetenv("DTRAIN_PEAK_GFLOPS");
    setenv("DTRAIN_CACHE", dir, 1);
}

static void test_measured_and_cached(void)
{
    char cpu[192], path[1024], err[1024];
    dt_peak p, q;
    unsetenv_all();
    dt_cpu_identity(cpu, sizeof cpu);
    CHECK(dt_peak_cache_path(cpu, path, sizeof path, err, sizeof err) == 0, "%s", err);
    CHECK(strncmp(path, dir, strlen(dir)) == 0, "cache %s not under DTRAIN_CACHE %s", path, dir);
    if (!dt_peak_loop_supported(DT_PEAK_F32_AVX2)) {
        printf("no AVX2 on this CPU: measured peaks not checked\n");
        return;
    }
    remove(path);
    CHECK(dt_peak_get(2, 0, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.source == DT_PEAK_MEASURED && p.per_thread > 1e9 && p.threads == 2,
          "first call measures: source %d, %.3g FLOP/s", (int)p.source, p.per_thread);
    dt_peak_entry e[DT_PEAK_CACHE_MAX];
    int n = dt_peak_cache_read(path, cpu, e, DT_PEAK_CACHE_MAX, err, sizeof err);
    CHECK(n >= 1, "the measurement was cached (%d, %s)", n, err);

    CHECK(dt_peak_get(2, 0, &q, err, sizeof err) == 0, "%s", err);
    CHECK(q.source == DT_PEAK_CACHED && q.per_thread == p.per_thread,
          "second call: source %d, %.6g vs %.6g", (int)q.source, q.per_thread, p.per_thread);

    /* A figure planted in the cache is what comes back, nothing measured
     * again; with AVX-512 too, the faster of the two fp32 loops. */
    dt_peak_entry planted[2] = {{DT_PEAK_F32_AVX2, 3, 1234.5}, {DT_PEAK_F32_AVX512, 3, 1000}};
    CHECK(dt_peak_cache_write(path, cpu, planted, 2, err, sizeof err) == 0, "%s", err);
    CHECK(dt_peak_get(3, 0, &q, err, sizeof err) == 0, "%s", err);
    CHECK(q.source == DT_PEAK_CACHED && q.per_thread == 1234.5e9 && q.loop == DT_PEAK_F32_AVX2,
          "planted: source %d, %.6g, loop %d", (int)q.source, q.per_thread, (int)q.loop);

    /* Corrupt: ignored, measured again, rewritten whole. */
    write_text(path, "dtrain-peak 1\ncpu nonsense\n");
    CHECK(dt_peak_get(2, 0, &q, err, sizeof err) == 0, "%s", err);
    CHECK(q.source == DT_PEAK_MEASURED && q.per_thread > 1e9, "after corruption: source %d",
          (int)q.source);
    n = dt_peak_cache_read(path, cpu, e, DT_PEAK_CACHE_MAX, err, sizeof err);
    CHECK(n >= 1, "rewritten after corruption (%d, %s)", n, err);

    /* bf16: a bf16 loop only where bf16 products run on a bf16 kernel: AMX's
     * tiles where they are usable (oneDNN multiplies there), else the
     * vector dot-product loop. */
    CHECK(dt_peak_get(2, 1, &q, err, sizeof err) == 0, "%s", err);
    int amx = dt_peak_loop_supported(DT_PEAK_BF16_AMX);
    if (dt_matmul_bf16_native() && (amx || dt_peak_loop_supported(DT_PEAK_BF16_AVX512)))
        CHECK(q.loop == (amx ? DT_PEAK_BF16_AMX : DT_PEAK_BF16_AVX512) && !q.bf16_in_fp32,
              "native bf16: loop %d", (int)q.loop);
    else
        CHECK(!dt_peak_loop_is_bf16(q.loop) && q.bf16_in_fp32, "bf16 in fp32: loop %d, flag %d",
              (int)q.loop, q.bf16_in_fp32);
    printf("bf16 products %s: bf16 peak from %s\n",
           dt_matmul_bf16_native() ? "native" : "emulated", dt_peak_loop_id(q.loop));

    double peak;
    char desc[512];
    CHECK(dt_mfu_peak(2, 3, 0, &peak, desc, sizeof desc) == 0, "%s", desc);
    printf("%s\n", desc);
    CHECK(strstr(desc, "measured peak of") && strstr(desc, "x 3 ranks x 2 threads") &&
              strstr(desc, "FMA loop"), "description: '%s'", desc);
    CHECK(dt_peak_get(2, 0, &q, err, sizeof err) == 0 && peak == q.per_thread * 6,
          "peak of 3 ranks x 2 threads: %.6g vs %.6g x 6", peak, q.per_thread);
}

static void test_override(void)
{
    double peak;
    char desc[512];
    dt_peak p;
    setenv("DTRAIN_PEAK_GFLOPS", "2.5", 1);
    CHECK(dt_peak_get(4, 1, &p, desc, sizeof desc) == 0 && p.source == DT_PEAK_ENV &&
              p.per_thread == 2.5e9, "override: source %d, %.6g", (int)p.source, p.per_thread);
    CHECK(dt_mfu_peak(4, 2, 0, &peak, desc, sizeof desc) == 0 && peak == 2.5e9 * 8,
          "override x 2 ranks x 4 threads: %.6g", peak);
    CHECK(strstr(desc, "DTRAIN_PEAK_GFLOPS=2.5") && strstr(desc, "2 ranks x 4 threads"),
          "description: '%s'", desc);
    CHECK(dt_peak_flops(4, 0) == 2.5e9 * 4, "dt_peak_flops(4 threads): %.6g", dt_peak_flops(4, 0));
    static const char *const bad[] = {"abc", "0", "-1", "1e12", "nan", "5 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DTRAIN_PEAK_GFLOPS", bad[i], 1);
        desc[0] = 0;
        CHECK(dt_mfu_peak(1, 1, 0, &peak, desc, sizeof desc) == -1 &&
                  strstr(desc, "DTRAIN_PEAK_GFLOPS"), "'%s' accepted ('%s')", bad[i], desc);
    }
    unsetenv_all();
}

/* The step line for a given MFU, through dt_print_step. */
static void step_line(double mfu, char *line, size_t len)
{
    FILE *f = tmpfile();
    dt_step_stats s = {.step = 0, .steps = 1, .loss = 1, .ms = 1, .tokens_per_s = 1, .mfu = mfu,
                       .ranks = 1};
    dt_print_step(f, &s);
    rewind(f);
    if (!fgets(line, (int)len, f)) line[0] = 0;
    fclose(f);
}

static void test_cap(void)
{
    char line[512];
    CHECK(dt_mfu(5e8, 1e9) == 0.5, "half the peak");
    CHECK(dt_mfu(1.61e9, 1e9) == 1.0, "capped at 1: %g", dt_mfu(1.61e9, 1e9));
    CHECK(dt_mfu(1e9, 0) == -1 && dt_mfu(1e9, -1) == -1, "no peak: unknown");
    step_line(0.425, line, sizeof line);
    CHECK(strstr(line, "| MFU 42.5% |"), "line '%s'", line);
    step_line(1.61, line, sizeof line);
    CHECK(strstr(line, "| MFU 100.0%* |") && !strstr(line, "161"), "capped line '%s'", line);
    step_line(-1, line, sizeof line);
    CHECK(!strstr(line, "MFU"), "unknown MFU printed: '%s'", line);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_mfu SCRATCH_DIR\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    mkdir(dir, 0777);
    test_flops();
    test_cache_file();
    test_override();
    test_measured_and_cached();
    test_cap();
    return finish("train.mfu");
}
