/* Snapshots in two slots written in place (see ckpt/shard.h). A shard file
 * is made once per slot, or kept from the attempt before, and mapped; a
 * snapshot then copies the live buffers into the mapping with the
 * checksum taken on the way (dt_sum_copy: one read and one write past
 * the cache), and tmpfs allocates no pages for it. The mapping is page
 * aligned, so a tensor's place in memory and in the file agree modulo 32,
 * as that copy wants. */
#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/fault.h"
#include "core/file.h"
#include "core/sum.h"
#include "core/str.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"
#include "train/ckpt/slots_internal.h"

#define NSLOTS DT_CKPT_SLOTS
#define PART DT_CKPT_SLOT_PART

void dt_ckpt_slot_path(char *buf, size_t len, const char *dir, int k, const char *name)
{
    dt_strf(buf, len, "%s/slot-%d%s%s", dir, k, name ? "/" : "", name ? name : "");
}

void dt_ckpt_slot_mark_path(char *buf, size_t len, const char *dir, int k, int rank)
{
    char name[32];
    dt_strf(name, sizeof name, "mark-%05d", rank);
    dt_ckpt_slot_path(buf, len, dir, k, name);
}

int dt_ckpt_slot_read_mark(const char *dir, int k, int r, long *step, uint64_t *bytes,
                           uint64_t *sum)
{
    char path[DT_PATH_MAX + 64], line[128] = {0};
    unsigned long long b, c;
    dt_ckpt_slot_mark_path(path, sizeof path, dir, k, r);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(line, sizeof line, f) && sscanf(line, "%ld %llu %llx", step, &b, &c) == 3;
    fclose(f);
    *bytes = b;
    *sum = c;
    return ok ? 0 : -1;
}

cJSON *dt_ckpt_slot_part(const char *dir, int k, long *step, int *n, char *err,
                         size_t errlen)
{
    char path[DT_PATH_MAX + 64];
    dt_ckpt_slot_path(path, sizeof path, dir, k, PART);
    *step = -1;
    *n = 0;
    char *text = dt_read_file(path, DT_CKPT_MANIFEST_BYTES, NULL, err, errlen);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *st = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "state"), "step");
    const cJSON *shards = cJSON_GetObjectItem(j, "shards");
    if (cJSON_IsNumber(st) && cJSON_IsArray(shards) && cJSON_GetArraySize(shards) > 0) {
        *step = (long)st->valuedouble;
        *n = cJSON_GetArraySize(shards);
        return j;
    }
    if (text) dt_strf(err, errlen, "%s: not a snapshot's manifest", path);
    cJSON_Delete(j);
    return NULL;
}

char *dt_ckpt_slot_manifest(const char *dir, int k, long step, const uint64_t *sums, int n,
                            char *err, size_t errlen)
{
    long got;
    int count;
    cJSON *j = dt_ckpt_slot_part(dir, k, &got, &count, err, errlen);
    if (!j) return NULL;
    if (got != step || count != n) {
        cJSON_Delete(j);
        return dt_strf(err, errlen, "%s/slot-%d: not the manifest of step %ld's %d shards", dir,
                       k, step, n), NULL;
    }
    cJSON *shards = cJSON_GetObjectItem(j, "shards");
    for (int r = 0; r < n; r++) {
        char hex[32];
        dt_strf(hex, sizeof hex, "%016" PRIx64, sums[r]);
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(shards, r), "checksum",
                                  cJSON_CreateString(hex));
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) dt_strf(err, errlen, "%s/slot-%d: out of memory for the manifest", dir, k);
    return text;
}

/* The slot a recovery made the checkpoint (`latest`), or -1: the one a
 * restarted job has just read, which its first snapshot must not write. */
