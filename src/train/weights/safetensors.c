/* The safetensors reader: the file mapped, its header checked whole
 * before any tensor is handed out. See weights/safetensors.h. */
#include "train/weights/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/str.h"
#include "core/half.h"
#include "train/weights/safetensors_internal.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is read in place"
#endif


static const struct {
    const char *name;
    size_t size;
} dtypes[DT_ST_DTYPE_COUNT] = {
    [DT_ST_F32] = {"F32", 4},         [DT_ST_F16] = {"F16", 2},
    [DT_ST_BF16] = {"BF16", 2},       [DT_ST_F64] = {"F64", 8},
    [DT_ST_I64] = {"I64", 8},         [DT_ST_I32] = {"I32", 4},
    [DT_ST_I16] = {"I16", 2},         [DT_ST_I8] = {"I8", 1},
    [DT_ST_U64] = {"U64", 8},         [DT_ST_U32] = {"U32", 4},
    [DT_ST_U16] = {"U16", 2},         [DT_ST_U8] = {"U8", 1},
    [DT_ST_BOOL] = {"BOOL", 1},       [DT_ST_F8_E4M3] = {"F8_E4M3", 1},
    [DT_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *dt_st_dtype_name(dt_st_dtype t)
{
    return (unsigned)t < DT_ST_DTYPE_COUNT ? dtypes[t].name : NULL;
}

size_t dt_st_dtype_size(dt_st_dtype t)
{
    return (unsigned)t < DT_ST_DTYPE_COUNT ? dtypes[t].size : 0;
}

static int dtype_from_name(const char *s, dt_st_dtype *out)
{
    for (int i = 0; i < DT_ST_DTYPE_COUNT; i++) {
        if (strcmp(dtypes[i].name, s) == 0) {
            *out = (dt_st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* Reader                                                              */
/* ------------------------------------------------------------------ */

int dt_st_fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    dt_vstrf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_strf(err, errlen, "%s: %s", path, msg);
    return -1;
}

static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= DT_ST_MAX_JSON_INT) || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static void format_shape(const dt_st_tensor *t, char *buf, size_t len)
{
    size_t n = (size_t)dt_strf(buf, len, "[");
    for (int i = 0; i < t->ndim; i++)
        n += (size_t)dt_strf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    dt_strf(buf + n, len - n, "]");
}

static int parse_shape(const cJSON *shape, dt_st_tensor *t, const char *path, char *err,
                       size_t errlen)
{
    if (!cJSON_IsArray(shape))
        return dt_st_fail(err, errlen, path, "tensor '%s': \"shape\" is missing or not an array",
                    t->name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > DT_ST_MAX_DIMS)
        return dt_st_fail(err, errlen, path, "tensor '%s': %d dimensions, at most %d are supported",
                    t->name, nd, DT_ST_MAX_DIMS);
    t->ndim = nd;
    t->numel = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape)
    {
        uint64_t v;
        if (json_uint(d, &v) != 0)
            return dt_st_fail(err, errlen, path,
                        "tensor '%s': shape entry %d is not a non-negative integer", t->name, i);
        t->shape[i++] = (int64_t)v;
        if (v && t->numel > UINT64_MAX / v)
            return dt_st_fail(err, errlen, path, "tensor '%s': shape too large", t->name);
        t->numel *= v;
    }
    return 0;
}

static int parse_offsets(const cJSON *offs, dt_st_tensor *t, uint64_t data_size,
                         const char *path, char *err, size_t errlen)
{
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_uint(cJSON_GetArrayItem(offs, 0), &begin) != 0 ||
        json_uint(cJSON_GetArrayItem(offs, 1), &end) != 0)
        return dt_st_fail(err, errlen, path,
                    "tensor '%s': \"data_offsets\" must be two non-negative integers", t->name);
    if (begin > end || end > data_size)
        return dt_st_fail(err, errlen, path,
                    "tensor '%s': data_offsets [%llu, %llu] out of range (the data section "
                    "holds %llu bytes)",
                    t->name, (unsigned long long)begin, (unsigned long long)end,
                    (unsigned long long)data_size);
    size_t esize = dtypes[t->dtype].size;
    char shp[200];
    format_shape(t, shp, sizeof shp);
    if (t->numel > UINT64_MAX / esize || t->numel * esize != end - begin)
        return dt_st_fail(err, errlen, path,
                    "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but dtype %s "
                    "and shape %s need %llu",
                    t->name, (unsigned long long)begin, (unsigned long long)end,
                    (unsigned long long)(end - begin), dtypes[t->dtype].name, shp,
                    (unsigned long long)(t->numel * esize));
    t->offset = begin;
    t->nbytes = end - begin;
    return 0;
}

static int parse_tensor(const cJSON *item, dt_st_tensor *t, uint64_t data_size,
                        const char *path, char *err, size_t errlen)
{
    t->name = strdup(item->string);
    if (!t->name) return dt_st_fail(err, errlen, path, "out of memory");
    if (!cJSON_IsObject(item))
        return dt_st_fail(err, errlen, path, "tensor '%s': entry is not a JSON object", t->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dt))
        return dt_st_fail(err, errlen, path, "tensor '%s': \"dtype\" is missing or not a string",
                    t->name);
    if (dtype_from_name(dt->valuestring, &t->dtype) != 0)
        return dt_st_fail(err, errlen, path, "tensor '%s': unknown dtype '%s'", t->name,
                    dt->valuestring);
    if (parse_shape(cJSON_GetObjectItemCaseSensitive(item, "shape"), t, path, err, errlen))
        return -1;
    return parse_offsets(cJSON_GetObjectItemCaseSensitive(item, "data_offsets"), t, data_size,
                         path, err, errlen);
}

/* Non-string values are skipped: the format says strings, and nothing
 * here depends on metadata being well formed. */
static int parse_meta(const cJSON *obj, dt_st_file *f, char *err, size_t errlen)
{
    if (!cJSON_IsObject(obj)) return dt_st_fail(err, errlen, f->path, "__metadata__ is not an object");
    f->meta = calloc((size_t)cJSON_GetArraySize(obj) + 1, sizeof *f->meta);
    if (!f->meta) return dt_st_fail(err, errlen, f->path, "out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, obj)
    {
        if (!cJSON_IsString(m)) continue;
        dt_st_meta *e = &f->meta[f->nmeta];
        e->key = strdup(m->string);
        e->value = strdup(m->valuestring);
        f->nmeta++;
        if (!e->key || !e->value) return dt_st_fail(err, errlen, f->path, "out of memory");
    }
    return 0;
}

static int cmp_offset(const void *a, const void *b)
{
    const dt_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    const dt_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* The tensors' bytes lie back to back from the start of the data section
 * to its end, as the format requires: a byte that belongs to no tensor
 * means a damaged file, or one something was appended to. */
static int check_tiling(dt_st_file *f, uint64_t data_size, char *err, size_t errlen)
{
    int n = f->ntensors;
    qsort(f->tensors, (size_t)n, sizeof *f->tensors, cmp_offset);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = &f->tensors[i], *prev = i ? t - 1 : NULL;
        if (t->offset < at)
            return dt_st_fail(err, errlen, f->path, "tensors '%s' and '%s' overlap", prev->name,
                        t->name);
        if (t->offset > at && prev)
            return dt_st_fail(err, errlen, f->path, "%llu bytes between tensors '%s' and '%s'",
                        (unsigned long long)(t->offset - at), prev->name, t->name);
        if (t->offset > at)
            return dt_st_fail(err, errlen, f->path, "%llu bytes before tensor '%s'",
                        (unsigned long long)t->offset, t->name);
        at = t->offset + t->nbytes;
    }
    if (at == data_size) return 0;
    if (n == 0)
        return dt_st_fail(err, errlen, f->path, "%llu bytes of data, but no tensor",
                    (unsigned long long)data_size);
    return dt_st_fail(err, errlen, f->path,
                "%llu bytes after the last tensor: the file is damaged or was appended to",
                (unsigned long long)(data_size - at));
}

static int check_layout(dt_st_file *f, uint64_t data_size, char *err, size_t errlen)
{
    int n = f->ntensors;
    if (check_tiling(f, data_size, err, errlen) != 0) return -1;
    const dt_st_tensor **byname = malloc((size_t)n * sizeof *byname + 1);
    if (!byname) return dt_st_fail(err, errlen, f->path, "out of memory");
    for (int i = 0; i < n; i++) byname[i] = &f->tensors[i];
    qsort(byname, (size_t)n, sizeof *byname, cmp_name_ptr);
    for (int i = 1; i < n; i++) {
        if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
            dt_st_fail(err, errlen, f->path, "tensor '%s' appears twice", byname[i]->name);
            free(byname);
            return -1;
        }
    }
    free(byname);
    return 0;
}

static int parse_entries(const cJSON *root, dt_st_file *f, const unsigned char *data,
                         uint64_t data_size, char *err, size_t errlen)
{
    f->tensors = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *f->tensors);
    if (!f->tensors) return dt_st_fail(err, errlen, f->path, "out of memory");
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (f->meta) return dt_st_fail(err, errlen, f->path, "__metadata__ appears twice");
            if (parse_meta(item, f, err, errlen) != 0) return -1;
            continue;
        }
        dt_st_tensor *t = &f->tensors[f->ntensors++];
        if (parse_tensor(item, t, data_size, f->path, err, errlen) != 0) return -1;
        t->data = data + t->offset;
    }
    return check_layout(f, data_size, err, errlen);
}

