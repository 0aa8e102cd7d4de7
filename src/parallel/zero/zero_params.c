/* ZeRO's parameters. Stages 1-2 hold them whole and gather the updated
 * pieces after each step. Stage 3 holds only its pieces; the model's
 * parameter buffer is a window (core/window.h) into which each segment is
 * gathered just before use, with the next `prefetch` segments in the order
 * of use gathered behind it, and let go after use. See zero.h. */
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/window.h"
#include "parallel/zero/zero_internal.h"

#define seg_lo dt_zero_seg_lo
#define seg_len dt_zero_seg_len

void dt_zero_drop_segment(zero *z, float *window, int s, dt_mem_kind kind, int accounted)
{
    size_t lo = seg_lo(z, s) * sizeof(float), n = seg_len(z, s) * sizeof(float);
    dt_window_drop(window, lo, lo + n);
    if (accounted) dt_mem_account(kind, -(long long)n);
}

void dt_zero_keep_piece(zero *z, int s)
{
    const dt_flat_range *p = &z->map.mine[s];
    memcpy(z->shard_p + p->at, z->m->params + p->lo, (p->hi - p->lo) * sizeof(float));
}

int dt_zero_fail(zero *z, int rc, const char *what)
{
    if (!z->error) {
        z->error = rc ? rc : -1;
        dt_strf(z->errmsg, sizeof z->errmsg, "%s: %s", what, dt_comm_error(z->comm));
        dt_strf(z->m->error, sizeof z->m->error, "%s", z->errmsg);
    }
    return -1;
}

float *dt_zero_params_of(const zero *z, int s)
{
    const dt_flat_range *p = &z->map.mine[s];
    return z->o.stage >= 3 ? z->shard_p + p->at : z->m->params + p->lo;
}

static int gather(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (g->gathered) return 0;
    const dt_flat_range *p = &z->map.mine[s];
    dt_zero_note(z, "gather", s);
    int rc = dt_iallgather(z->comm, z->shard_p + p->at, z->m->params + seg_lo(z, s),
                           z->map.piece[s], DT_F32, &g->ag);
    if (rc) return dt_zero_fail(z, rc, "parameter gather");
    g->gathered = 1;
    z->live += seg_len(z, s);
    dt_mem_account(DT_MEM_PARAMS, (long long)(seg_len(z, s) * sizeof(float)));
    return 0;
}

static int wait_gather(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!g->ag) return 0;
    uint64_t t0 = dt_now_ns();
    int rc = dt_wait(g->ag);
    g->ag = NULL;
    z->wait_ms += (double)(dt_now_ns() - t0) * 1e-6; /* compute stood still */
    return rc ? dt_zero_fail(z, rc, "parameter gather") : 0;
}

static int release(zero *z, int s, int force)
{
    zero_seg *g = &z->seg[s];
    if (!g->gathered || (g->persistent && !force)) return 0;
    if (wait_gather(z, s)) return -1;
    dt_zero_drop_segment(z, z->m->params, s, DT_MEM_PARAMS, 1);
    g->gathered = 0;
    z->live -= seg_len(z, s);
    return 0;
}

/* The segment used after s in forward (embeddings, layers, final norm) or
 * in backward (final norm and head, then the layers from the last), or -1. */
static int next_use(const zero *z, int s, int use)
{
    if (use == DT_USE_FORWARD) return s <= z->L ? s + 1 : -1;
    if (s == z->L + 1) return 0;
    if (s == 0) return z->L >= 1 ? z->L : -1;
    return s > 1 ? s - 1 : -1;
}

static int prefetch(zero *z, int s, int use)
{
    /* At the head, forward's next use is backward's first: already here. */
    if (use == DT_USE_FORWARD && s == 0 && z->in_head) return 0;
    for (int k = 0, t = next_use(z, s, use); k < z->o.prefetch && t >= 0;
         k++, t = next_use(z, t, use)) {
        if (z->seg[t].gathered) continue;
        if (z->o.max_live_floats && z->live + seg_len(z, t) > z->o.max_live_floats) break;
        if (gather(z, t)) return -1;
    }
    return 0;
}

static void hold_grads(zero *z, int s)
{
    if (z->o.stage < 2 || z->seg[s].grads_held) return;
    z->seg[s].grads_held = 1;
    dt_mem_account(DT_MEM_GRADS, (long long)(seg_len(z, s) * sizeof(float)));
}

int dt_zero_param_need(void *ctx, int s, int use)
{
    zero *z = ctx;
    if (z->error) return -1;
    if (use == DT_USE_BACKWARD) hold_grads(z, s);
    if (z->o.stage < 3) return 0;
    if (use == DT_USE_INIT) {
        dt_mem_account(DT_MEM_PARAMS, (long long)(seg_len(z, s) * sizeof(float)));
        return 0;
    }
    if (use == DT_USE_FORWARD && s == z->L + 1) z->in_head = 1;
    if (gather(z, s) || prefetch(z, s, use) || wait_gather(z, s)) return -1;
    dt_zero_note(z, use == DT_USE_FORWARD ? "forward" : "backward", s);
    return 0;
}

void dt_zero_param_done(void *ctx, int s, int use)
{
    zero *z = ctx;
    if (z->o.stage < 3 || z->error) return;
    if (use != DT_USE_INIT) dt_zero_note(z, use == DT_USE_FORWARD ? "forward_end" : "backward_end", s);
    if (use == DT_USE_INIT) {
        /* Keep this rank's piece of the initial values; let the rest go. */
        dt_zero_keep_piece(z, s);
        dt_zero_drop_segment(z, z->m->params, s, DT_MEM_PARAMS, 1);
        z->inited = 1;
        return;
    }
    if (use == DT_USE_FORWARD && z->in_head && (s == 0 || s == z->L + 1)) {
        /* The head's segments are backward's first: keep them. */
        if (s == 0) z->in_head = 0;
        return;
    }
    if (use == DT_USE_FORWARD && !z->o.reshard_after_forward) return;
    release(z, s, 0);
}

int dt_zero_params_refresh(zero *z)
{
    if (z->o.stage < 3) {
        for (int s = 0; s < z->nseg; s++) {
            float *p = z->m->params;
            int rc = dt_iallgather(z->comm, p + z->map.mine[s].lo, p + seg_lo(z, s),
                                   z->map.piece[s], DT_F32, &z->seg[s].ag);
            if (rc) return dt_zero_fail(z, rc, "parameter all-gather");
        }
        for (int s = 0; s < z->nseg; s++)
            if (wait_gather(z, s)) return -1;
        return 0;
    }
    for (int s = 0; s < z->nseg; s++) {
        if (release(z, s, 1)) return -1;
        if (z->seg[s].persistent && gather(z, s)) return -1;
    }
    return 0;
}

int dt_zero_gather_one(zero *z, int s) { return gather(z, s) || wait_gather(z, s) ? -1 : 0; }

void dt_zero_release_one(zero *z, int s) { release(z, s, 0); }

int dt_zero_gather_all(zero *z)
{
    if (z->o.stage < 3) return 0;
    for (int s = 0; s < z->nseg; s++)
        if (gather(z, s)) return -1;
    for (int s = 0; s < z->nseg; s++)
        if (wait_gather(z, s)) return -1;
    return 0;
}

void dt_zero_drop_all(zero *z)
{
    if (z->o.stage < 3) return;
    for (int s = 0; s < z->nseg; s++) release(z, s, 0);
}
