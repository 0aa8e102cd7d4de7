/* The planner's memory of what it worked out once (plan_internal.h):
 * opened with the whole model's layout, closed with everything kept. See
 * plan.h. */
#include <stdlib.h>

#include "core/str.h"
#include "plan/plan.h"
#include "plan/plan_internal.h"

int dt_plan_memo_open(dt_plan_memo **c, const dt_plan_input *in, char *err, size_t errlen)
{
    *c = calloc(1, sizeof **c);
    if (!*c || !((*c)->cache = calloc(DT_PLAN_ANSWERS, sizeof *(*c)->cache))) {
        free(*c);
        return dt_strf(err, errlen, "plan: out of memory"), -1;
    }
    (*c)->links = in->links;
    if (dt_gpt_create_layout(&(*c)->whole, &in->model, in->bf16 ? DT_PREC_BF16 : DT_PREC_F32, err,
                             errlen) == 0)
        return 0;
    free((*c)->cache);
    free(*c);
    return -1;
}

void dt_plan_memo_close(dt_plan_memo *c)
{
    if (!c) return;
    free(c->cache);
    free(c->spans);
    dt_plan_places_memo_free(c);
    dt_gpt_destroy(&c->whole);
    free(c);
}
