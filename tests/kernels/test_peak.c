/* The peak FMA loops: each loop this CPU runs does the arithmetic peak.h
 * says, for as many iterations as asked (checked against the recurrence
 * computed here one scalar at a time with fmaf); the FLOP count
 * per iteration is the loop's shape counted by hand; the ISA detection
 * agrees with the kernel's own flags in /proc/cpuinfo. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "kernels/matmul.h"
#include "kernels/peak.h"

/* What the loop must return: A accumulators x lanes, accumulator k
 * starting at k, each step rounded to float once as an FMA rounds. */
static double expected(dt_peak_loop l, long iters)
{
    double total = 0;
    for (int k = 0; k < dt_peak_loop_accumulators(l); k++) {
        float x = (float)k;
        for (long i = 0; i < iters; i++) {
            if (!dt_peak_loop_is_bf16(l)) x = fmaf(x, 0.5f, 1.0f);
            for (int p = 0; dt_peak_loop_is_bf16(l) && p < dt_peak_loop_products(l); p++)
                x += 0.25f;
        }
        total += (double)x * dt_peak_loop_lanes(l);
    }
    return total;
}

/* Whether /proc/cpuinfo's flags line has the word. -1 when unreadable. */
static int cpuinfo_flag(const char *word)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    char line[8192];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        found = 0;
        for (char *t = strtok(strchr(line, ':') + 1, " \n"); t; t = strtok(NULL, " \n"))
            if (!strcmp(t, word)) found = 1;
    }
    fclose(f);
    return found;
}

/* Which way bf16 products run (kernels/matmul_plans.c) follows the units'
 * rates, timed again here: the fp32 path where the fp32 FMA is clearly the
 * faster (the bf16 dot products under 0.7 of its rate), never where the
 * bf16 unit is at least as fast, nor where AMX multiplies. Rates near the
 * rule's edge (0.8) are not judged. */
static void check_bf16_path(void)
{
    const char *how = dt_matmul_bf16_how();
    printf("bf16 products: %s\n", how);
    if (!dt_peak_loop_supported(DT_PEAK_BF16_AVX512)) return;
    double fp32 = dt_peak_loop_rate(DT_PEAK_F32_AVX512);
    double bf16 = dt_peak_loop_rate(DT_PEAK_BF16_AVX512);
    printf("rates a thread: fp32 FMA %.1f GFLOP/s, bf16 dot products %.1f\n", fp32 * 1e-9,
           bf16 * 1e-9);
    CHECK(fp32 > 0 && bf16 > 0, "the loops ran: %g, %g", fp32, bf16);
    if (dt_peak_loop_supported(DT_PEAK_BF16_AMX) || bf16 >= fp32)
        CHECK(dt_matmul_bf16_native(), "bf16 unit as fast (or AMX), yet: %s", how);
    else if (bf16 < 0.7 * fp32)
        CHECK(!dt_matmul_bf16_native() && strstr(how, "outruns"),
              "fp32 FMA at %.2fx the bf16 rate, yet: %s", fp32 / bf16, how);
}

/* A job hands every rank the same rates (kernels/matmul.h); the path then
 * follows them alone, whatever this process would time, and a later choice
 * replaces an earlier one. Where rates do not decide (no AVX512-BF16, AMX,
 * DTRAIN_BF16_EMULATE set) the choice leaves the path as it was. */
static void check_bf16_choice(void)
{
    int before = dt_matmul_bf16_native();
    if (!dt_matmul_bf16_rates_matter()) {
        CHECK(dt_matmul_bf16_choose(100e9, 400e9) == before &&
                  dt_matmul_bf16_choose(400e9, 100e9) == before,
              "rates do not decide here, yet they changed the path");
        printf("bf16 choice: rates do not decide on this CPU (%s)\n", dt_matmul_bf16_how());
        return;
    }
    CHECK(dt_matmul_bf16_choose(100e9, 400e9) == 1 && dt_matmul_bf16_native() == 1,
          "bf16 rate 4x fp32's, yet: %s", dt_matmul_bf16_how());
    CHECK(dt_matmul_bf16_choose(400e9, 100e9) == 0 && dt_matmul_bf16_native() == 0 &&
              strstr(dt_matmul_bf16_how(), "(400 GFLOP/s a thread)") &&
              strstr(dt_matmul_bf16_how(), "dot products (100)"),
          "bf16 rate a quarter of fp32's, yet: %s", dt_matmul_bf16_how());
    CHECK(dt_matmul_bf16_choose(0, 0) == 1, "unmeasured rates must keep the kernel");
    printf("bf16 choice: follows the rates handed in\n");
}

