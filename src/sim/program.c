/* Programs: growable lists of operations (engine.h). */
#include <stdlib.h>

#include "sim/engine.h"

int dt_sim_prog_add(dt_sim_prog *p, dt_sim_op op)
{
    if (p->n == p->alloc) {
        int alloc = p->alloc ? 2 * p->alloc : 16;
        dt_sim_op *o = realloc(p->op, (size_t)alloc * sizeof *o);
        if (!o) return -1;
        p->op = o;
        p->alloc = alloc;
    }
    p->op[p->n++] = op;
    return 0;
}

void dt_sim_prog_free(dt_sim_prog *p)
{
    free(p->op);
    p->op = NULL;
    p->n = p->alloc = 0;
}
