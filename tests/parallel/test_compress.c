/*
 * Gradient compression codecs against serial references written here: topk
 * against a full sort by (|x| descending, index ascending), int8 against
 * per-block maxima, for sizes around the 256-float int8 block and a large
 * odd one, ratios from 1% to everything, inputs with many tied magnitudes
 * and all-zero blocks, with and without error feedback. Also: message sizes
 * (guard bytes after the buffer, two encodes into differently filled
 * buffers agree), accumulation into a non-zero buffer, NaN/Inf and
 * subnormal inputs, parsing and formatting, and error feedback over many
 * rounds keeping the residual bounded.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "parallel/compress.h"

#define GUARD 64

static float frand(void) { return (float)((double)(rnd_u64() >> 11) * 0x1p-53 * 2.0 - 1.0); }

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static uint32_t bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

enum { FAM_UNIFORM, FAM_TIES, FAM_ZEROS, FAM_COUNT };
static const char *fam_name[] = {"uniform", "ties", "zeros"};

/* g and, with feedback, an old residual; x = g + r_old as the codec forms
 * it. FAM_TIES draws from five values (equal magnitudes of both signs);
 * FAM_ZEROS has x = 0 on [256, 512) (a whole int8 block) and on every
 * seventh entry. */
static void make_input(int fam, size_t n, float *g, float *r_old, float *x)
{
    for (size_t i = 0; i < n; i++) {
        if (fam == FAM_TIES)
            g[i] = (float)((int)(rnd_u64() % 5) - 2) * 0.25f;
        else
            g[i] = frand();
        if (r_old) r_old[i] = fam == FAM_TIES ? 0.0f : 0.1f * frand();
        if (fam == FAM_ZEROS && ((i >= 256 && i < 512) || i % 7 == 0)) {
            g[i] = 0.0f;
            if (r_old) r_old[i] = 0.0f;
        }
        x[i] = r_old ? g[i] + r_old[i] : g[i];
    }
}

/* Encodes twice, into buffers filled with different bytes and each with
 * guard bytes after the message: both messages must be equal (every byte
 * written, deterministic), both residuals too, and the guards intact.
 * r_new gets r_old's values and is updated; NULL means no feedback. */
static unsigned char *encode_checked(const dt_compress_spec *s, const float *g, const float *r_old,
                                     float *r_new, size_t n, const char *what)
{
    size_t bytes = dt_compress_bytes(s, n);
    unsigned char *a = malloc(bytes + GUARD), *b = malloc(bytes + GUARD);
    float *r2 = r_new ? falloc(n) : NULL;
    if (!a || !b) exit(1);
    memset(a, 0xA5, bytes + GUARD);
    memset(b, 0x5A, bytes + GUARD);
    if (r_new) {
        memmove(r_new, r_old, n * sizeof *r_new); /* callers may update in place */
        memcpy(r2, r_new, n * sizeof *r2);
    }
    dt_compress_encode(s, g, r_new, n, a);
    dt_compress_encode(s, g, r2, n, b);
    int guard_ok = 1;
    for (size_t i = 0; i < GUARD; i++) guard_ok &= a[bytes + i] == 0xA5 && b[bytes + i] == 0x5A;
    CHECK(guard_ok, "%s: encode wrote past dt_compress_bytes = %zu", what, bytes);
    CHECK(memcmp(a, b, bytes) == 0, "%s: message depends on the buffer's old contents", what);
    if (r_new)
        CHECK(memcmp(r_new, r2, n * sizeof *r2) == 0, "%s: residual differs between runs", what);
    free(b);
    free(r2);
    return a;
}

static const float *sort_x;

