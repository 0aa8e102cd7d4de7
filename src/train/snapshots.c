/*
 * In-memory snapshots and the restart that reads them (issue: lose a
 * rank, lose nothing). Under a launcher that restarts failed jobs
 * (TORCHELASTIC_MAX_RESTARTS > 0, set by `dtrain launch --max-restarts`
 * and torchrun), every --snapshot-every steps the ranks write their
 * training state with the checkpoints' writers into the job's directory
 * in the host's shared memory (train/ckpt/snapshot.h), keeping the newest:
 * the training thread copies its state, a thread of its own writes the
 * files while the next steps run (snapshot_writer.c).
 * The writers' atomicity is the commit: a snapshot is in place whole, with
 * every rank's shard and the ranks' agreement on it, or not at all.
 *
 * A restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) continues from that
 * snapshot; resuming is exact, so the run ends with the weights it would
 * have had without the failure. Rank 0 also records the last step the job
 * completed (progress), which says how many steps the failure cost.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/env.h"
#include "core/log.h"
#include "core/timer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/shard.h"
#include "train/ckpt/snapshot.h"
#include "train/run.h"
#include "train/trace_marks.h"

#define PROGRESS "progress"
/* The job's start and its restarts, and the last step completed: each host's
 * first rank keeps both, so that a host lost (rank 0's too) leaves them on
 * the others. */
#define HISTORY "history"

/* The restart variables: 0 when there is no launcher that restarts. */
static int read_env(dt_run *t, long *max_restarts)
{
    char e[256];
    long v = 0;
    *max_restarts = 0;
    if (dt_env_long("TORCHELASTIC_MAX_RESTARTS", 0, 1000000, max_restarts, e, sizeof e) < 0 ||
        dt_env_long("TORCHELASTIC_RESTART_COUNT", 0, 1000000, &t->snap.restart, e, sizeof e) < 0)
        return dt_strf(ERR(t), "%s", e), -1;
    if (dt_env_long("DTRAIN_FAILURE_NS", 0, LONG_MAX, &v, e, sizeof e) < 0)
        return dt_strf(ERR(t), "%s", e), -1;
    t->snap.failure_ns = (uint64_t)v;
    return 0;
}

/* Two snapshots (the newest and the one being written) of the whole
 * state, weights and two moments in fp32, must fit in /dev/shm: checked
 * before the first step rather than found out at a full tmpfs. */
static int check_room(dt_run *t)
{
    struct statvfs fs;
    const double need = 2.0 * 3.0 * 4.0 * (double)t->model.n_floats;
    if (statvfs("/dev/shm", &fs) < 0)
        return dt_strf(ERR(t), "snapshots: cannot read /dev/shm's size: %s (--snapshot-every 0 "
                       "turns snapshots off)", strerror(errno)), -1;
    const double have = (double)fs.f_bavail * (double)fs.f_frsize;
    if (have >= need) return 0;
    return dt_strf(ERR(t), "snapshots: two of this model's training state take %.1f MiB of "
                   "shared memory, /dev/shm has %.1f MiB free; make room (a larger /dev/shm) "
                   "or turn snapshots off with --snapshot-every 0",
                   need / 1048576.0, have / 1048576.0), -1;
}

/* This host's first rank: it keeps the host's progress and history. */
static int host_first(const dt_run *t)
{
    return !t->r.world || dt_comm_local_rank(t->r.world) == 0;
}

/* The last step the failed attempt completed, as this host recorded it,
 * or -1 when unknown. */
