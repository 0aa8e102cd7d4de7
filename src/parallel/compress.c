/* Gradient compression codecs: none, topk, int8. See compress.h.
 *
 * Messages are read and written through memcpy, byte offsets into an
 * unaligned buffer: the compiler turns each into a plain load or store. */
#include "parallel/compress.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"

#define INT8_BLOCK 256
#define INT8_QMAX 127

static const char accepted[] = "none, int8 or topk:R with 0 < R <= 1 (e.g. topk:0.01)";

int dt_compress_parse(const char *text, dt_compress_spec *out, char *err, size_t errlen)
{
    if (!text) text = "";
    if (strcmp(text, "none") == 0 || strcmp(text, "int8") == 0) {
        out->kind = text[0] == 'n' ? DT_COMPRESS_NONE : DT_COMPRESS_INT8;
        out->ratio = 0.0;
        return 0;
    }
    if (strncmp(text, "topk:", 5) != 0) {
        if (err) dt_strf(err, errlen, "compression '%s' is unknown: expected %s", text, accepted);
        return -1;
    }
    /* strtod alone would also take leading blanks, "nan", "inf" and hex. */
    const char *p = text + 5;
    double r = 0.0;
    int ok = ((*p >= '0' && *p <= '9') || *p == '.') && p[strspn(p, "0123456789.eE+-")] == '\0';
    if (ok) {
        char *end;
        r = strtod(p, &end);
        ok = *end == '\0' && r > 0.0 && r <= 1.0;
    }
    if (!ok) {
        if (err)
            dt_strf(err, errlen, "compression '%s': the topk ratio must be a number in (0, 1]; expected %s",
                    text, accepted);
        return -1;
    }
    out->kind = DT_COMPRESS_TOPK;
    out->ratio = r;
    return 0;
}

void dt_compress_format(const dt_compress_spec *s, char *buf, size_t len)
{
    switch (s->kind) {
    case DT_COMPRESS_NONE: dt_strf(buf, len, "none"); return;
    case DT_COMPRESS_INT8: dt_strf(buf, len, "int8"); return;
    case DT_COMPRESS_TOPK: {
        char num[40];
        for (int digits = 1; digits <= 17; digits++) {
            dt_strf(num, sizeof num, "%.*g", digits, s->ratio);
            if (strtod(num, NULL) == s->ratio) break;
        }
        dt_strf(buf, len, "topk:%s", num);
        return;
    }
    }
    dt_strf(buf, len, "unknown(%d)", (int)s->kind);
}

size_t dt_compress_topk_k(const dt_compress_spec *s, size_t n)
{
    if (s->kind != DT_COMPRESS_TOPK) return n;
    if (n == 0) return 0;
    double x = s->ratio * (double)n;
    if (!(x > 1.0)) return 1; /* also a NaN ratio */
    if (x >= (double)n) return n;
    /* A ratio parsed from decimal is off by a relative 1e-16 or so, which
     * must not push an exact product past an integer. */
    size_t k = (size_t)ceil(x - x * 1e-12);
    return k < 1 ? 1 : (k > n ? n : k);
}

static size_t int8_blocks(size_t n) { return (n + INT8_BLOCK - 1) / INT8_BLOCK; }

size_t dt_compress_bytes(const dt_compress_spec *s, size_t n)
{
    switch (s->kind) {
    case DT_COMPRESS_NONE: return n * sizeof(float);
    case DT_COMPRESS_TOPK: return dt_compress_topk_k(s, n) * (sizeof(uint32_t) + sizeof(float));
    case DT_COMPRESS_INT8: return int8_blocks(n) * sizeof(float) + n;
    }
    return 0;
}

/* |v| as an integer: for non-negative floats the bit patterns order as the
 * values do, Inf above every finite value and NaN above Inf. A total order,
 * unlike float comparison, so NaN cannot break the selection. */
