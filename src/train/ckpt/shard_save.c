/* Saving a sharded checkpoint, collectively: every rank writes its shard
 * into the temporary directory rank 0 made, the ranks agree that every
 * shard is whole, and rank 0 writes the manifest and moves the checkpoint
 * into place. See ckpt/shard.h. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/fault.h"
#include "core/str.h"
#include "core/sum.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"
#include "train/weights/weights.h"

int dt_ckpt_agree(dt_ckpt_crew *c, dt_ckpt_report *me, const char *err_in, char *err,
                  size_t errlen)
{
    if (!me->ok) dt_strf(me->msg, sizeof me->msg, "%s", err_in);
    if (!c->group) {
        c->all[0] = *me;
    } else if (dt_allgather(c->group, me, c->all, sizeof *me, DT_U8) != 0) {
        dt_strf(err, errlen, "rank %d: the ranks could not agree on the checkpoint: %s", c->rank,
                dt_comm_error(c->group));
        return -1;
    }
    for (int r = 0; r < c->size; r++) {
        if (c->all[r].ok) continue;
        if (r != c->rank) dt_strf(err, errlen, "rank %d failed: %s", r, c->all[r].msg);
        return -1;
    }
    return 0;
}

/* ---- this rank's shard -------------------------------------------------- */

int dt_ckpt_check_finite(const dt_gpt *layout, const dt_ckpt_piece *p, int np,
                         const float *const bufs[DT_CKPT_NBUF], int nbuf, int rank, char *err,
                         size_t errlen)
{
    for (int i = 0; i < np; i++) {
        for (int b = 0; b < nbuf; b++) {
            const float *x = bufs[b] + p[i].at;
            if (dt_weights_all_finite(x, p[i].hi - p[i].lo, 0)) continue;
            for (uint64_t e = 0; e < p[i].hi - p[i].lo; e++) {
                if (isfinite(x[e])) continue;
                dt_strf(err, errlen,
                        "rank %d: refusing to save non-finite values: tensor %s%s holds %g at "
                        "element %llu",
                        rank, dt_ckpt_prefix[b], layout->tensors[p[i].tensor].name, (double)x[e],
                        (unsigned long long)(p[i].lo + e));
                return -1;
            }
        }
    }
    return 0;
}

int dt_ckpt_write_shard(const char *path, const dt_gpt *layout, const dt_ckpt_piece *p, int np,
                        const float *const bufs[DT_CKPT_NBUF], int nbuf, uint64_t *bytes,
                        uint64_t *sum, char *err, size_t errlen)
{
    const float **src = malloc((size_t)(np * nbuf + 1) * sizeof *src);
    if (!src) return dt_strf(err, errlen, "%s: out of memory", path), -1;
    for (int b = 0; b < nbuf; b++)
        for (int i = 0; i < np; i++) src[b * np + i] = bufs[b] + p[i].at;
    int rc = dt_ckpt_write_shard_from(path, layout, p, np, nbuf, src, bytes, sum, err, errlen);
    free(src);
    return rc;
}