static long read_progress(const dt_run *t)
{
    char path[320], buf[32] = {0};
    long step = -1;
    snprintf(path, sizeof path, "%s/" PROGRESS, t->snap.dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (!fgets(buf, sizeof buf, f) || sscanf(buf, "%ld", &step) != 1) step = -1;
    fclose(f);
    return step;
}

int dt_run_snapshots_start(dt_run *t, const char *where)
{
    const char *rank = dt_env_str("DTRAIN_FAILED_RANK"), *how = dt_env_str("DTRAIN_FAILURE");
    t->snap.from_step = t->step;
    /* Each host's first rank: a host may come to hold every shard of a
     * slot (its own, its partners' copies, or all of them after a
     * recovery fetched what it lacked). */
    if (t->snap.every > 0 && t->snap.restart == 0 && host_first(t) && check_room(t)) return -1;
    if (t->snap.every > 0 && dt_run_snapshot_writer_start(t)) return -1;
    if (t->snap.restart == 0) return 0;
    const char *source = !where                       ? "the start (no snapshot or checkpoint yet)"
                         : where == t->snap.dir       ? "the snapshot in memory"
                                                      : "the checkpoint on disk";
    /* The furthest any host recorded: a host lost took its record along. */
    int64_t done = host_first(t) ? read_progress(t) : -1;
    if (t->r.world && dt_allreduce(t->r.world, &done, &done, 1, DT_I64, DT_MAX))
        return dt_strf(ERR(t), "restart: agreeing on the last step completed: %s",
                       dt_comm_error(t->r.world)), -1;
    t->snap.lost = done >= t->step ? done - t->step : -1;
    fprintf(t->out, "restart %ld: rank %s %s; continuing at step %ld from %s", t->snap.restart,
            rank ? rank : "?", how ? how : "failed", t->step, source);
    if (where) fprintf(t->out, " (%s)", where);
    if (where == t->snap.dir && t->snap.moved[0])
        fprintf(t->out, ", %llu file(s) of it (%.1f MiB) copied between hosts",
                (unsigned long long)t->snap.moved[0], (double)t->snap.moved[1] / 1048576.0);
    if (done >= t->step) fprintf(t->out, ", %ld step(s) lost", (long)(done - t->step));
    fprintf(t->out, "\n");
    fflush(t->out);
    /* The last restart the launcher allows: what memory holds goes to
     * disk first, so that a failure now still leaves it to resume from. */
    if (t->snap.restart >= t->snap.max_restarts && where == t->snap.dir && t->cfg->out_dir[0])
        return dt_run_save(t);
    return 0;
}

/* Appends a line to the job's history (each host's first rank; first: a
 * new file). */
static void history_add(const dt_run *t, int first, const char *fmt, long a, long b, uint64_t c)
{
    char path[320];
    snprintf(path, sizeof path, "%s/" HISTORY, t->snap.dir);
    FILE *f = fopen(path, first ? "w" : "a");
    if (!f) return;
    fprintf(f, fmt, a, b, (unsigned long long)c);
    fclose(f);
}

/* The last step completed, for a restart's count of steps lost (each
 * host's first rank: a write to tmpfs a step; a torn one reads as
 * unknown). */
static void write_progress(const dt_run *t)
{
    char path[320], line[32];
    snprintf(path, sizeof path, "%s/" PROGRESS, t->snap.dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%20ld\n", t->step);
    ssize_t w = pwrite(fd, line, (size_t)n, 0);
    (void)w;
    close(fd);
}

int dt_run_snapshots_save_async(const dt_run *t) { return t->snap.every > 0 && !t->opt.store; }

int dt_run_snapshot_after_step(dt_run *t, int save)
{
    if (t->snap.restart > 0 && t->steps_run == 1 && t->snap.failure_ns) {
        const uint64_t took = dt_now_ns() - t->snap.failure_ns;
        const uint64_t start = t->snap.entry_ns > t->snap.failure_ns
                                   ? t->snap.entry_ns - t->snap.failure_ns : 0;
        const uint64_t loaded = t->snap.loaded_ns;
        /* Of the time to the model's load: the ranks started again, their
         * rendezvous, finding the snapshot; the rest is the setup and the
         * load itself. */
        const double find = (double)(t->snap.pooled_ns - t->snap.pool_ns) * 1e-9;
        const double join = (double)(t->snap.joined_ns - t->snap.entry_ns) * 1e-9;
        fprintf(t->out, "recovered: %.2f s from the failure to the end of the first step after "
                "it (%.2f s to start the ranks again, %.2f s to join the job, %.2f s to find "
                "the snapshot, %.2f s to set up and load, %.2f s for the step)\n",
                (double)took * 1e-9, (double)start * 1e-9, join, find,
                (double)(loaded - t->snap.joined_ns) * 1e-9 - find,
                (double)(dt_now_ns() - t->snap.loaded_ns) * 1e-9);
        if (host_first(t))
            history_add(t, 0, "restart %ld %ld %llu\n", t->snap.restart, t->snap.lost, took);
        dt_trace_mark_recovery(t->snap.failure_ns, took, t->snap.from_step, t->snap.lost);
    }
    if (t->snap.max_restarts > 0) fflush(t->out); /* a rank killed loses no line it printed */
    if (t->snap.every == 0) return 0;
    if (host_first(t)) write_progress(t); /* first: this step is done, snapshot or not */
    if (t->step % t->snap.every == 0 || save) {
        char path[512];
        const uint64_t t0 = dt_now_ns(), opened = t->snap.open_ns;
        int rc = dt_run_snapshot_stage(t, save); /* begun here, copied in the background */
        if (rc == 1) rc = dt_run_save_to(t, t->snap.dir, 1, path, sizeof path);
        if (rc) return -1;
        t->snap.count++;
        t->snap.write_ns += dt_now_ns() - t0 - (t->snap.open_ns - opened);
    }
    return 0;
}

/* The ranks make the newest snapshot that every rank completed a
 * checkpoint on every host (the failed attempt's ranks are gone: its files
 * no longer change): 1, 0 when there is none, or -1. */
static int recover(dt_run *t)
{
    long step = -1;
    int64_t got = 0;
    const int rc = dt_ckpt_slots_recover(t->snap.dir, t->r.world, &step, t->snap.moved, ERR(t));
    if (rc < 0) return -1;
    if (rc == 0) return 1;
    /* A run with its optimizer state on NVMe snapshots with the checkpoint
     * writers, into the directory itself (rank 0's host). */
    if (t->r.rank == 0) {
        char slot[320];
        snprintf(slot, sizeof slot, "%s/slot-0", t->snap.dir);
        got = access(slot, F_OK) != 0 && dt_ckpt_exists(t->snap.dir);
    }
    if (t->r.world && dt_broadcast(t->r.world, &got, &got, 1, DT_I64, 0))
        return dt_strf(ERR(t), "restart: learning rank 0's snapshot: %s",
                       dt_comm_error(t->r.world)), -1;
    return (int)got;
}

int dt_run_snapshots_wanted(void)
{
    const char *v = getenv("TORCHELASTIC_MAX_RESTARTS");
    return v && atol(v) > 0;
}

int dt_run_snapshots_setup(dt_run *t, const char **where)
{
    const dt_train_config *c = t->cfg;
    long max_restarts;
    *where = t->r.resuming ? (c->resume[0] ? c->resume : c->out_dir) : NULL;
    if (read_env(t, &max_restarts)) return -1;
    t->snap.max_restarts = max_restarts;
    if (max_restarts == 0) {
        if (DT_CONFIG_GIVEN(c, snapshot_every) && c->snapshot_every > 0)
            return dt_strf(ERR(t), "--snapshot-every %ld: snapshots serve restarts, and this run "
                           "has none; start it with dtrain launch --max-restarts K (or torchrun "
                           "--max-restarts K, or dtrain train --nproc N --max-restarts K)",
                           c->snapshot_every), -1;
        return 0;
    }
    const char *job = dt_env_str("DTRAIN_JOB_ID");
    if (!job || dt_snapshot_dir(job, t->snap.dir, sizeof t->snap.dir))
        return dt_strf(ERR(t), "restarts: DTRAIN_JOB_ID is %s; the launcher sets it",
                       job ? "too long" : "not set"), -1;
    t->snap.every = c->snapshot_every;
    /* Made here, not by the first snapshot: the progress record and the
     * history go in it from the first step. */
    if (mkdir(t->snap.dir, 0700) < 0 && errno != EEXIST)
        return dt_strf(ERR(t), "restarts: cannot create %s: %s", t->snap.dir, strerror(errno)),
               -1;
    if (t->snap.restart == 0 && host_first(t))
        history_add(t, 1, "start %ld %ld %llu\n", 0, 0, dt_now_ns());
    if (t->snap.restart == 0) return 0;
    t->snap.pool_ns = dt_now_ns();
    int found = recover(t);
    t->snap.pooled_ns = dt_now_ns();
    if (found < 0) return -1;
    if (found) {
        *where = t->snap.dir;
        t->r.resuming = 1;
    } else if (c->out_dir[0] && dt_ckpt_exists(c->out_dir)) {
        *where = c->out_dir;
        t->r.resuming = 1;
    }
    return 0;
}

/* The job's restarts from its history: their count, steps lost and
 * recovery time; the job's start. 0 restarts when there is no history. */
typedef struct {
    long restarts, lost;
    double recovery_s, worst_s;
    uint64_t start_ns;
} history;

static history read_history(const dt_run *t)
{
    history h = {0};
    char path[320], kind[16];
    long a, b;
    unsigned long long c;
    snprintf(path, sizeof path, "%s/" HISTORY, t->snap.dir);
    FILE *f = fopen(path, "r");
    while (f && fscanf(f, "%15s %ld %ld %llu", kind, &a, &b, &c) == 4) {
        if (strcmp(kind, "start") == 0) h.start_ns = c;
        if (strcmp(kind, "restart") != 0) continue;
        h.restarts++;
        h.lost += b > 0 ? b : 0;
        h.recovery_s += (double)c * 1e-9;
        if ((double)c * 1e-9 > h.worst_s) h.worst_s = (double)c * 1e-9;
    }
    if (f) fclose(f);
    return h;
}

/* The history as the lowest rank holding a whole one has it (a host lost
 * since the start began a new record, with no start in it): restarts,
 * steps lost, recovery time in all and at most, and the seconds since the
 * job started on that host's clock. restarts -1: no host kept it. */
static int agree_history(const dt_run *t, double v[5])
{
    const history h = host_first(t) ? read_history(t) : (history){0};
    int64_t from = h.start_ns ? t->r.rank : INT64_MAX;
    v[0] = (double)h.restarts, v[1] = (double)h.lost, v[2] = h.recovery_s, v[3] = h.worst_s;
    v[4] = h.start_ns ? (double)(dt_now_ns() - h.start_ns) * 1e-9 : 0.0;
    if (t->r.world && dt_allreduce(t->r.world, &from, &from, 1, DT_I64, DT_MIN)) return -1;
    if (from == INT64_MAX) return v[0] = -1, 0;
    return t->r.world ? dt_broadcast(t->r.world, v, v, 5, DT_F64, (int)from) : 0;
}

void dt_run_snapshots_summary(dt_run *t, double train_s)
{
    if (t->snap.count > 0) {
        /* The training thread's time (the agreement, and any wait for the
         * copy before an update), then the copies' own. */
        fprintf(t->out, "snapshots: %ld in memory (%s), %.1f ms each on the training thread "
                "(%.1f ms of it waiting for the copy), %.1f%% of the training time",
                t->snap.count, t->snap.dir,
                (double)t->snap.write_ns * 1e-6 / (double)t->snap.count,
                (double)t->snap.wait_ns * 1e-6 / (double)t->snap.count,
                train_s > 0 ? 100.0 * (double)t->snap.write_ns * 1e-9 / train_s : 0.0);
        if (t->snap.bg_count > 0)
            fprintf(t->out, "; copied in the background in %.0f ms each (%.2f GB/s), into two "
                    "slots of %.1f MiB in /dev/shm on this rank, made or mapped once in %.0f ms",
                    (double)t->snap.bg_ns * 1e-6 / (double)t->snap.bg_count,
                    (double)t->snap.shm_bytes / 2.0 * (double)t->snap.bg_count /
                        ((double)t->snap.bg_ns + 1.0),
                    (double)t->snap.shm_bytes / 2.0 / 1048576.0,
                    (double)t->snap.open_ns * 1e-6);
        fprintf(t->out, "\n");
    }
    /* Every rank takes part in the agreement; rank 0 prints. */
    if (t->snap.restart == 0 || t->steps_run == 0) return;
    double h[5];
    if (agree_history(t, h)) {
        DT_WARN("failures: the job's history could not be gathered: %s",
                t->r.world ? dt_comm_error(t->r.world) : "?");
        return;
    }
    if (t->r.rank != 0) return;
    if (h[0] < 0) { /* every host that kept it was lost at some point */
        fprintf(t->out, "failures: %ld restart(s); steps lost, recovery times and training "
                "efficiency unknown: every host that kept the job's history in %s has been "
                "lost since\n", t->snap.restart, t->snap.dir);
        return;
    }
    const long restarts = (long)h[0], lost = (long)h[1];
    if (!restarts) return;
    /* torchft's training efficiency: the share of the wall time since the
     * job started not lost to failures. A failure costs its recovery (to
     * the end of the first step after it, less that step) and the steps
     * it lost, at this attempt's pace. */
    const double wall = h[4];
    const double step_s = train_s / (double)t->steps_run;
    double lost_s = h[2] + (double)(lost - restarts) * step_s;
    if (lost_s < 0) lost_s = 0;
    if (lost_s > wall) lost_s = wall;
    /* The launcher counts every restart; the history only those whose
     * attempt completed a step (a rank that failed before it joined, and
     * the job that shrank for it, left none). */
    const long all = t->snap.restart > restarts ? t->snap.restart : restarts;
    fprintf(t->out, "failures: %ld restart(s)", all);
    if (all > restarts)
        fprintf(t->out, " (%ld of them failed before their first step)", all - restarts);
    fprintf(t->out, ", %ld step(s) lost, recovery %.2f s on average (%.2f s at most), training "
            "efficiency %.1f%% (%.1f s of %.1f s since the job started lost to failures)\n",
            lost, h[2] / (double)restarts, h[3], 100.0 * (1.0 - lost_s / wall),
            lost_s, wall);
}