static inline uint32_t mag_key(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

/* The passes after the first look for few keys (those in one narrow
 * range, or the k largest): a chunk is first counted as a whole, a loop the
 * compiler vectorizes, and only chunks holding a match are walked key by
 * key. */
#define TOPK_CHUNK 32

/* How many of x[0..m) have a key k with (k & mask) == prefix and k >= least. */
static uint32_t count_keys(const float *x, size_t m, uint32_t mask, uint32_t prefix,
                           uint32_t least)
{
    uint32_t count = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t key = mag_key(x[i]);
        count += ((key & mask) == prefix) & (key >= least);
    }
    return count;
}

/* The k-th largest key of x (1 <= k <= n) and how many keys exceed it,
 * by radix select over the key's 31 bits in digits of 11, 10 and 10: each
 * pass counts the keys that share the digits fixed so far and fixes the
 * next one. Three streaming passes whatever the data (many equal
 * magnitudes, as zeros, would degrade a quickselect), and no scratch.
 * The keys are those of x = g, or with a residual of x = residual += g,
 * formed by the first pass so that g is read once. */
static uint32_t kth_largest_key(const float *g, float *residual, size_t n, size_t k,
                                size_t *above)
{
    const float *x = residual ? residual : g;
    static const int shift[3] = {20, 10, 0};
    static const uint32_t bins[3] = {2048, 1024, 1024};
    size_t hist[2048];
    uint32_t prefix = 0, mask = 0;
    size_t want = k, greater = 0;
    for (int level = 0; level < 3; level++) {
        uint32_t nb = bins[level];
        int sh = shift[level];
        memset(hist, 0, nb * sizeof hist[0]);
        if (level == 0 && residual) {
            for (size_t i = 0; i < n; i++) {
                residual[i] += g[i];
                hist[mag_key(residual[i]) >> sh]++;
            }
        } else if (level == 0) {
            for (size_t i = 0; i < n; i++) hist[mag_key(x[i]) >> sh]++;
        } else {
            for (size_t c = 0; c < n; c += TOPK_CHUNK) {
                size_t end = n - c < TOPK_CHUNK ? n : c + TOPK_CHUNK;
                if (!count_keys(x + c, end - c, mask, prefix, 0)) continue;
                /* Counting every key of the chunk, matching or not, is
                 * cheaper than the branch, which the keys of a dense range
                 * would mispredict. */
                for (size_t i = c; i < end; i++) {
                    uint32_t key = mag_key(x[i]);
                    hist[(key >> sh) & (nb - 1)] += (key & mask) == prefix;
                }
            }
        }
        /* The keys counted hold at least want, so b stops at or above 0;
         * the b > 0 only keeps a broken count from reading out of bounds. */
        uint32_t b = nb - 1;
        while (b > 0 && hist[b] < want) {
            want -= hist[b];
            greater += hist[b];
            b--;
        }
        prefix |= b << sh;
        mask |= (nb - 1) << sh;
    }
    *above = greater;
    return prefix;
}

static void encode_topk(const dt_compress_spec *s, const float *g, float *residual, size_t n,
                        unsigned char *out)
{
    size_t k = dt_compress_topk_k(s, n);
    if (k == 0) return;
    unsigned char *vals = out + k * sizeof(uint32_t);
    uint32_t t = 0; /* k == n: every key is >= 0 */
    size_t above = 0;
    if (k < n)
        t = kth_largest_key(g, residual, n, k, &above);
    else if (residual)
        for (size_t i = 0; i < n; i++) residual[i] += g[i];
    const float *x = residual ? residual : g;
    /* Every key above t, then the first keys equal to t in index order:
     * one pass in index order, so the indices come out ascending. */
    size_t ties = k - above, j = 0;
    for (size_t c = 0; c < n && j < k; c += TOPK_CHUNK) {
        size_t end = n - c < TOPK_CHUNK ? n : c + TOPK_CHUNK;
        if (!count_keys(x + c, end - c, 0, 0, t)) continue;
        for (size_t i = c; i < end && j < k; i++) {
            uint32_t key = mag_key(x[i]);
            if (key < t) continue;
            if (key == t) {
                if (!ties) continue;
                ties--;
            }
            uint32_t idx = (uint32_t)i;
            memcpy(out + j * sizeof idx, &idx, sizeof idx);
            memcpy(vals + j * sizeof(float), &x[i], sizeof(float));
            j++;
            if (residual) residual[i] = 0.0f;
        }
    }
}

