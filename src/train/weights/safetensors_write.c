/* The safetensors writer: the JSON header built in memory, then the
 * tensors in offset order, published atomically. See weights/safetensors.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/str.h"
#include "train/weights/safetensors.h"
#include "train/weights/safetensors_internal.h"

/* The header as it is built; `failed` makes every later append a no-op,
 * so only the end needs checking. */
struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(struct sbuf *b, uint64_t v)
{
    char tmp[24];
    sb_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v));
}

/* A JSON string literal; bytes >= 0x80 pass through (names are UTF-8). */
static void sb_json(struct sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            sb_put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", c));
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int entry_bytes(const dt_st_entry *e, uint64_t *nbytes, char *err, size_t errlen,
                       const char *path)
{
    if (!e->name || strcmp(e->name, "__metadata__") == 0)
        return dt_st_fail(err, errlen, path, "a tensor needs a name other than __metadata__");
    if (e->ndim < 0 || e->ndim > DT_ST_MAX_DIMS)
        return dt_st_fail(err, errlen, path, "tensor '%s': %d dimensions (0 to %d allowed)",
                    e->name, e->ndim, DT_ST_MAX_DIMS);
    if ((unsigned)e->dtype >= DT_ST_DTYPE_COUNT)
        return dt_st_fail(err, errlen, path, "tensor '%s': invalid dtype %d", e->name, (int)e->dtype);
    uint64_t n = dt_st_dtype_size(e->dtype);
    for (int i = 0; i < e->ndim; i++) {
        uint64_t d = (uint64_t)e->shape[i];
        if (e->shape[i] < 0 || (double)e->shape[i] > DT_ST_MAX_JSON_INT)
            return dt_st_fail(err, errlen, path, "tensor '%s': bad dimension %lld", e->name,
                        (long long)e->shape[i]);
        if (d && n > UINT64_MAX / d)
            return dt_st_fail(err, errlen, path, "tensor '%s': too large", e->name);
        n *= d;
    }
    if (n && !e->data) return dt_st_fail(err, errlen, path, "tensor '%s': no data", e->name);
    *nbytes = n;
    return 0;
}

static void sb_meta(struct sbuf *b, const dt_st_meta *meta, int nmeta)
{
    int has_format = 0;
    for (int i = 0; i < nmeta; i++) has_format |= strcmp(meta[i].key, "format") == 0;
    sb_str(b, "{\"__metadata__\":{");
    if (!has_format) sb_str(b, nmeta ? "\"format\":\"pt\"," : "\"format\":\"pt\"");
    for (int i = 0; i < nmeta; i++) {
        sb_json(b, meta[i].key);
        sb_str(b, ":");
        sb_json(b, meta[i].value);
        if (i + 1 < nmeta) sb_str(b, ",");
    }
    sb_str(b, "}");
}

/* The data goes in order of element size, largest first, the given order
 * kept within a size: with the data section 8-aligned, every tensor is
 * then aligned to its element size without padding, which the format
 * forbids. A file of one dtype keeps the given order. */
static int *data_order(const dt_st_entry *entries, int n)
{
    int *order = malloc((size_t)n * sizeof *order + 1);
    if (!order) return NULL;
    int k = 0;
    for (size_t size = 8; size >= 1; size /= 2)
        for (int i = 0; i < n; i++)
            if (dt_st_dtype_size(entries[i].dtype) == size ||
                (size == 1 && dt_st_dtype_size(entries[i].dtype) == 0))
                order[k++] = i;
    return order;
}

/* Builds the header, padded with spaces so the data starts 8-aligned. */
static int build_header(struct sbuf *b, const dt_st_entry *entries, const int *order, int n,
                        const dt_st_meta *meta, int nmeta, const char *path, char *err,
                        size_t errlen)
{
    sb_meta(b, meta, nmeta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const dt_st_entry *e = &entries[order[i]];
        uint64_t nbytes;
        if (entry_bytes(e, &nbytes, err, errlen, path) != 0) return -1;
        sb_str(b, ",");
        sb_json(b, e->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, dt_st_dtype_name(e->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d) sb_str(b, ",");
            sb_u64(b, (uint64_t)e->shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_str(b, ",");
        sb_u64(b, off + nbytes);
        sb_str(b, "]}");
        off += nbytes;
    }
    sb_str(b, "}");
    while ((8 + b->len) % 8) sb_str(b, " ");
    if (b->failed) return dt_st_fail(err, errlen, path, "out of memory");
    return 0;
}

static int check_distinct(const dt_st_entry *entries, int n, const char *path, char *err,
                          size_t errlen)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (entries[i].name && entries[j].name &&
                strcmp(entries[i].name, entries[j].name) == 0)
                return dt_st_fail(err, errlen, path, "tensor '%s' given twice", entries[i].name);
    return 0;
}

int dt_st_write(const char *path, const dt_st_entry *entries, int n, const dt_st_meta *meta,
                int nmeta, char *err, size_t errlen)
{
    if (n < 0 || check_distinct(entries, n, path, err, errlen) != 0) return -1;
    int *order = data_order(entries, n);
    if (!order) return dt_st_fail(err, errlen, path, "out of memory");
    struct sbuf hdr = {0};
    dt_afile a;
    if (build_header(&hdr, entries, order, n, meta, nmeta, path, err, errlen) != 0 ||
        dt_afile_open(&a, path, err, errlen) != 0) {
        free(hdr.p);
        free(order);
        return -1;
    }
    uint64_t hlen = hdr.len;
    int rc = dt_afile_write(&a, &hlen, 8, err, errlen);
    if (rc == 0) rc = dt_afile_write(&a, hdr.p, hdr.len, err, errlen);
    free(hdr.p);
    for (int i = 0; rc == 0 && i < n; i++) {
        const dt_st_entry *e = &entries[order[i]];
        uint64_t nbytes;
        entry_bytes(e, &nbytes, err, errlen, path);
        rc = dt_afile_write(&a, e->data, (size_t)nbytes, err, errlen);
    }
    free(order);
    if (rc == 0) rc = dt_afile_commit(&a, err, errlen);
    return rc;
}

int dt_st_write_f32(const char *path, const dt_st_entry *entries, int n, char *err,
                    size_t errlen)
{
    return dt_st_write(path, entries, n, NULL, 0, err, errlen);
}
