/* Shares of the whole model: see slices.h. */
#include "parallel/slices.h"

#include <stdlib.h>
#include <string.h>

#include "core/sum.h"

int dt_slices_ranges(const dt_gpt *m, dt_slices_pick pick, dt_flat_range *out)
{
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *t = &m->tensors[i];
        if (!t->numel || !pick(t)) continue;
        if (n > 0 && out[n - 1].hi == t->offset) out[n - 1].hi = t->offset + t->numel;
        else out[n++] = (dt_flat_range){t->offset, t->offset + t->numel, t->offset};
    }
    return n;
}

uint64_t dt_slices_hash(const dt_gpt *m, dt_slices_pick pick)
{
    uint64_t h = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (pick(&m->tensors[i]))
            h = (h ^ dt_sum64(m->params + m->tensors[i].offset,
                              m->tensors[i].numel * sizeof(float))) * 1099511628211ull;
    return h;
}

int dt_slices_place(const dt_gpt *lay, dt_gpt *whole, const float *local)
{
    int n = dt_gpt_tp_ranges(lay, whole, NULL, 0);
    dt_flat_range *map = malloc((size_t)(n ? n : 1) * sizeof *map);
    if (!map) return -1;
    dt_gpt_tp_ranges(lay, whole, map, n);
    for (int i = 0; i < n; i++)
        memcpy(whole->params + map[i].lo, local + map[i].at,
               (map[i].hi - map[i].lo) * sizeof(float));
    free(map);
    return 0;
}