static int recovered_slot(const char *dir)
{
    char path[DT_PATH_MAX + 16], line[32] = {0};
    int k = -1;
    dt_strf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f && fgets(line, sizeof line, f) && sscanf(line, "slot-%d", &k) == 1 && k >= 0 &&
        k < NSLOTS) {
        fclose(f);
        return k;
    }
    if (f) fclose(f);
    return -1;
}

/* ---- the shard files ---------------------------------------------------- */

/* Whether the file at path holds exactly the tensors this rank writes. */
static int reusable(const dt_ckpt_slots *s, const char *path, char (*names)[128])
{
    dt_st_file f;
    char e[256];
    if (access(path, F_OK) != 0 || dt_st_open(path, &f, e, sizeof e) != 0) return 0;
    int ok = f.ntensors == s->np * s->nbuf;
    for (int k = 0; ok && k < s->np * s->nbuf; k++) {
        const dt_st_tensor *t = dt_st_find(&f, names[k]);
        const dt_ckpt_piece *q = &s->p[k % s->np];
        ok = t && t->dtype == DT_ST_F32 && t->numel == q->hi - q->lo;
    }
    dt_st_close(&f);
    return ok;
}

/* Where each tensor's values go in the mapping, in file order; they must
 * tile the data section, so that the checksum streamed over them is the
 * file's. */
static int place_jobs(dt_ckpt_slots *s, slot_file *sf, const char *path, char (*names)[128],
                      const float *const *src, char *err, size_t errlen)
{
    dt_st_file f;
    if (dt_st_open(path, &f, err, errlen)) return -1;
    const int n = s->np * s->nbuf;
    size_t at = 0;
    int rc = (sf->jobs = calloc((size_t)n, sizeof *sf->jobs)) ? 0 : -1;
    for (int k = 0; rc == 0 && k < n; k++) {
        const dt_st_tensor *t = dt_st_find(&f, names[k]);
        size_t off = (size_t)((const unsigned char *)t->data - (const unsigned char *)f.map);
        if (k == 0) at = off;
        if (off != at) rc = -1;
        sf->jobs[k] = (copy_job){(float *)(void *)(sf->map + off), src[k], t->numel};
        at = off + t->nbytes;
    }
    dt_st_close(&f);
    if (rc || at != sf->size)
        return dt_strf(err, errlen, "%s: its tensors are not in the order written", path), -1;
    dt_sum_init(&sf->header);
    dt_sum_add(&sf->header, sf->map, (size_t)((unsigned char *)sf->jobs[0].dst - sf->map));
    return 0;
}

/* Slot k's shard file, made when the one there is not this rank's, then
 * mapped with its pages in place. */
static int open_file(dt_ckpt_slots *s, int k, char (*names)[128], const float *const *src,
                     char *err, size_t errlen)
{
    char name[64], path[DT_PATH_MAX + 128];
    slot_file *sf = &s->f[k];
    dt_ckpt_shard_name(name, sizeof name, s->crew.rank, s->crew.size);
    dt_ckpt_slot_path(path, sizeof path, s->dir, k, name);
    uint64_t bytes, sum;
    char mark[DT_PATH_MAX + 64];
    dt_ckpt_slot_mark_path(mark, sizeof mark, s->dir, k, s->crew.rank);
    if (!reusable(s, path, names)) {
        /* A file made anew holds none of the snapshot its mark would claim. */
        if (unlink(mark) != 0 && errno != ENOENT)
            return dt_strf(err, errlen, "%s: %s", mark, strerror(errno)), -1;
        if (dt_ckpt_write_shard_from(path, s->layout, s->p, s->np, s->nbuf, src, &bytes, &sum,
                                     err, errlen))
            return -1;
    }
    struct stat st;
    sf->fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (sf->fd < 0 || fstat(sf->fd, &st) != 0)
        return dt_strf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    sf->size = (size_t)st.st_size;
    void *m = mmap(NULL, sf->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, sf->fd, 0);
    if (m == MAP_FAILED) return dt_strf(err, errlen, "%s: mmap: %s", path, strerror(errno)), -1;
    sf->map = m;
    return place_jobs(s, sf, path, names, src, err, errlen);
}

