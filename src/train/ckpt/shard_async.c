/* A sharded save in two halves, for snapshots written while training goes
 * on: the collective half on the training thread (which owns the
 * communicators), the writing on another thread without a call to the
 * communicator. The ranks of one host share the directory, and rank 0
 * learns from files that every shard is whole. See ckpt/shard.h. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/str.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"

/* How long rank 0 waits for the other ranks' shards of one save. */
#define MARKER_WAIT_S 300

struct dt_ckpt_async {
    dt_ckpt_crew crew;
    const dt_gpt *layout;
    dt_ckpt_piece *p; /* this rank's pieces: the layout is fixed, found once */
    int np;
    int64_t *all; /* every rank's pieces, gathered once */
    int max;
    int64_t *npieces; /* [size] */
    /* The save under way: set by begin, read by write. */
    char out_dir[DT_PATH_MAX];
    char tmp[DT_PATH_MAX + 128];
    dt_ckpt_state st;
    dt_ckpt_record rec; /* rank 0 */
    const float *bufs[DT_CKPT_NBUF];
    int stage, moments;
};

/* Once: this rank's pieces, and every rank's. */
static int plan(dt_ckpt_async *a, const dt_flat_ranges *mine, char *err, size_t errlen)
{
    dt_ckpt_crew *c = &a->crew;
    dt_ckpt_report me = {.ok = 1};
    int rc = dt_ckpt_pieces(a->layout, mine, &a->p, &a->np, err, errlen);
    me.ok = rc == 0;
    me.value[2] = a->np;
    if (dt_ckpt_agree(c, &me, err, err, errlen)) return -1;
    if (!(a->npieces = calloc((size_t)c->size, sizeof *a->npieces)))
        return dt_strf(err, errlen, "out of memory"), -1;
    for (int r = 0; r < c->size; r++) a->npieces[r] = c->all[r].value[2];
    a->all = dt_ckpt_gather_pieces(c, a->p, a->np, &a->max, err, errlen);
    return a->all ? 0 : -1;
}

static dt_ckpt_async *create(const dt_gpt *layout, const dt_flat_ranges *mine, dt_comm *group,
                             char *err, size_t errlen)
{
    dt_ckpt_async *a = calloc(1, sizeof *a);
    if (!a) return dt_strf(err, errlen, "out of memory"), NULL;
    a->layout = layout;
    a->crew = (dt_ckpt_crew){.group = group, .rank = group ? dt_comm_rank(group) : 0,
                             .size = group ? dt_comm_size(group) : 1};
    a->crew.all = calloc((size_t)a->crew.size, sizeof *a->crew.all);
    if (a->crew.all && plan(a, mine, err, errlen) == 0) return a;
    if (!a->crew.all) dt_strf(err, errlen, "out of memory");
    dt_ckpt_async_free(a);
    return NULL;
}

void dt_ckpt_async_free(dt_ckpt_async *a)
{
    if (!a) return;
    free(a->p);
    free(a->all);
    free(a->npieces);
    free(a->crew.all);
    free(a);
}

int dt_ckpt_async_begin(dt_ckpt_async **ap, const char *out_dir, const dt_gpt *layout,
                        const dt_flat_ranges *mine, const float *params, const dt_optimizer *o,
                        const dt_ckpt_state *st, int stage, dt_comm *group, const char *prev_err,
                        char *err, size_t errlen)
{
    if (!*ap && !(*ap = create(layout, mine, group, err, errlen))) return -1;
    dt_ckpt_async *a = *ap;
    dt_ckpt_crew *c = &a->crew;
    dt_strf(a->out_dir, sizeof a->out_dir, "%s", out_dir);
    a->st = *st;
    a->stage = stage;
    a->moments = o->v ? 2 : o->m ? 1 : 0;
    a->bufs[0] = params;
    a->bufs[1] = o->m;
    a->bufs[2] = o->v;
    dt_ckpt_report me = {.ok = !prev_err};
    int rc = prev_err ? (dt_strf(err, errlen, "%s", prev_err), -1) : 0;
    if (rc == 0 && c->rank == 0)
        rc = dt_ckpt_make_record(out_dir, layout, o, &a->st, &a->rec, err, errlen);
    if (rc == 0 && c->rank == 0) {
        me.value[0] = (int64_t)getpid();
        rc = dt_ckpt_make_tmp(out_dir, st->step, (long)me.value[0], a->tmp, sizeof a->tmp, err,
                              errlen);
    }
    me.ok = rc == 0;
    if (dt_ckpt_agree(c, &me, err, err, errlen)) {
        if (c->rank == 0 && rc == 0) dt_ckpt_remove_tree(a->tmp);
        return -1;
    }
    dt_ckpt_tmp_path(a->tmp, sizeof a->tmp, out_dir, st->step, (long)c->all[0].value[0]);
    return 0;
}

