/* A sharded checkpoint's manifest.json: written, read, and checked
 * against the model (its pieces tile every tensor). See ckpt/shard.h. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/parse.h"
#include "core/str.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"

#define FORMAT_NAME "dtrain-sharded"

/* ---- writing ------------------------------------------------------------ */

static void add_u64(cJSON *j, const char *key, uint64_t v, int hex)
{
    char buf[32];
    dt_strf(buf, sizeof buf, hex ? "%016" PRIx64 : "%" PRIu64, v);
    cJSON_AddStringToObject(j, key, buf);
}

static cJSON *shard_json(const dt_ckpt_shard *s, const dt_gpt *layout)
{
    cJSON *j = cJSON_CreateObject(), *pieces = cJSON_CreateArray();
    if (!j || !pieces) {
        cJSON_Delete(pieces);
        cJSON_Delete(j);
        return NULL;
    }
    cJSON_AddStringToObject(j, "file", s->file);
    add_u64(j, "bytes", s->bytes, 0);
    add_u64(j, "checksum", s->checksum, 1);
    for (int i = 0; i < s->npieces; i++) {
        const dt_ckpt_piece *p = &s->pieces[i];
        cJSON *a = cJSON_CreateArray();
        cJSON_AddItemToArray(a, cJSON_CreateString(layout->tensors[p->tensor].name));
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)p->lo));
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)p->hi));
        cJSON_AddItemToArray(pieces, a);
    }
    cJSON_AddItemToObject(j, "pieces", pieces);
    return j;
}

char *dt_ckpt_manifest_format(const dt_ckpt_manifest *m, const dt_gpt *layout)
{
    cJSON *j = cJSON_CreateObject(), *shards = cJSON_CreateArray();
    cJSON *state = dt_ckpt_state_json(&m->record);
    char *text = NULL;
    if (j && shards && state) {
        cJSON_AddStringToObject(j, "format", FORMAT_NAME);
        cJSON_AddNumberToObject(j, "version", DT_CKPT_SHARD_VERSION);
        cJSON_AddNumberToObject(j, "stage", m->stage);
        cJSON_AddNumberToObject(j, "ranks", m->ranks);
        cJSON_AddNumberToObject(j, "moments", m->moments);
        cJSON_AddItemToObject(j, "state", state);
        state = NULL;
        for (int i = 0; i < m->nshards; i++)
            cJSON_AddItemToArray(shards, shard_json(&m->shards[i], layout));
        cJSON_AddItemToObject(j, "shards", shards);
        shards = NULL;
        text = cJSON_Print(j);
    }
    cJSON_Delete(state);
    cJSON_Delete(shards);
    cJSON_Delete(j);
    return text;
}

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} reader;

static int bad(const reader *rd, const char *what, const char *want)
{
    dt_strf(rd->err, rd->errlen, "%s: %s; it must be %s (the manifest is damaged)", rd->path,
            what, want);
    return -1;
}

static int get_int(const reader *rd, const cJSON *obj, const char *key, long lo, long hi,
                   int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (d >= (double)lo && d <= (double)hi && d == floor(d)) {
        *out = (int)d;
        return 0;
    }
    char what[96], want[96];
    dt_strf(what, sizeof what, "\"%s\" is missing or not an integer in range", key);
    dt_strf(want, sizeof want, "an integer from %ld to %ld", lo, hi);
    return bad(rd, what, want);
}

static int get_u64(const reader *rd, const cJSON *obj, const char *key, int hex, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
    char *end = NULL;
    if (s && *s) {
        *out = strtoull(s, &end, hex ? 16 : 10);
        if (*end == 0 && s[0] != '-') return 0;
    }
    char what[96];
    dt_strf(what, sizeof what, "a shard's \"%s\" is missing or malformed", key);
    return bad(rd, what, hex ? "a hexadecimal string" : "a decimal string");
}

