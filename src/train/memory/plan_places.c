/* The plans of a job's places, and their table. See memory/plan_places.h. */
#include "train/memory/plan_places.h"

#include <stdlib.h>

#include "core/str.h"

#define MIB(x) ((double)(x) / 1048576.0)

int dt_mem_plan_places(const dt_gpt *layout, const dt_train_config *c, const dt_places *pl,
                       dt_mem_plan *plan, char *err, size_t errlen)
{
    for (int i = 0; i < pl->n; i++) {
        const dt_rank_mem *m = &pl->at[i].mem;
        if (dt_mem_plan_held(layout, c, m->copies > 0 ? m->copies : 1, m, &plan[i], err,
                             errlen))
            return -1;
    }
    return 0;
}

static double total(const dt_mem_plan *p) { return dt_mem_plan_state(p) + p->bytes[DT_MEM_ACTS]; }

/* A row per place, the formulas of the first above them. */
static void print_rows(FILE *f, const dt_places *pl, const dt_mem_plan *plan)
{
    fprintf(f, "memory per rank: %s; params %s | grads %s | optim %s\n", pl->rows,
            plan[0].formula[DT_MEM_PARAMS], plan[0].formula[DT_MEM_GRADS],
            plan[0].formula[DT_MEM_OPTIM]);
    for (int i = 0; i < pl->n; i++) {
        const dt_mem_plan *p = &plan[i];
        fprintf(f, "  %s: Psi_q = %zu | params %.1f MiB | grads %.1f MiB | optim %.1f MiB | "
                "acts %.1f MiB | state + acts %.1f MiB\n", pl->at[i].label, p->psi,
                MIB(p->bytes[DT_MEM_PARAMS]), MIB(p->bytes[DT_MEM_GRADS]),
                MIB(p->bytes[DT_MEM_OPTIM]), MIB(p->bytes[DT_MEM_ACTS]), MIB(total(p)));
    }
}

int dt_mem_plan_places_print(FILE *f, const dt_gpt *layout, const dt_train_config *c,
                             const dt_places *pl, char *err, size_t errlen)
{
    dt_mem_plan *plan = calloc((size_t)pl->n, sizeof *plan);
    if (!plan) return dt_strf(err, errlen, "memory plan: out of memory"), -1;
    int rc = dt_mem_plan_places(layout, c, pl, plan, err, errlen);
    if (rc == 0 && f) {
        if (pl->n == 1 && pl->at[0].mem.floats == 0)
            dt_mem_plan_print(f, &plan[0], "memory per rank", NULL, 0);
        else if (pl->pipe.p > 0)
            dt_mem_plan_pp_print(f, layout, pl, plan, "memory per stage");
        else
            print_rows(f, pl, plan);
    }
    free(plan);
    return rc;
}
