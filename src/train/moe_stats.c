/* A mixture-of-experts step's figures, from the model's per-layer counts
 * summed over the job. See moe_stats.h. */
#include "train/moe_stats.h"

#include <stdlib.h>
#include <string.h>

#include "train/run.h"

void dt_moe_step_begin(dt_run *t)
{
    dt_gpt_moe_reset(&t->model);
}

/* Doubles per layer on the wire: aux, z, sequences, tokens, dropped, load[E]. */
enum { FIXED = 5 };

/* Expert parallelism's rank q holds experts [q E / P, (q + 1) E / P): its
 * slots' share of the layer over the mean share; 0 without ep. */
static double ep_skew(const double *load, int E, int P)
{
    double hi = 0, sum = 0;
    for (int q = 0; P > 1 && q < P; q++) {
        double v = 0;
        for (int e = q * (E / P); e < (q + 1) * (E / P); e++) v += load[e];
        hi = v > hi ? v : hi, sum += v;
    }
    return sum > 0 ? hi * P / sum : 0.0;
}

static void print_load(FILE *f, int l, const double *s, int E, int P)
{
    double lo = s[FIXED], hi = s[FIXED], sum = 0;
    for (int e = 0; e < E; e++) {
        const double v = s[FIXED + e];
        lo = v < lo ? v : lo, hi = v > hi ? v : hi, sum += v;
    }
    fprintf(f, "  moe layer %d: slots per expert min %.0f max %.0f mean %.1f (max/mean %.2f), "
            "dropped %.0f", l, lo, hi, sum / E, sum > 0 ? hi * E / sum : 0.0, s[4]);
    if (P > 1) fprintf(f, ", busiest ep rank %.2fx the mean", ep_skew(s + FIXED, E, P));
    fputc('\n', f);
}

int dt_moe_step_end(dt_run *t, dt_moe_step *out, FILE *f, int print)
{
    const dt_gpt *m = &t->model;
    const dt_moe_config *mc = &m->cfg.moe;
    const int L = m->cfg.n_layer, E = mc->experts, per = FIXED + E;
    memset(out, 0, sizeof *out);
    if (!m->moe.stats) return 0;
    double *s = calloc((size_t)L * per, sizeof *s);
    if (!s) return dt_strf(ERR(t), "out of memory for the experts' counts"), -1;
    for (int l = 0; l < L; l++) {
        const dt_moe_layer_stats *st = &m->moe.stats[l];
        double *d = s + (size_t)l * per;
        d[0] = st->aux_sum, d[1] = st->z_sum, d[2] = st->seqs, d[3] = st->tokens;
        d[4] = st->dropped;
        memcpy(d + FIXED, st->load, (size_t)E * sizeof *d);
    }
    /* Each layer's counts sit on the ranks that ran it (a stage's, every replica's). */
    if (t->r.world && dt_allreduce(t->r.world, s, s, (size_t)L * per, DT_F64, DT_SUM)) {
        free(s);
        return comm_failed(t, t->r.world, "summing the experts' counts");
    }
    out->on = 1;
    for (int l = 0; l < L; l++) {
        const double *d = s + (size_t)l * per;
        if (d[2] > 0) out->aux_loss += mc->aux_coeff * d[0] / d[2];
        if (d[3] > 0) out->z_loss += mc->z_coeff * d[1] / d[3];
        out->dropped += d[4];
        dt_gpt_moe_update_bias(&t->model, l, d + FIXED);
        out->ep_skew += ep_skew(d + FIXED, E, m->ep.size) / L;
        if (print) print_load(f, l, d, E, m->ep.size);
    }
    free(s);
    return 0;
}
