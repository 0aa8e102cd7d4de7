/*
 * dt_reduce_elems, dt_reduce_finish_avg and the 16-bit float conversions,
 * checked against references written independently of the library: 16-bit
 * values decoded with ldexp, rounding found by a search over the ordered
 * bit patterns, arithmetic done in double (whose rounding to f32 is exact
 * for one + or *) or in wider integers.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/reduce_ops.h"


static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- reference 16-bit formats ---------------------------------------- */

typedef struct {
    const char *name;
    int mant_bits; /* stored mantissa bits */
    int exp_bits;
    uint16_t inf;  /* bit pattern of +inf */
} fmt16;

static const fmt16 FMT_BF16 = {"bf16", 7, 8, 0x7f80};
static const fmt16 FMT_F16 = {"f16", 10, 5, 0x7c00};

/* Value of a non-NaN pattern from the IEEE definition. The +inf pattern
 * decodes to the next power of two instead (what the largest finite value
 * plus one ulp would be), which makes overflow rounding fall out of the
 * nearest-value search below. */
static double ref_decode(const fmt16 *f, uint16_t h)
{
    int bias = (1 << (f->exp_bits - 1)) - 1;
    unsigned mag = h & 0x7fffu;
    unsigned e = mag >> f->mant_bits;
    unsigned m = mag & ((1u << f->mant_bits) - 1);
    double v = e == 0 ? ldexp(m, 1 - bias - f->mant_bits)
                      : ldexp(m + (1u << f->mant_bits), (int)e - bias - f->mant_bits);
    return (h & 0x8000u) ? -v : v;
}

static int ref_is_nan(const fmt16 *f, uint16_t h) { return (h & 0x7fffu) > f->inf; }

/* Nearest pattern to v (not NaN), ties to the even pattern: binary search
 * for the largest magnitude pattern not above |v|, then compare with its
 * successor. */
static uint16_t ref_encode(const fmt16 *f, double v)
{
    uint16_t sign = signbit(v) ? 0x8000u : 0;
    double a = fabs(v);
    if (isinf(a)) return sign | f->inf;
    unsigned lo = 0, hi = f->inf; /* decode(lo) <= a, invariant */
    if (a >= ref_decode(f, f->inf)) return sign | f->inf;
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (ref_decode(f, (uint16_t)mid) <= a) lo = mid;
        else hi = mid;
    }
    double dlo = a - ref_decode(f, (uint16_t)lo);
    double dhi = ref_decode(f, (uint16_t)hi) - a;
    unsigned r = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    return (uint16_t)(sign | r);
}

/* ---- conversions -------------------------------------------------------- */

static void check_f16_exhaustive(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_f16(f);
        if (ref_is_nan(&FMT_F16, (uint16_t)h)) {
            uint32_t want_bits = (h & 0x8000u) << 16 | 0x7fc00000u | (h & 0x3ffu) << 13;
            CHECK(f32_bits(f) == want_bits, "f16 NaN %04x widened to %08x, want a quiet %08x", h,
                  f32_bits(f), want_bits);
            /* payload kept, quiet bit set */
            CHECK(back == (h | 0x0200u), "f16 NaN %04x came back as %04x", h, back);
            continue;
        }
        double want = ref_decode(&FMT_F16, (uint16_t)h);
        if ((h & 0x7fffu) == 0x7c00u) want = (h & 0x8000u) ? -INFINITY : INFINITY;
        CHECK((double)f == want && !!signbit(f) == !!signbit(want),
              "f16 %04x widened to %a, want %a", h, f, want);
        CHECK(back == h, "f16 %04x round-tripped to %04x", h, back);
    }
}

static void check_bf16_exhaustive(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_bf16_to_f32((uint16_t)h);
        CHECK(f32_bits(f) == h << 16, "bf16 %04x widened to %08x", h, f32_bits(f));
        uint16_t back = dt_f32_to_bf16(f);
        uint16_t want = ref_is_nan(&FMT_BF16, (uint16_t)h) ? (uint16_t)(h | 0x40u) : (uint16_t)h;
        CHECK(back == want, "bf16 %04x round-tripped to %04x", h, back);
    }
}

static uint16_t lib_encode(const fmt16 *f, float x)
{
    return f == &FMT_F16 ? dt_f32_to_f16(x) : dt_f32_to_bf16(x);
}

