/* Several safetensors files seen as one: a model saved in shards. See
 * weights/safetensors.h (dt_st_join). */
#include <stdlib.h>
#include <string.h>

#include "train/weights/safetensors.h"
#include "train/weights/safetensors_internal.h"

typedef struct {
    const char *name;
    int part;
} owner;

static int cmp_owner(const void *a, const void *b)
{
    return strcmp(((const owner *)a)->name, ((const owner *)b)->name);
}

/* A name in two parts would make which one a reader gets depend on the
 * order of the files: refused, naming both. */
static int check_once(const dt_st_file *parts, int n, int total, const char *path, char *err,
                      size_t errlen)
{
    owner *o = malloc((size_t)total * sizeof *o + 1);
    if (!o) return dt_st_fail(err, errlen, path, "out of memory");
    int k = 0;
    for (int p = 0; p < n; p++)
        for (int i = 0; i < parts[p].ntensors; i++) o[k++] = (owner){parts[p].tensors[i].name, p};
    qsort(o, (size_t)total, sizeof *o, cmp_owner);
    int rc = 0;
    for (int i = 1; rc == 0 && i < total; i++)
        if (strcmp(o[i - 1].name, o[i].name) == 0)
            rc = dt_st_fail(err, errlen, path, "tensor %s is in both %s and %s", o[i].name,
                            parts[o[i - 1].part].path, parts[o[i].part].path);
    free(o);
    return rc;
}

static int join(dt_st_file *parts, int n, dt_st_file *f, char *err, size_t errlen)
{
    int total = 0;
    for (int p = 0; p < n; p++) total += parts[p].ntensors;
    if (check_once(parts, n, total, f->path, err, errlen)) return -1;
    f->tensors = calloc((size_t)total + 1, sizeof *f->tensors);
    if (!f->tensors) return dt_st_fail(err, errlen, f->path, "out of memory");
    for (int p = 0; p < n; p++)
        for (int i = 0; i < parts[p].ntensors; i++) {
            dt_st_tensor *t = &f->tensors[f->ntensors];
            *t = parts[p].tensors[i];
            if (!(t->name = strdup(t->name))) return dt_st_fail(err, errlen, f->path,
                                                                 "out of memory");
            f->ntensors++;
        }
    return 0;
}

int dt_st_join(dt_st_file *parts, int n, const char *path, dt_st_file *f, char *err,
               size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->parts = parts;
    f->nparts = n;
    f->path = strdup(path);
    if (!f->path) {
        dt_st_fail(err, errlen, path, "out of memory");
    } else if (join(parts, n, f, err, errlen) == 0) {
        return 0;
    }
    dt_st_close(f);
    return -1;
}