/* Rank 0: shard files of another rank count (an attempt before that
 * shrank) hold memory no snapshot of this one reads. */
static void remove_strangers(const dt_ckpt_slots *s, int k)
{
    char dir[DT_PATH_MAX + 16], mine[64], path[DT_PATH_MAX + 300];
    dt_ckpt_slot_path(dir, sizeof dir, s->dir, k, NULL);
    dt_strf(mine, sizeof mine, "-of-%05d.safetensors", s->crew.size);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "shard-", 6) != 0 || strstr(e->d_name, mine)) continue;
        dt_strf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
}

/* ---- opening ------------------------------------------------------------ */

static int plan(dt_ckpt_slots *s, const dt_flat_ranges *mine, const dt_flat_ranges *mine_params,
                char *err, size_t errlen)
{
    dt_ckpt_crew *c = &s->crew;
    dt_ckpt_report me = {.ok = 1};
    int npp = 0;
    int rc = dt_ckpt_pieces(s->layout, mine, &s->p, &s->np, err, errlen);
    if (rc == 0) rc = dt_ckpt_pieces(s->layout, mine_params, &s->pp, &npp, err, errlen);
    for (int i = 0; rc == 0 && i < s->np; i++)
        if (npp != s->np || s->pp[i].tensor != s->p[i].tensor || s->pp[i].lo != s->p[i].lo ||
            s->pp[i].hi != s->p[i].hi)
            rc = (dt_strf(err, errlen, "snapshot: the parameters' pieces are not the moments' "
                          "(a bug)"), -1);
    me.ok = rc == 0;
    me.value[2] = s->np;
    if (dt_ckpt_agree(c, &me, err, err, errlen)) return -1;
    s->np_of = calloc((size_t)c->size, sizeof *s->np_of);
    s->bytes_of = calloc((size_t)c->size, sizeof *s->bytes_of);
    s->sum_of = calloc((size_t)c->size, sizeof *s->sum_of);
    if (!s->np_of || !s->bytes_of || !s->sum_of) return dt_strf(err, errlen, "out of memory"), -1;
    for (int r = 0; r < c->size; r++) s->np_of[r] = c->all[r].value[2];
    s->all = dt_ckpt_gather_pieces(c, s->p, s->np, &s->max, err, errlen);
    return s->all ? 0 : -1;
}

/* Each tensor's name in the shard and where its values are. */
static int name_sources(dt_ckpt_slots *s, const float *params, const dt_optimizer *o,
                        char (*names)[128], const float **src)
{
    const float *bufs[DT_CKPT_NBUF] = {params, o->m, o->v};
    for (int b = 0; b < s->nbuf; b++) {
        for (int i = 0; i < s->np; i++) {
            const dt_ckpt_piece *q = b == 0 ? &s->pp[i] : &s->p[i];
            dt_ckpt_piece_name(names[b * s->np + i], sizeof names[0], dt_ckpt_prefix[b],
                               s->layout->tensors[q->tensor].name, q->lo);
            src[b * s->np + i] = bufs[b] + q->at;
        }
    }
    return 0;
}

/* Both slots' files; the ranks learn every shard's size and which slot
 * the first snapshot writes (rank 0's choice: not the newest whole one,
 * which a restarted job has just read). */
