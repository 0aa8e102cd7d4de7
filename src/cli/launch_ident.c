/*
 * The job's identity as `dtrain launch` makes it (the scheme is the
 * library's, comm/bootstrap/identity.h): the rendezvous address, the
 * secret (DTRAIN_SECRET, or a random one for a job on one host) and the
 * job id; and the environment that hands them to the ranks. The secret
 * goes through the environment, never the command line: another user can
 * read a process's command line in /proc, but not its environment. With
 * restarts, each attempt's ranks get a secret of their own, derived from
 * the job's (identity.h), and are told that the launcher serves the store.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "comm/transport/net.h"

#define MULTINODE_DEFAULT_PORT 29500

static int resolve_address(const struct launch_opts *o, struct job_ident *id)
{
    const char *addr = o->master_addr ? o->master_addr : "127.0.0.1";
    if (strlen(addr) >= sizeof id->master_addr) {
        fprintf(stderr, PROG ": --master-addr is too long\n");
        return -1;
    }
    strcpy(id->master_addr, addr);
    id->port_hold = -1;
    if (o->master_port)
        id->master_port = (int)o->master_port;
    else if (o->nnodes > 1)
        id->master_port = MULTINODE_DEFAULT_PORT;
    else
        id->master_port = 0; /* like torchrun --standalone: the kernel picks one */
    if (o->node_rank != 0) return 0; /* node 0 serves the store */
    /* Held from now on (net.h): a port merely seen free can go to another
     * job's link before rank 0 listens on it, and one that another
     * process listens on fails here, before any rank starts. */
    char why[256];
    if (dt_net_reserve_port(addr, id->master_port, &id->port_hold, &id->master_port, why,
                            sizeof why) == 0)
        return 0;
    if (o->master_port || o->nnodes > 1)
        fprintf(stderr, PROG ": the job's store cannot have port %d on %s: %s; choose another "
                "with --master-port%s\n", id->master_port, addr, why,
                o->nnodes > 1 ? " (the same on every node)" : ", or leave it out to have one picked");
    else
        fprintf(stderr, PROG ": cannot find a port for the job's store on %s: %s\n", addr, why);
    return -1;
}

