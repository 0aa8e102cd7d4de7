/*
 * Array casts between fp32 and the 16-bit formats, element by element with
 * the scalar conversions of core/half.h (round to nearest even, NaN kept
 * quiet, subnormals kept). The loops vectorise; big arrays are split across
 * the kernel threads, small ones are not worth waking them for.
 *   src, dst [n]
 */
#include "kernels/cast.h"

#include "core/half.h"
#include "kernels/threads.h"

#define PARALLEL_MIN_ELEMS (1 << 16)

/* One element-wise loop per direction, each the scalar conversion. */
#define DEFINE_CAST(name, Dst, Src, convert)                                     \
    void name(Dst *dst, const Src *src, size_t n)                                \
    {                                                                            \
        int nt = n >= PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;             \
        _Pragma("omp parallel for simd schedule(static) num_threads(nt)")        \
        for (size_t i = 0; i < n; i++) dst[i] = convert(src[i]);                 \
    }

DEFINE_CAST(dt_cast_f32_to_bf16, uint16_t, float, dt_f32_to_bf16)
DEFINE_CAST(dt_cast_bf16_to_f32, float, uint16_t, dt_bf16_to_f32)
DEFINE_CAST(dt_cast_f16_to_f32, float, uint16_t, dt_f16_to_f32)
DEFINE_CAST(dt_cast_f32_to_f16, uint16_t, float, dt_f32_to_f16)
