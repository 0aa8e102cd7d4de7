/*
 * The kernels' exp against libm's exp in double: relative error over the
 * whole normal range, the edges where it flushes to 0 or goes to infinity,
 * the special values, and the AVX-512 form giving the same bits as the
 * scalar one; 2^x in each vector form this build has (AVX-512, AVX2) against
 * libm's exp2, flushed to 0 below 2^-126, and the two giving the same bits
 * where both build.
 */
#include "kernel_test.h"
#include "kernels/fast_exp.h"

static void check_accuracy(void)
{
    double worst = 0.0, worst_x = 0.0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + (88.3f + 87.0f) * (float)i / 2000000.0f;
        double want = exp((double)x), got = dt_fast_expf(x);
        double err = fabs(got - want) / want;
        if (err > worst) worst = err, worst_x = x;
    }
    /* fp32 rounding alone is up to 6e-8; allow about 3 ulp */
    CHECK(worst < 2e-7, "worst relative error %.3g at x = %.9g", worst, worst_x);
    CHECK(dt_fast_expf(0.0f) == 1.0f, "exp(0) = %.9g", dt_fast_expf(0.0f));
}

static void check_special_values(void)
{
    CHECK(dt_fast_expf(-INFINITY) == 0.0f, "exp(-inf) = %g", dt_fast_expf(-INFINITY));
    CHECK(dt_fast_expf(-100.0f) == 0.0f, "exp(-100) = %g", dt_fast_expf(-100.0f));
    CHECK(isinf(dt_fast_expf(INFINITY)), "exp(inf) = %g", dt_fast_expf(INFINITY));
    CHECK(isinf(dt_fast_expf(89.0f)), "exp(89) = %g", dt_fast_expf(89.0f));
    CHECK(isnan(dt_fast_expf(NAN)), "exp(nan) = %g", dt_fast_expf(NAN));
    float near_max = dt_fast_expf(88.3f);
    CHECK(fabs(near_max / exp((double)88.3f) - 1.0) < 2e-7, "exp(88.3) = %g", near_max);
}

static void check_vector_form(void)
{
#if defined(__AVX512F__)
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        float x[16], y[16];
        for (int j = 0; j < 16; j++) x[j] = rnd_unit() * 100.0f;
        if (i == 0) x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY;
        _mm512_storeu_ps(y, dt_fast_exp512(_mm512_loadu_ps(x)));
        for (int j = 0; j < 16; j++) {
            float s = dt_fast_expf(x[j]);
            bad += memcmp(&s, &y[j], sizeof s) != 0;
        }
    }
    CHECK(bad == 0, "AVX-512 exp differs from the scalar one in %d cases", bad);
#endif
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* 2^x of 16 values in one vector form */
typedef void (*exp2_form)(float *y, const float *x);

#if defined(__AVX512F__)
static void exp2_512(float *y, const float *x)
{
    _mm512_storeu_ps(y, dt_fast_exp2_512(_mm512_loadu_ps(x)));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
static void exp2_256(float *y, const float *x)
{
    for (int h = 0; h < 16; h += 8)
        _mm256_storeu_ps(y + h, dt_fast_exp2_256(_mm256_loadu_ps(x + h)));
}
#endif

/* 2^x against libm's exp2 in double over the normal range down to
 * DT_EXP2_MIN_ARG = -126, 0 below it (never a subnormal, whose underflow
 * costs an assist), swept across the bound, and its edges */
static void check_exp2(const char *form, exp2_form exp2_of)
{
    double worst = 0.0, worst_x = 0.0;
    int not_zero = 0;
    float not_zero_x = 0.0f, not_zero_y = 0.0f;
    for (int i = 0; i <= 2000000; i += 16) {
        float x[16], y[16], xs[16], ys[16];
        for (int j = 0; j < 16; j++) {
            x[j] = DT_EXP2_MIN_ARG + 253.0f * (float)(i + j) / 2000000.0f;
            xs[j] = -160.0f + 40.0f * (float)(i + j) / 2000000.0f;
        }
        exp2_of(y, x);
        exp2_of(ys, xs);
        for (int j = 0; j < 16; j++) {
            double err = fabs(y[j] - exp2((double)x[j])) / exp2((double)x[j]);
            if (err > worst) worst = err, worst_x = x[j];
            if (xs[j] < DT_EXP2_MIN_ARG && ys[j] != 0.0f)
                not_zero++, not_zero_x = xs[j], not_zero_y = ys[j];
            else if (xs[j] >= DT_EXP2_MIN_ARG && ys[j] < 0x1p-126f)
                not_zero++, not_zero_x = xs[j], not_zero_y = ys[j];
        }
    }
    CHECK(worst < 2e-7, "%s exp2: worst relative error %.3g at x = %.9g", form, worst, worst_x);
    CHECK(not_zero == 0,
          "%s exp2: %d results on the wrong side of the flush at 2^%g, e.g. 2^%.9g = %g", form,
          not_zero, (double)DT_EXP2_MIN_ARG, not_zero_x, not_zero_y);
    float x[16] = {0.0f, -INFINITY, INFINITY, NAN, -160.0f, 130.0f, 1.0f, -1.0f,
                   -125.5f, -126.0f, -125.0f, -149.0f, nextafterf(-126.0f, -INFINITY)}, y[16];
    exp2_of(y, x);
    CHECK(y[0] == 1.0f && y[1] == 0.0f && isinf(y[2]) && isnan(y[3]),
          "%s exp2 of 0, -inf, inf, nan: %g %g %g %g", form, y[0], y[1], y[2], y[3]);
    CHECK(y[4] == 0.0f && isinf(y[5]) && y[6] == 2.0f && y[7] == 0.5f,
          "%s exp2 of -160, 130, 1, -1: %g %g %g %g", form, y[4], y[5], y[6], y[7]);
    CHECK(fabs(y[8] / exp2(-125.5) - 1.0) < 2e-7 && y[9] == 0x1p-126f && y[10] == 0x1p-125f &&
              y[11] == 0.0f && y[12] == 0.0f,
          "%s exp2 of -125.5, -126, -125, -149, just below -126: %g %g %g %g %g", form, y[8],
          y[9], y[10], y[11], y[12]);
}
#endif

/* Where both forms build, the AVX2 one gives the AVX-512 one's bits. */
static void check_exp2_forms_agree(void)
{
#if defined(__AVX512F__)
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        float x[16], y[16], z[16];
        for (int j = 0; j < 16; j++) x[j] = rnd_unit() * 160.0f;
        if (i == 0) x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY;
        exp2_512(y, x);
        exp2_256(z, x);
        for (int j = 0; j < 16; j++) bad += memcmp(&y[j], &z[j], sizeof y[j]) != 0;
    }
    CHECK(bad == 0, "AVX2 exp2 differs from the AVX-512 one in %d cases", bad);
#endif
}

int main(void)
{
    check_accuracy();
    check_special_values();
    check_vector_form();
#if defined(__AVX512F__)
    check_exp2("AVX-512", exp2_512);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    check_exp2("AVX2", exp2_256);
#endif
    check_exp2_forms_agree();
    return finish("test_fast_exp");
}
