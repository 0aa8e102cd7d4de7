/* Recovery from the snapshot slots (ckpt/shard.h), on one host or many.
 *
 * Each host keeps its own ranks' shard files in its own shared memory, and
 * the manifest only where the group's first rank lives, so no one host
 * sees a whole slot. The ranks therefore pool what their hosts hold: each
 * host's first rank (its leader) reads the marks and manifests of both
 * slots, the leaders' tables are gathered to every rank, and every rank
 * picks the same slot, the newest whose manifest and shards are all held
 * at one step somewhere. The leaders then fetch what their host lacks from
 * a host that has it, in one order every rank follows (so the sends and
 * receives pair up without a deadlock), and each leader makes the slot a
 * checkpoint on its host, which the normal loaders read at any layout. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/str.h"
#include "dtrain/comm.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"

/* A slot's row in a leader's table: the manifest's step and shard count,
 * then for each shard its mark (step, bytes, checksum) and the bytes the
 * manifest gives it. -1 where a host has no such file. */
enum { HDR = 2, PER = 4 };
enum { M_STEP, M_BYTES, M_SUM, M_WANT };
#define CHUNK ((size_t)64 << 20)

typedef struct {
    dt_comm *world; /* NULL: a process alone */
    int size, rank, nmax;
    int64_t moved[2]; /* files and bytes this rank received */
    int64_t *tab; /* [size][1 + DT_CKPT_SLOTS * (HDR + PER * nmax)]: leader flag, slots */
} view;

/* A slot's row: the header, then each shard's fields. */
static size_t row_width(int nmax) { return HDR + PER * (size_t)nmax; }

/* Rank r's part of the table: its leader flag, then a row per slot. */
static int64_t *rank_of(const view *v, int r)
{
    return v->tab + (size_t)r * (1 + DT_CKPT_SLOTS * row_width(v->nmax));
}

static int64_t *row(const view *v, int r, int k)
{
    return rank_of(v, r) + 1 + (size_t)k * row_width(v->nmax);
}

static int is_leader(const view *v, int r) { return rank_of(v, r)[0] != 0; }

/* ---- what this host holds ----------------------------------------------- */

/* Slot k's row of this host, w[row_width(nmax)]: its manifest's step,
 * shard count and shards' bytes, and the marks (-1 where absent). */
static void fill_row(const char *dir, int k, int64_t *w, int nmax)
{
    char e[256];
    long step;
    int n;
    for (size_t i = 0; i < row_width(nmax); i++) w[i] = -1;
    cJSON *j = dt_ckpt_slot_part(dir, k, &step, &n, e, sizeof e);
    const cJSON *shards = cJSON_GetObjectItem(j, "shards");
    w[0] = step;
    w[1] = n;
    for (int r = 0; r < nmax; r++) {
        int64_t *s = w + HDR + PER * r;
        long ms;
        uint64_t bytes, sum;
        const char *b = r < n ? cJSON_GetStringValue(
                                    cJSON_GetObjectItem(cJSON_GetArrayItem(shards, r), "bytes"))
                              : NULL;
        if (b) s[M_WANT] = (int64_t)strtoull(b, NULL, 10);
        if (dt_ckpt_slot_read_mark(dir, k, r, &ms, &bytes, &sum) == 0) {
            s[M_STEP] = ms;
            s[M_BYTES] = (int64_t)bytes;
            s[M_SUM] = (int64_t)sum;
        }
    }
    cJSON_Delete(j);
}

/* Every rank's table: the leaders' rows, the others' empty. */
static int gather(view *v, const char *dir, char *err, size_t errlen)
{
    const int leader = !v->world || dt_comm_local_rank(v->world) == 0;
    int64_t most = 0;
    for (int k = 0; leader && k < DT_CKPT_SLOTS; k++) {
        char e[256];
        long step;
        int n;
        cJSON_Delete(dt_ckpt_slot_part(dir, k, &step, &n, e, sizeof e));
        if (n > most) most = n;
    }
    if (v->world && dt_allreduce(v->world, &most, &most, 1, DT_I64, DT_MAX))
        return dt_strf(err, errlen, "restart: pooling the hosts' snapshots: %s",
                       dt_comm_error(v->world)), -1;
    v->nmax = (int)most;
    const size_t width = row_width(v->nmax), per = 1 + DT_CKPT_SLOTS * width;
    int64_t *mine = calloc(per, sizeof *mine);
    v->tab = calloc(per * (size_t)v->size, sizeof *v->tab);
    if (!mine || !v->tab) return free(mine), dt_strf(err, errlen, "out of memory"), -1;
    mine[0] = leader;
    for (int k = 0; k < DT_CKPT_SLOTS; k++) {
        int64_t *w = mine + 1 + (size_t)k * width;
        if (leader) {
            fill_row(dir, k, w, v->nmax);
        } else {
            for (size_t i = 0; i < width; i++) w[i] = -1;
        }
    }
    int rc = 0;
    if (!v->world) memcpy(v->tab, mine, per * sizeof *mine);
    else if (dt_allgather(v->world, mine, v->tab, per, DT_I64))
        rc = (dt_strf(err, errlen, "restart: pooling the hosts' snapshots: %s",
                      dt_comm_error(v->world)), -1);
    free(mine);
    return rc;
}