static int open_files(dt_ckpt_slots *s, const float *params, const dt_optimizer *o, char *err,
                      size_t errlen)
{
    const int n = s->np * s->nbuf;
    char(*names)[128] = calloc((size_t)n + 1, sizeof *names);
    const float **src = calloc((size_t)n + 1, sizeof *src);
    dt_ckpt_report me = {.ok = 1};
    int rc = names && src ? 0 : (dt_strf(err, errlen, "out of memory"), -1);
    if (rc == 0) name_sources(s, params, o, names, src);
    for (int k = 0; rc == 0 && k < NSLOTS; k++) {
        char dir[DT_PATH_MAX + 16];
        dt_ckpt_slot_path(dir, sizeof dir, s->dir, k, NULL);
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            rc = (dt_strf(err, errlen, "%s: %s", dir, strerror(errno)), -1);
        if (rc == 0 && s->crew.rank == 0) remove_strangers(s, k);
        if (rc == 0) rc = open_file(s, k, names, src, err, errlen);
    }
    me.ok = rc == 0;
    me.value[0] = (int64_t)s->f[0].size;
    me.value[1] = s->crew.rank == 0 ? recovered_slot(s->dir) : 0;
    free(names);
    free(src);
    if (dt_ckpt_agree(&s->crew, &me, err, err, errlen)) return -1;
    for (int r = 0; r < s->crew.size; r++) s->bytes_of[r] = s->crew.all[r].value[0];
    s->next = s->crew.all[0].value[1] == 0 ? 1 : 0;
    return 0;
}

int dt_ckpt_slots_open(dt_ckpt_slots **out, const char *dir, const dt_gpt *layout,
                       const dt_flat_ranges *mine, const dt_flat_ranges *mine_params,
                       const float *params, const dt_optimizer *o, int stage, dt_comm *group,
                       char *err, size_t errlen)
{
    dt_ckpt_slots *s = calloc(1, sizeof *s);
    if (!s) return dt_strf(err, errlen, "out of memory"), -1;
    s->layout = layout;
    s->stage = stage;
    s->moments = o->v ? 2 : o->m ? 1 : 0;
    s->nbuf = 1 + s->moments;
    s->f[0].fd = s->f[1].fd = -1;
    s->rep.fd[0] = s->rep.fd[1] = -1;
    dt_strf(s->dir, sizeof s->dir, "%s", dir);
    s->crew = (dt_ckpt_crew){.group = group, .rank = group ? dt_comm_rank(group) : 0,
                             .size = group ? dt_comm_size(group) : 1};
    s->crew.all = calloc((size_t)s->crew.size, sizeof *s->crew.all);
    int rc = s->crew.all ? 0 : (dt_strf(err, errlen, "out of memory"), -1);
    if (rc == 0) rc = plan(s, mine, mine_params, err, errlen);
    if (rc == 0) rc = open_files(s, params, o, err, errlen);
    if (rc == 0) rc = dt_ckpt_replica_open(s, err, errlen);
    if (rc == 0) return *out = s, 0;
    dt_ckpt_slots_close(s);
    return -1;
}

void dt_ckpt_slots_close(dt_ckpt_slots *s)
{
    if (!s) return;
    if (s->crew.rank == 0 && s->tmp[0]) dt_ckpt_remove_tree(s->tmp); /* a save never run */
    dt_ckpt_replica_close(s);
    for (int k = 0; k < NSLOTS; k++) {
        if (s->f[k].map) munmap(s->f[k].map, s->f[k].size);
        if (s->f[k].fd >= 0) close(s->f[k].fd);
        free(s->f[k].jobs);
    }
    free(s->p);
    free(s->pp);
    free(s->all);
    free(s->np_of);
    free(s->bytes_of);
    free(s->sum_of);
    free(s->crew.all);
    free(s);
}

uint64_t dt_ckpt_slots_bytes(const dt_ckpt_slots *s)
{
    return (uint64_t)s->f[0].size + s->f[1].size;
}

/* ---- a snapshot --------------------------------------------------------- */

