/*
 * Element-wise reductions.
 *
 * These loops run on every byte an all-reduce moves, so each (dtype, op)
 * pair gets its own plain loop that the compiler vectorises; the switch
 * sits outside the loop. The pointers are not restrict because dst may
 * equal a or b: GCC then versions each loop with a run-time overlap check
 * that accepts dst == a (a dependence distance of zero), so the in-place
 * case takes the vector path too.
 *
 * The 16-bit conversions live in core/half.h (shared with the kernels'
 * casts); they are inline, branch-free bit manipulation, so they vectorise
 * inside these loops.
 */
#include "comm/reduce_ops.h"

#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* ---- element combiners -------------------------------------------------- */

/* Floating max/min propagate NaN (a NaN gradient must not be hidden by a
 * reduction); written as selects so that they vectorise. */
#define COMBINE_SUM(x, y) ((x) + (y))
#define COMBINE_PROD(x, y) ((x) * (y))
#define COMBINE_FMAX(x, y) (((x) != (x) || (x) > (y)) ? (x) : (y))
#define COMBINE_FMIN(x, y) (((x) != (x) || (x) < (y)) ? (x) : (y))
#define COMBINE_IMAX(x, y) ((x) > (y) ? (x) : (y))
#define COMBINE_IMIN(x, y) ((x) < (y) ? (x) : (y))
#define COMBINE_AND(x, y) ((x) & (y))
#define COMBINE_OR(x, y) ((x) | (y))
#define COMBINE_XOR(x, y) ((x) ^ (y))

/* One loop over native elements. */
#define DEFINE_LOOP(name, T, COMBINE)                                         \
    static void name(T *dst, const T *a, const T *b, size_t n)                \
    {                                                                         \
        for (size_t i = 0; i < n; i++) dst[i] = (T)COMBINE(a[i], b[i]);       \
    }

/* bf16 loops work on pairs: two neighbouring bf16 values are the halves of
 * one 32-bit word, and each half becomes an f32 by a shift or a mask
 * inside the word. Every value thus stays in its vector lane, where an
 * element-wise loop makes the compiler widen, narrow and permute across
 * lanes (the pairs run 1.6x faster). Each half goes back where it came
 * from, so byte order does not matter. */
#define DEFINE_LOOP_BF16(name, COMBINE)                                       \
    static void name(uint16_t *dst, const uint16_t *a, const uint16_t *b,     \
                     size_t n)                                                \
    {                                                                         \
        for (size_t p = 0; p < n / 2; p++) {                                  \
            uint32_t wa, wb;                                                  \
            memcpy(&wa, a + 2 * p, sizeof wa);                                \
            memcpy(&wb, b + 2 * p, sizeof wb);                                \
            float xl = dt_bits_as_f32(wa << 16), yl = dt_bits_as_f32(wb << 16); \
            float xh = dt_bits_as_f32(wa & 0xffff0000u);                      \
            float yh = dt_bits_as_f32(wb & 0xffff0000u);                      \
            uint32_t lo = dt_bf16_rounded_bits(COMBINE(xl, yl));              \
            uint32_t hi = dt_bf16_rounded_bits(COMBINE(xh, yh));              \
            uint32_t w = (hi & 0xffff0000u) | (lo >> 16);                     \
            memcpy(dst + 2 * p, &w, sizeof w);                                \
        }                                                                     \
        if (n % 2) {                                                          \
            float x = dt_bf16_to_f32(a[n - 1]), y = dt_bf16_to_f32(b[n - 1]); \
            dst[n - 1] = dt_f32_to_bf16(COMBINE(x, y));                       \
        }                                                                     \
    }

DEFINE_LOOP(sum_f32, float, COMBINE_SUM)
DEFINE_LOOP(prod_f32, float, COMBINE_PROD)
DEFINE_LOOP(max_f32, float, COMBINE_FMAX)
DEFINE_LOOP(min_f32, float, COMBINE_FMIN)

DEFINE_LOOP(sum_f64, double, COMBINE_SUM)
DEFINE_LOOP(prod_f64, double, COMBINE_PROD)
DEFINE_LOOP(max_f64, double, COMBINE_FMAX)
DEFINE_LOOP(min_f64, double, COMBINE_FMIN)

DEFINE_LOOP_BF16(sum_bf16, COMBINE_SUM)
DEFINE_LOOP_BF16(prod_bf16, COMBINE_PROD)
DEFINE_LOOP_BF16(max_bf16, COMBINE_FMAX)
DEFINE_LOOP_BF16(min_bf16, COMBINE_FMIN)

/* Signed sums and products run on the unsigned type of the same width:
 * the low bits of a two's complement result do not depend on signedness,
 * and unsigned arithmetic wraps where signed overflow would be undefined.
 * (Reading an int32_t through a uint32_t lvalue is allowed aliasing.) */
