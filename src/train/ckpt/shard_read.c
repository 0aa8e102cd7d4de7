/* Opening a sharded checkpoint's shards as sources of pieces, each shard
 * checked against the manifest before any value is used: present, of the
 * size and checksum recorded, of the same model, holding exactly the
 * tensors its pieces name with their sizes. See ckpt/shard.h. */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "core/parse.h"
#include "core/str.h"
#include "core/sum.h"
#include "train/ckpt/internal.h"

/* Whether the shard holds any element of the wanted pieces. */
static int shard_needed(const dt_ckpt_shard *s, const dt_ckpt_piece *need, int nneed)
{
    for (int i = 0; i < s->npieces; i++)
        for (int j = 0; j < nneed; j++)
            if (s->pieces[i].tensor == need[j].tensor && s->pieces[i].lo < need[j].hi &&
                need[j].lo < s->pieces[i].hi)
                return 1;
    return 0;
}

/* Present, whole, unchanged: checked before the file is parsed, so that a
 * truncated shard is named as such. */
static int check_file(const char *path, const dt_ckpt_shard *s, int rank, char *err,
                      size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        dt_strf(err, errlen,
                "%s: missing (the manifest lists it as rank %d's shard): the checkpoint is "
                "incomplete",
                path, rank);
        return -1;
    }
    if ((uint64_t)st.st_size == s->bytes) return 0;
    dt_strf(err, errlen,
            "%s: %lld bytes, the manifest says %" PRIu64 ": the shard is truncated or damaged",
            path, (long long)st.st_size, s->bytes);
    return -1;
}

static int check_checksum(const dt_st_file *f, const dt_ckpt_shard *s, char *err, size_t errlen)
{
    uint64_t sum = dt_sum64(f->map, f->map_size);
    if (sum == s->checksum) return 0;
    dt_strf(err, errlen,
            "%s: checksum %016" PRIx64 ", the manifest says %016" PRIx64 ": the shard is damaged",
            f->path, sum, s->checksum);
    return -1;
}

/* The model sizes in the shard's metadata (dt_st_write's, as the weights
 * writer records them) must be the manifest's. */
static int check_model(const dt_st_file *f, const dt_gpt_config *c, char *err, size_t errlen)
{
    const struct {
        const char *key;
        int want;
    } s[] = {{"n_layer", c->n_layer},
             {"n_head", c->n_head},
             {"n_embd", c->n_embd},
             {"vocab_size", c->vocab_size},
             {"block_size", c->block_size}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        const char *v = dt_st_meta_get(f, s[i].key);
        long have = -1;
        if (v && dt_parse_long(v, 0, INT_MAX, &have) == 0 && have == s[i].want) continue;
        dt_strf(err, errlen,
                "%s: its metadata gives %s %.20s, the manifest's model has %d: the shard is of "
                "another model",
                f->path, s[i].key, v ? v : "(none)", s[i].want);
        return -1;
    }
    return 0;
}

/* The tensor of piece i for buffer b: 1-D fp32 of the piece's length. */
static const dt_st_tensor *piece_tensor(const dt_st_file *f, const dt_ckpt_shard *s, int i, int b,
                                        char *err, size_t errlen)
{
    const dt_ckpt_piece *p = &s->pieces[i];
    char name[128];
    dt_ckpt_piece_name(name, sizeof name, dt_ckpt_prefix[b], s->names[i], p->lo);
    const dt_st_tensor *t = dt_st_find(f, name);
    if (!t) {
        dt_strf(err, errlen, "%s: tensor %s is missing (the manifest lists the piece %s[%" PRIu64
                ":%" PRIu64 "])",
                f->path, name, s->names[i], p->lo, p->hi);
        return NULL;
    }
    if (t->dtype == DT_ST_F32 && t->ndim == 1 && t->numel == p->hi - p->lo) return t;
    dt_strf(err, errlen,
            "%s: tensor %s holds %" PRIu64 " %s elements in %d dimension(s); the manifest's "
            "piece [%" PRIu64 ":%" PRIu64 "] needs %" PRIu64 " F32 in one",
            f->path, name, t->numel, dt_st_dtype_name(t->dtype), t->ndim, p->lo, p->hi,
            p->hi - p->lo);
    return NULL;
}