/* One f32 through the library's narrowing against the reference. */
static void check_narrow(const fmt16 *f, float x)
{
    uint16_t got = lib_encode(f, x);
    if (isnan(x)) {
        CHECK(ref_is_nan(f, got), "%s(%08x NaN) gave %04x", f->name, f32_bits(x), got);
        return;
    }
    uint16_t want = ref_encode(f, x);
    CHECK(got == want, "%s(%a = %08x) gave %04x, want %04x", f->name, x, f32_bits(x), got, want);
}

/* Every midpoint between neighbouring patterns (the ties), and the floats
 * just either side of it: the places where rounding goes wrong. */
static void check_narrow_ties(const fmt16 *f)
{
    for (unsigned p = 0; p < f->inf; p++) {
        double mid = (ref_decode(f, (uint16_t)p) + ref_decode(f, (uint16_t)(p + 1))) / 2;
        float x = (float)mid;
        CHECK((double)x == mid, "%s midpoint %u not exact in f32", f->name, p);
        for (int s = 0; s < 2; s++) {
            float y = s ? -x : x;
            check_narrow(f, y);
            check_narrow(f, nextafterf(y, INFINITY));
            check_narrow(f, nextafterf(y, -INFINITY));
        }
    }
}

/* Random bit patterns cover every exponent; scaled values concentrate on
 * the 16-bit format's own range, its subnormals and its overflow edge. */
static void check_narrow_random(const fmt16 *f)
{
    for (int i = 0; i < 1000000; i++) {
        check_narrow(f, bits_f32((uint32_t)rnd_u64()));
        double m = (double)(rnd_u64() >> 11) * 0x1p-53;
        int e = (int)(rnd_u64() % 48) - 30;
        check_narrow(f, (float)ldexp(rnd_u64() & 1 ? -m : m, e));
    }
    check_narrow(f, 0.0f);
    check_narrow(f, -0.0f);
    check_narrow(f, INFINITY);
    check_narrow(f, -INFINITY);
    check_narrow(f, NAN);
    check_narrow(f, 65504.0f);
    check_narrow(f, 65519.99f);
    check_narrow(f, 65520.0f);
    check_narrow(f, 0x1p-25f);
    check_narrow(f, 0x1.000002p-25f);
    check_narrow(f, 0x1p-149f);
    check_narrow(f, 3.4028235e38f);
}

#ifdef __FLT16_MAX__
/* The compiler's own _Float16 conversions as a second, unrelated oracle. */
static void check_f16_against_compiler(void)
{
    for (int i = 0; i < 2000000; i++) {
        float x = bits_f32((uint32_t)rnd_u64());
        if (i & 1) x = (float)ldexp((double)(rnd_u64() >> 11) * 0x1p-53, (int)(rnd_u64() % 48) - 30);
        if (isnan(x)) continue;
        _Float16 h = (_Float16)x;
        uint16_t want;
        memcpy(&want, &h, sizeof want);
        uint16_t got = dt_f32_to_f16(x);
        CHECK(got == want, "f16(%a) gave %04x, the compiler says %04x", x, got, want);
    }
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t bits = (uint16_t)b;
        if (ref_is_nan(&FMT_F16, bits)) continue;
        _Float16 h;
        memcpy(&h, &bits, sizeof h);
        float want = (float)h;
        CHECK(f32_bits(dt_f16_to_f32(bits)) == f32_bits(want), "f16 %04x widening", b);
    }
}
#endif

/* ---- reductions: reference ---------------------------------------------- */

static int is_float_type(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_BF16 || t == DT_F16; }

/* The bitwise ops are the integer types' alone (the collectives refuse the
 * others). */
static int is_bitwise(dt_op op) { return op == DT_BAND || op == DT_BOR || op == DT_BXOR; }

/* Floating reference in double: NaN-propagating max/min, and + and * of
 * two f32 values, which round correctly to f32 through double. */
static double ref_fcombine(dt_op op, double x, double y)
{
    switch (op) {
    case DT_SUM:
    case DT_AVG: return x + y;
    case DT_PROD: return x * y;
    case DT_MAX: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
    case DT_MIN: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
    default: return NAN;
    }
}

