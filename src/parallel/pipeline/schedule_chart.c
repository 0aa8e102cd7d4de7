/* The text chart of a schedule: its unit-time simulation drawn one rank a
 * row, one unit of time a column; its figures are the caller's (`dtrain
 * plan` prints them for the whole step). See schedule.h. */
#include "parallel/pipeline/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"

/* Whole units so every action fills whole columns; B costs two forwards,
 * as the usual rule of thumb for a transformer layer has it. */
const double dt_pp_chart_cost[4] = {1, 2, 1, 1};

/* "F12", or with chunks "F12c1": compute letter, micro-batch, chunk. */
static int cell_text(char *buf, size_t n, const dt_pp_schedule *s, dt_pp_action a)
{
    const char letter = "FBIW"[a.op];
    if (s->V > 1) return dt_strf(buf, n, "%c%dc%d", letter, (int)a.micro, a.stage / s->p);
    return dt_strf(buf, n, "%c%d", letter, (int)a.micro);
}

static int cell_width(const dt_pp_schedule *s)
{
    char buf[32];
    dt_pp_action widest = {DT_PP_F, (int16_t)(s->p * s->V - 1), s->M - 1, -1};
    return cell_text(buf, sizeof buf, s, widest) + 1;
}

/* One rank's row: every column '.', then each compute action's text over
 * the columns it takes. */
static void chart_row(FILE *f, const dt_pp_schedule *s, const dt_pp_sim *sim, int r, char *line,
                      int slots, int width)
{
    for (int u = 0; u < slots; u++) {
        memset(line + u * width, ' ', (size_t)width);
        line[u * width] = '.';
    }
    for (int j = 0; j < s->n[r]; j++) {
        dt_pp_action a = s->acts[r][j];
        if (a.op > DT_PP_W) continue;
        char text[32];
        int len = cell_text(text, sizeof text, s, a), t0 = (int)lround(sim->start[r][j]);
        for (int u = t0; u < t0 + (int)dt_pp_chart_cost[a.op] && u < slots; u++)
            memcpy(line + u * width, text, (size_t)len), line[u * width + len] = ' ';
    }
    int end = slots * width;
    while (end > 0 && line[end - 1] == ' ') end--;
    fprintf(f, "rank %2d | %.*s\n", r, end, line);
}

void dt_pp_schedule_chart(FILE *f, const dt_pp_schedule *s)
{
    char err[256];
    dt_pp_sim sim;
    if (dt_pp_schedule_simulate(s, dt_pp_chart_cost, &sim, err, sizeof err)) {
        fprintf(f, "%s\n", err);
        return;
    }
    const int slots = (int)ceil(sim.makespan), width = cell_width(s);
    char *line = malloc((size_t)slots * width + 1);
    if (line) {
        fprintf(f, "%s, p = %d, V = %d, M = %d: one column per unit of time (F = 1, B = 2, "
                "I = W = 1), '.' idle%s\n", dt_pp_kind_name(s->kind), s->p, s->V, s->M,
                s->V > 1 ? ", c<k>: chunk k" : "");
        for (int r = 0; r < s->p; r++) chart_row(f, s, &sim, r, line, slots, width);
    }
    free(line);
    dt_pp_sim_free(&sim);
}
