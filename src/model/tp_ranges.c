/* Where a tensor-parallel rank's slices sit in the whole model's layout:
 * the ranges that let checkpoints, weights files and the initialisation
 * treat a rank's flat buffer as a shard of the whole one; and another
 * rank's layout, for the memory plans of the ranks and the gathering of
 * the whole parameters. See gpt.h. */
#include "model/gpt.h"

#include "core/str.h"

int dt_gpt_ep_peer_layout(const dt_gpt *like, int q, int ep, dt_gpt *lay, char *err, size_t n)
{
    if (dt_gpt_peer_layout(like, like->tp.rank, like->tp.size, lay, err, n)) return -1;
    if (dt_gpt_set_ep(lay, q, ep) == 0) return 0;
    dt_strf(err, n, "%s", lay->error);
    dt_gpt_destroy(lay);
    return -1;
}

int dt_gpt_peer_layout(const dt_gpt *like, int q, int tp, dt_gpt *lay, char *err, size_t n)
{
    if (dt_gpt_create_layout(lay, &like->cfg, like->prec, err, n)) return -1;
    lay->acts.recompute = like->acts.recompute;
    const dt_gpt_cp *cp = &like->cp;
    if (dt_gpt_pad_segments(lay, like->seg_align) == 0 && dt_gpt_set_tp(lay, q, tp) == 0 &&
        dt_gpt_set_ep(lay, like->ep.rank, like->ep.size) == 0 &&
        dt_gpt_set_cp(lay, cp->rank, cp->size, cp->kind, cp->saved_widths) == 0) {
        lay->tp.sp = like->tp.sp && tp > 1;
        return 0;
    }
    dt_strf(err, n, "%s", lay->error);
    dt_gpt_destroy(lay);
    return -1;
}

/* Ranges are merged where one continues the last (a slice of whole rows
 * is one range), so the count and the writing share one pass. */
int dt_gpt_tp_ranges(const dt_gpt *m, const dt_gpt *whole, dt_flat_range *out, int cap)
{
    int k = 0;
    dt_flat_range last = {0, 0, 0};
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *t = &m->tensors[i];
        const size_t gcols = (size_t)(t->ndim == 2 ? t->gshape[1] : t->gshape[0]);
        const size_t cols = (size_t)(t->ndim == 2 ? t->shape[1] : t->shape[0]);
        const size_t rows = t->ndim == 2 ? (size_t)t->shape[0] : t->numel ? 1 : 0;
        const size_t bw = cols / (size_t)t->nblk;
        for (size_t r = 0; r < rows; r++)
            for (int b = 0; b < t->nblk; b++) {
                size_t lo = whole->tensors[i].offset + ((size_t)t->row0 + r) * gcols +
                            (size_t)t->col0 + (size_t)b * (size_t)t->cstride;
                size_t at = t->offset + r * cols + (size_t)b * bw;
                if (k > 0 && last.hi == lo && last.at + (last.hi - last.lo) == at) {
                    last.hi += bw;
                } else {
                    if (k > 0 && out && k <= cap) out[k - 1] = last;
                    last = (dt_flat_range){lo, lo + bw, at};
                    k++;
                }
            }
    }
    if (k > 0 && out && k <= cap) out[k - 1] = last;
    return k;
}
