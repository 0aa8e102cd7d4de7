/* The server side of the parameter server (see ps.h): one thread per
 * worker, each answering its worker's control messages, around one shard of
 * the parameters and its optimizer state. */
#ifndef DT_PARALLEL_PS_SERVER_H
#define DT_PARALLEL_PS_SERVER_H

#include <stddef.h>

#include "parallel/ps.h"

typedef struct {
    dt_ps *ps;
    const dt_gpt *layout;  /* the model's tensor table (no parameters) */
    dt_optimizer *opt;     /* state for this server's shard: base = shard start */
    double (*lr_at)(const void *ctx, long step);
    const void *lr_ctx;
    double grad_clip;      /* max norm; 0 = none */
} dt_ps_server_args;

/* Serves until every worker has sent STOP: first the INIT of worker 0 (the
 * starting parameters and, on resume, the optimizer state), then each
 * worker's steps, pulls and fetches. On return *params_out holds the shard
 * (for the final comparison of replicas; the caller frees it with
 * dt_free). 0, or -1 with a message. */
int dt_ps_server_run(const dt_ps_server_args *a, float **params_out, long *updates_out,
                     char *err, size_t errlen);

#endif