/* ---- which slot --------------------------------------------------------- */

/* Whether leader h's host holds shard r of slot k at step, with the bytes
 * that the manifest used (leader m's) gives it. */
static int has(const view *v, int h, int k, long step, int m, int r)
{
    const int64_t *s = row(v, h, k) + HDR + PER * r;
    return is_leader(v, h) && s[M_STEP] == step &&
           s[M_BYTES] == row(v, m, k)[HDR + PER * r + M_WANT];
}

/* The first leader whose host holds it, or -1. */
static int holder(const view *v, int k, long step, int m, int r)
{
    for (int h = 0; h < v->size; h++)
        if (has(v, h, k, step, m, r)) return h;
    return -1;
}

/* The newest whole slot: *k, *step and the leader m whose manifest it
 * uses; 0, or 1 when there is none. */
static int choose(const view *v, int *k, long *step, int *m)
{
    *k = *m = -1;
    *step = -1;
    for (int s = 0; s < DT_CKPT_SLOTS; s++) {
        for (int h = 0; h < v->size; h++) {
            const int64_t *w = row(v, h, s);
            if (!is_leader(v, h) || w[0] <= *step || w[1] <= 0) continue;
            int whole = 1;
            for (int r = 0; whole && r < w[1]; r++) whole = holder(v, s, w[0], h, r) >= 0;
            if (!whole) continue;
            *k = s;
            *step = w[0];
            *m = h;
        }
    }
    return *k < 0 ? 1 : 0;
}

/* ---- fetching what a host lacks ----------------------------------------- */

static int send_file(dt_comm *c, const char *path, int peer, char *err, size_t errlen)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int64_t size = fd >= 0 && fstat(fd, &st) == 0 ? (int64_t)st.st_size : -1;
    void *map = size > 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    if (map == MAP_FAILED) size = -1, map = NULL;
    if (fd >= 0) close(fd);
    int rc = dt_send(c, &size, 1, DT_I64, peer);
    for (int64_t at = 0; rc == 0 && at < size; at += (int64_t)CHUNK) {
        const size_t n = (size_t)(size - at) < CHUNK ? (size_t)(size - at) : CHUNK;
        rc = dt_send(c, (const unsigned char *)map + at, n, DT_U8, peer);
    }
    if (map) munmap(map, (size_t)size);
    if (rc) return dt_strf(err, errlen, "restart: sending %s: %s", path, dt_comm_error(c)), -2;
    if (size < 0) return dt_strf(err, errlen, "restart: cannot read %s", path), -1;
    return 0;
}

/* For the test of a failure during a recovery: with
 * DTRAIN_SNAPSHOT_TEST_DIE_FETCHING set, a rank of the job's first restart
 * is killed (SIGKILL) as it starts to receive a file. */
static void test_die(void)
{
    const char *v = getenv("DTRAIN_SNAPSHOT_TEST_DIE_FETCHING");
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    if (v && *v && restart && atol(restart) == 1) raise(SIGKILL);
}

/* -1: a failure here (the run goes on to agree on it); -2: the communicator
 * failed (the job is failing). */
static int recv_file(dt_comm *c, const char *path, int peer, char *err, size_t errlen)
{
    int64_t size;
    if (dt_recv(c, &size, 1, DT_I64, peer))
        return dt_strf(err, errlen, "restart: receiving %s: %s", path, dt_comm_error(c)), -2;
    if (size < 0) return dt_strf(err, errlen, "restart: rank %d could not read its copy of %s",
                                 peer, path), -1;
    unsigned char *buf = malloc(size < (int64_t)CHUNK ? (size_t)size + 1 : CHUNK);
    if (!buf) return dt_strf(err, errlen, "restart: out of memory receiving %s", path), -2;
    dt_afile a;
    int ok = dt_afile_open(&a, path, err, errlen) == 0;
    test_die();
    for (int64_t at = 0; at < size; at += (int64_t)CHUNK) {
        const size_t n = (size_t)(size - at) < CHUNK ? (size_t)(size - at) : CHUNK;
        if (dt_recv(c, buf, n, DT_U8, peer)) {
            if (ok) dt_afile_abort(&a);
            free(buf);
            return dt_strf(err, errlen, "restart: receiving %s: %s", path, dt_comm_error(c)),
                   -2;
        }
        if (ok && dt_afile_write(&a, buf, n, err, errlen)) ok = 0;
    }
    free(buf);
    return ok && dt_afile_commit(&a, err, errlen) == 0 ? 0 : -1;
}

/* One file from leader `from` to leader `to` (mark: shard r's, written
 * beside it once it is whole; r -1 for the manifest). */
