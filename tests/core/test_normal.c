/* The weights' normal numbers (core/normal.h) against libm: Box-Muller on
 * the same uniforms with glibc's log and cos is the reference.
 *   - over 2^24 draws of two streams, the float weights (std 0.02, the
 *     init's) equal the reference's in all but at most 4 (one in millions
 *     sits on a rounding tie of the float), and where one differs, by one
 *     unit in the last place;
 *   - each double within 2e-14 of the reference (libm's cosine takes 2 pi x
 *     rounded, 4.4e-16 off at most, times sqrt(-2 ln u1) up to 8.6; the
 *     numbers' size gives no relative bound near the cosine's zeros),
 *     and the logarithm and the cosine alone within 4e-16 of libm's
 *     (absolute, over the uniforms' range: the cosine's zeros and ln 1 = 0
 *     leave no relative size);
 *   - the uniforms are the stream's top 53 bits times 2^-53, converted
 *     in the vectorizable way bit for bit as by a plain cast;
 *   - a vector loop over a range that starts and ends off any vector's
 *     edge gives the same bits as one number at a time: every layout of
 *     the weights draws the same values.
 *
 *   test_normal */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "core/normal.h"

#define DRAWS (1u << 24)

static double reference(uint64_t s, uint64_t g)
{
    const double u1 = dt_uniform01_at(s, 2 * g) + 0.5 / 9007199254740992.0;
    const double u2 = dt_uniform01_at(s, 2 * g + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* One at a time: a call the compiler keeps out of any vector loop. */
static __attribute__((noinline)) float one(uint64_t s, uint64_t g)
{
    return (float)(0.02 * dt_normal_at(s, g));
}

static void vector_fill(float *out, uint64_t s, uint64_t g0, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = (float)(0.02 * dt_normal_at(s, g0 + i));
}

static void floats_against_libm(uint64_t s, float *buf)
{
    vector_fill(buf, s, 0, DRAWS);
    unsigned differ = 0, far = 0;
    double worst = 0;
    for (uint64_t g = 0; g < DRAWS; g++) {
        const float want = (float)(0.02 * reference(s, g));
        if (buf[g] != want) {
            differ++;
            if (nextafterf(want, buf[g]) != buf[g]) far++;
        }
        if (g % 64 == 0) { /* the doubles, on a sample */
            const double a = dt_normal_at(s, g), b = reference(s, g);
            if (fabs(a - b) > worst) worst = fabs(a - b);
        }
    }
    CHECK(differ <= 4 && far == 0, "stream %llx: %u of %u floats differ from libm's (%u by more "
          "than one unit)", (unsigned long long)s, differ, DRAWS, far);
    CHECK(worst <= 2e-14, "stream %llx: a double %.3g from libm's", (unsigned long long)s, worst);
    printf("stream %llx: %u of %u floats differ from libm's; doubles at most %.3g apart\n",
           (unsigned long long)s, differ, DRAWS, worst);
}

static void parts_against_libm(void)
{
    double worst_log = 0, worst_cos = 0;
    for (int i = 0; i < 1 << 20; i++) {
        const double u = dt_uniform01_at(99, (uint64_t)i) + 0.5 / 9007199254740992.0;
        worst_log = fmax(worst_log, fabs(dt_log_unit(u) - log(u)) / fmax(1.0, fabs(log(u))));
        /* cos(2 pi x) against cos of 2 pi x in double: libm's argument is
         * rounded (up to 4.4e-16 at x near 1), so the allowance is that */
        worst_cos = fmax(worst_cos, fabs(dt_cos_turns(u - 0.5 / 9007199254740992.0) -
                                         cos(6.283185307179586 * (u - 0.5 / 9007199254740992.0))));
    }
    CHECK(dt_log_unit(1.0) == 0.0 && dt_log_unit(0.5) == log(0.5), "ln 1 = %g, ln 0.5 = %.17g",
          dt_log_unit(1.0), dt_log_unit(0.5));
    CHECK(dt_cos_turns(0.0) == 1.0 && dt_cos_turns(0.5) == -1.0 && dt_cos_turns(0.25) == 0.0,
          "cos 0, pi, pi/2 turns: %g %g %g", dt_cos_turns(0.0), dt_cos_turns(0.5),
          dt_cos_turns(0.25));
    CHECK(worst_log <= 4e-16, "ln: %.3g from libm's", worst_log);
    CHECK(worst_cos <= 1e-15, "cos: %.3g from libm's", worst_cos);
    double smallest = dt_log_unit(0.5 / 9007199254740992.0);
    CHECK(fabs(smallest - log(0.5 / 9007199254740992.0)) < 1e-14, "ln 2^-54 = %.17g",
          smallest);
}

static void uniforms_exact(void)
{
    unsigned differ = 0;
    for (uint64_t k = 0; k < 1000000; k++)
        differ += dt_uniform01_at(12345, k) !=
                  (double)(dt_splitmix64_at(12345, k) >> 11) * (1.0 / 9007199254740992.0);
    CHECK(differ == 0, "%u of 1000000 uniforms differ from the top 53 bits times 2^-53", differ);
}

static void vector_is_scalar(float *buf)
{
    const uint64_t s = 0x9E3779B97F4A7C15ull * 7, g0 = 1000003;
    const size_t n = 100003; /* odd start and length: head and tail */
    vector_fill(buf + 3, s, g0, n);
    unsigned differ = 0;
    for (size_t i = 0; i < n; i++) differ += buf[3 + i] != one(s, g0 + i);
    CHECK(differ == 0, "%u of %zu numbers of a vector loop differ from one at a time", differ,
          n);
}

int main(void)
{
    float *buf = malloc(sizeof(float) * (DRAWS + 8));
    if (!buf) return 1;
    floats_against_libm(0x9E3779B97F4A7C15ull, buf);
    floats_against_libm(0xD1B54A32D192ED03ull * 5, buf);
    parts_against_libm();
    uniforms_exact();
    vector_is_scalar(buf);
    free(buf);
    return finish("test_normal");
}