/* The JSON may be followed by spaces (padding to align the data), and
 * nothing else. */
static int parse_header(dt_st_file *f, const char *hdr, uint64_t hlen, char *err,
                        size_t errlen)
{
    uint64_t data_size = f->map_size - 8 - hlen;
    const unsigned char *data = (const unsigned char *)hdr + hlen;
    if (hlen == 0 || hdr[0] != '{')
        return dt_st_fail(err, errlen, f->path, "header is not a JSON object (it must start with '{')");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - hdr) : 0;
        return dt_st_fail(err, errlen, f->path, "header is not valid JSON (error at byte %zu of %llu)",
                    at, (unsigned long long)hlen);
    }
    int rc = -1;
    for (const char *p = end; p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != '\0') {
            dt_st_fail(err, errlen, f->path, "header has data after its JSON object (byte %zu)",
                 (size_t)(p - hdr));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        dt_st_fail(err, errlen, f->path, "header is not a JSON object");
        goto done;
    }
    rc = parse_entries(root, f, data, data_size, err, errlen);
done:
    cJSON_Delete(root);
    return rc;
}

static int map_file(const char *path, dt_st_file *f, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_st_fail(err, errlen, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return dt_st_fail(err, errlen, path, "cannot stat: %s", strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dt_st_fail(err, errlen, path, "not a regular file");
    }
    if (st.st_size < 8) {
        close(fd);
        return dt_st_fail(err, errlen, path,
                    "file is %lld bytes, shorter than the 8-byte header length: not a "
                    "safetensors file",
                    (long long)st.st_size);
    }
    f->map_size = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return dt_st_fail(err, errlen, path, "cannot map: %s", strerror(errno));
    }
    return 0;
}

