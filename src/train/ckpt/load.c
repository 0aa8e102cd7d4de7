/* Loading checkpoints, whole-model or sharded, into whatever ranges of
 * the flat layout a rank holds: the checkpoint's pieces of named tensors
 * are intersected with the rank's, so the layouts (rank count, stage,
 * padding) of the save and the load need not agree. A whole-model load is
 * the case of one range covering the layout. See ckpt/checkpoint.h and
 * ckpt/shard.h. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/str.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"
#include "train/weights/weights.h"

const char *const dt_ckpt_prefix[DT_CKPT_NBUF] = {"", "exp_avg.", "exp_avg_sq."};

/* ---- the record and the model's sizes ----------------------------------- */

int dt_ckpt_is_sharded(const char *dir)
{
    char path[DT_PATH_MAX + 32];
    struct stat st;
    dt_strf(path, sizeof path, "%s/" DT_CKPT_MANIFEST, dir);
    return stat(path, &st) == 0;
}

/* The first shard file in dir (its name to first), or 0 when none. */
static int find_shard(const char *dir, char *first, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)) != NULL)
        if ((found = strncmp(e->d_name, "shard-", 6) == 0 && strstr(e->d_name, "-of-") &&
                     dt_ends_with(e->d_name, ".safetensors")))
            dt_strf(first, len, "%s", e->d_name);
    if (d) closedir(d);
    return found;
}

int dt_ckpt_has_shards(const char *dir)
{
    char name[256];
    return find_shard(dir, name, sizeof name);
}

/* A sharded checkpoint that lost its manifest has no state.json either;
 * the manifest is what is missing. */
static int missing_manifest(const char *dir, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32], shard[256];
    struct stat st;
    dt_strf(path, sizeof path, "%s/state.json", dir);
    if (stat(path, &st) == 0 || !find_shard(dir, shard, sizeof shard)) return 0;
    dt_strf(err, errlen,
            "%s/" DT_CKPT_MANIFEST " is missing: %s holds the shards of a sharded checkpoint "
            "(%s ...) but not the manifest that lists them, so it cannot be read; restore "
            "its " DT_CKPT_MANIFEST " or use another checkpoint",
            dir, dir, shard);
    return 1;
}

int dt_ckpt_read_record(const char *dir, dt_ckpt_record *r, char *err, size_t errlen)
{
    if (!dt_ckpt_is_sharded(dir))
        return missing_manifest(dir, err, errlen) ? -1 : dt_ckpt_state_read(dir, r, err, errlen);
    dt_ckpt_manifest man;
    if (dt_ckpt_manifest_read(dir, &man, err, errlen) != 0) return -1;
    *r = man.record;
    dt_ckpt_manifest_free(&man);
    return 0;
}

/* ---- the experts' bias -------------------------------------------------- */

/* The state object of the checkpoint's file at path: state.json whole, or
 * the manifest's "state". *root: what to delete after. */
static const cJSON *state_object(const char *path, int sharded, cJSON **root, char *err,
                                 size_t errlen)
{
    char *text = dt_read_file(path, sharded ? DT_CKPT_MANIFEST_BYTES : DT_CKPT_STATE_BYTES,
                              NULL, err, errlen);
    *root = text ? cJSON_ParseWithOpts(text, NULL, 1) : NULL;
    free(text);
    const cJSON *j = sharded ? cJSON_GetObjectItemCaseSensitive(*root, "state") : *root;
    if (text && !j) dt_strf(err, errlen, "%s: not valid JSON", path);
    return j;
}

int dt_ckpt_read_moe_bias(const char *dir, float *bias, size_t n, char *err, size_t errlen)
{
    dt_ckpt_record r;
    if (dt_ckpt_read_record(dir, &r, err, errlen) != 0) return -1;
    if (r.moe_bias_n == 0) return 1;
    const int sharded = dt_ckpt_is_sharded(dir);
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/%s", dir, sharded ? DT_CKPT_MANIFEST : "state.json");
    if (n == 0)
        return dt_strf(err, errlen, "%s: the checkpoint holds the experts' bias of "
                       "--moe-router-enable-expert-bias (%zu values), which this run does not "
                       "keep: resume with that flag (without it the routing would change and "
                       "the next checkpoint would lose the bias)", path, r.moe_bias_n), -1;
    if (r.moe_bias_n != n)
        return dt_strf(err, errlen, "%s: the experts' bias holds %zu values (%d layers x %d "
                       "experts); this model keeps %zu", path, r.moe_bias_n, r.model.n_layer,
                       r.model.moe.experts, n), -1;
    cJSON *root;
    const cJSON *j = state_object(path, sharded, &root, err, errlen);
    int rc = j ? dt_ckpt_state_moe_bias(path, j, &r, bias, err, errlen) : -1;
    cJSON_Delete(root);
    return rc;
}