int main(void)
{
    int ran = 0;
    for (int i = 0; i < DT_PEAK_LOOPS; i++) {
        dt_peak_loop l = (dt_peak_loop)i;
        if (!dt_peak_loop_supported(l)) {
            printf("%s: not on this CPU, not run (returns 0: %g)\n", dt_peak_loop_id(l),
                   dt_peak_loop_run(l, 10));
            CHECK(dt_peak_loop_run(l, 10) == 0, "an unsupported loop must not run");
            continue;
        }
        ran++;
        static const long iters[] = {0, 1, 2, 3, 7, 40, 1000};
        for (size_t k = 0; k < sizeof iters / sizeof iters[0]; k++) {
            double got = dt_peak_loop_run(l, iters[k]), want = expected(l, iters[k]);
            CHECK(got == want, "%s, %ld iterations: %.17g, want %.17g", dt_peak_loop_id(l),
                  iters[k], got, want);
        }
        printf("%s: arithmetic checked\n", dt_peak_loop_id(l));
    }
    CHECK(ran > 0 || cpuinfo_flag("avx2") == 0, "AVX2 is in /proc/cpuinfo, yet no loop runs");

    /* FLOPs of 10 iterations, by hand: accumulators x lanes x FLOPs per lane
     * (an FMA is 2; vdpbf16ps sums two products per float lane: 4; an AMX
     * tile element sums 32: 64, over 6 tiles of 16 x 16). */
    CHECK(dt_peak_loop_flops(DT_PEAK_F32_AVX2, 10) == 10.0 * 12 * 8 * 2, "avx2 flops");
    CHECK(dt_peak_loop_flops(DT_PEAK_F32_AVX512, 10) == 10.0 * 16 * 16 * 2, "avx512 flops");
    CHECK(dt_peak_loop_flops(DT_PEAK_BF16_AVX512, 10) == 10.0 * 16 * 16 * 4, "bf16 flops");
    CHECK(dt_peak_loop_flops(DT_PEAK_BF16_AMX, 10) == 10.0 * 6 * 256 * 64, "amx flops");
    CHECK(dt_peak_loop_is_bf16(DT_PEAK_BF16_AVX512) && !dt_peak_loop_is_bf16(DT_PEAK_F32_AVX512) &&
              dt_peak_loop_is_bf16(DT_PEAK_BF16_AMX),
          "dtypes");

    /* Detection against the kernel's view (cpuinfo spells avx512_bf16). */
    int avx2 = cpuinfo_flag("avx2"), fma = cpuinfo_flag("fma");
    int avx512 = cpuinfo_flag("avx512f"), bf16 = cpuinfo_flag("avx512_bf16");
    int amx = cpuinfo_flag("amx_tile") == 1 && cpuinfo_flag("amx_bf16") == 1;
    if (avx2 >= 0) {
        CHECK(dt_peak_loop_supported(DT_PEAK_F32_AVX2) == (avx2 && fma), "avx2+fma detection");
        CHECK(dt_peak_loop_supported(DT_PEAK_F32_AVX512) == avx512, "avx512f detection");
        CHECK(dt_peak_loop_supported(DT_PEAK_BF16_AVX512) == (avx512 && bf16), "bf16 detection");
        /* Usable tiles need the CPU's flags (and a kernel that grants them). */
        CHECK(!dt_peak_loop_supported(DT_PEAK_BF16_AMX) || amx, "amx detection");
        if (amx && !dt_peak_loop_supported(DT_PEAK_BF16_AMX))
            printf("amx: the CPU has it, the kernel does not grant the tiles\n");
    }
    check_bf16_path();
    check_bf16_choice();
    char id[256];
    dt_cpu_identity(id, sizeof id);
    printf("cpu: %s\n", id);
    CHECK(strstr(id, "family ") && strstr(id, " model ") && strstr(id, " stepping "),
          "identity '%s' lacks family/model/stepping", id);
    CHECK(!(avx2 == 1) || strstr(id, " avx2"), "identity '%s' lacks avx2", id);
    return finish("kernels.peak");
}
