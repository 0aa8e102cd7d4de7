/* bf16 <-> fp32 over arrays (round to nearest even, NaN kept quiet). */
#ifndef DT_KERNELS_CAST_H
#define DT_KERNELS_CAST_H

#include <stddef.h>
#include <stdint.h>

void dt_cast_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void dt_cast_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void dt_cast_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void dt_cast_f32_to_f16(uint16_t *dst, const float *src, size_t n);

#endif