static int by_magnitude(const void *pa, const void *pb)
{
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    float ma = fabsf(sort_x[a]), mb = fabsf(sort_x[b]);
    if (ma != mb) return ma > mb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

typedef struct {
    const char *text;
    size_t num, den; /* the ratio as a fraction, for an exact reference k */
} ratio_case;

static void test_topk(const ratio_case *rc, size_t n, int fam, int feedback)
{
    char what[128];
    snprintf(what, sizeof what, "%s n=%zu %s%s", rc->text, n, fam_name[fam],
             feedback ? " feedback" : "");
    dt_compress_spec s;
    char err[256];
    CHECK(dt_compress_parse(rc->text, &s, err, sizeof err) == 0, "%s: %s", what, err);

    size_t k_ref = (n * rc->num + rc->den - 1) / rc->den;
    if (k_ref < 1) k_ref = 1;
    if (k_ref > n) k_ref = n;
    size_t k = dt_compress_topk_k(&s, n);
    CHECK(k == k_ref, "%s: k %zu, want %zu", what, k, k_ref);
    CHECK(dt_compress_bytes(&s, n) == 8 * k_ref, "%s: bytes %zu, want %zu", what,
          dt_compress_bytes(&s, n), 8 * k_ref);
    if (k != k_ref) return;

    float *g = falloc(n), *r_old = feedback ? falloc(n) : NULL, *r_new = feedback ? falloc(n) : NULL;
    float *x = falloc(n);
    make_input(fam, n, g, r_old, x);
    unsigned char *msg = encode_checked(&s, g, r_old, r_new, n, what);

    size_t *order = malloc(n * sizeof *order);
    unsigned char *kept = calloc(n, 1);
    for (size_t i = 0; i < n; i++) order[i] = i;
    sort_x = x;
    qsort(order, n, sizeof *order, by_magnitude);
    for (size_t j = 0; j < k; j++) kept[order[j]] = 1;

    /* Strictly ascending indices, all in the reference set, k of them: the
     * same set. */
    int bad_idx = 0, bad_val = 0;
    uint32_t prev = 0;
    for (size_t j = 0; j < k; j++) {
        uint32_t idx;
        float v;
        memcpy(&idx, msg + 4 * j, 4);
        memcpy(&v, msg + 4 * k + 4 * j, 4);
        if (idx >= n || !kept[idx] || (j > 0 && idx <= prev)) {
            if (!bad_idx++)
                CHECK(0, "%s: entry %zu has index %u (previous %u, kept by reference: %d)", what, j,
                      idx, prev, idx < n ? kept[idx] : -1);
        } else if (bits(v) != bits(x[idx])) {
            if (!bad_val++) CHECK(0, "%s: value at %u is %g, want %g", what, idx, v, x[idx]);
        }
        prev = idx;
    }

    /* decode + residual == x bit for bit; the decode of an entry not kept
     * is zero and its residual is x. */
    float *acc = falloc(n), *base = falloc(n), *acc2 = falloc(n);
    dt_compress_decode_add(&s, msg, n, acc);
    for (size_t i = 0; i < n; i++) {
        base[i] = frand();
        acc2[i] = base[i];
    }
    dt_compress_decode_add(&s, msg, n, acc2);
    int bad_dec = 0, bad_res = 0, bad_acc = 0;
    for (size_t i = 0; i < n; i++) {
        float want = kept[i] ? x[i] : 0.0f;
        if (bits(acc[i]) != bits(want) && !bad_dec++)
            CHECK(0, "%s: decode[%zu] = %g, want %g", what, i, acc[i], want);
        if (feedback) {
            float rw = kept[i] ? 0.0f : x[i];
            if ((r_new[i] != rw || acc[i] + r_new[i] != x[i]) && !bad_res++)
                CHECK(0, "%s: residual[%zu] = %g (decode %g, x %g)", what, i, r_new[i], acc[i], x[i]);
        }
        if (bits(acc2[i]) != bits(base[i] + acc[i]) && !bad_acc++)
            CHECK(0, "%s: accumulate[%zu] = %g, want %g + %g", what, i, acc2[i], base[i], acc[i]);
    }
    free(g), free(r_old), free(r_new), free(x), free(msg), free(order), free(kept);
    free(acc), free(base), free(acc2);
}

static void test_int8(size_t n, int fam, int feedback)
{
    char what[128];
    snprintf(what, sizeof what, "int8 n=%zu %s%s", n, fam_name[fam], feedback ? " feedback" : "");
    dt_compress_spec s = {DT_COMPRESS_INT8, 0.0};
    size_t nb = (n + 255) / 256;
    CHECK(dt_compress_bytes(&s, n) == 4 * nb + n, "%s: bytes %zu, want %zu", what,
          dt_compress_bytes(&s, n), 4 * nb + n);

    float *g = falloc(n), *r_old = feedback ? falloc(n) : NULL, *r_new = feedback ? falloc(n) : NULL;
    float *x = falloc(n);
    make_input(fam, n, g, r_old, x);
    unsigned char *msg = encode_checked(&s, g, r_old, r_new, n, what);
    const signed char *q = (const signed char *)(msg + 4 * nb);

    float *acc = falloc(n), *base = falloc(n), *acc2 = falloc(n);
    dt_compress_decode_add(&s, msg, n, acc);
    for (size_t i = 0; i < n; i++) acc2[i] = base[i] = frand();
    dt_compress_decode_add(&s, msg, n, acc2);

    int bad = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * 256, hi = lo + 256 < n ? lo + 256 : n;
        float amax = 0.0f, scale;
        for (size_t i = lo; i < hi; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        memcpy(&scale, msg + 4 * b, 4);
        if (scale != amax / 127.0f && !bad++)
            CHECK(0, "%s: block %zu scale %g, want %g", what, b, scale, amax / 127.0f);
        for (size_t i = lo; i < hi; i++) {
            double e = fabs((double)acc[i] - x[i]);
            if ((q[i] < -127 || e > scale * 0.5 * (1 + 1e-6)) && !bad++)
                CHECK(0, "%s: [%zu] x %g decodes to %g (q %d, scale %g)", what, i, x[i], acc[i], q[i],
                      scale);
            if (amax == 0.0f && (q[i] != 0 || bits(acc[i]) != 0) && !bad++)
                CHECK(0, "%s: all-zero block %zu decodes [%zu] to %g", what, b, i, acc[i]);
            if (feedback) {
                double sum = (double)acc[i] + r_new[i];
                if ((r_new[i] != x[i] - acc[i] ||
                     fabs(sum - x[i]) > 2 * FLT_EPSILON * (fabs(x[i]) + scale)) &&
                    !bad++)
                    CHECK(0, "%s: [%zu] decode %g + residual %g != x %g", what, i, acc[i], r_new[i],
                          x[i]);
            }
            if (bits(acc2[i]) != bits(base[i] + acc[i]) && !bad++)
                CHECK(0, "%s: accumulate[%zu] = %g, want %g + %g", what, i, acc2[i], base[i], acc[i]);
        }
    }
    free(g), free(r_old), free(r_new), free(x), free(msg), free(acc), free(base), free(acc2);
}

static void test_none(size_t n, int feedback)
{
    char what[64];
    snprintf(what, sizeof what, "none n=%zu%s", n, feedback ? " feedback" : "");
    dt_compress_spec s = {DT_COMPRESS_NONE, 0.0};
    CHECK(dt_compress_bytes(&s, n) == 4 * n, "%s: bytes", what);
    float *g = falloc(n), *r_old = feedback ? falloc(n) : NULL, *r_new = feedback ? falloc(n) : NULL;
    float *x = falloc(n), *acc = falloc(n);
    make_input(FAM_UNIFORM, n, g, r_old, x);
    unsigned char *msg = encode_checked(&s, g, r_old, r_new, n, what);
    CHECK(memcmp(msg, x, 4 * n) == 0, "%s: message is not x", what);
    for (size_t i = 0; i < n; i++) acc[i] = 1.0f;
    dt_compress_decode_add(&s, msg, n, acc);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (acc[i] != 1.0f + x[i] && !bad++) CHECK(0, "%s: acc[%zu] = %g", what, i, acc[i]);
        if (feedback && r_new[i] != 0.0f && !bad++) CHECK(0, "%s: residual[%zu] = %g", what, i, r_new[i]);
    }
    free(g), free(r_old), free(r_new), free(x), free(acc), free(msg);
}