static int get_piece(const reader *rd, const cJSON *a, dt_ckpt_piece *p, char *name)
{
    const cJSON *n = cJSON_GetArrayItem(a, 0), *lo = cJSON_GetArrayItem(a, 1),
                *hi = cJSON_GetArrayItem(a, 2);
    int ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == 3 && cJSON_IsString(n) &&
             strlen(n->valuestring) < 48 && cJSON_IsNumber(lo) && cJSON_IsNumber(hi) &&
             lo->valuedouble >= 0 && hi->valuedouble > lo->valuedouble &&
             hi->valuedouble <= 9007199254740992.0 && lo->valuedouble == floor(lo->valuedouble) &&
             hi->valuedouble == floor(hi->valuedouble);
    if (!ok) return bad(rd, "a piece is malformed", "[\"TENSOR\", LO, HI] with 0 <= LO < HI");
    dt_strf(name, 48, "%s", n->valuestring);
    p->tensor = -1;
    p->lo = (uint64_t)lo->valuedouble;
    p->hi = (uint64_t)hi->valuedouble;
    p->at = 0;
    return 0;
}

static int get_shard(const reader *rd, const cJSON *j, dt_ckpt_shard *s)
{
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(j, "file");
    const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(j, "pieces");
    if (!cJSON_IsString(file) || strlen(file->valuestring) >= sizeof s->file ||
        strchr(file->valuestring, '/') || file->valuestring[0] == '.')
        return bad(rd, "a shard's \"file\" is missing or not a plain file name",
                   "a file name inside the checkpoint directory");
    dt_strf(s->file, sizeof s->file, "%s", file->valuestring);
    if (get_u64(rd, j, "bytes", 0, &s->bytes) || get_u64(rd, j, "checksum", 1, &s->checksum))
        return -1;
    if (!cJSON_IsArray(pieces)) return bad(rd, "a shard's \"pieces\" is missing", "an array");
    s->npieces = cJSON_GetArraySize(pieces);
    s->pieces = calloc((size_t)s->npieces + 1, sizeof *s->pieces);
    s->names = calloc((size_t)s->npieces + 1, sizeof *s->names);
    if (!s->pieces || !s->names) return bad(rd, "out of memory", "smaller");
    int i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, pieces)
    {
        if (get_piece(rd, a, &s->pieces[i], s->names[i]) != 0) return -1;
        i++;
    }
    return 0;
}

static int get_format(const reader *rd, const cJSON *j)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version");
    if (!cJSON_IsString(f) || strcmp(f->valuestring, FORMAT_NAME) != 0)
        return bad(rd, "\"format\" is missing or another", "\"" FORMAT_NAME "\"");
    if (cJSON_IsNumber(v) && v->valuedouble == DT_CKPT_SHARD_VERSION) return 0;
    dt_strf(rd->err, rd->errlen, "%s: \"version\" is not %d, the version this dtrain reads",
            rd->path, DT_CKPT_SHARD_VERSION);
    return -1;
}

static int parse(const reader *rd, const cJSON *j, dt_ckpt_manifest *m)
{
    if (get_format(rd, j) || get_int(rd, j, "stage", 0, 3, &m->stage) ||
        get_int(rd, j, "ranks", 1, 1 << 20, &m->ranks) ||
        get_int(rd, j, "moments", 0, 2, &m->moments))
        return -1;
    if (dt_ckpt_state_from_json(rd->path, cJSON_GetObjectItemCaseSensitive(j, "state"),
                                &m->record, rd->err, rd->errlen) != 0)
        return -1;
    if (m->record.model.n_layer == 0)
        return bad(rd, "\"state.model\" is missing", "the model's sizes");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) != m->ranks)
        return bad(rd, "\"shards\" is missing or does not hold one shard per rank",
                   "an array of \"ranks\" shards");
    m->nshards = m->ranks;
    m->shards = calloc((size_t)m->nshards, sizeof *m->shards);
    if (!m->shards) return bad(rd, "out of memory", "smaller");
    int i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, shards)
    {
        if (get_shard(rd, s, &m->shards[i++]) != 0) return -1;
    }
    return 0;
}

