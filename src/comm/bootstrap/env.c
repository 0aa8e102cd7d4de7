/*
 * Who am I in the job? Read from the environment of whichever launcher
 * started us, in this order (docs/comm.md): torchrun (and `dtrain
 * launch`), Open MPI, MPICH/PMI, Slurm; with none of them the job is this
 * process alone.
 *
 * Launchers other than ours do not say where rank 0 is: MASTER_ADDR wins
 * when set, a job on one host uses the loopback, and Slurm's node list
 * gives its first host. The store port comes from MASTER_PORT or, when
 * absent, from the launcher's job id, so that two jobs on one machine do
 * not collide. Under Open MPI's mpirun with MPI built in, rank 0 says both
 * over MPI instead (mpi_job.c, right after this).
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/identity.h"
#include "comm/mpi.h"
#include "core/env.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/str.h"

static int env_int(const char *name, long min, long max, int *out, char *err, size_t errlen)
{
    long v;
    int rc = dt_env_long(name, min, max, &v, err, errlen);
    if (rc == 1) *out = (int)v;
    return rc;
}

/* First host of a Slurm node list such as "gpu[03-07,09],cpu1" -> "gpu03". */
static void slurm_first_host(const char *list, char *out, size_t len)
{
    size_t i = 0, o = 0;
    while (list[i] && list[i] != ',' && list[i] != '[' && o + 1 < len) out[o++] = list[i++];
    if (list[i] == '[')
        for (i++; isdigit((unsigned char)list[i]) && o + 1 < len; i++) out[o++] = list[i];
    out[o] = '\0';
}

typedef struct {
    const char *name;
    const char *rank, *size, *local_rank, *local_size, *job_id;
} launcher_vars;

static const launcher_vars launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_JOBID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
     "SLURM_JOB_ID"},
};

static int read_ranks(dt_bootstrap *b, const launcher_vars *v, char *err, size_t errlen)
{
    int rc;
    if ((rc = env_int(v->size, 1, DT_MAX_WORLD_SIZE, &b->size, err, errlen)) < 0) return -1;
    if (rc == 0) {
        snprintf(err, errlen, "%s is set but %s is not", v->rank, v->size);
        return -1;
    }
    if (env_int(v->rank, 0, b->size - 1, &b->rank, err, errlen) < 0) return -1;
    b->local_rank = -1;
    b->local_size = -1;
    if (env_int(v->local_rank, 0, b->size - 1, &b->local_rank, err, errlen) < 0) return -1;
    /* Slurm's tasks-per-node may read "2(x3)"; the real grouping comes from
     * hostnames at init anyway, so only a plain number is taken. */
    long ls;
    const char *s = dt_env_str(v->local_size);
    if (s && sscanf(s, "%ld", &ls) == 1 && ls >= 1 && ls <= b->size) b->local_size = (int)ls;
    snprintf(b->launcher, sizeof b->launcher, "%s", v->name);
    const char *id = dt_env_str(v->job_id);
    if (id) snprintf(b->launcher_job, sizeof b->launcher_job, "%s:%s", v->name, id);
    return 0;
}

static int read_master(dt_bootstrap *b, char *err, size_t errlen)
{
    const char *addr = dt_env_str("MASTER_ADDR");
    const char *nodes = dt_env_str("SLURM_STEP_NODELIST");
    if (!nodes) nodes = dt_env_str("SLURM_JOB_NODELIST");
    if (addr) {
        snprintf(b->master_addr, sizeof b->master_addr, "%s", addr);
    } else if (b->local_size == b->size || b->size == 1) {
        snprintf(b->master_addr, sizeof b->master_addr, "127.0.0.1");
    } else if (!strcmp(b->launcher, "slurm") && nodes) {
        slurm_first_host(nodes, b->master_addr, sizeof b->master_addr);
    } else if (!strcmp(b->launcher, "torchrun")) {
        snprintf(b->master_addr, sizeof b->master_addr, "127.0.0.1");
    } else if (!strcmp(b->launcher, "openmpi") && dt_have_mpi() && dt_mpi_launched()) {
        /* dt_mpi_job_init fills it in from rank 0, over MPI. */
    } else {
        snprintf(err, errlen,
                 "ranks span several hosts but MASTER_ADDR is not set: export the address of "
                 "rank 0's host (for example mpirun -x MASTER_ADDR=host0)");
        return -1;
    }
    /* Below Linux's default ephemeral range (32768-60999): a port the
     * kernel lends to some outgoing connection cannot take the store's. */
    int port = 29500;
    if (b->launcher_job[0] && !dt_env_str("MASTER_PORT"))
        port = 20000 + (int)(dt_fnv1a64_str(b->launcher_job) % 12000);
    if (env_int("MASTER_PORT", 1, 65535, &port, err, errlen) < 0) return -1;
    b->master_port = port;
    return 0;
}

/* The secret proves membership of the job. Our launcher makes a random one;
 * under other launchers the best we have is the launcher's job id, which
 * keeps jobs apart but is no protection against a hostile peer. */
static void read_secret(dt_bootstrap *b)
{
    const char *s = dt_env_str("DTRAIN_SECRET");
    if (s) {
        snprintf(b->secret, sizeof b->secret, "%s", s);
        b->secret_from_env = 1;
    } else {
        dt_strf(b->secret, sizeof b->secret, "dtrain:%s:%s:%d", b->launcher_job,
                 b->master_addr, b->master_port);
    }
    const char *id = dt_env_str("DTRAIN_JOB_ID");
    if (id) {
        size_t o = 0;
        for (; *id && o + 1 < sizeof b->job_id; id++)
            if (isalnum((unsigned char)*id)) b->job_id[o++] = *id;
        b->job_id[o] = '\0';
    }
    if (!b->job_id[0])
        dt_ident_job_id(b->secret, b->master_addr, b->master_port, b->job_id, sizeof b->job_id);
}

int dt_bootstrap_from_env(dt_bootstrap *b, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    b->size = 1;
    b->port_hold = -1;
    snprintf(b->launcher, sizeof b->launcher, "none");
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        if (!dt_env_str(launchers[i].rank)) continue;
        if (read_ranks(b, &launchers[i], err, errlen) < 0) return -1;
        break;
    }
    if (read_master(b, err, errlen) < 0) return -1;
    read_secret(b);
    const char *by = dt_env_str("DTRAIN_STORE_SERVER");
    if (by && strcmp(by, "launcher")) {
        snprintf(err, errlen, "DTRAIN_STORE_SERVER=%s is not 'launcher' (the launcher serves the "
                 "store) or unset (rank 0 serves it)", by);
        return -1;
    }
    b->store_by_launcher = by != NULL;
    return dt_bootstrap_read_settings(b, err, errlen);
}

int dt_bootstrap_read_settings(dt_bootstrap *b, char *err, size_t errlen)
{
    double timeout = DT_DEFAULT_TIMEOUT_S;
    if (dt_env_double("DTRAIN_TIMEOUT", 0.1, 1e7, &timeout, err, errlen) < 0) return -1;
    b->timeout_s = timeout;
    const char *tr = dt_env_str("DTRAIN_TRANSPORT");
    if (tr && strcmp(tr, "tcp") && strcmp(tr, "auto") && strcmp(tr, "shm") && strcmp(tr, "mpi")) {
        snprintf(err, errlen, "DTRAIN_TRANSPORT=%s is not one of auto, shm, tcp, mpi", tr);
        return -1;
    }
    b->force_tcp = tr && !strcmp(tr, "tcp");
    b->use_mpi = tr && !strcmp(tr, "mpi");
    return 0;
}