static void test_parse_format(void)
{
    static const struct {
        const char *text, *canon;
        dt_compress_kind kind;
        double ratio;
    } good[] = {{"none", "none", DT_COMPRESS_NONE, 0},
                {"int8", "int8", DT_COMPRESS_INT8, 0},
                {"topk:0.01", "topk:0.01", DT_COMPRESS_TOPK, 0.01},
                {"topk:1", "topk:1", DT_COMPRESS_TOPK, 1.0},
                {"topk:1.0", "topk:1", DT_COMPRESS_TOPK, 1.0},
                {"topk:.5", "topk:0.5", DT_COMPRESS_TOPK, 0.5},
                {"topk:1e-3", "topk:0.001", DT_COMPRESS_TOPK, 0.001}};
    char err[256], buf[64];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        dt_compress_spec s = {DT_COMPRESS_NONE, -1};
        err[0] = 0;
        int rc = dt_compress_parse(good[i].text, &s, err, sizeof err);
        CHECK(rc == 0 && s.kind == good[i].kind && (s.kind != DT_COMPRESS_TOPK || s.ratio == good[i].ratio),
              "parse '%s': rc %d kind %d ratio %g (%s)", good[i].text, rc, (int)s.kind, s.ratio, err);
        dt_compress_format(&s, buf, sizeof buf);
        CHECK(strcmp(buf, good[i].canon) == 0, "format of '%s' is '%s', want '%s'", good[i].text, buf,
              good[i].canon);
    }
    static const char *bad[] = {"topk", "topk:", "topk:0", "topk:1.5", "topk:abc", "int4", "",
                                "topk:-0.1", "topk:nan", "topk:inf", "topk: 0.1", "topk:0.1x", "NONE",
                                "int8 ", "topk:0x0.8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_compress_spec s;
        char quoted[64];
        err[0] = 0;
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        int rc = dt_compress_parse(bad[i], &s, err, sizeof err);
        CHECK_ERR(rc, err, quoted, "none", "int8", "topk:R");
    }
    /* Every ratio reads back to itself from its canonical text. */
    for (int i = 0; i < 1000; i++) {
        dt_compress_spec s = {DT_COMPRESS_TOPK, (double)(rnd_u64() >> 11) * 0x1p-53}, t;
        if (i == 0) s.ratio = 1.0 / 3.0;
        if (s.ratio == 0.0) continue;
        dt_compress_format(&s, buf, sizeof buf);
        int rc = dt_compress_parse(buf, &t, err, sizeof err);
        CHECK(rc == 0 && t.kind == DT_COMPRESS_TOPK && t.ratio == s.ratio, "ratio %.17g -> '%s' -> %.17g",
              s.ratio, buf, t.ratio);
    }
}

