/* A DDP step as programs for the engine (ddp.h). */
#include "sim/ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "parallel/ddp.h"
#include "sim/coll.h"

/* What the step is made of, shared by every rank. */
typedef struct {
    int nb;              /* buckets */
    size_t *bytes;       /* [nb] */
    int *low_seg;        /* [nb] the segment whose completion makes the bucket ready */
    dt_sim_sched *sched; /* [nb] distinct sizes recorded once: sched[i] for the first bucket */
    int *sched_of;       /* [nb] index into sched */
    int nsched;
    int segments, layers;
    dt_sim_prog compute, comm;
} step;

static void step_free(step *s)
{
    for (int i = 0; i < s->nsched; i++) dt_sim_sched_free(&s->sched[i]);
    free(s->sched);
    free(s->bytes);
    free(s->low_seg);
    free(s->sched_of);
    dt_sim_prog_free(&s->compute);
    dt_sim_prog_free(&s->comm);
}

/* DDP's buckets over the model's real layout (parallel/ddp.c). */
static int buckets(step *s, const dt_sim_ddp_opts *o, dt_sim_ddp *out, char *err, size_t len)
{
    dt_gpt m;
    if (dt_gpt_create_layout(&m, &o->cfg, DT_PREC_F32, err, len)) return -1;
    dt_ddp d;
    int rc = dt_ddp_init(&d, NULL, &m, o->bucket_bytes, NULL);
    s->segments = dt_gpt_segments(&m);
    s->layers = o->cfg.n_layer;
    out->params = m.n_floats;
    s->nb = rc ? 0 : d.nbuckets;
    s->bytes = calloc((size_t)s->nb + 1, sizeof *s->bytes);
    s->low_seg = calloc((size_t)s->nb + 1, sizeof *s->low_seg);
    if (rc == 0 && s->bytes && s->low_seg) {
        for (int i = 0; i < s->nb; i++) {
            s->bytes[i] = (d.buckets[i].hi - d.buckets[i].lo) * sizeof(float);
            int seg = 0;
            while (dt_gpt_segment_start(&m, seg) < d.buckets[i].lo) seg++;
            s->low_seg[i] = seg;
        }
    }
    if (rc == 0) dt_ddp_free(&d);
    dt_gpt_destroy(&m);
    if (rc || !s->bytes || !s->low_seg) {
        snprintf(err, len, "out of memory for the model's buckets");
        return -1;
    }
    out->nbuckets = s->nb;
    return 0;
}

/* Each distinct bucket size's all-reduce, recorded once. */
static int record(step *s, dt_sim_world *w, const dt_sim_ddp_opts *o, dt_sim_ddp *out,
                  char *err, size_t len)
{
    s->sched = calloc((size_t)s->nb + 1, sizeof *s->sched);
    s->sched_of = calloc((size_t)s->nb + 1, sizeof *s->sched_of);
    if (!s->sched || !s->sched_of) return snprintf(err, len, "out of memory"), -1;
    for (int i = 0; i < s->nb; i++) {
        int k = 0;
        while (k < s->nsched && s->sched[k].bytes != s->bytes[i]) k++;
        if (k == s->nsched) {
            if (dt_sim_sched_record(&s->sched[k], w, DT_COLL_ALLREDUCE, o->algo, s->bytes[i],
                                    err, len))
                return -1;
            s->nsched++;
            if (!strstr(out->algos, s->sched[k].algo)) {
                size_t n = strlen(out->algos);
                snprintf(out->algos + n, sizeof out->algos - n, "%s%s", n ? "," : "",
                         s->sched[k].algo);
            }
        }
        s->sched_of[i] = k;
        out->comm_predicted_s += s->sched[k].predicted;
    }
    return 0;
}

/* Signals the buckets that segment seg's completion makes ready. */
static int segment_done(step *s, int seg)
{
    int rc = 0;
    for (int i = 0; i < s->nb; i++)
        if (s->low_seg[i] == seg) rc |= dt_sim_prog_add(&s->compute, dt_sim_signal(i));
    return rc;
}

/* Compute stream: forward, backward from the head down (segment L + 1,
 * the final LayerNorm, is done with the head; layer l is segment l + 1;
 * the embeddings, segment 0, last), then the optimizer after the last
 * bucket. Comm stream: each bucket when ready, in DDP's launch order. */
