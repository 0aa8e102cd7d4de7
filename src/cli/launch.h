/*
 * `dtrain launch`, inside: what its files share. launch.c runs a job
 * through them: the options (launch_opts.c), the job's identity and
 * environment (launch_ident.c), starting each rank (launch_spawn.c), the
 * ranks' tagged output (launch_output.c), watching the ranks under the
 * failure policy (launch_watch.c), and, for a job that restarts, the store
 * node 0's launcher serves and through which the nodes agree on how each
 * attempt ended (launch_store.c).
 */
#ifndef DT_CLI_LAUNCH_H
#define DT_CLI_LAUNCH_H

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "comm/bootstrap/identity.h"

#define PROG "dtrain launch"

#define MAX_NNODES 65536
/* --max-restarts: torchrun has no bound; this one keeps a job that can never
 * succeed from looping for ever. */
#define MAX_RESTARTS 1000
/* Longest line kept whole under --tag-output; longer ones are split. */
#define LINE_CAP 16384

/* --bind-to: each local rank on CPUs of its own, or left to the scheduler
 * (launch_bind.c). */
enum { LAUNCH_BIND_AUTO, LAUNCH_BIND_CORE, LAUNCH_BIND_NONE };

struct launch_opts {
    long nproc;
    long nnodes;
    long node_rank;
    const char *master_addr; /* NULL: not given */
    long master_port;        /* 0: not given */
    double grace_s;
    int grace_given;
    long max_restarts; /* 0: fail fast, no restart */
    long min_nproc;    /* --min-nproc: the fewest ranks the job may shrink to */
    int min_nproc_given;
    long lost_slot;    /* DTRAIN_LAUNCH_TEST_LOST_RANK: a slot that cannot start again; -1 */
    int standalone;
    int tag_output;
    int bind;            /* --bind-to: LAUNCH_BIND_* */
    int report_bindings; /* --report-bindings */
    int help;
    char **cmd; /* NULL-terminated, points into argv */
};

/* The rendezvous address, the secret and the job id, the same on every
 * node. */
struct job_ident {
    char master_addr[256];
    int master_port;
    /* Node 0: the socket that holds the store's port, chosen or given,
     * for the job's whole life (dt_net_reserve_port), so that no other
     * job is handed it before the store serves there; else -1. */
    int port_hold;
    char secret_buf[DT_SECRET_HEX + 1];
    char *secret_copy; /* of DTRAIN_SECRET, when given */
    const char *secret;
    char job_id[DT_JOB_ID_MAX + 1];
};

/* One of a rank's output pipes under --tag-output. */
struct stream {
    int fd;     /* read end; -1 once closed */
    int dest;   /* 1 or 2 */
    int midline; /* the last thing written was a piece of an over-long line */
    size_t len;
    char *buf;  /* LINE_CAP bytes */
};

/* A rank's slot: j->ranks[i] is the i-th rank the job started with. A job
 * that shrank leaves the slots it lost empty and numbers the others'
 * ranks in slot order. */
struct rank {
    int rank; /* global, in this attempt */
    int local;
    int lost;      /* the slot could not be started again: no rank from now on */
    int joined_fd; /* read end of the pipe the rank writes a byte to once it joined; -1 */
    int joined;    /* it did */
    pid_t pid; /* 0: never started */
    int finished;
    int code;   /* exit code, when it exited */
    int signo;  /* signal, when it was killed */
    int stopped; /* the signal that stopped it (SIGSTOP, SIGTSTP...), while stopped */
    int unjudged; /* ended in failure, not yet judged (check_ranks) */
    struct stream out, err;
};

enum phase {
    PHASE_RUNNING, /* nothing has gone wrong */
    PHASE_GRACE,   /* a rank failed; the others may still exit on their own */
    PHASE_TERM,    /* SIGTERM sent; waiting before SIGKILL */
    PHASE_KILL,    /* SIGKILL sent */
};

/* How an attempt ended, as the nodes agreed on it through the store
 * (launch_store.c): the first node to report a failure decides it. */
struct verdict {
    int done;    /* every node's ranks exited 0 */
    int lost;    /* the store is gone, node 0's launcher with it (why says so) */
    int ours;    /* this node's own report decided it */
    long node;   /* of the failure */
    int rank;    /* the failed rank; -1: a launcher ended the job */
    int status;  /* its exit status */
    int restart; /* the attempt is to be followed by another */
    char what[96];
    char why[1024];
};

struct launch_store;

struct job {
    const struct launch_opts *o;
    struct job_ident id;
    /* With restarts: this attempt's secret (DTRAIN_SECRET), and the
     * attempt's store (NULL without restarts). */
    char attempt_secret[DT_ATTEMPT_SECRET_HEX + 1];
    struct launch_store *store;
    struct rank *ranks;
    int nranks;
    cpu_set_t *cpus; /* the CPUs of each local rank (launch_bind.c); NULL: not bound */
    struct pollfd *fds; /* the signalfd, then each rank's stdout and stderr */
    pid_t launcher_pid;
    int sigfd;
    sigset_t orig_mask;
    struct sigaction orig_sigpipe;
    int stdin_is_tty;