/* ---- the writing (no communicator) -------------------------------------- */

static void marker_path(char *buf, size_t len, const char *tmp, int rank)
{
    dt_strf(buf, len, "%s/.done-%05d", tmp, rank);
}

/* This rank's result, for rank 0: "ok BYTES SUM" or "failed MESSAGE",
 * written whole (a temporary file renamed into place). */
static int write_marker(dt_ckpt_async *a, int ok, uint64_t bytes, uint64_t sum, const char *why,
                        char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 160], line[512];
    marker_path(path, sizeof path, a->tmp, a->crew.rank);
    if (ok)
        dt_strf(line, sizeof line, "ok %llu %llu\n", (unsigned long long)bytes,
                (unsigned long long)sum);
    else
        dt_strf(line, sizeof line, "failed %s\n", why);
    return dt_afile_write_file(path, line, strlen(line), err, errlen);
}

/* Reads rank r's marker: 1 when there, 0 when not yet, -1 with the
 * rank's message when it failed. */
static int read_marker(dt_ckpt_async *a, int r, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 160], line[512] = {0};
    unsigned long long bytes, sum;
    marker_path(path, sizeof path, a->tmp, r);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (got && sscanf(line, "ok %llu %llu", &bytes, &sum) == 2) {
        a->crew.all[r].value[0] = (int64_t)bytes;
        a->crew.all[r].value[1] = (int64_t)sum;
        a->crew.all[r].value[2] = a->npieces[r];
        unlink(path); /* no part of the checkpoint */
        return 1;
    }
    line[strcspn(line, "\n")] = 0;
    dt_strf(err, errlen, "rank %d failed: %s", r, strncmp(line, "failed ", 7) ? line : line + 7);
    return -1;
}

/* Rank 0: until every rank's marker is there (a rank of this host writes
 * it into the shared directory), the deadline passes, or abandon is set. */
static int wait_markers(dt_ckpt_async *a, const atomic_int *abandon, char *err, size_t errlen)
{
    const struct timespec nap = {0, 2000000};
    const time_t deadline = time(NULL) + MARKER_WAIT_S;
    for (int r = 0; r < a->crew.size;) {
        int got = read_marker(a, r, err, errlen);
        if (got < 0) return -1;
        if (got) {
            r++;
            continue;
        }
        if (atomic_load(abandon)) return dt_strf(err, errlen, "abandoned"), -1;
        if (time(NULL) > deadline)
            return dt_strf(err, errlen, "%s: rank %d's shard did not come within %d s (the ranks "
                           "of a job with restarts must share one host's /dev/shm)",
                           a->tmp, r, MARKER_WAIT_S), -1;
        nanosleep(&nap, NULL);
    }
    return 0;
}

int dt_ckpt_async_write(dt_ckpt_async *a, long keep_last, const atomic_int *abandon, char *err,
                        size_t errlen)
{
    char name[64], path[DT_PATH_MAX + 200];
    dt_ckpt_crew *c = &a->crew;
    uint64_t bytes = 0, sum = 0;
    const int nbuf = 1 + a->moments;
    dt_ckpt_shard_name(name, sizeof name, c->rank, c->size);
    dt_strf(path, sizeof path, "%s/%s", a->tmp, name);
    int rc = dt_ckpt_check_finite(a->layout, a->p, a->np, a->bufs, nbuf, c->rank, err, errlen);
    if (rc == 0)
        rc = dt_ckpt_write_shard(path, a->layout, a->p, a->np, a->bufs, nbuf, &bytes, &sum, err,
                                 errlen);
    char why[512];
    if (rc != 0) unlink(path); /* room for the marker that says why */
    if (write_marker(a, rc == 0, bytes, sum, err, why, sizeof why) && rc == 0)
        rc = (dt_strf(err, errlen, "%s", why), -1);
    if (c->rank == 0 && rc == 0) rc = wait_markers(a, abandon, err, errlen);
    if (c->rank == 0 && rc == 0)
        rc = dt_ckpt_write_manifest(a->tmp, c, a->layout, &a->rec, a->stage, a->moments, a->all,
                                    a->max, err, errlen);
    if (c->rank == 0 && rc == 0)
        rc = dt_ckpt_publish(a->out_dir, a->st.step, a->tmp, err, errlen);
    if (c->rank == 0 && rc == 0)
        dt_ckpt_prune(a->out_dir, a->st.step, keep_last > 0 ? keep_last : 1);
    /* A failed save leaves no temporary directory. Rank 0 removes it, once
     * the others' markers cannot still be waited for: a rank still writing
     * then finds it gone. */
    if (rc != 0 && c->rank == 0) dt_ckpt_remove_tree(a->tmp);
    return rc;
}
