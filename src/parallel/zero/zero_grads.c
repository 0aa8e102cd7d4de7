/* ZeRO's gradients: each segment reduce-scattered (summed: each rank
 * weighed its share, dt_strategy.grad_ranks) as backward finishes it, so
 * rank r ends with the mean of its pieces. Stage 1 does it
 * on the step's last micro-batch only, in place in the whole gradient
 * buffer; stages 2-3 on every micro-batch, folding this rank's piece into
 * the shard and giving the segment's slot back. See zero.h. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "core/timer.h"
#include "parallel/zero/zero_internal.h"

static int segment_at(const zero *z, size_t lo)
{
    for (int s = 0; s < z->nseg; s++)
        if (dt_gpt_segment_start(z->m, s) == lo) return s;
    return -1;
}

int dt_zero_wait(zero *z, dt_request **r, const char *name, size_t bytes)
{
    uint64_t t0 = dt_now_ns(), start = 0, end = 0;
    int rc = dt_wait_timed(*r, &start, &end);
    *r = NULL;
    z->wait_ms += (double)(dt_now_ns() - t0) * 1e-6; /* compute stood still */
    if (rc == 0) dt_zero_trace(z, name, start, end, bytes);
    return rc;
}

/* Segment s's gradients of this micro-batch from element `at` of the
 * layout on: in its slot (stages 2-3), or in the model's buffer (stage 1,
 * fp32 or bf16). */
static dt_gbuf seg_grads(const zero *z, int s, size_t at)
{
    (void)s;
    return dt_gpt_grads_at(z->m, at);
}

/* The reduced piece, back from a copy in the wire's type. */
static int wait_reduce_scatter(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    const dt_flat_range *p = &z->map.mine[s];
    int rc = dt_zero_wait(z, &g->rs, "reduce_scatter",
                          dt_zero_seg_len(z, s) * dt_dtype_size(z->o.wire));
    if (rc == 0)
        dt_wire_result(&g->wire, p->lo - dt_zero_seg_lo(z, s), seg_grads(z, s, p->lo),
                       p->hi - p->lo);
    dt_wire_close(&g->wire);
    return rc ? dt_zero_fail(z, rc, "gradient reduce-scatter") : 0;
}

/* Waits for segment s's reduce-scatter; stages 2-3 fold the piece into the
 * shard (the step's first micro-batch copies, later ones add) and give the
 * segment's slot back. */
static int fold(zero *z, int s, int micro)
{
    zero_seg *g = &z->seg[s];
    if (!g->rs) return 0;
    const dt_flat_range *p = &z->map.mine[s];
    size_t n = p->hi - p->lo;
    if (g->qsend ? dt_zero_qgz_finish(z, s, seg_grads(z, s, p->lo).f32) : wait_reduce_scatter(z, s))
        return -1;
    if (z->o.stage < 2) return 0;
    if (!g->grads_held) { /* every backward use holds one (zero_params.c: hold_grads) */
        if (!z->error) {
            z->error = -1;
            dt_strf(z->errmsg, sizeof z->errmsg, "ZeRO-%d: segment %d's gradients were "
                    "reported without a slot to hold them (a bug)", z->o.stage, s);
            dt_strf(z->m->error, sizeof z->m->error, "%s", z->errmsg);
        }
        return -1;
    }
    dt_gbuf_accumulate(dt_gbuf_at(z->shard_g, p->at), seg_grads(z, s, p->lo).f32, n, micro == 0);
    dt_gpt_grads_release(z->m, s);
    g->grads_held = 0;
    return 0;
}

/* The model's hook: segment s is final for this micro-batch. */
static void on_grad_ready(void *ctx, size_t lo, size_t hi)
{
    zero *z = ctx;
    int s = segment_at(z, lo);
    if (s < 0 || hi <= lo || z->error) return;
    /* Windows of at most two segments at once: the one before this is folded
     * now, its reduce-scatter having run while this one computed. */
    if (z->o.stage >= 2 && s + 1 < z->nseg && fold(z, s + 1, z->micro)) return;
    zero_seg *g = &z->seg[s];
    dt_zero_note(z, "reduce_scatter", s);
    if (z->o.quant_grads) { /* stage 3's gradients are fp32 in the slot */
        dt_zero_qgz_start(z, s, seg_grads(z, s, lo).f32);
        return;
    }
    /* Stage 1 with bf16 accumulation reduces the model's bf16 sums; the
     * other cases the fp32 gradients of this micro-batch. */
    if (dt_wire_open(&g->wire, seg_grads(z, s, lo), hi - lo, z->o.wire)) {
        dt_strf(z->errmsg, sizeof z->errmsg, "out of memory for a gradient copy in the wire's type");
        z->error = -1;
        return;
    }
    void *mine = dt_wire_at(&g->wire, z->map.mine[s].lo - lo);
    int rc = dt_ireduce_scatter(z->comm, g->wire.buf, mine, z->map.piece[s], z->o.wire, DT_SUM,
                                &g->rs);
    if (rc) dt_zero_fail(z, rc, "gradient reduce-scatter");
}

void dt_zero_grads_hook(zero *z)
{
    /* A deferred update reads the gradient pieces this backward folds
     * into: what forward did not settle is settled now. */
    if (z->micro == 0 && dt_zero_settle_all(z)) return;
    /* The previous micro-batch's last reduce-scatters ran during this
     * forward; fold them before this backward writes the slots again. */
    for (int s = 0; s < z->nseg && z->micro > 0; s++)
        if (fold(z, s, z->micro - 1)) break;
    int communicate = z->o.stage >= 2 || z->last;
    z->m->hooks.grad_ready = communicate ? on_grad_ready : NULL;
    z->m->hooks.grad_ctx = z;
}

int dt_zero_grads_finish(zero *z)
{
    z->m->hooks.grad_ready = NULL;
    for (int s = z->nseg - 1; s >= 0; s--)
        if (fold(z, s, z->micro) && !z->error) return -1;
    return z->error ? -1 : 0;
}

dt_gbuf dt_zero_grads_of(const zero *z, int s)
{
    return z->o.stage >= 2 ? dt_gbuf_at(z->shard_g, z->map.mine[s].at)
                           : dt_gbuf_at(dt_gpt_grads(z->m), z->map.mine[s].lo);
}

void dt_zero_grads_free(zero *z)
{
    for (int s = 0; s < z->nseg; s++) {
        if (z->seg[s].rs) dt_wait(z->seg[s].rs);
        z->seg[s].rs = NULL;
        dt_wire_close(&z->seg[s].wire);
        free(z->seg[s].qsend), free(z->seg[s].qrecv);
        z->seg[s].qsend = z->seg[s].qrecv = NULL;
    }
}