int dt_ckpt_slots_begin(dt_ckpt_slots *s, const dt_optimizer *o, const dt_ckpt_state *st,
                        const char *save_dir, const char *prev_err, char *err, size_t errlen)
{
    dt_ckpt_crew *c = &s->crew;
    dt_ckpt_report me = {.ok = !prev_err};
    char why[512] = "";
    s->save_dir[0] = s->tmp[0] = 0;
    if (me.ok && save_dir && c->rank == 0) {
        me.value[0] = (int64_t)getpid();
        me.ok = dt_ckpt_make_tmp(save_dir, st->step, (long)me.value[0], s->tmp, sizeof s->tmp,
                                 why, sizeof why) == 0;
    }
    if (dt_ckpt_agree(c, &me, prev_err ? prev_err : why, err, errlen)) {
        if (s->tmp[0]) dt_ckpt_remove_tree(s->tmp);
        return -1;
    }
    if (save_dir) {
        dt_strf(s->save_dir, sizeof s->save_dir, "%s", save_dir);
        dt_ckpt_tmp_path(s->tmp, sizeof s->tmp, save_dir, st->step, (long)c->all[0].value[0]);
    }
    /* Every rank's previous snapshot is whole: the other slot may go. */
    const int k = s->next;
    char path[DT_PATH_MAX + 64];
    dt_ckpt_slot_mark_path(path, sizeof path, s->dir, k, c->rank);
    if (unlink(path) != 0 && errno != ENOENT)
        return dt_strf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    if (dt_ckpt_replica_begin(s, k, err, errlen)) return -1;
    s->cur = k;
    s->next = 1 - k;
    s->step = st->step;
    if (c->rank != 0) return 0;
    dt_ckpt_slot_path(path, sizeof path, s->dir, k, DT_CKPT_MANIFEST);
    if (unlink(path) != 0 && errno != ENOENT)
        return dt_strf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    dt_ckpt_record rec;
    if (dt_ckpt_make_record(s->dir, s->layout, o, st, &rec, err, errlen)) return -1;
    for (int r = 0; r < c->size; r++)
        c->all[r] = (dt_ckpt_report){.ok = 1, .value = {s->bytes_of[r], 0, s->np_of[r]}};
    dt_ckpt_slot_path(path, sizeof path, s->dir, k, NULL);
    return dt_ckpt_write_manifest(path, PART, c, s->layout, &rec, s->stage, s->moments, s->all,
                                  s->max, err, errlen);
}

int dt_ckpt_slots_write(dt_ckpt_slots *s, char *err, size_t errlen)
{
    slot_file *sf = &s->f[s->cur];
    dt_sum sum = sf->header;
    for (int k = 0; k < s->np * s->nbuf; k++) {
        if (k == s->np * s->nbuf / 2) dt_fault_point_of("snapshot", s->step);
        dt_sum_copy(&sum, sf->jobs[k].dst, sf->jobs[k].src, sf->jobs[k].n * sizeof(float));
    }
    char path[DT_PATH_MAX + 64], line[96];
    dt_ckpt_slot_mark_path(path, sizeof path, s->dir, s->cur, s->crew.rank);
    s->sum = dt_sum_end(&sum);
    dt_strf(line, sizeof line, "%ld %llu %016" PRIx64 "\n", s->step,
            (unsigned long long)sf->size, s->sum);
    if (dt_afile_write_file(path, line, strlen(line), err, errlen)) return -1;
    return dt_ckpt_replica_send(s, err, errlen);
}

/* ---- the save to disk from a slot (--save-every) ------------------------ */

/* How long rank 0 waits for the other ranks' shards of one save. */
#define SAVE_WAIT_S 600

static void done_path(char *buf, size_t len, const char *tmp, int rank)
{
    dt_strf(buf, len, "%s/.done-%05d", tmp, rank);
}

/* Rank r's result in the save's directory: 1 done (its shard's checksum
 * to s->sum_of[r]), 0 not yet, -1 failed (its message to err). */
static int read_done(const dt_ckpt_slots *s, int r, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 200], line[512] = {0};
    unsigned long long sum;
    done_path(path, sizeof path, s->tmp, r);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (got && sscanf(line, "ok %llx", &sum) == 1) {
        s->sum_of[r] = sum;
        return unlink(path), 1;
    }
    line[strcspn(line, "\n")] = 0;
    return dt_strf(err, errlen, "rank %d failed: %s", r, line), -1;
}