static void test_k_table(void)
{
    static const struct {
        double ratio;
        size_t n, k;
    } t[] = {{0.01, 0, 0},        {0.01, 1, 1},     {0.01, 100, 1},   {0.01, 101, 2},
             {0.01, 2000000, 20000}, {0.07, 100, 7}, {0.3, 10, 3},     {0.1, 1000, 100},
             {0.5, 255, 128},     {1.0, 257, 257},  {1e-9, 1000, 1},  {0.999, 1000, 999},
             {0.999, 1001, 1000}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        dt_compress_spec s = {DT_COMPRESS_TOPK, t[i].ratio};
        size_t k = dt_compress_topk_k(&s, t[i].n);
        CHECK(k == t[i].k, "topk:%g of %zu keeps %zu, want %zu", t[i].ratio, t[i].n, k, t[i].k);
    }
    dt_compress_spec none = {DT_COMPRESS_NONE, 0}, i8 = {DT_COMPRESS_INT8, 0};
    CHECK(dt_compress_bytes(&i8, 0) == 0 && dt_compress_bytes(&none, 0) == 0, "n = 0 has bytes");
    CHECK(dt_compress_bytes(&i8, 257) == 8 + 257, "int8 of 257: %zu bytes", dt_compress_bytes(&i8, 257));
}

/* NaN and Inf go through without undefined behaviour, reach the receiver,
 * and leave no trace in the residual once sent. */
