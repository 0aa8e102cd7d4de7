/*
 * `dtrain launch`: starts N local ranks of a command with the torchrun
 * environment, watches them, and applies one failure policy:
 *
 *   the first rank to fail decides the exit status; the others get a grace
 *   period to fail on their own (the library makes them report a clear
 *   error of their own), then SIGTERM, then SIGKILL.
 *
 * With --max-restarts K, a failure instead ends the attempt at once and all
 * ranks start again, the same job, up to K times; on every node, which
 * agree through the store that node 0's launcher then serves.
 *
 * This file runs a job from start to end, attempt after attempt; launch.h says which file does
 * what on the way.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "comm/transport/shm.h"
#include "train/ckpt/snapshot.h"

/* Everything sized by the rank count, before any rank exists, so that a
 * shortage of memory is an error up front rather than midway. */
static int alloc_ranks(struct job *j)
{
    const struct launch_opts *o = j->o;
    j->nranks = (int)o->nproc;
    j->ranks = calloc((size_t)j->nranks, sizeof *j->ranks);
    /* The signalfd, each rank's two pipes, the verdict's pipe. */
    j->fds = calloc((size_t)(2 + 2 * j->nranks), sizeof *j->fds);
    if (!j->ranks || !j->fds) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    for (int i = 0; i < j->nranks; i++)
        j->ranks[i] = (struct rank){.out.fd = -1, .err.fd = -1, .joined_fd = -1};
    j->active = j->nranks;
    j->shrink_slot = -1;
    return 0;
}

/* The slots not lost, numbered in slot order. */
static void number_ranks(struct job *j)
{
    int k = 0;
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        if (r->lost) continue;
        r->local = k;
        r->rank = (int)(j->o->node_rank * j->o->nproc) + k++;
    }
}

static void start_ranks(struct job *j)
{
    fflush(NULL);
    number_ranks(j);
    for (int i = 0; i < j->nranks; i++) {
        if (j->ranks[i].lost || launch_spawn_rank(j, &j->ranks[i]) == 0) continue;
        /* A rank that could not even be forked leaves the others waiting
         * for it until their timeout, with nothing of their own to
         * report: no grace period. (A failed exec is an ordinary failed
         * rank, status 127.) */
        j->no_restart = 1;
        if (j->ranks[i].pid <= 0) {
            launch_record_failure(j, 1);
            launch_store_report(j, j->ranks[i].rank, 1, "could not be started", 0);
            launch_enter_term(j);
        }
        break;
    }
}

/* Ends an attempt: the ranks reaped, their slots ready for another. */
static void end_attempt(struct job *j)
{
    /* After a failure, whatever the ranks left behind in their groups
     * (helpers, data workers) goes too. */
    if (j->failed) launch_signal_groups(j, SIGKILL);
    for (int i = 0; i < j->nranks; i++) launch_drain_rank(j, &j->ranks[i], 1);
    launch_read_joined(j);
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        if (r->pid > 0)
            while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR) {
            }
        free(r->out.buf);
        free(r->err.buf);
        if (r->joined_fd >= 0) close(r->joined_fd);
        *r = (struct rank){.rank = r->rank, .local = r->local, .lost = r->lost, .out.fd = -1,
                           .err.fd = -1, .joined_fd = -1};
    }
    /* Ranks that died cannot remove their shared-memory segments, and a
     * new attempt must not find the last one's. */
    char err[512];
    if (dt_shm_remove_job(j->id.job_id, err, sizeof err) < 0) fprintf(stderr, PROG ": %s\n", err);
    launch_store_close(j);
}

/* The slot a restarted rank could not be started in is given up, and
 * the job goes on without it: the ranks left still compute the blocks of
 * each batch that the ranks the job started with did
 * (DTRAIN_VIRTUAL_WORLD_SIZE), the first rank the lost ones'. */
static void shrink(struct job *j)
{
    const int was = j->active;
    j->ranks[j->shrink_slot].lost = 1;
    j->active--;
    j->shrink_slot = -1;
    fprintf(stderr, PROG ": the job shrinks from %d to %d ranks (of the %d it started with; "
            "--min-nproc %ld): %s, so its slot is given up; the global batch is kept: the "
            "ranks left compute the %d ranks' blocks of each batch, rank 0 computing %d of "
            "them (DTRAIN_VIRTUAL_WORLD_SIZE=%d)\n", was, j->active, j->nranks,
            j->o->min_nproc, j->shrink_why, j->nranks, j->nranks - j->active + 1, j->nranks);
}

static void next_attempt(struct job *j)
{
    if (j->shrink_slot >= 0) shrink(j);
    j->restarts++;
    j->restart_pending = 0;
    j->failed = 0;
    j->exit_status = 0;
    j->phase = PHASE_RUNNING;
    j->settle_ns = 0;
    fprintf(stderr, PROG ": restart %d of %ld: starting the %d rank%s again\n", j->restarts,
            j->o->max_restarts, j->active, j->active == 1 ? "" : "s");
}

/* The snapshots kept in memory for restarts are of no use once the job is
 * over, however it ended. */
static void finish(struct job *j)
{
    char err[512];
    if (dt_snapshot_remove(j->id.job_id, err, sizeof err) < 0) fprintf(stderr, PROG ": %s\n", err);
    launch_store_free(j);
    free(j->id.secret_copy);
    if (j->id.port_hold >= 0) close(j->id.port_hold);
    if (j->sigfd >= 0) close(j->sigfd);
    free(j->ranks);
    free(j->cpus);
    free(j->fds);
}

int cli_launch(int argc, char **argv)
{
    struct launch_opts o = {.nproc = 1, .nnodes = 1};
    if (launch_parse_args(argc, argv, &o) < 0) return CLI_EXIT_USAGE;
    if (o.help) {
        launch_usage(stdout);
        return 0;
    }
    if (launch_check_opts(&o) < 0) return CLI_EXIT_USAGE;

    static struct job j; /* holds the line scratch buffer; one per process */
    memset(&j, 0, sizeof j);
    j.o = &o;
    j.sigfd = -1;
    j.id.port_hold = -1;
    j.launcher_pid = getpid();
    j.stdin_is_tty = isatty(0);
    int rc = launch_resolve_ident(&o, &j.id);
    if (rc == 0) rc = launch_store_init(&j);
    if (rc != 0) return rc;
    if (alloc_ranks(&j) < 0) return 1;
    rc = launch_plan_binding(&j);
    if (rc < 0) return rc == -2 ? CLI_EXIT_USAGE : 1;
    if (launch_export_env(&o, &j.id) < 0 || launch_setup_signals(&j) < 0) return 1;

    for (;;) {
        int start = launch_export_attempt(&j);
        if (start == 0) start = launch_store_open(&j);
        if (start < 0) {
            launch_record_failure(&j, 1); /* unless the cause was said already */
            break;
        }
        if (start == 0) start_ranks(&j); /* else the verdict came first: the watch has it */
        launch_watch(&j);
        end_attempt(&j);
        if (!launch_take_restart(&j)) break;
        next_attempt(&j);
    }
    finish(&j);
    return j.failed ? j.exit_status : 0;
}