int dt_ckpt_manifest_read(const char *dir, dt_ckpt_manifest *m, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/" DT_CKPT_MANIFEST, dir);
    memset(m, 0, sizeof *m);
    char *text = dt_read_file(path, DT_CKPT_MANIFEST_BYTES, NULL, err, errlen);
    if (!text) return -1;
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1);
    free(text);
    reader rd = {path, err, errlen};
    int rc = !j || !cJSON_IsObject(j) ? bad(&rd, "not a JSON object", "valid JSON")
                                      : parse(&rd, j, m);
    cJSON_Delete(j);
    if (rc != 0) dt_ckpt_manifest_free(m);
    return rc;
}

void dt_ckpt_manifest_free(dt_ckpt_manifest *m)
{
    for (int i = 0; m->shards && i < m->nshards; i++) {
        free(m->shards[i].pieces);
        free(m->shards[i].names);
    }
    free(m->shards);
    memset(m, 0, sizeof *m);
}

/* ---- checking against the model --------------------------------------- */

typedef struct {
    int tensor, shard;
    uint64_t lo, hi;
} placed;

static int cmp_placed(const void *a, const void *b)
{
    const placed *x = a, *y = b;
    if (x->tensor != y->tensor) return (x->tensor > y->tensor) - (x->tensor < y->tensor);
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sorted by tensor and element, consecutive pieces must meet exactly. */
static int check_tiling(const char *path, const dt_ckpt_manifest *m, const dt_gpt *layout,
                        placed *all, size_t n, char *err, size_t errlen)
{
    qsort(all, n, sizeof *all, cmp_placed);
    size_t i = 0;
    for (int k = 0; k < layout->n_tensors; k++) {
        const dt_param_tensor *t = &layout->tensors[k];
        uint64_t next = 0;
        for (; i < n && all[i].tensor == k; i++) {
            const placed *p = &all[i];
            const char *why = p->lo < next ? "overlaps the piece before it"
                              : p->lo > next ? "leaves a gap before it"
                              : p->hi > t->numel ? "ends past the tensor"
                                                 : NULL;
            if (!why) {
                next = p->hi;
                continue;
            }
            dt_strf(err, errlen,
                    "%s: piece %s[%llu:%llu] of %s %s (the pieces before it end at element "
                    "%llu; the tensor has %zu)",
                    path, t->name, (unsigned long long)p->lo, (unsigned long long)p->hi,
                    m->shards[p->shard].file, why, (unsigned long long)next, t->numel);
            return -1;
        }
        if (next != t->numel) {
            dt_strf(err, errlen,
                    "%s: tensor %s is covered to element %llu of %zu: a piece is missing "
                    "from the manifest",
                    path, t->name, (unsigned long long)next, t->numel);
            return -1;
        }
    }
    return 0;
}

int dt_ckpt_manifest_check(const char *dir, dt_ckpt_manifest *m, const dt_gpt *layout,
                           char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/" DT_CKPT_MANIFEST, dir);
    const dt_gpt_config *c = &m->record.model, *l = &layout->cfg;
    if (dt_ckpt_model_differs(path, c, l, err, errlen)) return -1;
    size_t n = 0;
    for (int s = 0; s < m->nshards; s++) n += (size_t)m->shards[s].npieces;
    placed *all = calloc(n + 1, sizeof *all);
    if (!all) {
        dt_strf(err, errlen, "%s: out of memory for %zu pieces", path, n);
        return -1;
    }
    size_t k = 0;
    for (int s = 0; s < m->nshards; s++) {
        dt_ckpt_shard *sh = &m->shards[s];
        for (int i = 0; i < sh->npieces; i++) {
            const dt_param_tensor *t = dt_gpt_find(layout, sh->names[i]);
            if (!t) {
                dt_strf(err, errlen, "%s: %s holds a piece of \"%s\", a tensor the model lacks",
                        path, sh->file, sh->names[i]);
                free(all);
                return -1;
            }
            sh->pieces[i].tensor = (int)(t - layout->tensors);
            all[k++] = (placed){sh->pieces[i].tensor, s, sh->pieces[i].lo, sh->pieces[i].hi};
        }
    }
    int rc = check_tiling(path, m, layout, all, n, err, errlen);
    free(all);
    return rc;
}
