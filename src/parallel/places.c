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