/* The weights must hold the model state.json describes: its shapes give
 * every size but the head count, which its metadata may record. */
static int check_weights_agree(const char *dir, const dt_gpt_config *want,
                               const dt_gpt_config *have, const char *wpath, char *err,
                               size_t errlen)
{
    const struct {
        const char *name;
        int want, have;
        const char *verb;
    } s[] = {
        {"n_layer", want->n_layer, have->n_layer, "holds"},
        {"n_head", want->n_head, have->n_head ? have->n_head : want->n_head, "records"},
        {"n_embd", want->n_embd, have->n_embd, "holds"},
        {"vocab_size", want->vocab_size, have->vocab_size, "holds"},
        {"block_size", want->block_size, have->block_size, "holds"},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        if (s[i].want == s[i].have) continue;
        dt_strf(err, errlen, "%s/state.json: \"model.%s\" is %d, but %s %s %s %d", dir,
                s[i].name, s[i].want, wpath, s[i].verb, s[i].name, s[i].have);
        return -1;
    }
    return 0;
}

int dt_ckpt_model_config(const char *dir, dt_gpt_config *cfg, char *err, size_t errlen)
{
    dt_ckpt_record r;
    if (dt_ckpt_read_record(dir, &r, err, errlen) != 0) return -1;
    if (dt_ckpt_is_sharded(dir)) { /* the shards are checked against it as they load */
        *cfg = r.model;
        return 0;
    }
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/model.safetensors", dir);
    dt_gpt_config w;
    if (dt_weights_inspect(path, &w, err, errlen) != 0) return -1;
    if (r.model.n_layer == 0) { /* a checkpoint from before the sizes were recorded */
        *cfg = w;
        return 0;
    }
    if (check_weights_agree(dir, &r.model, &w, path, err, errlen) != 0) return -1;
    /* The blocks are the record's: a file's shapes do not say them. */
    *cfg = r.model;
    return 0;
}

/* ---- a whole-model checkpoint as pieces --------------------------------- */

/* One piece per tensor: the whole of it, from model.safetensors and
 * optimizer.safetensors (every tensor checked for presence and shape). */
static int open_full(const char *dir, const dt_gpt *m, const int want[DT_CKPT_NBUF],
                     dt_ckpt_source *src, char *err, size_t errlen)
{
    memset(src, 0, sizeof *src);
    src->files = calloc(2, sizeof *src->files);
    src->p = calloc((size_t)m->n_tensors + 1, sizeof *src->p);
    if (!src->files || !src->p) return dt_strf(err, errlen, "%s: out of memory", dir), -1;
    const char *names[2] = {"model.safetensors", "optimizer.safetensors"};
    int need[2] = {want[DT_CKPT_PARAMS], want[DT_CKPT_EXP_AVG] || want[DT_CKPT_EXP_AVG_SQ]};
    dt_st_file *file_of[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (!need[i]) continue;
        char path[DT_PATH_MAX + 32];
        dt_strf(path, sizeof path, "%s/%s", dir, names[i]);
        if (dt_st_open(path, &src->files[src->nfiles], err, errlen) != 0) return -1;
        file_of[i] = &src->files[src->nfiles++];
    }
    for (int k = 0; k < m->n_tensors; k++) {
        dt_ckpt_source_piece *p = &src->p[src->n++];
        *p = (dt_ckpt_source_piece){.tensor = k, .lo = 0, .hi = m->tensors[k].numel};
        for (int b = 0; b < DT_CKPT_NBUF; b++) {
            if (!want[b]) continue;
            p->f[b] = file_of[b == DT_CKPT_PARAMS ? 0 : 1];
            p->t[b] = dt_weights_tensor(m, p->f[b], dt_ckpt_prefix[b], k, err, errlen);
            if (!p->t[b]) return -1;
        }
    }
    return 0;
}

void dt_ckpt_source_close(dt_ckpt_source *src)
{
    for (int i = 0; i < src->nfiles; i++) dt_st_close(&src->files[i]);
    free(src->files);
    free(src->p);
    memset(src, 0, sizeof *src);
}

/* ---- filling a rank's ranges -------------------------------------------- */

/* Nothing non-finite is loaded, nor a negative second moment (Adam divides
 * by its square root). x: elements [first, first + n) of the piece's
 * tensor. */
