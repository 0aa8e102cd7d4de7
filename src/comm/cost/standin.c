/* Stand-in communicators (standin.h). */
#include "comm/cost/standin.h"

#include <stdio.h>
#include <stdlib.h>

#include "comm/comm_internal.h"

/* One allocation: the communicator first, so that it frees the whole. */
typedef struct {
    dt_comm comm;
    dt_job job;
} standin;

/* Copy the host map; number the hosts and the most members on one. */
static void place(dt_comm *c, const int *host_of, int *count)
{
    for (int r = 0; r < c->size; r++) {
        int h = host_of[r];
        c->host_of[r] = h;
        c->nhosts += count[h]++ == 0;
        if (count[h] > c->local_size) c->local_size = count[h];
    }
}

dt_comm *dt_standin_create(int size, const int *host_of, const dt_cost_model *m)
{
    standin *s = calloc(1, sizeof *s);
    int *count = calloc((size_t)size, sizeof *count);
    if (s) s->comm.host_of = malloc((size_t)size * sizeof *s->comm.host_of);
    if (!s || !count || !s->comm.host_of) {
        if (s) free(s->comm.host_of);
        free(s);
        free(count);
        return NULL;
    }
    dt_job *job = &s->job;
    job->model = *m;
    job->size = size;
    job->wake_fd = -1; /* nothing to wake: an abort here must not write to fd 0 */
    job->port_hold = -1;
    pthread_mutex_init(&job->lock, NULL);
    dt_comm *c = &s->comm;
    c->job = job;
    snprintf(c->id, sizeof c->id, "stand-in");
    c->size = size;
    place(c, host_of, count);
    free(count);
    pthread_mutex_init(&c->err_lock, NULL);
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++) c->algo_forced[k] = DT_ALGO_AUTO;
    c->model_seen = ~0u; /* auto's choices are made on first use */
    return c;
}

void dt_standin_destroy(dt_comm *c)
{
    if (!c) return;
    standin *s = (standin *)c;
    pthread_mutex_destroy(&s->job.lock);
    pthread_mutex_destroy(&c->err_lock);
    free(c->host_of);
    free(s);
}
