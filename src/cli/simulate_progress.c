/* `dtrain simulate`'s progress lines (simulate.h): a simulation of a
 * million ranks runs for minutes, and a person waiting on it should know
 * what it is doing and roughly how long it has left. Short runs print
 * nothing: the first line comes once the command has run a while. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/simulate.h"
#include "core/env.h"
#include "core/timer.h"

#define FIRST_S 5.0 /* the first line, once the command has run this long */
#define PHASE_S 1.0 /* and the phase reported on this long: a quick one goes unsaid */

int sim_progress_init(sim_progress *p, char *err, size_t len)
{
    memset(p, 0, sizeof *p);
    p->every_s = 10;
    p->start_ns = dt_now_ns();
    if (dt_env_double("DTRAIN_SIM_PROGRESS_S", 0, 3600, &p->every_s, err, len) < 0) return -1;
    return 0;
}

static double since(uint64_t t0, uint64_t now) { return (double)(now - t0) * 1e-9; }

static void line(const sim_progress *p, double done, double total, uint64_t now)
{
    double f = total > 0 ? done / total : 1, t = since(p->phase_ns, now);
    double pct = floor(100 * f); /* 99.7% is not done */
    fprintf(stderr, "dtrain simulate: %s: ", p->what);
    if (f >= 1) fprintf(stderr, "done in %.0f s\n", t);
    else if (f < 0.01 || t < 1) fprintf(stderr, "%.0f%% after %.0f s\n", pct, t);
    else fprintf(stderr, "%.0f%% after %.0f s, about %.0f s left\n", pct, t, t * (1 - f) / f);
    fflush(stderr);
}

void sim_progress_tell(void *ctx, const char *what, double done, double total)
{
    sim_progress *p = ctx;
    uint64_t now = dt_now_ns();
    if (strcmp(what, p->what)) {
        snprintf(p->what, sizeof p->what, "%s", what);
        p->phase_ns = now;
        p->told = p->ended = 0;
    }
    if (p->ended) return;
    double first = p->every_s < FIRST_S ? p->every_s : FIRST_S;
    double phase = p->every_s < PHASE_S ? p->every_s : PHASE_S;
    int due = since(p->start_ns, now) >= first && since(p->phase_ns, now) >= phase &&
              (!p->last_ns || since(p->last_ns, now) >= p->every_s);
    /* The end of a phase that was reported on, so its last line says so. */
    if (done >= total && p->told) due = 1;
    if (!due) return;
    line(p, done, total, now);
    p->last_ns = now;
    p->told++;
    p->ended = done >= total;
}