static void test_nonfinite(void)
{
    size_t n = 1000;
    float *g = falloc(n), *r = falloc(n), *acc = falloc(n);
    for (size_t i = 0; i < n; i++) g[i] = frand();
    g[10] = NAN, g[500] = INFINITY, g[700] = -INFINITY;

    dt_compress_spec s = {DT_COMPRESS_TOPK, 0.01}; /* k = 10 */
    unsigned char *msg = encode_checked(&s, g, r, r, n, "topk nonfinite");
    dt_compress_decode_add(&s, msg, n, acc);
    CHECK(isnan(acc[10]) && acc[500] == INFINITY && acc[700] == -INFINITY,
          "topk: non-finite not sent: %g %g %g", acc[10], acc[500], acc[700]);
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(r[i]);
    CHECK(finite && r[10] == 0 && r[500] == 0, "topk: residual keeps a non-finite value");
    free(msg);

    /* k = 1: NaN ranks above Inf; the Inf waits in the residual and goes
     * out next round. */
    dt_compress_spec one = {DT_COMPRESS_TOPK, 0.001};
    memset(r, 0, n * sizeof *r);
    memset(acc, 0, n * sizeof *acc);
    g[700] = 0.5f;
    msg = encode_checked(&one, g, r, r, n, "topk k=1 nonfinite");
    uint32_t idx;
    memcpy(&idx, msg, 4);
    CHECK(idx == 10 && r[500] == INFINITY, "topk k=1: sent %u first, residual[500] %g", idx, r[500]);
    free(msg);
    float *zero = falloc(n);
    msg = encode_checked(&one, zero, r, r, n, "topk k=1 second round");
    memcpy(&idx, msg, 4);
    CHECK(idx == 500 && r[500] == 0, "topk k=1: sent %u second, residual[500] %g", idx, r[500]);
    free(msg);

    /* int8: the block holding a NaN (block 1) or an Inf (block 2) decodes
     * to NaN everywhere and resets its residual; block 0 is unaffected. */
    size_t m = 600;
    dt_compress_spec i8 = {DT_COMPRESS_INT8, 0};
    for (size_t i = 0; i < m; i++) g[i] = frand(), r[i] = 0.01f * frand(), acc[i] = 0;
    g[300] = NAN, g[550] = INFINITY;
    float x0[256];
    for (size_t i = 0; i < 256; i++) x0[i] = g[i] + r[i];
    msg = encode_checked(&i8, g, r, r, m, "int8 nonfinite");
    dt_compress_decode_add(&i8, msg, m, acc);
    int ok0 = 1, nan12 = 1, res12 = 1;
    for (size_t i = 0; i < 256; i++) ok0 &= fabsf(acc[i] - x0[i]) <= 1.0f / 127;
    for (size_t i = 256; i < m; i++) nan12 &= isnan(acc[i]) != 0, res12 &= r[i] == 0.0f;
    CHECK(ok0 && nan12 && res12, "int8 nonfinite: finite block %d, NaN blocks %d, reset residual %d",
          ok0, nan12, res12);
    free(msg);

    /* Subnormal magnitudes: a scale that underflows to 0 sends zeros and
     * keeps the values in the residual; a subnormal scale stays finite. */
    for (size_t i = 0; i < 256; i++) g[i] = (i % 2 ? 1 : -1) * 1e-44f;
    for (size_t i = 256; i < 512; i++) g[i] = ((float)i - 300.0f) * 1e-41f;
    memset(r, 0, 512 * sizeof *r);
    memset(acc, 0, 512 * sizeof *acc);
    msg = encode_checked(&i8, g, r, r, 512, "int8 subnormal");
    dt_compress_decode_add(&i8, msg, 512, acc);
    int tiny_ok = 1;
    for (size_t i = 0; i < 512; i++)
        tiny_ok &= isfinite(acc[i]) && isfinite(r[i]) && acc[i] + r[i] == g[i] &&
                   fabsf(acc[i] - g[i]) <= 1e-40f;
    CHECK(tiny_ok, "int8: subnormal input mishandled");
    free(msg);
    free(g), free(r), free(acc), free(zero);
}

/* A constant gradient sent with error feedback for many rounds: the sum of
 * what was decoded differs from the true sum only by the residual, which
 * stays bounded, so the average decoded gradient converges to the true
 * one. For topk (a contraction: |x - topk(x)|^2 <= (1 - k/n) |x|^2) the
 * residual's norm stays below about 2n/k |g|; for int8 each entry stays
 * below half a step, max|g| / 253. Without feedback topk never sends the
 * small entries and the error grows with every round. */