static int programs(step *s, const dt_sim_ddp_opts *o, dt_sim_ddp *out, const int *coll_id)
{
    dt_gpt_config head_only = o->cfg;
    head_only.n_layer = 0;
    double tokens = (double)o->batch * o->seq, F = o->flops_per_s;
    double all = dt_gpt_flops_per_token(&o->cfg, o->seq);
    double head = dt_gpt_flops_per_token(&head_only, o->seq);
    double layer = s->layers ? (all - head) / s->layers : 0;
    out->forward_s = tokens * all / 3 / F;
    out->backward_s = tokens * all * 2 / 3 / F;
    out->optimizer_s = (double)out->params * 28 / (o->mem_GBps * 1e9);
    int rc = dt_sim_prog_add(&s->compute, dt_sim_compute(out->forward_s, "forward"));
    rc |= dt_sim_prog_add(&s->compute, dt_sim_compute(tokens * head * 2 / 3 / F, "backward head"));
    rc |= segment_done(s, s->layers + 1);
    for (int l = s->layers - 1; l >= 0; l--) {
        rc |= dt_sim_prog_add(&s->compute, dt_sim_compute(tokens * layer * 2 / 3 / F, "backward"));
        rc |= segment_done(s, l + 1);
    }
    rc |= segment_done(s, 0);
    rc |= dt_sim_prog_add(&s->compute, dt_sim_wait(s->nb));
    rc |= dt_sim_prog_add(&s->compute, dt_sim_compute(out->optimizer_s, "optimizer"));
    for (int i = 0; i < s->nb; i++) {
        rc |= dt_sim_prog_add(&s->comm, dt_sim_wait(i));
        rc |= dt_sim_prog_add(&s->comm, dt_sim_coll(coll_id[i]));
    }
    rc |= dt_sim_prog_add(&s->comm, dt_sim_signal(s->nb));
    return rc;
}

static void summarize(const dt_sim_engine *e, int ranks, dt_sim_ddp *out)
{
    out->step_s = dt_sim_engine_makespan(e);
    memset(&out->mean, 0, sizeof out->mean);
    for (int r = 0; r < ranks; r++) {
        const dt_sim_rank_stats *st = dt_sim_engine_stats(e, r);
        if (r == 0 || st->finish > out->slowest.finish) out->slowest = *st, out->slowest_rank = r;
        out->mean.compute += st->compute / ranks;
        out->mean.exposed += st->exposed / ranks;
        out->mean.idle += st->idle / ranks;
        out->mean.finish += st->finish / ranks;
    }
    long long changes;
    dt_sim_engine_counts(e, &out->events, &out->messages, &changes);
}

static int simulate(step *s, dt_sim_world *w, const dt_sim_ddp_opts *o, dt_sim_span_fn span,
                    void *ctx, dt_sim_ddp *out, char *err, size_t len)
{
    dt_sim_engine *e = dt_sim_engine_new(w, o->nics, 2, s->nb + 1, err, len);
    if (!e) return -1;
    int *id = calloc((size_t)s->nb + 1, sizeof *id), rc = id ? 0 : -1;
    for (int i = 0; rc == 0 && i < s->nb; i++)
        if ((id[i] = dt_sim_engine_add_coll(e, &s->sched[s->sched_of[i]])) < 0) rc = -1;
    if (rc == 0) rc = programs(s, o, out, id);
    if (rc) snprintf(err, len, "out of memory for the step's programs");
    for (int r = 0; rc == 0 && r < w->ranks; r++) {
        dt_sim_engine_program(e, r, 0, &s->compute);
        dt_sim_engine_program(e, r, 1, &s->comm);
    }
    dt_sim_engine_on_span(e, span, ctx);
    uint64_t t0 = dt_now_ns();
    if (rc == 0) rc = dt_sim_engine_run(e, err, len);
    out->run_s = (double)(dt_now_ns() - t0) * 1e-9;
    if (rc == 0) summarize(e, w->ranks, out);
    free(id);
    dt_sim_engine_free(e);
    return rc;
}

int dt_sim_ddp_run(dt_sim_world *w, const dt_sim_ddp_opts *o, dt_sim_span_fn span, void *ctx,
                   dt_sim_ddp *out, char *err, size_t len)
{
    memset(out, 0, sizeof *out);
    step s = {0};
    uint64_t t0 = dt_now_ns();
    int rc = buckets(&s, o, out, err, len);
    if (rc == 0) rc = record(&s, w, o, out, err, len);
    out->record_s = (double)(dt_now_ns() - t0) * 1e-9;
    if (rc == 0) rc = simulate(&s, w, o, span, ctx, out, err, len);
    step_free(&s);
    return rc;
}
