/*
 * Rotary position embeddings, rotate-half.
 *   x [rows, ld] (heads x D columns turned), pos [rows]
 * Each position's angles computed once for the sequences and heads that
 * share it. Backward turns by the negative angle: the rotation is
 * orthogonal, so its transpose is its inverse.
 */
#include "kernels/rope.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "kernels/profile.h"
#include "kernels/threads.h"

enum { MAX_HALF = 1024 }; /* heads up to 2048 dimensions */

/* One row's heads turned by its angles' cosines c and sines s [D / 2]. */
static void turn_row(float *x, const float *c, const float *s, int heads, int D)
{
    const int half = D / 2;
    for (int h = 0; h < heads; h++) {
        float *a = x + (size_t)h * D, *b = a + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            const float x1 = a[i], x2 = b[i];
            a[i] = x1 * c[i] - x2 * s[i];
            b[i] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* The angles of position p: cosines and sines (negated for the inverse). */
static void angles(float *c, float *s, int p, const float *inv, int half, int sign)
{
    for (int i = 0; i < half; i++) {
        const float angle = (float)p * inv[i];
        c[i] = cosf(angle);
        s[i] = sign > 0 ? sinf(angle) : -sinf(angle);
    }
}

/* Each position's angles once (the b sequences share them), then every
 * row turned; rows split over the threads, so the bits do not depend on
 * their count. */
static void rope_body(float *x, int ld, const int32_t *pos, int b, int t, int heads, int D,
                      double theta, int sign)
{
    const int half = D / 2;
    float inv[MAX_HALF];
    for (int i = 0; i < half && i < MAX_HALF; i++)
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)D);
    float *table = malloc((size_t)t * D * sizeof *table);
    const int nt = dt_kernels_threads();
    if (!table) { /* no memory for the table: each row's angles as it goes */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int r = 0; r < b * t; r++) {
            float c[MAX_HALF], s[MAX_HALF];
            angles(c, s, pos[r % t], inv, half, sign);
            turn_row(x + (size_t)r * ld, c, s, heads, D);
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int j = 0; j < t; j++)
        angles(table + (size_t)j * D, table + (size_t)j * D + half, pos[j], inv, half, sign);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < b * t; r++) {
        const float *c = table + (size_t)(r % t) * D;
        turn_row(x + (size_t)r * ld, c, c + half, heads, D);
    }
    free(table);
}

/* --profile counts it with the embeddings (a position embedding): 3 FLOPs
 * an element turned, each read and written once. */
void dt_rope(float *x, int ld, const int32_t *pos, int b, int t, int heads, int D,
             double theta, int sign)
{
    const uint64_t t0 = dt_prof_begin();
    rope_body(x, ld, pos, b, t, heads, D, theta, sign);
    const double elems = (double)b * t * heads * D;
    dt_prof_end(DT_PROF_EMBEDDING, t0, 3.0 * elems, 8.0 * elems);
}