static int resolve_secret(const struct launch_opts *o, struct job_ident *id)
{
    const char *env = getenv("DTRAIN_SECRET");
    if (env && *env) {
        /* A copy: with restarts, the variable changes with each attempt. */
        id->secret = id->secret_copy = strdup(env);
        if (id->secret) return 0;
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    if (o->nnodes > 1) {
        fprintf(stderr,
                PROG ": DTRAIN_SECRET is not set. With --nnodes > 1 every node must share the\n"
                "same job secret (ranks authenticate each other with it). Set it on all nodes\n"
                "before launching, for example:\n"
                "  export DTRAIN_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n");
        return -1;
    }
    if (dt_ident_random_secret(id->secret_buf, sizeof id->secret_buf) < 0) {
        fprintf(stderr, PROG ": cannot draw a random job secret (getrandom): %s\n",
                strerror(errno));
        return -1;
    }
    id->secret = id->secret_buf;
    return 0;
}

static int resolve_job_id(struct job_ident *id)
{
    const char *env = getenv("DTRAIN_JOB_ID");
    if (env && *env) {
        if (!dt_ident_job_id_valid(env)) {
            fprintf(stderr,
                    PROG ": DTRAIN_JOB_ID='%s' is not valid: use 1 to %d letters or digits\n",
                    env, DT_JOB_ID_MAX);
            return -1;
        }
        strcpy(id->job_id, env);
        return 0;
    }
    dt_ident_job_id(id->secret, id->master_addr, id->master_port, id->job_id, sizeof id->job_id);
    return 0;
}

int launch_resolve_ident(const struct launch_opts *o, struct job_ident *id)
{
    if (resolve_secret(o, id) < 0) return CLI_EXIT_USAGE;
    if (resolve_address(o, id) < 0) return 1;
    if (resolve_job_id(id) < 0) return CLI_EXIT_USAGE;
    return 0;
}

int launch_setenv_long(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return setenv(name, buf, 1);
}

/* Launched under mpirun or srun, the launcher itself carries those
 * launchers' rank variables; a rank must not mistake them for its own. */
static void remove_foreign_rank_vars(void)
{
    static const char *const names[] = {"PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                        "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);

    /* unsetenv reshuffles environ, so restart the scan after each removal. */
    static const char prefix[] = "OMPI_COMM_WORLD_";
    for (;;) {
        char name[256] = "";
        for (char **e = environ; *e; e++) {
            const char *eq = strchr(*e, '=');
            size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
            if (strncmp(*e, prefix, sizeof prefix - 1) == 0 && n < sizeof name) {
                memcpy(name, *e, n);
                name[n] = '\0';
                break;
            }
        }
        if (!name[0]) break;
        unsetenv(name);
    }
}

/* The variables shared by all local ranks go into the launcher's own
 * environment once; the child adds only RANK and LOCAL_RANK. */
int launch_export_env(const struct launch_opts *o, const struct job_ident *id)
{
    remove_foreign_rank_vars();
    int bad = 0;
    bad |= launch_setenv_long("WORLD_SIZE", o->nnodes * o->nproc);
    bad |= launch_setenv_long("LOCAL_WORLD_SIZE", o->nproc);
    bad |= launch_setenv_long("GROUP_RANK", o->node_rank);
    bad |= launch_setenv_long("NODE_RANK", o->node_rank);
    bad |= launch_setenv_long("GROUP_WORLD_SIZE", o->nnodes);
    bad |= setenv("MASTER_ADDR", id->master_addr, 1);
    bad |= launch_setenv_long("MASTER_PORT", id->master_port);
    bad |= setenv("DTRAIN_SECRET", id->secret, 1);
    bad |= setenv("DTRAIN_JOB_ID", id->job_id, 1);
    bad |= launch_setenv_long("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
    /* A store that rank 0 served would go with it at a restart. */
    if (o->max_restarts > 0)
        bad |= setenv("DTRAIN_STORE_SERVER", "launcher", 1);
    else
        unsetenv("DTRAIN_STORE_SERVER");
    /* The ranks the job started with, which a job that may shrink keeps
     * as blocks of each batch; said from the first attempt on, so that a
     * layout that could not is refused before it fails. */
    if (launch_may_shrink(o))
        bad |= launch_setenv_long("DTRAIN_VIRTUAL_WORLD_SIZE", o->nproc);
    else
        unsetenv("DTRAIN_VIRTUAL_WORLD_SIZE");
    if (bad) fprintf(stderr, PROG ": cannot set the environment: %s\n", strerror(errno));
    return bad ? -1 : 0;
}

/* With restarts, attempt k's secret: no rank of an earlier attempt can
 * join it, and every node derives the same. */
static int export_attempt_secret(struct job *j)
{
    if (j->o->max_restarts == 0) return 0;
    if (dt_ident_attempt_secret(j->id.secret, j->restarts, j->attempt_secret,
                                sizeof j->attempt_secret) < 0) {
        errno = EINVAL;
        return -1;
    }
    return setenv("DTRAIN_SECRET", j->attempt_secret, 1);
}

/* The failure that ended the last attempt, appended to the job's log of
 * them (the oldest lines dropped to make room). */
static void log_failure(struct job *j)
{
    char line[160];
    int n = snprintf(line, sizeof line, "%d %llu %d %s\n", j->restarts,
                     (unsigned long long)j->failure_ns, j->failed_rank, j->failure);
    if (n <= 0 || (size_t)n >= sizeof line) return;
    char *log = j->failures_log;
    while (strlen(log) + (size_t)n >= sizeof j->failures_log) {
        char *next = strchr(log, '\n');
        if (!next) {
            log[0] = '\0';
            break;
        }
        memmove(log, next + 1, strlen(next + 1) + 1);
    }
    strcat(log, line);
}

/* torchrun's count of restarts, the ranks of a job that shrank, and ours
 * of what ended the last attempt (a restarted rank reports how long it
 * took to recover from it) and of every failure so far. The first attempt has no failure behind it: a
 * launcher started by a rank of another job must not hand that job's
 * failure down. */
int launch_export_attempt(struct job *j)
{
    int bad = launch_setenv_long("TORCHELASTIC_RESTART_COUNT", j->restarts);
    bad |= export_attempt_secret(j);
    if (launch_may_shrink(j->o)) { /* one host: the ranks left are the job */
        bad |= launch_setenv_long("WORLD_SIZE", j->active);
        bad |= launch_setenv_long("LOCAL_WORLD_SIZE", j->active);
    }
    if (j->restarts == 0) {
        unsetenv("DTRAIN_FAILURE_NS");
        unsetenv("DTRAIN_FAILED_RANK");
        unsetenv("DTRAIN_FAILURE");
        unsetenv("DTRAIN_FAILURES");
    } else {
        char ns[32];
        snprintf(ns, sizeof ns, "%llu", (unsigned long long)j->failure_ns);
        bad |= setenv("DTRAIN_FAILURE_NS", ns, 1);
        bad |= launch_setenv_long("DTRAIN_FAILED_RANK", j->failed_rank);
        bad |= setenv("DTRAIN_FAILURE", j->failure, 1);
        log_failure(j);
        bad |= setenv("DTRAIN_FAILURES", j->failures_log, 1);
    }
    if (bad) fprintf(stderr, PROG ": cannot set the environment: %s\n", strerror(errno));
    return bad ? -1 : 0;
}