int dt_ckpt_write_shard_from(const char *path, const dt_gpt *layout, const dt_ckpt_piece *p,
                             int np, int nbuf, const float *const *src, uint64_t *bytes,
                             uint64_t *sum, char *err, size_t errlen)
{
    int n = np * nbuf;
    dt_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    char (*names)[128] = calloc((size_t)n + 1, sizeof *names);
    int rc = -1;
    if (!e || !names) {
        dt_strf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    for (int b = 0; b < nbuf; b++) {
        for (int i = 0; i < np; i++) {
            int k = b * np + i;
            dt_ckpt_piece_name(names[k], sizeof names[k], dt_ckpt_prefix[b],
                               layout->tensors[p[i].tensor].name, p[i].lo);
            e[k] = (dt_st_entry){.name = names[k], .data = src[k], .ndim = 1,
                                 .shape = {(int64_t)(p[i].hi - p[i].lo)}};
        }
    }
    char v[5][16];
    const dt_gpt_config *c = &layout->cfg;
    const int sizes[5] = {c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size};
    for (int i = 0; i < 5; i++) dt_strf(v[i], sizeof v[i], "%d", sizes[i]);
    const dt_st_meta meta[5] = {{"n_layer", v[0]},    {"n_head", v[1]},    {"n_embd", v[2]},
                                {"vocab_size", v[3]}, {"block_size", v[4]}};
    dt_st_file f;
    if (dt_st_write(path, e, n, meta, 5, err, errlen) != 0 || dt_st_open(path, &f, err, errlen))
        goto out;
    *bytes = f.map_size;
    *sum = dt_sum64(f.map, f.map_size);
    dt_st_close(&f);
    rc = 0;
out:
    free(e);
    free(names);
    return rc;
}

/* For the test of a rank killed during a save: DTRAIN_CKPT_TEST_EXIT_RANK
 * names a rank that cuts its shard to half its size, as a write cut short
 * would leave it, and exits at once. */
static void test_exit_hook(const char *path, int rank, uint64_t bytes)
{
    const char *v = getenv("DTRAIN_CKPT_TEST_EXIT_RANK");
    if (!v || atoi(v) != rank) return;
    if (truncate(path, (off_t)(bytes / 2)) != 0) _exit(3);
    _exit(3);
}

/* ---- the manifest (rank 0) ---------------------------------------------- */

int64_t *dt_ckpt_gather_pieces(dt_ckpt_crew *c, const dt_ckpt_piece *p, int np, int *max,
                               char *err, size_t errlen)
{
    *max = 1;
    for (int r = 0; r < c->size; r++)
        if (c->all[r].value[2] > *max) *max = (int)c->all[r].value[2];
    size_t per = (size_t)*max * 3;
    int64_t *mine = calloc(per, sizeof *mine), *all = calloc(per * (size_t)c->size, sizeof *all);
    int rc = mine && all ? 0 : -1;
    for (int i = 0; rc == 0 && i < np; i++) {
        mine[3 * i] = p[i].tensor;
        mine[3 * i + 1] = (int64_t)p[i].lo;
        mine[3 * i + 2] = (int64_t)p[i].hi;
    }
    if (rc == 0 && c->group) rc = dt_allgather(c->group, mine, all, per, DT_I64);
    if (rc == 0 && !c->group) memcpy(all, mine, per * sizeof *all);
    free(mine);
    if (rc == 0) return all;
    free(all);
    dt_strf(err, errlen, "rank %d: gathering the checkpoint's pieces failed: %s", c->rank,
            c->group && rc != -1 ? dt_comm_error(c->group) : "out of memory");
    return NULL;
}

int dt_ckpt_write_manifest(const char *tmp, const char *name, dt_ckpt_crew *c,
                           const dt_gpt *layout, const dt_ckpt_record *rec, int stage,
                           int moments, const int64_t *all, int max, char *err, size_t errlen)
{
    dt_ckpt_manifest m = {.stage = stage, .ranks = c->size, .moments = moments,
                          .record = *rec, .nshards = c->size};
    m.shards = calloc((size_t)c->size, sizeof *m.shards);
    dt_ckpt_piece *pieces = calloc((size_t)c->size * (size_t)max, sizeof *pieces);
    char *text = NULL;
    if (m.shards && pieces) {
        for (int r = 0; r < c->size; r++) {
            dt_ckpt_shard *s = &m.shards[r];
            dt_ckpt_shard_name(s->file, sizeof s->file, r, c->size);
            s->bytes = (uint64_t)c->all[r].value[0];
            s->checksum = (uint64_t)c->all[r].value[1];
            s->npieces = (int)c->all[r].value[2];
            s->pieces = pieces + (size_t)r * (size_t)max;
            const int64_t *q = all + (size_t)r * (size_t)max * 3;
            for (int i = 0; i < s->npieces; i++)
                s->pieces[i] = (dt_ckpt_piece){(int)q[3 * i], (uint64_t)q[3 * i + 1],
                                               (uint64_t)q[3 * i + 2], 0};
        }
        text = dt_ckpt_manifest_format(&m, layout);
    }
    free(m.shards);
    free(pieces);
    if (!text) return dt_strf(err, errlen, "%s: out of memory for the manifest", tmp), -1;
    char path[DT_PATH_MAX + 160];
    dt_strf(path, sizeof path, "%s/%s", tmp, name);
    int rc = dt_afile_write_file(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

/* ---- the save ----------------------------------------------------------- */

typedef struct {
    const char *out_dir;
    const dt_gpt *layout;
    const dt_ckpt_state *st;
    int stage, moments;
    const float *bufs[DT_CKPT_NBUF];
    dt_ckpt_piece *p;
    int np;
    dt_ckpt_record rec;
    char tmp[DT_PATH_MAX + 128];
    int made;  /* rank 0 made tmp */
    int known; /* every rank knows tmp's name (and may have written into it) */
} job;

/* Part 1: every rank's values are checked; rank 0 makes the directory. */
static int prepare(dt_ckpt_crew *c, job *j, const dt_flat_ranges *mine, const dt_optimizer *o,
                   char *err, size_t errlen)
{
    dt_ckpt_report me = {.ok = 1};
    int rc = dt_ckpt_pieces(j->layout, mine, &j->p, &j->np, err, errlen);
    if (rc == 0)
        rc = dt_ckpt_check_finite(j->layout, j->p, j->np, j->bufs, 1 + j->moments, c->rank, err,
                                  errlen);
    if (rc == 0 && c->rank == 0)
        rc = dt_ckpt_make_record(j->out_dir, j->layout, o, j->st, &j->rec, err, errlen);
    if (rc == 0 && c->rank == 0) {
        me.value[0] = (int64_t)getpid();
        rc = dt_ckpt_make_tmp(j->out_dir, j->st->step, (long)me.value[0], j->tmp, sizeof j->tmp,
                              err, errlen);
        j->made = rc == 0;
    }
    me.ok = rc == 0;
    if (dt_ckpt_agree(c, &me, err, err, errlen) != 0) return -1;
    dt_ckpt_tmp_path(j->tmp, sizeof j->tmp, j->out_dir, j->st->step, (long)c->all[0].value[0]);
    j->known = 1;
    return 0;
}

/* Part 2: every rank writes its shard. */
static int write_own(dt_ckpt_crew *c, job *j, char *err, size_t errlen)
{
    char name[64], path[DT_PATH_MAX + 200];
    dt_ckpt_shard_name(name, sizeof name, c->rank, c->size);
    dt_strf(path, sizeof path, "%s/%s", j->tmp, name);
    uint64_t bytes = 0, sum = 0;
    dt_ckpt_report me = {.ok = 1};
    me.ok = dt_ckpt_write_shard(path, j->layout, j->p, j->np, j->bufs, 1 + j->moments, &bytes,
                                &sum, err, errlen) == 0;
    if (me.ok) test_exit_hook(path, c->rank, bytes);
    dt_fault_point_of("save", j->st->step); /* its shard written, not yet whole */
    me.value[0] = (int64_t)bytes;
    me.value[1] = (int64_t)sum;
    me.value[2] = j->np;
    return dt_ckpt_agree(c, &me, err, err, errlen);
}

/* Part 3: rank 0 writes the manifest and moves the checkpoint into place;
 * the others learn how that went. */
static int finish(dt_ckpt_crew *c, job *j, long keep_last, char *err, size_t errlen)
{
    int max;
    int64_t *all = dt_ckpt_gather_pieces(c, j->p, j->np, &max, err, errlen);
    dt_ckpt_report me = {.ok = all != NULL};
    if (me.ok && c->rank == 0) {
        me.ok = dt_ckpt_write_manifest(j->tmp, DT_CKPT_MANIFEST, c, j->layout, &j->rec, j->stage, j->moments, all,
                                       max, err, errlen) == 0 &&
                dt_ckpt_publish(j->out_dir, j->st->step, j->tmp, err, errlen) == 0;
        if (me.ok) dt_ckpt_prune(j->out_dir, j->st->step, keep_last > 0 ? keep_last : 1);
    }
    free(all);
    return dt_ckpt_agree(c, &me, err, err, errlen);
}

int dt_ckpt_save_sharded(const char *out_dir, const dt_gpt *layout, const dt_flat_ranges *mine,
                         const float *params, const dt_optimizer *o, const dt_ckpt_state *st,
                         int stage, dt_comm *group, long keep_last, char *path_out,
                         size_t path_len, char *err, size_t errlen)
{
    dt_ckpt_crew c = {.group = group, .rank = group ? dt_comm_rank(group) : 0,
              .size = group ? dt_comm_size(group) : 1};
    job j = {.out_dir = out_dir, .layout = layout, .st = st, .stage = stage,
             .moments = o->v ? 2 : o->m ? 1 : 0, .bufs = {params, o->m, o->v}};
    c.all = calloc((size_t)c.size, sizeof *c.all);
    if (!c.all) return dt_strf(err, errlen, "out of memory"), -1;
    int rc = prepare(&c, &j, mine, o, err, errlen);
    if (rc == 0) rc = write_own(&c, &j, err, errlen);
    if (rc == 0) rc = finish(&c, &j, keep_last, err, errlen);
    /* A failed save leaves no temporary directory (the next save's pruning
     * would remove it otherwise). Every rank that may have written into it
     * removes what is there: a rank still writing when rank 0 cleans up
     * would otherwise leave its shard, and the directory, behind; the last
     * to finish empties it (one that finds it gone cannot write there). */
    if (rc != 0 && (j.made || j.known)) dt_ckpt_remove_tree(j.tmp);
    if (rc == 0 && path_out) dt_ckpt_dir_path(path_out, path_len, out_dir, st->step);
    free(j.p);
    free(c.all);
    return rc;
}
