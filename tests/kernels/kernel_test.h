/*
 * Helpers shared by the kernel tests (on top of tests/check.h): random
 * arrays, and the comparison every test uses: the largest error relative to the
 * largest magnitude of the reference (so a tensor passes or fails as a
 * whole, and elements near zero do not need a tolerance of their own).
 * References are written in the tests themselves, in double.
 */
#ifndef DT_TESTS_KERNEL_TEST_H
#define DT_TESTS_KERNEL_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* uniform in [-1, 1) */
static inline float rnd_unit(void) { return (float)((double)(rnd_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static inline float *rnd_array(size_t n, float scale)
{
    float *x = calloc(n ? n : 1, sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rnd_unit() * scale;
    return x;
}

static inline double *dalloc(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

static inline float *fcopy(const float *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof *y);
    if (n) memcpy(y, x, n * sizeof *y);
    return y;
}

/* max |got - want| / max |want| (absolute error when want is all zero);
 * NaN anywhere in got gives infinity. */
static inline double rel_error(const float *got, const double *want, size_t n)
{
    double max_want = 0.0, max_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        double e = fabs((double)got[i] - want[i]);
        if (e > max_err) max_err = e;
        if (fabs(want[i]) > max_want) max_want = fabs(want[i]);
    }
    return max_want > 0.0 ? max_err / max_want : max_err;
}

/* Counts a failure, described by fmt, when rel_error exceeds tol. */
static inline void check_close_at(const char *file, int line, const float *got, const double *want,
                           size_t n, double tol, const char *fmt, ...)
{
    double err = rel_error(got, want, n);
    if (err <= tol) return;
    if (failures < 30) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "%s:%d: ", file, line);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, ": relative error %.3g > %.3g\n", err, tol);
        va_end(ap);
    }
    failures++;
}

#define CHECK_CLOSE(got, want, n, tol, ...)                                                     \
    check_close_at(__FILE__, __LINE__, (got), (want), (n), (tol), __VA_ARGS__)

static inline int bits_equal(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof *a) == 0;
}

#endif