/* Adds the shard's pieces to src, their tensors checked. */
static int add_pieces(const dt_st_file *f, const dt_ckpt_shard *s, int moments,
                      const int want[DT_CKPT_NBUF], dt_ckpt_source *src, char *err, size_t errlen)
{
    int per = 1 + moments;
    if (f->ntensors != s->npieces * per) {
        dt_strf(err, errlen,
                "%s: holds %d tensors, the manifest lists %d pieces of %d tensor(s) each: the "
                "manifest disagrees with its shard",
                f->path, f->ntensors, s->npieces, per);
        return -1;
    }
    for (int i = 0; i < s->npieces; i++) {
        dt_ckpt_source_piece *p = &src->p[src->n++];
        *p = (dt_ckpt_source_piece){.tensor = s->pieces[i].tensor, .lo = s->pieces[i].lo,
                                    .hi = s->pieces[i].hi};
        for (int b = 0; b < per; b++) {
            const dt_st_tensor *t = piece_tensor(f, s, i, b, err, errlen);
            if (!t) return -1;
            if (want[b]) p->f[b] = f, p->t[b] = t;
        }
    }
    return 0;
}

static int open_shard(const char *dir, const dt_ckpt_manifest *man, int rank,
                      const int want[DT_CKPT_NBUF], dt_ckpt_source *src, char *err, size_t errlen)
{
    const dt_ckpt_shard *s = &man->shards[rank];
    char path[DT_PATH_MAX + 96];
    dt_strf(path, sizeof path, "%s/%s", dir, s->file);
    if (check_file(path, s, rank, err, errlen) != 0) return -1;
    dt_st_file *f = &src->files[src->nfiles];
    if (dt_st_open(path, f, err, errlen) != 0) return -1;
    src->nfiles++;
    if (check_checksum(f, s, err, errlen) || check_model(f, &man->record.model, err, errlen))
        return -1;
    return add_pieces(f, s, man->moments, want, src, err, errlen);
}

/* The optimizer buffers wanted must have been saved. */
static int check_moments(const char *dir, const dt_ckpt_manifest *man,
                         const int want[DT_CKPT_NBUF], char *err, size_t errlen)
{
    for (int b = DT_CKPT_EXP_AVG; b < DT_CKPT_NBUF; b++) {
        if (!want[b] || man->moments >= b) continue;
        dt_strf(err, errlen,
                "%s/" DT_CKPT_MANIFEST ": the checkpoint holds %d optimizer buffer(s) per "
                "piece; this run's %s needs %s",
                dir, man->moments, dt_opt_kind_name(man->record.optimizer),
                b == DT_CKPT_EXP_AVG ? "exp_avg" : "exp_avg_sq");
        return -1;
    }
    return 0;
}

int dt_ckpt_open_sharded(const char *dir, dt_ckpt_manifest *man, const dt_gpt *layout,
                         const int want[DT_CKPT_NBUF], const dt_ckpt_piece *need, int nneed,
                         dt_ckpt_source *src, char *err, size_t errlen)
{
    memset(src, 0, sizeof *src);
    if (dt_ckpt_manifest_check(dir, man, layout, err, errlen) != 0 ||
        check_moments(dir, man, want, err, errlen) != 0)
        return -1;
    size_t npieces = 0;
    for (int r = 0; r < man->nshards; r++) npieces += (size_t)man->shards[r].npieces;
    src->files = calloc((size_t)man->nshards, sizeof *src->files);
    src->p = calloc(npieces + 1, sizeof *src->p);
    if (!src->files || !src->p) return dt_strf(err, errlen, "%s: out of memory", dir), -1;
    for (int r = 0; r < man->nshards; r++) {
        if (!shard_needed(&man->shards[r], need, nneed)) continue;
        if (open_shard(dir, man, r, want, src, err, errlen) != 0) return -1;
    }
    return 0;
}
