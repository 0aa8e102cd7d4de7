/* Block-wise int8 quantization (ZeRO++'s qwZ): each block of `block`
 * values (the last one shorter) is sent as int8 values q with one fp32
 * scale, x ~ q * scale, scale = max |x| / 127 over the block (0 for an
 * all-zero block), q = round-to-nearest(x / scale). The error of an
 * element is at most scale / 2: 1/254 of its block's largest magnitude.
 *   x, out [n]; q [n]; scales [ceil(n / block)]. */
#ifndef DT_KERNELS_QUANT_H
#define DT_KERNELS_QUANT_H

#include <stddef.h>
#include <stdint.h>

size_t dt_quant_blocks(size_t n, size_t block);
void dt_quant_int8(int8_t *q, float *scales, const float *x, size_t n, size_t block);
void dt_dequant_int8(float *out, const int8_t *q, const float *scales, size_t n, size_t block);

#endif