/* Integer reference: exact, then wrapped to the type's width. */
static int64_t ref_icombine(dt_op op, int64_t x, int64_t y, int bits)
{
    unsigned __int128 r;
    switch (op) {
    case DT_SUM:
    case DT_AVG: r = (unsigned __int128)((__int128)x + y); break;
    case DT_PROD: r = (unsigned __int128)((__int128)x * y); break;
    case DT_MAX: return x > y ? x : y;
    case DT_MIN: return x < y ? x : y;
    case DT_BAND: r = (unsigned __int128)(uint64_t)(x & y); break;
    case DT_BOR: r = (unsigned __int128)(uint64_t)(x | y); break;
    case DT_BXOR: r = (unsigned __int128)(uint64_t)(x ^ y); break;
    default: return 0;
    }
    uint64_t low = (uint64_t)r;
    if (bits == 64) return (int64_t)low;
    uint64_t mask = (1ull << bits) - 1;
    low &= mask;
    /* sign-extend for the signed types (i32); u8 stays non-negative */
    if (bits == 32 && (low >> 31)) return (int64_t)low - (int64_t)(1ull << 32);
    return (int64_t)low;
}

static double load_float(dt_dtype t, const void *p, size_t i)
{
    switch (t) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_BF16: {
        uint16_t h = ((const uint16_t *)p)[i];
        return ref_is_nan(&FMT_BF16, h) ? NAN
               : (h & 0x7fffu) == 0x7f80u ? ((h & 0x8000u) ? -INFINITY : INFINITY)
                                           : ref_decode(&FMT_BF16, h);
    }
    case DT_F16: {
        uint16_t h = ((const uint16_t *)p)[i];
        return ref_is_nan(&FMT_F16, h) ? NAN
               : (h & 0x7fffu) == 0x7c00u ? ((h & 0x8000u) ? -INFINITY : INFINITY)
                                           : ref_decode(&FMT_F16, h);
    }
    default: return NAN;
    }
}