int dt_st_open(const char *path, dt_st_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return dt_st_fail(err, errlen, path, "out of memory");
    if (map_file(path, f, err, errlen) != 0) goto fail;
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->map_size - 8) {
        dt_st_fail(err, errlen, path,
             "header length %llu goes beyond the end of the file (%zu bytes): truncated or "
             "not a safetensors file",
             (unsigned long long)hlen, f->map_size);
        goto fail;
    }
    if (parse_header(f, (const char *)f->map + 8, hlen, err, errlen) != 0) goto fail;
    return 0;
fail:
    dt_st_close(f);
    return -1;
}

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *dt_st_meta_get(const dt_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

void dt_st_let_go(const dt_st_tensor *t, uint64_t first, uint64_t count)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), size = dt_st_dtype_size(t->dtype);
    uintptr_t lo = (uintptr_t)t->data + first * size, hi = lo + count * size;
    lo = (lo + page - 1) / page * page;
    hi = hi / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

int dt_st_read_f32_range(const dt_st_file *f, const dt_st_tensor *t, uint64_t first,
                         uint64_t count, float *dst, char *err, size_t errlen)
{
    if (first > t->numel || count > t->numel - first)
        return dt_st_fail(err, errlen, f->path,
                          "elements [%llu, %llu) asked of tensor '%s', which has %llu",
                          (unsigned long long)first, (unsigned long long)(first + count),
                          t->name, (unsigned long long)t->numel);
    const unsigned char *src = t->data;
    uint16_t h;
    switch (t->dtype) {
    case DT_ST_F32:
        memcpy(dst, src + 4 * first, 4 * count);
        return 0;
    case DT_ST_F16:
        for (uint64_t i = 0; i < count; i++) {
            memcpy(&h, src + 2 * (first + i), 2);
            dst[i] = dt_f16_to_f32(h);
        }
        return 0;
    case DT_ST_BF16:
        for (uint64_t i = 0; i < count; i++) {
            memcpy(&h, src + 2 * (first + i), 2);
            dst[i] = dt_bf16_to_f32(h);
        }
        return 0;
    default:
        return dt_st_fail(err, errlen, f->path,
                    "tensor '%s' has dtype %s; only F32, F16 and BF16 can be read as floats",
                    t->name, dt_st_dtype_name(t->dtype));
    }
}

int dt_st_read_f32(const dt_st_file *f, const dt_st_tensor *t, float *dst, char *err,
                   size_t errlen)
{
    return dt_st_read_f32_range(f, t, 0, t->numel, dst, err, errlen);
}

void dt_st_close(dt_st_file *f)
{
    if (f->map) munmap(f->map, f->map_size);
    for (int i = 0; i < f->ntensors; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->nmeta; i++) {
        free((char *)f->meta[i].key);
        free((char *)f->meta[i].value);
    }
    free(f->tensors);
    free(f->meta);
    free((char *)f->path);
    for (int i = 0; i < f->nparts; i++) dt_st_close(&f->parts[i]);
    free(f->parts);
    memset(f, 0, sizeof *f);
}