DEFINE_LOOP(sum_u32, uint32_t, COMBINE_SUM)
DEFINE_LOOP(prod_u32, uint32_t, COMBINE_PROD)
DEFINE_LOOP(max_i32, int32_t, COMBINE_IMAX)
DEFINE_LOOP(min_i32, int32_t, COMBINE_IMIN)

DEFINE_LOOP(sum_u64, uint64_t, COMBINE_SUM)
DEFINE_LOOP(prod_u64, uint64_t, COMBINE_PROD)
DEFINE_LOOP(max_i64, int64_t, COMBINE_IMAX)
DEFINE_LOOP(min_i64, int64_t, COMBINE_IMIN)

/* uint8_t promotes to int, where 255 * 255 cannot overflow; the cast back
 * wraps modulo 256. */
DEFINE_LOOP(sum_u8, uint8_t, COMBINE_SUM)
DEFINE_LOOP(prod_u8, uint8_t, COMBINE_PROD)
DEFINE_LOOP(max_u8, uint8_t, COMBINE_IMAX)
DEFINE_LOOP(min_u8, uint8_t, COMBINE_IMIN)

/* The bitwise ops do not care about signedness. */
DEFINE_LOOP(and_u32, uint32_t, COMBINE_AND)
DEFINE_LOOP(or_u32, uint32_t, COMBINE_OR)
DEFINE_LOOP(xor_u32, uint32_t, COMBINE_XOR)
DEFINE_LOOP(and_u64, uint64_t, COMBINE_AND)
DEFINE_LOOP(or_u64, uint64_t, COMBINE_OR)
DEFINE_LOOP(xor_u64, uint64_t, COMBINE_XOR)
DEFINE_LOOP(and_u8, uint8_t, COMBINE_AND)
DEFINE_LOOP(or_u8, uint8_t, COMBINE_OR)
DEFINE_LOOP(xor_u8, uint8_t, COMBINE_XOR)

/* ---- dispatch ----------------------------------------------------------- */

/* One switch per dtype picks the loop; AVG reduces as SUM. The void
 * pointers convert to the loop's element pointers implicitly. The bitwise
 * ops are the integer types' (validated before any call reaches here). */
#define DEFINE_DISPATCH(name, sum, prod, max, min, BITWISE)                   \
    static void name(dt_op op, void *dst, const void *a, const void *b,       \
                     size_t n)                                                \
    {                                                                         \
        switch (op) {                                                         \
        case DT_SUM:                                                          \
        case DT_AVG: sum(dst, a, b, n); break;                                \
        case DT_PROD: prod(dst, a, b, n); break;                              \
        case DT_MAX: max(dst, a, b, n); break;                                \
        case DT_MIN: min(dst, a, b, n); break;                                \
            BITWISE                                                           \
        default: break;                                                       \
        }                                                                     \
    }
#define NO_BITWISE
#define BITWISE(and, or, xor)                                                 \
    case DT_BAND: and(dst, a, b, n); break;                                   \
    case DT_BOR: or(dst, a, b, n); break;                                     \
    case DT_BXOR: xor(dst, a, b, n); break;

DEFINE_DISPATCH(reduce_f32, sum_f32, prod_f32, max_f32, min_f32, NO_BITWISE)
DEFINE_DISPATCH(reduce_f64, sum_f64, prod_f64, max_f64, min_f64, NO_BITWISE)
DEFINE_DISPATCH(reduce_bf16, sum_bf16, prod_bf16, max_bf16, min_bf16, NO_BITWISE)
DEFINE_DISPATCH(reduce_i32, sum_u32, prod_u32, max_i32, min_i32,
                BITWISE(and_u32, or_u32, xor_u32))
DEFINE_DISPATCH(reduce_i64, sum_u64, prod_u64, max_i64, min_i64,
                BITWISE(and_u64, or_u64, xor_u64))
DEFINE_DISPATCH(reduce_u8, sum_u8, prod_u8, max_u8, min_u8, BITWISE(and_u8, or_u8, xor_u8))

/* ---- f16 ---------------------------------------------------------------- */

/* f16 goes through f32 in chunks: widen both operands into small buffers
 * on the stack, combine with the f32 loops, narrow back. The widening and
 * narrowing then use the CPU's conversion instructions where the build
 * allows them (about 5x faster than the bit manipulation, which
 * vectorises but needs many instructions per element); they round to
 * nearest even and keep subnormals whatever the FTZ/DAZ flags say, like
 * the portable code that handles the tails. Reading a whole chunk before
 * writing it also makes dst == a or b safe. */
#define F16_CHUNK 128 /* small: larger chunks defeat the prefetchers on big buffers */

static void widen_f16(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(in + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
#endif
    for (; i < n; i++) out[i] = dt_f16_to_f32(in[i]);
}

static void narrow_f16(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) out[i] = dt_f32_to_f16(in[i]);
}