static void encode_int8(const float *g, float *residual, size_t n, unsigned char *out)
{
    size_t nblocks = int8_blocks(n);
    signed char *q = (signed char *)(out + nblocks * sizeof(float));
    for (size_t b = 0; b < nblocks; b++) {
        size_t lo = b * INT8_BLOCK, m = n - lo < INT8_BLOCK ? n - lo : INT8_BLOCK;
        const float *x = g + lo;
        float *r = residual ? residual + lo : NULL;
        if (r) {
            for (size_t i = 0; i < m; i++) r[i] += g[lo + i];
            x = r;
        }
        uint32_t kmax = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t key = mag_key(x[i]);
            kmax = key > kmax ? key : kmax;
        }
        float scale;
        if (kmax >= 0x7f800000u) { /* Inf or NaN: see compress.h */
            scale = NAN;
            memset(q + lo, 0, m);
            if (r) memset(r, 0, m * sizeof *r);
        } else {
            float amax;
            memcpy(&amax, &kmax, sizeof amax);
            scale = amax / INT8_QMAX;
            if (scale == 0.0f) {
                /* All zero, or so tiny (below 127 x the least subnormal)
                 * that the scale underflows: sent as zeros, and with
                 * feedback the values wait in the residual. */
                scale = 0.0f;
                memset(q + lo, 0, m);
            } else {
                for (size_t i = 0; i < m; i++) {
                    /* |x| <= amax bounds x / scale by 127 up to rounding;
                     * the clamp is for a subnormal scale, which has lost
                     * precision. */
                    float v = rintf(x[i] / scale);
                    v = v > INT8_QMAX ? INT8_QMAX : (v < -INT8_QMAX ? -INT8_QMAX : v);
                    signed char qi = (signed char)v;
                    q[lo + i] = qi;
                    if (r) {
                        float dec = (float)qi * scale; /* exactly what decode adds */
                        r[i] = x[i] - dec;
                    }
                }
            }
        }
        memcpy(out + b * sizeof scale, &scale, sizeof scale);
    }
}

void dt_compress_encode(const dt_compress_spec *s, const float *g, float *residual, size_t n,
                        void *out)
{
    unsigned char *o = out;
    switch (s->kind) {
    case DT_COMPRESS_NONE:
        if (!residual) {
            memcpy(o, g, n * sizeof(float));
            return;
        }
        for (size_t i = 0; i < n; i++) {
            float v = g[i] + residual[i];
            memcpy(o + i * sizeof v, &v, sizeof v);
            residual[i] = 0.0f;
        }
        return;
    case DT_COMPRESS_TOPK: encode_topk(s, g, residual, n, o); return;
    case DT_COMPRESS_INT8: encode_int8(g, residual, n, o); return;
    }
}

void dt_compress_decode_add(const dt_compress_spec *s, const void *in, size_t n, float *acc)
{
    const unsigned char *p = in;
    switch (s->kind) {
    case DT_COMPRESS_NONE:
        for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, p + i * sizeof v, sizeof v);
            acc[i] += v;
        }
        return;
    case DT_COMPRESS_TOPK: {
        size_t k = dt_compress_topk_k(s, n);
        const unsigned char *vals = p + k * sizeof(uint32_t);
        for (size_t j = 0; j < k; j++) {
            uint32_t idx;
            float v;
            memcpy(&idx, p + j * sizeof idx, sizeof idx);
            memcpy(&v, vals + j * sizeof v, sizeof v);
            if (idx < n) acc[idx] += v;
        }
        return;
    }
    case DT_COMPRESS_INT8: {
        size_t nblocks = int8_blocks(n);
        const signed char *q = (const signed char *)(p + nblocks * sizeof(float));
        for (size_t b = 0; b < nblocks; b++) {
            size_t lo = b * INT8_BLOCK, m = n - lo < INT8_BLOCK ? n - lo : INT8_BLOCK;
            float scale;
            memcpy(&scale, p + b * sizeof scale, sizeof scale);
            for (size_t i = 0; i < m; i++) acc[lo + i] += (float)q[lo + i] * scale;
        }
        return;
    }
    }
}
