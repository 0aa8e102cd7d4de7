/* Block-wise int8 quantization against a double reference: each element
 * within half its block's scale (max |x| / 127 / 2) of its value; scales
 * the blocks' max |x| / 127 exactly; a block's largest magnitude exact to
 * rounding; an all-zero block zeros with scale 0; a last block shorter
 * than the others; values of both signs and magnitudes 1e-6 to 1e3. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "kernels/quant.h"

static void run(size_t n, size_t block)
{
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    int8_t *q = malloc(n);
    size_t nb = dt_quant_blocks(n, block);
    float *sc = malloc(nb * sizeof *sc);
    unsigned seed = 7;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double u = (double)(seed >> 8) / 16777216.0 - 0.5;
        size_t b = i / block;
        x[i] = (float)(u * pow(10.0, (double)(b % 10) - 6.0)); /* 1e-6 .. 1e3 by block */
        if (b == 1) x[i] = 0.0f;                                /* an all-zero block */
    }
    dt_quant_int8(q, sc, x, n, block);
    dt_dequant_int8(y, q, sc, n, block);
    CHECK(nb == (n + block - 1) / block, "%zu blocks of %zu for %zu", nb, block, n);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, hi = lo + block < n ? lo + block : n;
        double amax = 0;
        for (size_t i = lo; i < hi; i++) amax = fmax(amax, fabs((double)x[i]));
        CHECK(fabs(sc[b] - amax / 127.0) <= 1e-6 * amax / 127.0, "block %zu: scale %g, "
              "max/127 %g", b, sc[b], amax / 127.0);
        for (size_t i = lo; i < hi; i++)
            CHECK(fabs((double)y[i] - x[i]) <= 0.5 * sc[b] * (1 + 1e-5) + 1e-30,
                  "n %zu block %zu: element %zu: %g from %g (scale %g)", n, block, i, y[i],
                  x[i], sc[b]);
    }
    CHECK(sc[1] == 0.0f && y[block] == 0.0f, "an all-zero block: scale 0, zeros back");
    free(x), free(y), free(q), free(sc);
}

int main(void)
{
    run(10 * 256 + 77, 256);
    run(4096, 64);
    run(1000, 1000 / 3);
    return finish("test_quant");
}
