/* Range arithmetic over the flat layout. See ranges.h. */
#include "model/ranges.h"

int dt_flat_ranges_cover(const dt_flat_ranges *r, size_t lo, size_t hi)
{
    for (int i = 0; r && i < r->n; i++)
        if (lo >= r->r[i].lo && hi <= r->r[i].hi) return 1;
    return !r;
}

dt_flat_ranges dt_flat_ranges_within(const dt_flat_ranges *a, const dt_flat_ranges *b,
                                     dt_flat_range *out)
{
    int n = 0;
    /* A merge of two ascending lists: each overlap once, in order. */
    for (int i = 0, j = 0; i < a->n && j < b->n;) {
        const dt_flat_range *x = &a->r[i], *y = &b->r[j];
        size_t lo = x->lo > y->lo ? x->lo : y->lo, hi = x->hi < y->hi ? x->hi : y->hi;
        if (lo < hi) out[n++] = (dt_flat_range){lo, hi, x->at + (lo - x->lo)};
        if (x->hi <= y->hi) i++;
        else j++;
    }
    return (dt_flat_ranges){n, out, a->len};
}

dt_flat_ranges dt_flat_ranges_compose(const dt_flat_ranges *a, const dt_flat_ranges *map,
                                      dt_flat_range *out)
{
    int n = 0, j = 0;
    for (int i = 0; i < a->n; i++) {
        const dt_flat_range *q = &a->r[i];
        while (j < map->n && map->r[j].at + (map->r[j].hi - map->r[j].lo) <= q->lo) j++;
        for (int k = j; k < map->n && map->r[k].at < q->hi; k++) {
            const dt_flat_range *p = &map->r[k];
            size_t end = p->at + (p->hi - p->lo);
            size_t x = q->lo > p->at ? q->lo : p->at, y = q->hi < end ? q->hi : end;
            if (x < y)
                out[n++] = (dt_flat_range){p->lo + (x - p->at), p->lo + (y - p->at),
                                           q->at + (x - q->lo)};
        }
    }
    return (dt_flat_ranges){n, out, a->len};
}
