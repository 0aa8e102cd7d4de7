/* The planner's run: every layout weighed, the fitting ranked by step
 * time, the rest kept with their reasons. See plan.h. */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "core/timer.h"

#define TIE 0.005 /* steps within half a percent: the model cannot tell them apart */

/* How much machinery a layout runs beyond plain data parallelism: the
 * tie-break, since what the model leaves out (smaller products, more
 * messages, more code on the critical path) grows with it. */
static int machinery(const dt_plan_layout *l)
{
    return (l->tp > 1) + (l->cp > 1) + (l->pp > 1) + l->zero + (int)l->rc;
}

/* Fitting before dropped; among the fitting the fastest first; ties to
 * the simpler, then to the one that holds less. */
static int by_rank(const void *a, const void *b)
{
    const dt_plan_row *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->fits && (x->step > y->step * (1 + TIE) || y->step > x->step * (1 + TIE)))
        return x->step < y->step ? -1 : 1;
    if (machinery(&x->l) != machinery(&y->l)) return machinery(&x->l) - machinery(&y->l);
    if (x->mem_total != y->mem_total) return x->mem_total < y->mem_total ? -1 : 1;
    return 0;
}

/* A layout's memory, and its step time where it fits: what does not fit
 * is not timed, unless the report shows it (time_dropped). */
static int weigh(const dt_plan_input *in, dt_plan_memo *c, dt_plan_row *row, char *err,
                 size_t errlen)
{
    if (dt_plan_memory(in, c, &row->l, row, err, errlen)) return -1;
    return row->fits ? dt_plan_time(in, c, &row->l, row, err, errlen) : 0;
}

/* The dropped layouts the report shows, the first in->show of them in
 * rank order (which does not depend on their step time), timed. */
static int time_dropped(const dt_plan_input *in, dt_plan_memo *c, dt_plan_result *out, char *err,
                        size_t errlen)
{
    for (int i = out->nfit; i < out->n && i < out->nfit + in->show; i++)
        if (dt_plan_time(in, c, &out->rows[i].l, &out->rows[i], err, errlen)) return -1;
    return 0;
}

static int weigh_all(const dt_plan_input *in, const dt_plan_layout *ls, dt_plan_result *out,
                     char *err, size_t errlen)
{
    dt_plan_memo *c;
    if (dt_plan_memo_open(&c, in, err, errlen)) return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < out->n; i++) {
        if (in->progress) in->progress(in->progress_arg, i, out->n);
        out->rows[i].l = ls[i];
        rc = weigh(in, c, &out->rows[i], err, errlen);
    }
    if (rc == 0) {
        qsort(out->rows, (size_t)out->n, sizeof *out->rows, by_rank);
        while (out->nfit < out->n && out->rows[out->nfit].fits) out->nfit++;
        rc = time_dropped(in, c, out, err, errlen);
    }
    dt_plan_memo_close(c);
    return rc;
}

int dt_plan_run(const dt_plan_input *in, dt_plan_result *out, char *err, size_t errlen)
{
    uint64_t t0 = dt_now_ns();
    dt_plan_layout *ls;
    int n;
    memset(out, 0, sizeof *out);
    if (dt_plan_layouts(in, &ls, &n, err, errlen)) return -1;
    if (!(out->rows = calloc((size_t)n, sizeof *out->rows))) {
        free(ls);
        return dt_strf(err, errlen, "plan: out of memory for %d layouts", n), -1;
    }
    out->n = n;
    out->considered = n;
    int rc = weigh_all(in, ls, out, err, errlen);
    free(ls);
    if (rc) return dt_plan_result_free(out), -1;
    out->seconds = (double)(dt_now_ns() - t0) * 1e-9;
    return 0;
}

void dt_plan_result_free(dt_plan_result *r)
{
    free(r->rows);
    memset(r, 0, sizeof *r);
}
