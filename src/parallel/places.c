/* The list of a job's places. See places.h. */
#include "parallel/places.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"

int dt_places_alloc(dt_places *pl, int n, char *err, size_t errlen)
{
    memset(pl, 0, sizeof *pl);
    if (n < 1 || !(pl->at = calloc((size_t)n, sizeof *pl->at)))
        return dt_strf(err, errlen, "places: out of memory for %d", n), -1;
    pl->n = n;
    return 0;
}

void dt_places_free(dt_places *pl)
{
    free(pl->at);
    pl->at = NULL;
    pl->n = 0;
}

int dt_places_whole(dt_places *pl, int world, char *err, size_t errlen)
{
    if (dt_places_alloc(pl, 1, err, errlen)) return -1;
    dt_strf(pl->rows, sizeof pl->rows, "every rank holds the whole model");
    dt_strf(pl->at[0].label, sizeof pl->at[0].label, "every rank");
    pl->at[0].ranks = world;
    pl->at[0].mem = (dt_rank_mem){.floats = 0, .copies = world};
    return 0;
}

static size_t seg_len(const dt_gpt *m, int s)
{
    return dt_gpt_segment_start(m, s + 1) - dt_gpt_segment_start(m, s);
}

/* In use at once (what mixed precision widens, bf16 accumulation opens
 * in fp32): a layer, or the head's ln_f with the tied embeddings. */
void dt_places_layout_mem(const dt_gpt *lay, int B, int T, dt_rank_mem *out)
{
    const int nl = lay->cfg.n_layer;
    size_t most = seg_len(lay, 0) + seg_len(lay, nl + 1);
    for (int l = 0; l < nl; l++)
        if (seg_len(lay, 1 + l) > most) most = seg_len(lay, 1 + l);
    *out = (dt_rank_mem){.floats = lay->n_floats, .in_use = most, .grads_open = most,
                         .acts = 4.0 * (double)dt_gpt_acts_floats(lay, B, T)};
}
