/* What the environment says about this process's place in the job. */
#ifndef DT_COMM_BOOTSTRAP_H
#define DT_COMM_BOOTSTRAP_H

#include <stddef.h>

/* The most ranks a job may have (WORLD_SIZE), and the most one host's
 * `dtrain launch -n` starts: `dtrain train --nproc` starts its ranks
 * through the launcher, so it has the same bound. */
#define DT_MAX_WORLD_SIZE (1 << 20)
#define DT_MAX_LOCAL_RANKS 1024
/* DTRAIN_TIMEOUT's default, in seconds: the launcher's waits for the
 * store follow it too. */
#define DT_DEFAULT_TIMEOUT_S 300.0

typedef struct {
    int rank, size;
    int local_rank, local_size; /* -1 when the launcher did not say */
    char launcher[16];          /* torchrun, openmpi, pmi, slurm, none */
    char launcher_job[128];     /* "<launcher>:<job id>" when it gives one */
    char master_addr[256];
    int master_port;
    char secret[256];
    int secret_from_env;
    char job_id[64];
    double timeout_s;
    int force_tcp;
    int use_mpi; /* DTRAIN_TRANSPORT=mpi */
    /* DTRAIN_STORE_SERVER=launcher: the launcher serves the store, not
     * rank 0 (`dtrain launch --max-restarts`, so that it outlives every
     * rank). */
    int store_by_launcher;
    /* Rank 0 under mpirun with no MASTER_PORT: the socket that holds the
     * port it chose until its store serves there (dt_net_reserve_port);
     * -1: none. */
    int port_hold;
} dt_bootstrap;

/* 0, or -1 with a message naming the offending variable. */
int dt_bootstrap_from_env(dt_bootstrap *b, char *err, size_t errlen);
/* Of them, what does not depend on the launcher: the timeout
 * (DTRAIN_TIMEOUT) and the transport (DTRAIN_TRANSPORT). */
int dt_bootstrap_read_settings(dt_bootstrap *b, char *err, size_t errlen);

#endif