static int check_values(const dt_ckpt_source_piece *p, int b, const dt_gpt *m, const float *x,
                        uint64_t first, uint64_t n, char *err, size_t errlen)
{
    if (dt_weights_all_finite(x, n, b == DT_CKPT_EXP_AVG_SQ)) return 0;
    for (uint64_t i = 0; i < n; i++) {
        if (isfinite(x[i]) && !(b == DT_CKPT_EXP_AVG_SQ && x[i] < 0)) continue;
        const char *name = m->tensors[p->tensor].name;
        uint64_t e = first + i;
        if (!isfinite(x[i]))
            dt_strf(err, errlen, "%s: tensor %s%s holds %s at element %llu", p->f[b]->path,
                    dt_ckpt_prefix[b], name, isnan(x[i]) ? "nan" : x[i] > 0 ? "inf" : "-inf",
                    (unsigned long long)e);
        else
            dt_strf(err, errlen,
                    "%s: tensor exp_avg_sq.%s holds %g at element %llu; a second moment cannot "
                    "be negative",
                    p->f[b]->path, name, (double)x[i], (unsigned long long)e);
        return -1;
    }
    return 0;
}

/* Copies what the source pieces hold of the wanted piece w. */
static int fill_piece(const dt_ckpt_source *src, const dt_gpt *m, const dt_ckpt_piece *w,
                      float *const bufs[DT_CKPT_NBUF], char *err, size_t errlen)
{
    for (int i = 0; i < src->n; i++) {
        const dt_ckpt_source_piece *p = &src->p[i];
        uint64_t a = p->lo > w->lo ? p->lo : w->lo, z = p->hi < w->hi ? p->hi : w->hi;
        if (p->tensor != w->tensor || a >= z) continue;
        for (int b = 0; b < DT_CKPT_NBUF; b++) {
            if (!bufs[b]) continue;
            float *dst = bufs[b] + w->at + (a - w->lo);
            if (dt_st_read_f32_range(p->f[b], p->t[b], a - p->lo, z - a, dst, err, errlen) ||
                check_values(p, b, m, dst, a, z - a, err, errlen))
                return -1;
        }
    }
    return 0;
}

static int check_kind_and_model(const char *dir, const dt_ckpt_record *r, const dt_gpt *m,
                                const dt_optimizer *o, char *err, size_t errlen)
{
    const char *file = dt_ckpt_is_sharded(dir) ? DT_CKPT_MANIFEST : "state.json";
    if (o && r->optimizer != o->kind) {
        dt_strf(err, errlen, "%s/%s: the checkpoint was trained with %s, this run uses %s",
                dir, file, dt_opt_kind_name(r->optimizer), dt_opt_kind_name(o->kind));
        return -1;
    }
    const dt_gpt_config *c = &m->cfg, *s = &r->model;
    char where[DT_PATH_MAX + 32];
    dt_strf(where, sizeof where, "%s/%s", dir, file);
    return s->n_layer ? dt_ckpt_model_differs(where, s, c, err, errlen) : 0;
}

int dt_ckpt_model_differs(const char *where, const dt_gpt_config *s, const dt_gpt_config *c,
                          char *err, size_t errlen)
{
    if (s->n_layer == c->n_layer && s->n_head == c->n_head && s->n_embd == c->n_embd &&
        s->vocab_size == c->vocab_size && s->block_size == c->block_size &&
        dt_blocks_same(s->blocks, c->blocks))
        return 0;
    const char *sb = s->blocks[0] ? s->blocks : dt_blocks_gpt2;
    const char *cb = c->blocks[0] ? c->blocks : dt_blocks_gpt2;
    return dt_strf(err, errlen, "%s: the checkpoint's model (n_layer %d, n_head %d, n_embd %d, "
                   "vocab_size %d, block_size %d, blocks \"%s\") is not the one built (%d, "
                   "%d, %d, %d, %d, \"%s\")", where, s->n_layer, s->n_head, s->n_embd,
                   s->vocab_size, s->block_size, sb, c->n_layer, c->n_head, c->n_embd,
                   c->vocab_size, c->block_size, cb), -1;
}

/* Opens the checkpoint's sources of the wanted pieces. */
static int open_source(const char *dir, const dt_gpt *m, const int want[DT_CKPT_NBUF],
                       const dt_ckpt_piece *need, int nneed, dt_ckpt_manifest *man,
                       dt_ckpt_source *src, char *err, size_t errlen)
{
    memset(man, 0, sizeof *man);
    if (!dt_ckpt_is_sharded(dir)) return open_full(dir, m, want, src, err, errlen);
    if (dt_ckpt_manifest_read(dir, man, err, errlen) != 0) return -1;
    return dt_ckpt_open_sharded(dir, man, m, want, need, nneed, src, err, errlen);
}

/* Zeroes the floats of buf[len] that no piece fills (padding), and only
 * those when the pieces lie in order: a second pass over the whole state
 * would cost a restart as much as the copy. */
