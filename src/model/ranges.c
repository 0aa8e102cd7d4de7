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
