/* A model directory's weights as one safetensors file: model.safetensors,
 * or the shards model.safetensors.index.json lists, joined. See
 * weights/hf_dir.h. */
#include "train/weights/hf_dir.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/str.h"

void dt_hf_path(char *buf, size_t len, const char *dir, const char *name)
{
    const size_t n = strlen(dir);
    dt_strf(buf, len, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
}

static int exists(const char *dir, const char *name)
{
    char path[4200];
    struct stat st;
    dt_hf_path(path, sizeof path, dir, name);
    return stat(path, &st) == 0;
}

int dt_hf_is_model_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) && exists(path, DT_HF_CONFIG);
}

/* An index as read: its weight_map's entries, and the shards they name,
 * each once, in order of first mention. */
typedef struct {
    char path[4200];
    cJSON *root;
    const cJSON *map;
    int n;              /* entries */
    const char **shard; /* the distinct shard names */
    int nshards;
} index_file;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A name twice in weight_map (JSON allows it; cJSON keeps both) would leave
 * which shard holds the tensor to the order of the lines. */
static int check_names_once(const index_file *x, char *err, size_t errlen)
{
    const char **names = malloc((size_t)x->n * sizeof *names + 1);
    if (!names) return dt_strf(err, errlen, "%s: out of memory", x->path), -1;
    int k = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, x->map) names[k++] = e->string;
    qsort(names, (size_t)k, sizeof *names, cmp_str);
    for (int i = 1; i < k && rc == 0; i++)
        if (!strcmp(names[i - 1], names[i]))
            rc = (dt_strf(err, errlen, "%s: weight_map names tensor %s twice", x->path,
                          names[i]), -1);
    free(names);
    return rc;
}

/* Each entry a tensor name -> a file of the directory; the shards listed. */
static int read_entries(index_file *x, char *err, size_t errlen)
{
    x->n = cJSON_GetArraySize(x->map);
    if (x->n == 0) return dt_strf(err, errlen, "%s: weight_map lists no tensor", x->path), -1;
    if (!(x->shard = calloc((size_t)x->n, sizeof *x->shard)))
        return dt_strf(err, errlen, "%s: out of memory", x->path), -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, x->map)
    {
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!s || !s[0] || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
            return dt_strf(err, errlen, "%s: weight_map gives tensor %s no file name of the "
                           "directory (a shard's name, such as model-00001-of-00002.safetensors)",
                           x->path, e->string), -1;
        int i = 0;
        while (i < x->nshards && strcmp(x->shard[i], s)) i++;
        if (i == x->nshards) x->shard[x->nshards++] = s;
    }
    return check_names_once(x, err, errlen);
}

static int read_index(const char *dir, index_file *x, char *err, size_t errlen)
{
    dt_hf_path(x->path, sizeof x->path, dir, DT_HF_INDEX);
    char *text = dt_read_file(x->path, (size_t)64 << 20, NULL, err, errlen);
    if (!text) return -1;
    x->root = cJSON_Parse(text);
    free(text);
    x->map = cJSON_GetObjectItemCaseSensitive(x->root, "weight_map");
    if (!cJSON_IsObject(x->map))
        return dt_strf(err, errlen, "%s: no \"weight_map\" object (tensor name -> shard file)",
                       x->path), -1;
    return read_entries(x, err, errlen);
}

/* The first tensor the index places in shard s, for a message. */
static const char *first_in(const index_file *x, const char *s, int *count)
{
    const char *first = NULL;
    const cJSON *e;
    *count = 0;
    cJSON_ArrayForEach(e, x->map)
        if (!strcmp(e->valuestring, s) && (*count)++ == 0) first = e->string;
    return first;
}

static int open_shard(const char *dir, const index_file *x, int i, dt_st_file *f, char *err,
                      size_t errlen)
{
    if (!exists(dir, x->shard[i])) {
        int n;
        const char *t = first_in(x, x->shard[i], &n);
        return dt_strf(err, errlen, "%s names the shard %s (for %s and %d more tensor(s)), "
                       "which is not in %s: %s", x->path, x->shard[i], t, n - 1, dir,
                       strerror(ENOENT)), -1;
    }
    char path[4200];
    dt_hf_path(path, sizeof path, dir, x->shard[i]);
    return dt_st_open(path, f, err, errlen);
}

/* Every tensor the index names is where it says. */
static int check_placed(const index_file *x, const dt_st_file *parts, char *err,
                        size_t errlen)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, x->map)
    {
        int i = 0;
        while (strcmp(x->shard[i], e->valuestring)) i++;
        if (!dt_st_find(&parts[i], e->string))
            return dt_strf(err, errlen, "%s does not hold tensor %s, which %s places there",
                           parts[i].path, e->string, x->path), -1;
    }
    return 0;
}

static int open_shards(const char *dir, dt_st_file *f, char *err, size_t errlen)
{
    index_file x = {0};
    dt_st_file *parts = NULL;
    int opened = 0, rc = read_index(dir, &x, err, errlen);
    if (rc == 0 && !(parts = calloc((size_t)x.nshards, sizeof *parts)))
        rc = (dt_strf(err, errlen, "%s: out of memory", x.path), -1);
    for (; rc == 0 && opened < x.nshards; opened++)
        rc = open_shard(dir, &x, opened, &parts[opened], err, errlen);
    if (rc == 0) rc = check_placed(&x, parts, err, errlen);
    if (rc == 0) {
        rc = dt_st_join(parts, x.nshards, x.path, f, err, errlen); /* owns parts now */
    } else {
        for (int i = 0; i < opened; i++) dt_st_close(&parts[i]);
        free(parts);
    }
    free(x.shard);
    cJSON_Delete(x.root);
    return rc;
}

int dt_hf_open(const char *dir, dt_st_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (!exists(dir, DT_HF_CONFIG))
        return dt_strf(err, errlen, "%s: a directory without " DT_HF_CONFIG ", so not a model "
                       "directory as Hugging Face writes it (" DT_HF_CONFIG " beside "
                       DT_HF_WEIGHTS ", or beside " DT_HF_INDEX " and its shards; a dtrain "
                       "checkpoint continues with --resume)", dir), -1;
    const int one = exists(dir, DT_HF_WEIGHTS), index = exists(dir, DT_HF_INDEX);
    if (one && index)
        return dt_strf(err, errlen, "%s holds both " DT_HF_WEIGHTS " and " DT_HF_INDEX
                       ": which is the model is unclear; remove the stale one", dir), -1;
    if (!one && !index)
        return dt_strf(err, errlen, "%s: " DT_HF_CONFIG " but neither " DT_HF_WEIGHTS " nor "
                       DT_HF_INDEX, dir), -1;
    if (!index) {
        char path[4200];
        dt_hf_path(path, sizeof path, dir, DT_HF_WEIGHTS);
        return dt_st_open(path, f, err, errlen);
    }
    return open_shards(dir, f, err, errlen);
}
