/* Block-wise quantization against a double reference (int8; packets at
 * 8 and 4 bits further down): each element
 * within half its block's scale (max |x| / 127 / 2) of its value; scales
 * the blocks' max |x| / 127 exactly; a block's largest magnitude exact to
 * rounding; an all-zero block zeros with scale 0; a last block shorter
 * than the others; values of both signs and magnitudes 1e-6 to 1e3. The
 * packets' bf16 unpacking: the bits of unpack followed by a bf16 cast. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "kernels/cast.h"
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

/* Packets (what qwZ and qgZ send) at 8 and 4 bits: the size, the scales
 * at max |x| / Q, each value within half a scale, and unpack_add adding
 * to what is there. */
static void packet(size_t n, size_t block, int bits)
{
    const double qmax = bits == 4 ? 7.0 : 127.0;
    size_t nb = (n + block - 1) / block, values = bits == 4 ? (n + 1) / 2 : n;
    size_t len = dt_quant_packet_bytes(n, block, bits), at = (values + 3) / 4 * 4;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *acc = malloc(n * sizeof *acc);
    float *buf = malloc(len + 4);
    unsigned seed = 11;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double u = (double)(seed >> 8) / 16777216.0 - 0.5;
        x[i] = (float)(u * pow(10.0, (double)(i / block % 5) - 2));
        acc[i] = (float)i;
    }
    CHECK(len == at + nb * 4 && len % 4 == 0, "%d-bit packet of %zu: %zu bytes, want %zu", bits,
          n, len, at + nb * 4);
    dt_quant_pack(buf, x, n, block, bits);
    dt_quant_unpack(y, buf, n, block, bits);
    dt_quant_unpack_add(acc, buf, n, block, bits);
    uint16_t *h = malloc(n * sizeof *h), *want = malloc(n * sizeof *want);
    dt_quant_unpack_bf16(h, buf, n, block, bits);
    dt_cast_f32_to_bf16(want, y, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != want[i];
    CHECK(bad == 0, "%d bits: unpack_bf16 differs from unpack then a bf16 cast at %zu of %zu",
          bits, bad, n);
    free(h), free(want);
    const float *sc = (const float *)((const char *)buf + at);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, hi = lo + block < n ? lo + block : n;
        double amax = 0;
        for (size_t i = lo; i < hi; i++) amax = fmax(amax, fabs((double)x[i]));
        CHECK(fabs(sc[b] - amax / qmax) <= 1e-6 * amax / qmax, "%d bits, block %zu: scale %g, "
              "want %g", bits, b, sc[b], amax / qmax);
        for (size_t i = lo; i < hi; i++) {
            CHECK(fabs((double)y[i] - x[i]) <= 0.5 * sc[b] * (1 + 1e-5) + 1e-30,
                  "%d bits: element %zu: %g from %g (scale %g)", bits, i, y[i], x[i], sc[b]);
            CHECK(acc[i] == (float)i + y[i], "%d bits: unpack_add at %zu: %g, want %g", bits, i,
                  acc[i], (float)i + y[i]);
        }
    }
    free(x), free(y), free(acc), free(buf);
}

int main(void)
{
    run(10 * 256 + 77, 256);
    run(4096, 64);
    run(1000, 1000 / 3);
    packet(10 * 256 + 77, 256, 8);
    packet(10 * 256 + 77, 256, 4);
    packet(1001, 64, 4); /* an odd count: the last byte's high nibble unused */
    return finish("test_quant");
}