static int move_one(view *v, const char *dir, int k, int from, int to, int r,
                    const int64_t *mark, long step, int n, char *err, size_t errlen)
{
    char name[64], path[DT_PATH_MAX + 128];
    if (r < 0) dt_strf(name, sizeof name, "%s", DT_CKPT_SLOT_PART);
    else dt_ckpt_shard_name(name, sizeof name, r, n);
    dt_ckpt_slot_path(path, sizeof path, dir, k, name);
    if (v->rank == from) return send_file(v->world, path, to, err, errlen);
    if (v->rank != to) return 0;
    int rc = recv_file(v->world, path, from, err, errlen);
    struct stat st;
    if (rc == 0 && stat(path, &st) == 0) {
        v->moved[0]++;
        v->moved[1] += (int64_t)st.st_size;
    }
    if (rc == 0 && r >= 0) {
        char line[96];
        dt_ckpt_slot_mark_path(path, sizeof path, dir, k, r);
        dt_strf(line, sizeof line, "%ld %llu %016" PRIx64 "\n", step,
                (unsigned long long)mark[M_BYTES], (uint64_t)mark[M_SUM]);
        rc = dt_afile_write_file(path, line, strlen(line), err, errlen);
    }
    return rc;
}

/* Every leader's host made to hold slot k's manifest and every shard at
 * step. 0, -1 (a file failed: agreed on after), -2 (the comm failed). */
static int fetch(view *v, const char *dir, int k, long step, int m, char *err,
                 size_t errlen)
{
    const int n = (int)row(v, m, k)[1];
    int rc = 0;
    for (int h = 0; h < v->size; h++) {
        if (!is_leader(v, h)) continue;
        const int64_t *w = row(v, h, k);
        if (h == v->rank) {
            char path[DT_PATH_MAX + 16];
            dt_ckpt_slot_path(path, sizeof path, dir, k, NULL);
            if (mkdir(path, 0700) != 0 && errno != EEXIST)
                rc = (dt_strf(err, errlen, "%s: %s", path, strerror(errno)), -1);
        }
        if (w[0] != step || w[1] != n) {
            const int got = move_one(v, dir, k, m, h, -1, NULL, step, n, err, errlen);
            if (got == -2) return -2;
            if (got) rc = -1;
        }
        for (int r = 0; r < n; r++) {
            if (has(v, h, k, step, m, r)) continue;
            const int from = holder(v, k, step, m, r);
            const int got = move_one(v, dir, k, from, h, r, row(v, from, k) + HDR + PER * r,
                                     step, n, err, errlen);
            if (got == -2) return -2;
            if (got) rc = -1;
        }
    }
    return rc;
}

/* ---- the checkpoint ----------------------------------------------------- */

/* A leader: slot k's manifest with every shard's checksum (from the marks
 * pooled), then `latest` pointing at it. */
static int make_checkpoint(const view *v, const char *dir, int k, long step, int m, char *err,
                           size_t errlen)
{
    const int n = (int)row(v, m, k)[1];
    uint64_t *sums = calloc((size_t)n + 1, sizeof *sums);
    if (!sums) return dt_strf(err, errlen, "out of memory"), -1;
    for (int r = 0; r < n; r++)
        sums[r] = (uint64_t)row(v, holder(v, k, step, m, r), k)[HDR + PER * r + M_SUM];
    char *text = dt_ckpt_slot_manifest(dir, k, step, sums, n, err, errlen);
    free(sums);
    if (!text) return -1;
    char path[DT_PATH_MAX + 64], line[32];
    dt_ckpt_slot_path(path, sizeof path, dir, k, DT_CKPT_MANIFEST);
    int rc = dt_afile_write_file(path, text, strlen(text), err, errlen);
    free(text);
    dt_strf(path, sizeof path, "%s/latest", dir);
    dt_strf(line, sizeof line, "slot-%d\n", k);
    return rc ? -1 : dt_afile_write_file(path, line, strlen(line), err, errlen);
}

int dt_ckpt_slots_recover(const char *dir, dt_comm *world, long *step, uint64_t moved[2],
                          char *err, size_t errlen)
{
    view v = {.world = world, .size = world ? dt_comm_size(world) : 1,
              .rank = world ? dt_comm_rank(world) : 0};
    int k, m;
    err[0] = 0;
    moved[0] = moved[1] = 0;
    if (gather(&v, dir, err, errlen)) return free(v.tab), -1;
    if (choose(&v, &k, step, &m)) return free(v.tab), 1;
    int rc = fetch(&v, dir, k, *step, m, err, errlen);
    if (rc == 0 && is_leader(&v, v.rank)) rc = make_checkpoint(&v, dir, k, *step, m, err, errlen);
    free(v.tab);
    if (rc == -2) return -1;
    int64_t bad = rc != 0 ? v.rank + 1 : 0;
    if (world && (dt_allreduce(world, &bad, &bad, 1, DT_I64, DT_MAX) ||
                  dt_allreduce(world, v.moved, v.moved, 2, DT_I64, DT_SUM)))
        return dt_strf(err, errlen, "restart: agreeing on the snapshot: %s",
                       dt_comm_error(world)), -1;
    if (bad && rc == 0)
        dt_strf(err, errlen, "restart: rank %d could not make the snapshot of step %ld whole on "
                "its host", (int)bad - 1, *step);
    moved[0] = (uint64_t)v.moved[0];
    moved[1] = (uint64_t)v.moved[1];
    return bad ? -1 : 0;
}
