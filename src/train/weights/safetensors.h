/* safetensors files: an 8-byte little-endian header length N, N bytes of
 * JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * optional "__metadata__": {string: string}}), then the tensors' bytes,
 * offsets counted from the end of the header.
 *
 * The reader maps the file and checks everything before handing out a
 * tensor, so a bad file fails at open with a message naming the file and
 * the problem, never later with a crash. As the format requires, the
 * tensors tile the data section exactly: a gap between them or a byte
 * after the last is refused (a damaged file, or one appended to). The
 * writer publishes its file atomically (see atomic_file.h). */
#ifndef DT_TRAIN_WEIGHTS_SAFETENSORS_H
#define DT_TRAIN_WEIGHTS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define DT_ST_MAX_DIMS 8

/* Every dtype the format names. Only F32, F16 and BF16 convert to fp32;
 * the others open fine and can be read raw through `data`. F32 is 0 so
 * that a zero-initialised dt_st_entry means fp32. */
typedef enum {
    DT_ST_F32 = 0,
    DT_ST_F16,
    DT_ST_BF16,
    DT_ST_F64,
    DT_ST_I64,
    DT_ST_I32,
    DT_ST_I16,
    DT_ST_I8,
    DT_ST_U64,
    DT_ST_U32,
    DT_ST_U16,
    DT_ST_U8,
    DT_ST_BOOL,
    DT_ST_F8_E4M3,
    DT_ST_F8_E5M2,
    DT_ST_DTYPE_COUNT
} dt_st_dtype;

typedef struct {
    const char *name;
    dt_st_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[DT_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t offset; /* from the start of the data section */
    uint64_t nbytes;
    const void *data; /* in the mapping; not aligned in general */
} dt_st_tensor;

typedef struct {
    const char *key;
    const char *value;
} dt_st_meta;

typedef struct dt_st_file {
    const char *path;
    void *map;
    size_t map_size;
    dt_st_tensor *tensors; /* in data order (by offset); a join's by part */
    int ntensors;
    dt_st_meta *meta; /* __metadata__ entries with string values */
    int nmeta;
    struct dt_st_file *parts; /* a join's files (dt_st_join), closed with it */
    int nparts;
} dt_st_file;

/* "F32", "BF16", ...; NULL for an out-of-range value. */
const char *dt_st_dtype_name(dt_st_dtype t);
/* Bytes per element. */
size_t dt_st_dtype_size(dt_st_dtype t);

/* Maps and validates path. On failure *f holds nothing to close. */
int dt_st_open(const char *path, dt_st_file *f, char *err, size_t errlen);
/* The tensor with exactly this name, or NULL. */
const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
/* A __metadata__ value, or NULL. */
const char *dt_st_meta_get(const dt_st_file *f, const char *key);
/* Converts t (F32, F16 or BF16) into t->numel floats at dst. Any other
 * dtype is an error naming the tensor, its dtype and the file. */
int dt_st_read_f32(const dt_st_file *f, const dt_st_tensor *t, float *dst, char *err,
                   size_t errlen);
/* Elements [first, first + count) of t as floats at dst (a shard of a
 * tensor); the range must lie inside the tensor. */
int dt_st_read_f32_range(const dt_st_file *f, const dt_st_tensor *t, uint64_t first,
                         uint64_t count, float *dst, char *err, size_t errlen);
/* The mapping's pages of elements [first, first + count) of t, given back
 * (those wholly inside): a reader that is done with them keeps the file
 * out of its resident memory. Reading them again faults them back in. */
void dt_st_let_go(const dt_st_tensor *t, uint64_t first, uint64_t count);
void dt_st_close(dt_st_file *f);
/* The tensors of n open files seen as one file named path (a model in
 * shards): every tensor of every part, each in one part only (a name in
 * two is refused, naming both files). The join owns parts (a malloc'd
 * array) from the call on, and closes them with itself or on failure. It
 * has no metadata; a tensor's data stays in its part's mapping. */
int dt_st_join(dt_st_file *parts, int n, const char *path, dt_st_file *f, char *err,
               size_t errlen);

/* One tensor to write: numel = product of shape[0..ndim-1] elements of
 * dtype at data, written as they are (host order is little-endian). */
typedef struct {
    const char *name;
    const void *data;
    int ndim;
    int64_t shape[DT_ST_MAX_DIMS];
    dt_st_dtype dtype; /* 0 = DT_ST_F32 */
} dt_st_entry;

/* Writes the entries with __metadata__ holding "format": "pt" (what
 * PyTorch loaders expect) and then the nmeta pairs of meta. Names must be
 * distinct and not "__metadata__". The data is in the given order when all
 * entries have one element size; otherwise grouped by element size,
 * largest first, so that every tensor is aligned to its element size. */
int dt_st_write(const char *path, const dt_st_entry *entries, int n, const dt_st_meta *meta,
                int nmeta, char *err, size_t errlen);
/* dt_st_write without extra metadata; the entries are normally fp32. */
int dt_st_write_f32(const char *path, const dt_st_entry *entries, int n, char *err,
                    size_t errlen);

#endif
