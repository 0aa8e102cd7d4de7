/* A step's communication waits across the lockstep group (step_waits.h). */
#include "train/step_waits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "train/run.h"

/* One all-reduce (MAX) of three doubles carries the least wait, the most,
 * and who waited least: the key floor(wait in us) x 2^20 + rank is exact in
 * a double for waits under 2^33 us (2.4 hours) and ranks under 2^20, and
 * its least value names the rank with the least wait, the lowest on a tie. */
#define RANK_BITS 20

int dt_step_waits_agree(dt_run *t, long step, double mine_ms, dt_step_waits *w)
{
    memset(w, 0, sizeof *w);
    dt_comm *g = t->S.lockstep;
    if (!g || dt_comm_size(g) < 2) return 0;
    double us = floor(mine_ms * 1e3);
    const double most_us = ldexp(1.0, 53 - RANK_BITS) - 1;
    if (!(us >= 0)) us = 0;
    if (us > most_us) us = most_us;
    const int rank = t->r.rank < (1 << RANK_BITS) ? t->r.rank : (1 << RANK_BITS) - 1;
    double v[3] = {-mine_ms, mine_ms, -(ldexp(us, RANK_BITS) + rank)};
    if (dt_allreduce(g, v, v, 3, DT_F64, DT_MAX) != 0)
        return dt_strf(ERR(t), "step %ld: comparing the ranks' communication waits: %s",
                       step + 1, dt_comm_error(g)), -1;
    w->known = 1;
    w->exposed_ms = -v[0];
    w->most_ms = v[1];
    w->slowest = (int)fmod(-v[2], ldexp(1.0, RANK_BITS));
    return 0;
}

void dt_step_waits_count(dt_waits_total *w, const dt_step_waits *s, double mine_ms,
                         double step_ms, int ranks)
{
    if (!s->known) return;
    if (!w->slowest && ranks > 0 && (w->slowest = calloc((size_t)ranks, sizeof *w->slowest)))
        w->ranks = ranks;
    if (s->slowest >= 0 && s->slowest < w->ranks) w->slowest[s->slowest]++;
    w->steps++;
    w->step_ms += step_ms;
    w->exposed_ms += s->exposed_ms;
    w->mine_ms += mine_ms;
}

void dt_step_waits_report(FILE *f, const dt_waits_total *w, int rank)
{
    if (w->steps == 0) return;
    const double n = (double)w->steps, step = w->step_ms / n;
    const double exposed = w->exposed_ms / n, mine = w->mine_ms / n;
    fprintf(f, "communication waits, the mean of %ld step%s after the first: %.1f ms exposed "
            "(%.2f%% of the step); rank %d waited %.1f ms (%.2f%%), the rest of it behind "
            "slower ranks", w->steps, w->steps == 1 ? "" : "s", exposed, 100.0 * exposed / step,
            rank, mine, 100.0 * mine / step);
    int most = -1;
    for (int r = 0; r < w->ranks; r++)
        if (most < 0 || w->slowest[r] > w->slowest[most]) most = r;
    if (most >= 0)
        fprintf(f, "; the slowest rank most often: rank %d, in %ld of %ld steps", most,
                w->slowest[most], w->steps);
    fprintf(f, "\n");
    fflush(f); /* whole, between other ranks' lines on a shared terminal */
}

void dt_step_waits_free(dt_waits_total *w)
{
    free(w->slowest);
    memset(w, 0, sizeof *w);
}
