/* A rank's ranges of the flat layout as pieces of named tensors: the
 * range arithmetic that makes a checkpoint independent of the layout's
 * padding. See ckpt/shard.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "train/ckpt/shard.h"

static int check_ranges(const dt_gpt *layout, const dt_flat_ranges *mine, char *err,
                        size_t errlen)
{
    for (int i = 0; i < mine->n; i++) {
        const dt_flat_range *r = &mine->r[i];
        const char *why = NULL;
        if (r->lo > r->hi)
            why = "ends before it starts";
        else if (r->hi > layout->n_floats)
            why = "ends past the layout's flat buffer";
        else if (r->at > mine->len || r->hi - r->lo > mine->len - r->at)
            why = "ends past the shard buffers";
        else if (i > 0 && r->lo < mine->r[i - 1].hi)
            why = "is not after the range before it (ranges must be ascending and disjoint)";
        if (!why) continue;
        dt_strf(err, errlen,
                "range %d, floats [%zu, %zu) at %zu, %s (layout of %zu floats, shard of %zu)", i,
                r->lo, r->hi, r->at, why, layout->n_floats, mine->len);
        return -1;
    }
    return 0;
}

int dt_ckpt_pieces(const dt_gpt *layout, const dt_flat_ranges *mine, dt_ckpt_piece **out,
                   int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (check_ranges(layout, mine, err, errlen) != 0) return -1;
    /* A tensor meets each range at most once. */
    size_t cap = (size_t)mine->n + (size_t)layout->n_tensors;
    dt_ckpt_piece *p = calloc(cap ? cap : 1, sizeof *p);
    if (!p) {
        dt_strf(err, errlen, "out of memory for %zu checkpoint pieces", cap);
        return -1;
    }
    int count = 0;
    for (int i = 0; i < mine->n; i++) {
        const dt_flat_range *r = &mine->r[i];
        for (int k = 0; k < layout->n_tensors; k++) {
            const dt_param_tensor *t = &layout->tensors[k];
            size_t lo = r->lo > t->offset ? r->lo : t->offset;
            size_t hi = r->hi < t->offset + t->numel ? r->hi : t->offset + t->numel;
            if (lo >= hi) continue;
            p[count++] = (dt_ckpt_piece){.tensor = k, .lo = lo - t->offset,
                                         .hi = hi - t->offset, .at = r->at + (lo - r->lo)};
        }
    }
    *out = p;
    *n = count;
    return 0;
}

void dt_ckpt_shard_name(char *buf, size_t len, int rank, int ranks)
{
    dt_strf(buf, len, "shard-%05d-of-%05d.safetensors", rank, ranks);
}

void dt_ckpt_piece_name(char *buf, size_t len, const char *prefix, const char *tensor,
                        uint64_t lo)
{
    dt_strf(buf, len, "%s%s@%llu", prefix, tensor, (unsigned long long)lo);
}

