/* Writing a model directory as Hugging Face's save_pretrained does. See
 * weights/hf_dir.h. */
#include "train/weights/hf_dir.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/env.h"
#include "core/file.h"
#include "core/str.h"
#include "train/weights/weights.h"

int dt_hf_is_dir_path(const char *path)
{
    const size_t n = strlen(path);
    return n && path[n - 1] == '/';
}

/* Whether dir holds anything: 1, 0, or -1 when it cannot be read. */
static int has_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    const struct dirent *e;
    int any = 0;
    while (!any && (e = readdir(d)))
        any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return any;
}

int dt_hf_check_output(const char *what, const char *dir, char *err, size_t errlen)
{
    if (dt_check_dir_writable(what, dir, err, errlen)) return -1;
    const int any = has_entries(dir);
    if (any <= 0 || dt_hf_is_model_dir(dir)) return 0; /* new or empty, or a model's */
    /* Its files would sit among files of something else (a checkpoint, a
     * run directory), or replace some of them. */
    return dt_strf(err, errlen, "%s %s: a directory that holds other files and no " DT_HF_CONFIG
                   "; give a new or empty directory, or a model directory to replace its "
                   "weights", what, dir), -1;
}

/* The largest shard: DT_HF_SHARD_BYTES, or DTRAIN_HF_SHARD_BYTES. */
static int shard_limit(long *limit, char *err, size_t errlen)
{
    *limit = DT_HF_SHARD_BYTES;
    return dt_env_long("DTRAIN_HF_SHARD_BYTES", 1, LONG_MAX, limit, err, errlen) < 0 ? -1 : 0;
}

/* The first tensor of each shard, as save_pretrained cuts them: in layout
 * order, a new shard where the next tensor would pass the limit (a tensor
 * larger than the limit alone in its own). first[n] = n_tensors. */
static int cut_shards(const dt_gpt *m, size_t esz, long limit, int *first)
{
    int n = 0;
    size_t used = 0;
    for (int k = 0; k < m->n_tensors; k++) {
        const size_t bytes = m->tensors[k].numel * esz;
        if (k == 0 || used + bytes > (size_t)limit) {
            first[n++] = k;
            used = 0;
        }
        used += bytes;
    }
    first[n] = m->n_tensors;
    return n;
}

static void shard_name(char *buf, size_t len, int s, int n)
{
    if (n == 1) dt_strf(buf, len, DT_HF_WEIGHTS);
    else dt_strf(buf, len, "model-%05d-of-%05d.safetensors", s + 1, n);
}

/* Hugging Face's GPT2LMHeadModel names its tensors under "transformer.". */
static const char *prefix_of(const dt_gpt *m)
{
    return m->cfg.arch == DT_ARCH_LLAMA ? "" : "transformer.";
}

static int write_index(const dt_gpt *m, size_t esz, const int *first, int n, const char *dir,
                       char *err, size_t errlen)
{
    cJSON *o = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(o, "metadata");
    cJSON *map = cJSON_AddObjectToObject(o, "weight_map");
    char name[128], shard[64], path[4200];
    size_t total = 0;
    for (int s = 0; s < n; s++) {
        shard_name(shard, sizeof shard, s, n);
        for (int k = first[s]; k < first[s + 1]; k++) {
            dt_strf(name, sizeof name, "%s%s", prefix_of(m), m->tensors[k].name);
            cJSON_AddStringToObject(map, name, shard);
            total += m->tensors[k].numel * esz;
        }
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return dt_strf(err, errlen, "%s: out of memory for " DT_HF_INDEX, dir), -1;
    dt_hf_path(path, sizeof path, dir, DT_HF_INDEX);
    const int rc = dt_afile_write_file(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

/* Whether name is a shard's, model-IIIII-of-NNNNN.safetensors: 1 with I
 * and N, else 0. */
static int shard_of(const char *name, int *i, int *n)
{
    const char *form = "model-#####-of-#####.safetensors";
    if (strlen(name) != strlen(form)) return 0;
    for (int k = 0; form[k]; k++)
        if (form[k] == '#' ? name[k] < '0' || name[k] > '9' : name[k] != form[k]) return 0;
    *i = atoi(name + 6);
    *n = atoi(name + 15);
    return 1;
}

/* model.safetensors, the index and the shards are the weights' files; one
 * of them this save (of n shards) did not write is a previous save's. */
static int stale(const char *name, int n)
{
    int i, of;
    if (!strcmp(name, DT_HF_WEIGHTS)) return n > 1;
    if (!strcmp(name, DT_HF_INDEX)) return n == 1;
    return shard_of(name, &i, &of) && (n == 1 || of != n || i < 1 || i > n);
}

/* Leaves the directory with one model in it, as save_pretrained does:
 * otherwise the next reader would find two. */
static int remove_stale(const char *dir, int n, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) return dt_strf(err, errlen, "%s: cannot list: %s", dir, strerror(errno)), -1;
    const struct dirent *e;
    char path[4200];
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (!stale(e->d_name, n)) continue;
        dt_hf_path(path, sizeof path, dir, e->d_name);
        if (unlink(path) != 0)
            rc = (dt_strf(err, errlen, "%s: cannot remove a previous save's %s: %s", dir,
                          e->d_name, strerror(errno)), -1);
    }
    closedir(d);
    if (rc == 0 && dt_fsync_dir(dir) != 0)
        rc = (dt_strf(err, errlen, "%s: cannot flush: %s", dir, strerror(errno)), -1);
    return rc;
}

static int write_weights(const dt_gpt *m, const float *flat, const char *dir, dt_st_dtype dtype,
                         int *n, char *err, size_t errlen)
{
    long limit;
    const size_t esz = dt_st_dtype_size(dtype);
    int *first = malloc(((size_t)m->n_tensors + 1) * sizeof *first);
    if (!first) return dt_strf(err, errlen, "%s: out of memory", dir), -1;
    int rc = shard_limit(&limit, err, errlen);
    if (rc == 0) *n = cut_shards(m, esz, limit, first);
    char name[64], path[4200];
    for (int s = 0; rc == 0 && s < *n; s++) {
        shard_name(name, sizeof name, s, *n);
        dt_hf_path(path, sizeof path, dir, name);
        rc = dt_weights_write_part(m, flat, prefix_of(m), first[s], first[s + 1], dtype, path,
                                   err, errlen);
    }
    if (rc == 0 && *n > 1) rc = write_index(m, esz, first, *n, dir, err, errlen);
    free(first);
    return rc;
}

int dt_hf_save(const dt_gpt *m, const float *flat, const char *dir, dt_st_dtype dtype, char *err,
               size_t errlen)
{
    char path[4200];
    int n = 0;
    char *config = dt_hf_config_text(&m->cfg, dt_weights_torch_dtype(dtype), err, errlen);
    if (!config) return -1;
    int rc = dt_hf_check_output("writing", dir, err, errlen) || dt_mkdir_p(dir, err, errlen) ||
             write_weights(m, flat, dir, dtype, &n, err, errlen);
    dt_hf_path(path, sizeof path, dir, DT_HF_CONFIG);
    if (rc == 0) rc = dt_afile_write_file(path, config, strlen(config), err, errlen);
    free(config);
    return rc || remove_stale(dir, n, err, errlen) ? -1 : 0;
}