static void reduce_f16(dt_op op, uint16_t *dst, const uint16_t *a, const uint16_t *b, size_t n)
{
    float x[F16_CHUNK], y[F16_CHUNK];
    for (size_t off = 0; off < n; off += F16_CHUNK) {
        size_t m = n - off < F16_CHUNK ? n - off : F16_CHUNK;
        widen_f16(x, a + off, m);
        widen_f16(y, b + off, m);
        reduce_f32(op, x, x, y, m);
        narrow_f16(dst + off, x, m);
    }
}

void dt_reduce_elems(dt_dtype t, dt_op op, void *dst, const void *a, const void *b, size_t n)
{
    switch (t) {
    case DT_F32: reduce_f32(op, dst, a, b, n); break;
    case DT_F64: reduce_f64(op, dst, a, b, n); break;
    case DT_BF16: reduce_bf16(op, dst, a, b, n); break;
    case DT_F16: reduce_f16(op, dst, a, b, n); break;
    case DT_I32: reduce_i32(op, dst, a, b, n); break;
    case DT_I64: reduce_i64(op, dst, a, b, n); break;
    case DT_U8: reduce_u8(op, dst, a, b, n); break;
    default: break;
    }
}

/* f32 sums with streaming stores: the result goes to memory without
 * first reading its lines into the cache (no read-for-ownership), which
 * makes a large reduction about 1.4x faster when its output is not read
 * again soon. The bits are those of sum_f32: one rounding per element. */
static int sum_f32_stream(float *dst, const float *a, const float *b, size_t n)
{
#if defined(__AVX512F__)
    size_t i = 0;
    while (i < n && ((uintptr_t)(dst + i) & 63)) dst[i] = a[i] + b[i], i++;
    for (; i + 16 <= n; i += 16)
        _mm512_stream_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    for (; i < n; i++) dst[i] = a[i] + b[i];
    _mm_sfence(); /* streaming stores are weakly ordered: done before we say so */
    return 1;
#else
    (void)dst, (void)a, (void)b, (void)n;
    return 0;
#endif
}

void dt_reduce_elems_stream(dt_dtype t, dt_op op, void *dst, const void *a, const void *b,
                            size_t n)
{
    if (t == DT_F32 && (op == DT_SUM || op == DT_AVG) && sum_f32_stream(dst, a, b, n)) return;
    dt_reduce_elems(t, op, dst, a, b, n);
}

void dt_copy_stream(void *dst, const void *src, size_t bytes)
{
#if defined(__AVX512F__)
    char *d = dst;
    const char *s = src;
    size_t i = 0;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    for (i = head; i + 64 <= bytes; i += 64)
        _mm512_stream_si512((__m512i *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
    memcpy(d + i, s + i, bytes - i);
    _mm_sfence();
#else
    memcpy(dst, src, bytes);
#endif
}

/* ---- average ------------------------------------------------------------ */

/* Division rather than multiplication by 1/divisor: the quotient is then
 * correctly rounded, as a serial x / p would be. */
#define DEFINE_DIV(name, T, D)                                                \
    static void name(T *x, size_t n, D d)                                     \
    {                                                                         \
        for (size_t i = 0; i < n; i++) x[i] = (T)(x[i] / d);                  \
    }

#define DEFINE_DIV16(name, TO_F32, FROM_F32)                                  \
    static void name(uint16_t *x, size_t n, float d)                          \
    {                                                                         \
        for (size_t i = 0; i < n; i++) x[i] = FROM_F32(TO_F32(x[i]) / d);     \
    }

DEFINE_DIV(div_f32, float, float)
DEFINE_DIV(div_f64, double, double)
DEFINE_DIV(div_i32, int32_t, int32_t)
DEFINE_DIV(div_i64, int64_t, int64_t)
DEFINE_DIV(div_u8, uint8_t, unsigned)
DEFINE_DIV16(div_bf16, dt_bf16_to_f32, dt_f32_to_bf16)
DEFINE_DIV16(div_f16, dt_f16_to_f32, dt_f32_to_f16)

/* A divisor below 2 leaves x as it is (one rank averages to itself). */
void dt_reduce_finish_avg(dt_dtype t, void *x, size_t n, int divisor)
{
    if (divisor < 2) return;
    switch (t) {
    case DT_F32: div_f32(x, n, (float)divisor); break;
    case DT_F64: div_f64(x, n, (double)divisor); break;
    case DT_BF16: div_bf16(x, n, (float)divisor); break;
    case DT_F16: div_f16(x, n, (float)divisor); break;
    case DT_I32: div_i32(x, n, (int32_t)divisor); break;
    case DT_I64: div_i64(x, n, (int64_t)divisor); break;
    case DT_U8: div_u8(x, n, (unsigned)divisor); break;
    default: break;
    }
}