static void zero_padding(float *buf, size_t len, const dt_ckpt_piece *p, int n)
{
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].at < at) { /* out of order: all of it */
            memset(buf, 0, len * sizeof(float));
            return;
        }
        memset(buf + at, 0, (p[i].at - at) * sizeof(float));
        at = p[i].at + (size_t)(p[i].hi - p[i].lo);
    }
    if (at < len) memset(buf + at, 0, (len - at) * sizeof(float));
}

int dt_ckpt_load_ranges(const char *dir, const dt_gpt *layout, const dt_flat_ranges *mine,
                        float *params, dt_optimizer *o, dt_ckpt_state *st, char *err,
                        size_t errlen)
{
    dt_ckpt_record r;
    if (dt_ckpt_read_record(dir, &r, err, errlen) != 0 ||
        check_kind_and_model(dir, &r, layout, o, err, errlen) != 0)
        return -1;
    float *const bufs[DT_CKPT_NBUF] = {params, o ? o->m : NULL, o ? o->v : NULL};
    int want[DT_CKPT_NBUF];
    for (int b = 0; b < DT_CKPT_NBUF; b++) want[b] = bufs[b] != NULL;
    dt_ckpt_piece *need;
    int nneed;
    if (dt_ckpt_pieces(layout, mine, &need, &nneed, err, errlen) != 0) return -1;
    dt_ckpt_manifest man;
    dt_ckpt_source src = {0};
    int rc = open_source(dir, layout, want, need, nneed, &man, &src, err, errlen);
    for (int b = 0; rc == 0 && b < DT_CKPT_NBUF; b++)
        if (bufs[b]) zero_padding(bufs[b], mine->len, need, nneed);
    for (int i = 0; rc == 0 && i < nneed; i++)
        rc = fill_piece(&src, layout, &need[i], bufs, err, errlen);
    dt_ckpt_source_close(&src);
    dt_ckpt_manifest_free(&man);
    free(need);
    if (rc != 0) return -1;
    if (o) o->t = r.optimizer_step;
    if (st) *st = r.run;
    return 0;
}

int dt_ckpt_load(const char *dir, dt_gpt *m, dt_optimizer *o, dt_ckpt_state *state, char *err,
                 size_t errlen)
{
    dt_flat_range all = {0, m->n_floats, 0};
    dt_flat_ranges whole = {1, &all, m->n_floats};
    return dt_ckpt_load_ranges(dir, m, &whole, m->params, o, state, err, errlen);
}

/* ---- checking without loading ------------------------------------------- */

/* The buffers a whole-model checkpoint holds: the weights, and the moments
 * its optimizer keeps (Adam's two; SGD's momentum when it saved one). */
static void whole_buffers(const char *dir, const dt_ckpt_record *r, int want[DT_CKPT_NBUF])
{
    char path[DT_PATH_MAX + 32];
    struct stat st;
    dt_strf(path, sizeof path, "%s/optimizer.safetensors", dir);
    int adam = r->optimizer != DT_OPT_SGD;
    want[DT_CKPT_PARAMS] = 1;
    want[DT_CKPT_EXP_AVG] = adam || stat(path, &st) == 0;
    want[DT_CKPT_EXP_AVG_SQ] = adam;
}

int dt_ckpt_check_files(const char *dir, int *nfiles, char *err, size_t errlen)
{
    dt_ckpt_record r;
    dt_gpt_config cfg;
    dt_gpt layout;
    if (dt_ckpt_read_record(dir, &r, err, errlen) != 0 ||
        dt_ckpt_model_config(dir, &cfg, err, errlen) != 0 ||
        dt_gpt_create_layout(&layout, &cfg, DT_PREC_F32, err, errlen) != 0)
        return -1;
    /* A sharded checkpoint's shards are checked whole whatever is wanted. */
    int want[DT_CKPT_NBUF] = {1, 0, 0};
    if (!dt_ckpt_is_sharded(dir)) whole_buffers(dir, &r, want);
    dt_flat_range all = {0, layout.n_floats, 0};
    dt_flat_ranges whole = {1, &all, layout.n_floats};
    dt_ckpt_piece *need = NULL;
    int nneed;
    dt_ckpt_manifest man = {0};
    dt_ckpt_source src = {0};
    int rc = dt_ckpt_pieces(&layout, &whole, &need, &nneed, err, errlen);
    if (rc == 0) rc = open_source(dir, &layout, want, need, nneed, &man, &src, err, errlen);
    *nfiles = src.nfiles;
    dt_ckpt_source_close(&src);
    dt_ckpt_manifest_free(&man);
    free(need);
    dt_gpt_destroy(&layout);
    return rc;
}