/* Rank 0: until every rank's shard is in the save's directory (a file
 * system every rank's host sees, as --out must be), the deadline passes,
 * or abandon is set. */
static int wait_done(const dt_ckpt_slots *s, const atomic_int *abandon, char *err,
                     size_t errlen)
{
    const struct timespec nap = {0, 2000000};
    const time_t deadline = time(NULL) + SAVE_WAIT_S;
    for (int r = 0; r < s->crew.size;) {
        const int got = read_done(s, r, err, errlen);
        if (got < 0) return -1;
        if (got) {
            r++;
            continue;
        }
        if (atomic_load(abandon)) return dt_strf(err, errlen, "abandoned"), -1;
        if (time(NULL) > deadline)
            return dt_strf(err, errlen, "%s: rank %d's shard did not come within %d s", s->tmp,
                           r, SAVE_WAIT_S), -1;
        nanosleep(&nap, NULL);
    }
    return 0;
}

/* Rank 0: the slot's manifest with the shards' checksums, then the
 * checkpoint moved into place. */
static int publish(const dt_ckpt_slots *s, long keep, char *path, size_t pathlen, char *err,
                   size_t errlen)
{
    char file[DT_PATH_MAX + 160];
    char *text = dt_ckpt_slot_manifest(s->dir, s->cur, s->step, s->sum_of, s->crew.size, err,
                                       errlen);
    if (!text) return -1;
    dt_strf(file, sizeof file, "%s/" DT_CKPT_MANIFEST, s->tmp);
    int rc = dt_afile_write_file(file, text, strlen(text), err, errlen);
    free(text);
    if (rc == 0) rc = dt_ckpt_publish(s->save_dir, s->step, s->tmp, err, errlen);
    if (rc == 0) dt_ckpt_prune(s->save_dir, s->step, keep > 0 ? keep : 1);
    if (rc == 0) dt_ckpt_dir_path(path, pathlen, s->save_dir, s->step);
    return rc;
}

int dt_ckpt_slots_save(dt_ckpt_slots *s, long keep, const atomic_int *abandon, char *path,
                       size_t pathlen, char *err, size_t errlen)
{
    char name[64], file[DT_PATH_MAX + 200], line[600], why[512];
    const slot_file *sf = &s->f[s->cur];
    path[0] = 0;
    dt_ckpt_shard_name(name, sizeof name, s->crew.rank, s->crew.size);
    dt_strf(file, sizeof file, "%s/%s", s->tmp, name);
    int rc = dt_afile_write_file(file, sf->map, sf->size, err, errlen);
    dt_fault_point_of("save", s->step); /* its shard written, the checkpoint not yet whole */
    if (rc == 0) dt_strf(line, sizeof line, "ok %016" PRIx64 "\n", s->sum);
    else dt_strf(line, sizeof line, "failed %.500s\n", err);
    done_path(file, sizeof file, s->tmp, s->crew.rank);
    if (dt_afile_write_file(file, line, strlen(line), why, sizeof why) && rc == 0)
        rc = (dt_strf(err, errlen, "%s", why), -1);
    if (s->crew.rank == 0 && rc == 0) rc = wait_done(s, abandon, err, errlen);
    if (s->crew.rank == 0 && rc == 0) rc = publish(s, keep, path, pathlen, err, errlen);
    /* Nothing half-written: a failed save leaves no directory (rank 0
     * removes it once the others' results cannot still be waited for). */
    if (s->crew.rank == 0 && rc != 0) dt_ckpt_remove_tree(s->tmp);
    s->tmp[0] = 0;
    return rc;
}

int dt_ckpt_slots_saving(const dt_ckpt_slots *s) { return s->save_dir[0] != 0; }
