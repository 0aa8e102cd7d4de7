/* Activation recomputation: the modes' names, and the activation bytes each
 * mode keeps per layer (the formulas: acts.h, docs/train.md). The carving of
 * the arena and the rebuilding itself are acts.c's and layer.c's. */
#include <string.h>

#include "model/gpt.h"

int dt_recompute_parse(const char *name, dt_recompute *mode)
{
    static const dt_recompute modes[] = {DT_RECOMPUTE_NONE, DT_RECOMPUTE_SELECTIVE,
                                         DT_RECOMPUTE_FULL};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(name, dt_recompute_name(modes[i]))) return *mode = modes[i], 0;
    return -1;
}

const char *dt_recompute_name(dt_recompute mode)
{
    switch (mode) {
    case DT_RECOMPUTE_SELECTIVE: return "selective";
    case DT_RECOMPUTE_FULL: return "full";
    default: return "none";
    }
}

/* The formulas and why: acts.h. */
size_t dt_gpt_layer_act_bytes(dt_recompute mode, int B, int T, int C, int NH, size_t *shared)
{
    const size_t N = (size_t)B * T, NC = N * (size_t)C, lse = N * (size_t)NH;
    size_t kept, rebuilt;
    switch (mode) {
    case DT_RECOMPUTE_SELECTIVE:
        kept = 10 * NC + lse;
        rebuilt = 6 * NC + 4 * N;
        break;
    case DT_RECOMPUTE_FULL:
        kept = NC;
        rebuilt = 15 * NC + 4 * N + lse;
        break;
    default:
        kept = 16 * NC + 4 * N + lse;
        rebuilt = 0;
    }
    if (shared) *shared = rebuilt * sizeof(float);
    return kept * sizeof(float);
}
