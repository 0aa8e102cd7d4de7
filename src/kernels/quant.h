/* Block-wise quantization (ZeRO++'s qwZ and qgZ): each block of `block`
 * values (the last one shorter) is sent as signed integers q of `bits`
 * bits (8, or 4) with one fp32 scale, x ~ q * scale, scale = max |x| / Q
 * over the block with Q = 2^(bits-1) - 1 (127, or 7; 0 for an all-zero
 * block), q = round-to-nearest(x / scale). The error of an element is at
 * most scale / 2: 1/254 (int8) or 1/14 (int4) of its block's largest
 * magnitude.
 *   x, out [n]; q [n]; scales [ceil(n / block)].
 * A packet is what goes on the wire: the n values (int4: two to a byte,
 * the even element in the low nibble), then the block scales from the
 * next 4-byte boundary; its size is a multiple of 4, so packets laid end
 * to end keep their scales aligned. */
#ifndef DT_KERNELS_QUANT_H
#define DT_KERNELS_QUANT_H

#include <stddef.h>
#include <stdint.h>

size_t dt_quant_blocks(size_t n, size_t block);
void dt_quant_int8(int8_t *q, float *scales, const float *x, size_t n, size_t block);
void dt_dequant_int8(float *out, const int8_t *q, const float *scales, size_t n, size_t block);

size_t dt_quant_packet_bytes(size_t n, size_t block, int bits);
void dt_quant_pack(void *packet, const float *x, size_t n, size_t block, int bits);
void dt_quant_unpack(float *out, const void *packet, size_t n, size_t block, int bits);
/* acc[i] += the packet's value i: a reduction's step without a copy. */
void dt_quant_unpack_add(float *acc, const void *packet, size_t n, size_t block, int bits);
/* The packet's values rounded to bf16 (nearest even): qwZ's gathers into
 * a bf16 window, without an fp32 copy. */
void dt_quant_unpack_bf16(uint16_t *out, const void *packet, size_t n, size_t block, int bits);

#endif