static int64_t load_int(dt_dtype t, const void *p, size_t i)
{
    switch (t) {
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I64: return ((const int64_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

static int int_bits(dt_dtype t) { return t == DT_I32 ? 32 : t == DT_I64 ? 64 : 8; }

/* Does got[i] equal the reference result r (a double holding the exact
 * value the combine must round)? NaN matches any NaN; max/min may return
 * either zero for +0 vs -0; otherwise the bits must match. */
static int float_matches(dt_dtype t, dt_op op, const void *got, size_t i, double r)
{
    double g = load_float(t, got, i);
    if (isnan(r) || isnan(g)) return isnan(r) && isnan(g);
    if (op == DT_MAX || op == DT_MIN) return g == r;
    float rf = (float)r; /* the f32 result the 16-bit types then round */
    switch (t) {
    case DT_F32: return f32_bits((float)g) == f32_bits(rf);
    case DT_F64: return memcmp(&g, &r, sizeof g) == 0;
    case DT_BF16: return ((const uint16_t *)got)[i] == ref_encode(&FMT_BF16, rf);
    case DT_F16: return ((const uint16_t *)got)[i] == ref_encode(&FMT_F16, rf);
    default: return 0;
    }
}

/* ---- reductions: inputs ------------------------------------------------- */

/* Mostly ordinary values, with special ones sprinkled in so that NaN, inf,
 * zeros of both signs and subnormals meet every op. */
static void fill_float(dt_dtype t, void *p, size_t n)
{
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f,
                                     65504.0f, 1.0f, -1.0f};
    for (size_t i = 0; i < n; i++) {
        float v = (float)((double)(int64_t)(rnd_u64() % 2000001) - 1000000.0) / 1024.0f;
        if (rnd_u64() % 8 == 0) v = specials[rnd_u64() % (sizeof specials / sizeof specials[0])];
        switch (t) {
        case DT_F32: ((float *)p)[i] = rnd_u64() % 4 == 0 ? bits_f32((uint32_t)rnd_u64()) : v; break;
        case DT_F64: ((double *)p)[i] = rnd_u64() % 4 == 0 ? (double)bits_f32((uint32_t)rnd_u64()) * 1e10 : v; break;
        case DT_BF16: ((uint16_t *)p)[i] = (uint16_t)(rnd_u64() % 2 ? rnd_u64() : f32_bits(v) >> 16); break;
        case DT_F16:
            ((uint16_t *)p)[i] = (uint16_t)(rnd_u64() % 2 || isnan(v) ? rnd_u64() : ref_encode(&FMT_F16, v / 64));
            break;
        default: break;
        }
    }
}

/* Full-range random integers overflow on every sum and product; small
 * ones (half of them) keep products meaningful. */
static void fill_int(dt_dtype t, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd_u64();
        if (rnd_u64() % 2) r = (uint64_t)((int64_t)(rnd_u64() % 2001) - 1000);
        switch (t) {
        case DT_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)r; break;
        case DT_I64: ((int64_t *)p)[i] = (int64_t)r; break;
        case DT_U8: ((uint8_t *)p)[i] = (uint8_t)r; break;
        default: break;
        }
    }
}

static void fill(dt_dtype t, void *p, size_t n)
{
    if (is_float_type(t)) fill_float(t, p, n);
    else fill_int(t, p, n);
}

/* ---- reductions: the checks --------------------------------------------- */

enum { OUT_OF_PLACE, DST_IS_A, DST_IS_B, ALL_SAME, ALIAS_MODES };
static const char *alias_name[] = {"out of place", "dst == a", "dst == b", "dst == a == b"};

static void check_case(dt_dtype t, dt_op op, size_t n, int alias)
{
    size_t esz = dt_dtype_size(t);
    size_t bytes = n * esz + 1; /* +1: never malloc(0) */
    char *a = malloc(bytes), *b = malloc(bytes), *d = malloc(bytes);
    char *a0 = malloc(bytes), *b0 = malloc(bytes);
    fill(t, a, n);
    fill(t, b, n);
    if (alias == ALL_SAME) memcpy(b, a, n * esz);
    memcpy(a0, a, n * esz);
    memcpy(b0, b, n * esz);
    memset(d, 0x5a, bytes);
    char *dst = alias == DST_IS_A || alias == ALL_SAME ? a : alias == DST_IS_B ? b : d;
    const char *pb = alias == ALL_SAME ? a : b;

    dt_reduce_elems(t, op, dst, a, pb, n);

    int bad = 0;
    for (size_t i = 0; i < n && bad < 3; i++) {
        int ok;
        if (is_float_type(t)) {
            double r = ref_fcombine(op, load_float(t, a0, i), load_float(t, b0, i));
            ok = float_matches(t, op, dst, i, r);
        } else {
            int64_t r = ref_icombine(op, load_int(t, a0, i), load_int(t, b0, i), int_bits(t));
            ok = load_int(t, dst, i) == r;
        }
        if (!ok) bad++;
        CHECK(ok, "%s %s n=%zu %s: element %zu wrong", dt_dtype_name(t), dt_op_name(op), n,
              alias_name[alias], i);
    }
    /* Nothing past the end is touched. */
    if (alias == OUT_OF_PLACE)
        CHECK((unsigned char)d[n * esz] == 0x5a, "%s %s n=%zu wrote past the end",
              dt_dtype_name(t), dt_op_name(op), n);
    free(a);
    free(b);
    free(d);
    free(a0);
    free(b0);
}

static void check_reductions(void)
{
    static const size_t sizes[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65,
                                   127, 129, 255, 1000, 4099, 65537};
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        for (int op = 0; op < DT_OP_COUNT; op++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && !(is_bitwise((dt_op)op) &&
                                                                    is_float_type((dt_dtype)t));
                 s++)
                for (int alias = 0; alias < ALIAS_MODES; alias++)
                    check_case((dt_dtype)t, (dt_op)op, sizes[s], alias);
}

/* Corner cases the random inputs may miss. */
static void check_reduction_corners(void)
{
    int32_t ia[] = {INT32_MAX, INT32_MIN, -1, 65536};
    int32_t ib[] = {1, -1, INT32_MIN, 65536};
    int32_t id[4];
    dt_reduce_elems(DT_I32, DT_SUM, id, ia, ib, 4);
    CHECK(id[0] == INT32_MIN && id[1] == INT32_MAX && id[2] == INT32_MAX, "i32 sum wrap");
    dt_reduce_elems(DT_I32, DT_PROD, id, ia, ib, 4);
    CHECK(id[3] == 0 && id[2] == INT32_MIN, "i32 prod wrap");
    int64_t la[] = {INT64_MAX, INT64_MIN}, lb[] = {1, -1}, ld[2];
    dt_reduce_elems(DT_I64, DT_SUM, ld, la, lb, 2);
    CHECK(ld[0] == INT64_MIN && ld[1] == INT64_MAX, "i64 sum wrap");
    uint8_t ua[] = {200, 16}, ub[] = {100, 16}, ud[2];
    dt_reduce_elems(DT_U8, DT_SUM, ud, ua, ub, 2);
    CHECK(ud[0] == 44 && ud[1] == 32, "u8 sum wrap");
    dt_reduce_elems(DT_U8, DT_PROD, ud, ua, ub, 2);
    CHECK(ud[0] == (uint8_t)(200 * 100) && ud[1] == 0, "u8 prod wrap");
    /* f16 sum overflowing to inf, and bf16 NaN staying NaN through max. */
    uint16_t ha[] = {0x7bff, 0x0001}, hb[] = {0x7bff, 0x0001}, hd[2];
    dt_reduce_elems(DT_F16, DT_SUM, hd, ha, hb, 2);
    CHECK(hd[0] == 0x7c00 && hd[1] == 0x0002, "f16 sum: %04x %04x", hd[0], hd[1]);
    uint16_t ba[] = {0x7fc1, 0x3f80}, bb[] = {0x3f80, 0xffc0}, bd[2];
    dt_reduce_elems(DT_BF16, DT_MAX, bd, ba, bb, 2);
    CHECK(ref_is_nan(&FMT_BF16, bd[0]) && ref_is_nan(&FMT_BF16, bd[1]), "bf16 max NaN");
}

/* Every 16-bit pattern through a reduction (x + -0 = x, x * 1 = x): the
 * vector conversions inside the reduction loops, which the scalar
 * conversion tests above do not reach. */
static void check_reduce16_exhaustive(const fmt16 *f, dt_dtype t)
{
    uint16_t *x = malloc(65536 * sizeof *x), *z = malloc(65536 * sizeof *z);
    uint16_t *one = malloc(65536 * sizeof *one), *d = malloc(65536 * sizeof *d);
    uint16_t one_bits = ref_encode(f, 1.0);
    for (uint32_t i = 0; i < 65536; i++) {
        x[i] = (uint16_t)i;
        z[i] = 0x8000u;
        one[i] = one_bits;
    }
    for (int pass = 0; pass < 2; pass++) {
        dt_reduce_elems(t, pass ? DT_PROD : DT_SUM, d, x, pass ? one : z, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            int ok = ref_is_nan(f, (uint16_t)i) ? ref_is_nan(f, d[i]) : d[i] == i;
            CHECK(ok, "%s %s of %04x gave %04x", f->name, pass ? "x * 1" : "x + -0", i, d[i]);
            if (!ok) break;
        }
    }
    free(x);
    free(z);
    free(one);
    free(d);
}

/* ---- average ------------------------------------------------------------ */

static void check_avg_case(dt_dtype t, size_t n, int divisor)
{
    size_t esz = dt_dtype_size(t);
    char *x = malloc(n * esz + 1), *x0 = malloc(n * esz + 1);
    fill(t, x, n);
    memcpy(x0, x, n * esz);
    dt_reduce_finish_avg(t, x, n, divisor);
    for (size_t i = 0; i < n; i++) {
        int ok;
        if (is_float_type(t)) {
            double v = load_float(t, x0, i);
            /* f32 and the 16-bit types divide in f32: one correctly
             * rounded division, which double reproduces. */
            double r = t == DT_F64 ? v / divisor : (double)(float)(v / divisor);
            ok = float_matches(t, DT_SUM, x, i, r);
        } else {
            int64_t v = load_int(t, x0, i);
            ok = load_int(t, x, i) == v / divisor;
        }
        CHECK(ok, "avg %s n=%zu /%d: element %zu wrong", dt_dtype_name(t), n, divisor, i);
        if (!ok) break;
    }
    free(x);
    free(x0);
}

static void check_avg(void)
{
    static const int divisors[] = {1, 2, 3, 7, 9, 300};
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        for (size_t d = 0; d < sizeof divisors / sizeof divisors[0]; d++) {
            check_avg_case((dt_dtype)t, 0, divisors[d]);
            check_avg_case((dt_dtype)t, 1, divisors[d]);
            check_avg_case((dt_dtype)t, 1001, divisors[d]);
        }
}

int main(void)
{
    check_f16_exhaustive();
    check_bf16_exhaustive();
    check_narrow_ties(&FMT_F16);
    check_narrow_ties(&FMT_BF16);
    check_narrow_random(&FMT_F16);
    check_narrow_random(&FMT_BF16);
#ifdef __FLT16_MAX__
    check_f16_against_compiler();
#endif
    check_reductions();
    check_reduction_corners();
    check_reduce16_exhaustive(&FMT_F16, DT_F16);
    check_reduce16_exhaustive(&FMT_BF16, DT_BF16);
    check_avg();
    return finish("test_reduce_ops");
}