static void test_feedback_rounds(void)
{
    const size_t n = 1000;
    const int rounds = 2000;
    float *g = falloc(n), *r = falloc(n), *dec = falloc(n);
    double *sum = calloc(n, sizeof *sum), *sum_nofb = calloc(n, sizeof *sum_nofb);
    double gnorm = 0, gmax = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = frand() * (i % 10 == 0 ? 1.0f : 0.01f);
        gnorm += (double)g[i] * g[i];
        gmax = fabs(g[i]) > gmax ? fabs(g[i]) : gmax;
    }
    gnorm = sqrt(gnorm);

    dt_compress_spec topk = {DT_COMPRESS_TOPK, 0.01}, i8 = {DT_COMPRESS_INT8, 0};
    size_t k = dt_compress_topk_k(&topk, n);
    unsigned char *msg = malloc(dt_compress_bytes(&i8, n) + dt_compress_bytes(&topk, n));
    double worst_r = 0;
    for (int t = 1; t <= rounds; t++) {
        memset(dec, 0, n * sizeof *dec);
        dt_compress_encode(&topk, g, r, n, msg);
        dt_compress_decode_add(&topk, msg, n, dec);
        double rn = 0;
        for (size_t i = 0; i < n; i++) sum[i] += dec[i], rn += (double)r[i] * r[i];
        worst_r = sqrt(rn) > worst_r ? sqrt(rn) : worst_r;
        memset(dec, 0, n * sizeof *dec);
        dt_compress_encode(&topk, g, NULL, n, msg);
        dt_compress_decode_add(&topk, msg, n, dec);
        for (size_t i = 0; i < n; i++) sum_nofb[i] += dec[i];
    }
    double err = 0, err_nofb = 0, truth = 0, drift = 0;
    for (size_t i = 0; i < n; i++) {
        double want = (double)rounds * g[i];
        err += (sum[i] - want) * (sum[i] - want);
        err_nofb += (sum_nofb[i] - want) * (sum_nofb[i] - want);
        truth += want * want;
        /* decoded + residual == true sum, up to float rounding of x */
        double d = fabs(sum[i] + r[i] - want) / (rounds * gmax);
        drift = d > drift ? d : drift;
    }
    err = sqrt(err), err_nofb = sqrt(err_nofb), truth = sqrt(truth);
    CHECK(worst_r <= 2.0 * n / k * gnorm, "topk feedback: residual norm %g exceeds %g", worst_r,
          2.0 * n / k * gnorm);
    CHECK(err <= 2.0 * n / k * gnorm, "topk feedback: cumulative error %g (true sum %g)", err, truth);
    CHECK(err_nofb > 10 * err, "topk: without feedback error %g, with %g", err_nofb, err);
    CHECK(drift < 1e-3, "topk feedback: decoded + residual drifts from the true sum by %g", drift);

    memset(r, 0, n * sizeof *r);
    memset(sum, 0, n * sizeof *sum);
    double worst_ri = 0;
    for (int t = 1; t <= rounds; t++) {
        memset(dec, 0, n * sizeof *dec);
        dt_compress_encode(&i8, g, r, n, msg);
        dt_compress_decode_add(&i8, msg, n, dec);
        for (size_t i = 0; i < n; i++) {
            sum[i] += dec[i];
            worst_ri = fabs(r[i]) > worst_ri ? fabs(r[i]) : worst_ri;
        }
    }
    double mean_err = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(sum[i] / rounds - g[i]);
        mean_err = e > mean_err ? e : mean_err;
    }
    CHECK(worst_ri <= gmax / 253 * 1.001, "int8 feedback: residual %g exceeds %g", worst_ri, gmax / 253);
    CHECK(mean_err <= 2 * gmax / 253 / rounds + 1e-6 * gmax,
          "int8 feedback: mean decoded gradient off by %g after %d rounds", mean_err, rounds);
    free(g), free(r), free(dec), free(sum), free(sum_nofb), free(msg);
}

int main(void)
{
    static const size_t sizes[] = {1, 2, 255, 256, 257, 1000, 100003};
    static const ratio_case ratios[] = {
        {"topk:0.01", 1, 100}, {"topk:0.1", 1, 10}, {"topk:0.5", 1, 2}, {"topk:1", 1, 1}};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int fb = 0; fb < 2; fb++) {
            test_none(sizes[si], fb);
            for (int fam = 0; fam < FAM_COUNT; fam++) {
                test_int8(sizes[si], fam, fb);
                for (size_t ri = 0; ri < sizeof ratios / sizeof ratios[0]; ri++)
                    test_topk(&ratios[ri], sizes[si], fam, fb);
            }
        }
    test_parse_format();
    test_k_table();
    test_nonfinite();
    test_feedback_rounds();
    return finish("test_compress");
}