    enum phase phase;
    uint64_t deadline_ns; /* of the current phase (dt_now_ns) */
    uint64_t settle_ns;   /* when ranks that exited with a status are judged; 0: none wait */
    int failed;           /* a rank failed, a rank could not start, or we were signalled */
    int signalled;        /* a stop signal came: the job ends */
    int exit_status;

    /* Restarts (--max-restarts): the attempts made so far, less one. */
    int restarts;
    int restart_pending; /* this attempt failed and another will follow */
    int no_restart;      /* a rank could not start: trying again would not help */
    int failed_rank;     /* of the failure that ended the last attempt */
    /* Shrinking (--min-nproc): the ranks each attempt starts, whether any
     * rank ever said it joined (a command that does not say so is never
     * shrunk), and the slot the next attempt gives up (-1: none). */
    int active;
    int ever_joined;
    int shrink_slot;
    char shrink_why[224];
    uint64_t failure_ns; /* when the launcher noticed it (dt_now_ns) */
    char failure[96];    /* what happened to that rank, in words */
    /* Every failure so far, a line each ("RESTART NS RANK HOW", the newest
     * last, the oldest dropped when full): DTRAIN_FAILURES, so that rank 0
     * can mark in --trace the failures of attempts that never ran a step. */
    char failures_log[2048];
    char scratch[LINE_CAP + 32];
};

/* launch_opts.c */
void launch_usage(FILE *f);
/* The command line into o: 0, or -1 after a message on stderr. */
int launch_parse_args(int argc, char **argv, struct launch_opts *o);
/* After parsing: the grace period's default and the options' agreement. */
int launch_check_opts(struct launch_opts *o);

/* launch_ident.c */
/* 0, CLI_EXIT_USAGE, or 1, after a message on stderr. */
int launch_resolve_ident(const struct launch_opts *o, struct job_ident *id);
/* The variables every local rank shares, into our own environment. */
int launch_export_env(const struct launch_opts *o, const struct job_ident *id);
int launch_setenv_long(const char *name, long v);
/* The variables that tell an attempt which one it is, its secret and,
 * after a failure, what ended the last one. */
int launch_export_attempt(struct job *j);

/* Whether the job may go on with fewer ranks (--min-nproc below -n). */
int launch_may_shrink(const struct launch_opts *o);

/* launch_spawn.c: start one rank; 0, or -1 when it did not start. */
int launch_spawn_rank(struct job *j, struct rank *r);
/* Notes the ranks that said they joined the job (their pipes). */
void launch_read_joined(struct job *j);

/* launch_output.c */
int launch_stream_open(struct stream *s, int dest, int *write_end);
void launch_stream_read(struct job *j, struct stream *s, int rank, int until_empty);
void launch_drain_rank(struct job *j, struct rank *r, int until_empty);

/* launch_watch.c */
int launch_setup_signals(struct job *j);
/* Follow the ranks until every one has ended. */
void launch_watch(struct job *j);
void launch_signal_groups(struct job *j, int sig);
/* The first failure sets the exit status; later ones are consequences. */
void launch_record_failure(struct job *j, int status);
void launch_enter_term(struct job *j);
/* After launch_watch: whether the failed attempt is to be followed by
 * another (no stop signal has come meanwhile). */
int launch_take_restart(struct job *j);
/* Handles the signals that have come (a stop signal: j->signalled). */
void launch_read_signals(struct job *j);

/* launch_store.c: with --max-restarts, the store node 0's launcher serves
 * for each attempt, and the nodes' agreement on how the attempt ends.
 * Each does nothing without restarts. */
/* Once: the timeouts; 0, or CLI_EXIT_USAGE after a message. */
int launch_store_init(struct job *j);
/* Before an attempt's ranks start: serve (node 0), connect, and meet the
 * other nodes. 0: start the ranks; 1: the verdict came before they
 * started; -1: no attempt (said why, j->failed set). */
int launch_store_open(struct job *j);
/* This node's failure (rank -1: its launcher's) or its ranks' success;
 * the first node to report decides the attempt's verdict. */
void launch_store_report(struct job *j, int rank, int status, const char *what, int restart);
void launch_store_done(struct job *j);
/* The pipe that is readable once the verdict is in (-1: none to wait for),
 * and whether it is still to come. */
/* launch_bind.c: j->cpus from --bind-to and the CPUs this launcher may
 * use. 0, -1 (an error, said), -2 (a usage error, said). */
int launch_plan_binding(struct job *j);

int launch_store_fd(const struct job *j);
int launch_store_waiting(const struct job *j);
/* Reads the verdict once launch_store_fd is readable, and tells node 0
 * that this node has it. */
void launch_store_verdict(struct job *j, struct verdict *v);
/* After the attempt's ranks are reaped: node 0 waits (a while) for every
 * node to have read the verdict and stops its server; another node before
 * a restart waits for that. */
void launch_store_close(struct job *j);
void launch_store_free(struct job *j);

#endif
