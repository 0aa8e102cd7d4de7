/* ZeRO's parameters. Stages 1-2 hold the working parameters whole and
 * gather the updated pieces after each step. Stage 3 holds only its
 * pieces; each segment is gathered into a slot (core/slot_pool.h) just
 * before use, with the next `prefetch` segments in the order of use
 * gathered behind it, and let go after use; the model reads it there
 * (dt_gpt.param_slots). A gather of the whole model for a save or an
 * evaluation goes to the working parameters' window (core/window.h)
 * instead, where those read it in place.
 * With mixed precision the working parameters are the model's bf16
 * params16 (half the bytes to gather), and the pieces this rank updates are
 * fp32 master weights, rounded into the working copy after each update.
 * With offload_param a stage-3 rank's pieces live in the optimizer's NVMe
 * store: each is read into a buffer of its own one segment ahead of its
 * gather, and let go when the gather is done. See zero.h. */
#include <stdlib.h>
#include <string.h>

#include "model/optimizer.h"

#include "core/alloc.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/window.h"
#include "kernels/cast.h"
#include "parallel/zero/zero_internal.h"

#define seg_lo dt_zero_seg_lo
#define seg_len dt_zero_seg_len
#define seg_working dt_zero_seg_working

/* Segment s of a window (elements of esz bytes) backed by the window's
 * pool before it is written, zeroed when asked (core/window.h). */
static void bring_segment(const zero *z, void *window, size_t esz, int s, int zeroed)
{
    size_t lo = seg_lo(z, s) * esz;
    dt_window_bring(window, lo, lo + seg_len(z, s) * esz, zeroed);
}

void dt_zero_drop_segment(zero *z, void *window, size_t esz, int s, dt_mem_kind kind,
                          int accounted)
{
    size_t lo = seg_lo(z, s) * esz, n = seg_len(z, s) * esz;
    dt_window_drop(window, lo, lo + n);
    if (accounted) dt_mem_account(kind, -(long long)n);
}

/* offload_param: the optimizer's store, which holds the pieces (NULL once
 * the optimizer is gone: its engine finished every read then). */
static dt_opt_store *store_of(const zero *z)
{
    dt_optimizer *o = z->S->rank->opt;
    return o ? o->store : NULL;
}

static int io_failed(zero *z)
{
    if (!z->error) {
        z->error = -1;
        dt_strf(z->errmsg, sizeof z->errmsg, "%s", z->m->error);
    }
    return -1;
}

int dt_zero_keep_piece(zero *z, int s)
{
    const dt_flat_range *p = &z->map.mine[s];
    if (!z->o.offload_params) {
        memcpy(z->shard_p + p->at, z->m->params + p->lo, (p->hi - p->lo) * sizeof(float));
        return 0;
    }
    if (p->hi == p->lo) return 0;
    if (dt_opt_store_write_params(store_of(z), p->at, p->hi - p->lo, z->m->params + p->lo,
                                  z->m->error, sizeof z->m->error))
        return io_failed(z);
    return 0;
}

/* offload_param: segment s's piece read from the store into a buffer of
 * its own, queued now and waited for when its gather starts. */
static int read_piece(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!z->o.offload_params || g->pbuf || !dt_zero_has(z, s)) return 0;
    size_t bytes = z->map.piece[s] * sizeof(float);
    if (posix_memalign((void **)&g->pbuf, 4096, bytes)) {
        g->pbuf = NULL;
        dt_strf(z->m->error, sizeof z->m->error, "offload_param: out of memory for %zu bytes",
                bytes);
        return io_failed(z);
    }
    dt_mem_account(DT_MEM_PARAMS, (long long)bytes);
    g->rd = dt_opt_store_read_params(store_of(z), z->map.mine[s].at, z->map.piece[s], g->pbuf,
                                     z->m->error, sizeof z->m->error);
    return g->rd < 0 ? io_failed(z) : 0;
}

/* Its piece here: read (now, if no read was queued) and waited for. */
static int piece_ready(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!z->o.offload_params) return 0;
    if (read_piece(z, s)) return -1;
    if (g->rd < 0) return 0;
    int rc = dt_opt_store_wait(store_of(z), g->rd, z->m->error, sizeof z->m->error);
    g->rd = -1;
    return rc ? io_failed(z) : 0;
}

static void free_piece(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!g->pbuf) return;
    dt_opt_store *st = store_of(z);
    if (g->rd >= 0 && st) dt_opt_store_wait(st, g->rd, z->m->error, sizeof z->m->error);
    g->rd = -1;
    free(g->pbuf);
    g->pbuf = NULL;
    dt_mem_account(DT_MEM_PARAMS, -(long long)(z->map.piece[s] * sizeof(float)));
}

void dt_zero_free_pieces(zero *z)
{
    for (int s = 0; s < z->nseg; s++) free_piece(z, s);
}

/* After the update wrote the pieces: what was read before is stale. The
 * next forward starts at segment 0: its read goes now. */
static int reread_pieces(zero *z)
{
    if (!z->o.offload_params) return 0;
    dt_zero_free_pieces(z);
    return read_piece(z, 0);
}

/* A deferred update (--offload-overlap): segment s's piece brought up to
 * date before anything reads it, the stream advanced past it while the
 * reads of the next ones stay in flight, and with mixed precision its
 * bf16 copy rounded. */
static int settle(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!g->stale) return 0;
    const dt_flat_range *p = &z->map.mine[s];
    if (dt_optimizer_settle(z->S->rank->opt, p->at + (p->hi - p->lo), z->m->error,
                            sizeof z->m->error))
        return io_failed(z);
    g->stale = 0;
    if (z->mixed) dt_cast_f32_to_bf16(z->shard16 + p->at, z->shard_p + p->at, p->hi - p->lo);
    return 0;
}

int dt_zero_settle_all(zero *z)
{
    for (int s = z->nseg - 1; s >= 0; s--) /* the last first: the stream ends at once */
        if (settle(z, s)) return -1;
    return 0;
}

/* This rank's fp32 piece of segment s: in the shard, or read from the store. */
static const float *piece_f32(const zero *z, int s)
{
    return z->shard_p ? z->shard_p + z->map.mine[s].at : z->seg[s].pbuf;
}

void *dt_zero_working(const zero *z)
{
    return z->mixed ? (void *)z->m->mixed.params16 : (void *)z->m->params;
}

static dt_dtype working_type(const zero *z) { return z->mixed ? DT_BF16 : DT_F32; }

/* Where segment s's working values start, and this rank's piece of them
 * that a gather sends (stage 3: its shard; stages 1-2: in place). */
static char *working_at(const zero *z, size_t floats)
{
    return (char *)dt_zero_working(z) + floats * dt_zero_esz(z);
}

/* The slot segment s's gather filled (stage 3, a step's gather), or NULL:
 * the model's table is the one record of it. */
static void *slot_of(const zero *z, int s)
{
    return z->m->param_slots ? z->m->param_slots[s] : NULL;
}

char *dt_zero_seg_working(const zero *z, int s)
{
    return slot_of(z, s) ? (char *)slot_of(z, s) : working_at(z, seg_lo(z, s));
}

/* Room for segment s's gather: a slot the model is told of, or with
 * into_window its place in the window. */
static int place_segment(zero *z, int s)
{
    if (z->into_window) {
        bring_segment(z, dt_zero_working(z), dt_zero_esz(z), s, 0);
        return 0;
    }
    size_t bytes = seg_len(z, s) * dt_zero_esz(z);
    if (!(z->m->param_slots[s] = dt_slot_get(&z->param_pool, bytes)))
        return dt_strf(z->m->error, sizeof z->m->error, "ZeRO-3: out of memory for a gathered "
                       "segment (%.1f MiB)", (double)bytes / 1048576.0), io_failed(z);
    return 0;
}

/* Segment s's gathered values let go: its slot back to the pool, or its
 * window pages dropped. */
static void unplace_segment(zero *z, int s)
{
    if (!slot_of(z, s)) {
        dt_zero_drop_segment(z, dt_zero_working(z), dt_zero_esz(z), s, DT_MEM_PARAMS, 1);
        return;
    }
    dt_slot_put(&z->param_pool, z->m->param_slots[s]);
    dt_mem_account(DT_MEM_PARAMS, -(long long)(seg_len(z, s) * dt_zero_esz(z)));
    z->m->param_slots[s] = NULL;
}

static const void *piece_to_send(const zero *z, int s)
{
    const dt_flat_range *p = &z->map.mine[s];
    if (z->o.stage < 3) return working_at(z, p->lo);
    return z->mixed ? (const void *)(z->shard16 + p->at) : (const void *)piece_f32(z, s);
}

int dt_zero_fail(zero *z, int rc, const char *what)
{
    return dt_zero_fail_on(z, z->comm, rc, what);
}

int dt_zero_fail_on(zero *z, dt_comm *c, int rc, const char *what)
{
    if (!z->error) {
        z->error = rc ? rc : -1;
        dt_strf(z->errmsg, sizeof z->errmsg, "%s: %s", what, dt_comm_error(c));
        dt_strf(z->m->error, sizeof z->m->error, "%s", z->errmsg);
    }
    return -1;
}

/* qwZ: this rank's piece quantized into its slot of an all-gather of every
 * rank's, which wait_gather dequantizes into the window. With mixed
 * precision from the fp32 master piece: one rounding, not two. */
static int gather_int8(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    size_t len = dt_zero_packet_bytes(z, s, 8), p = z->map.piece[s];
    if (!(g->qbuf = malloc(len * (size_t)z->n)))
        return dt_strf(z->m->error, sizeof z->m->error, "ZeRO++ qwZ: out of memory"), -1;
    dt_mem_account(DT_MEM_COMM, (long long)(len * (size_t)z->n));
    unsigned char *mine = g->qbuf + len * (size_t)z->me;
    dt_quant_pack(mine, piece_f32(z, s), p, (size_t)z->o.quant_block, 8);
    free_piece(z, s);
    return dt_iallgather(z->comm, mine, g->qbuf, len, DT_U8, &g->ag);
}

/* Every rank's piece of segment s from the int8 gather into the window:
 * every rank holds the same dequantized values, its own piece's too
 * (with mixed precision rounded once, into the bf16 window). */
static void dequantize(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    size_t len = dt_zero_packet_bytes(z, s, 8), p = z->map.piece[s], B = (size_t)z->o.quant_block;
    for (int r = 0; r < z->n; r++) {
        void *w = seg_working(z, s) + (size_t)r * p * dt_zero_esz(z);
        const unsigned char *in = g->qbuf + len * (size_t)r;
        if (z->mixed) dt_quant_unpack_bf16(w, in, p, B, 8);
        else dt_quant_unpack(w, in, p, B, 8);
    }
    free(g->qbuf);
    g->qbuf = NULL;
    dt_mem_account(DT_MEM_COMM, -(long long)(len * (size_t)z->n));
}

/* Stage 3: segment s of the working parameters, gathered into the window;
 * with qwZ in int8 unless exact (the final weights, the replica check),
 * and an int8 copy already there is gathered again exactly. */
static int wait_gather(zero *z, int s);

/* hpZ: this rank's piece of segment s in the secondary partition. */
static char *sec_piece(const zero *z, int s)
{
    return (char *)z->sec + z->seg[s].sec_at * dt_zero_esz(z);
}

static size_t sec_count(const zero *z, int s) { return seg_len(z, s) / (size_t)z->hpz_k; }

/* hpZ: backward's gather of segment s from the group's secondary pieces,
 * over the ranks of one host. */
static int gather_secondary(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    int rc = dt_iallgather(z->hpz_comm, sec_piece(z, s), seg_working(z, s),
                           sec_count(z, s), working_type(z), &g->ag);
    if (rc) return dt_zero_fail(z, rc, "hpZ parameter gather");
    g->gathered = 1;
    g->from_sec = 1;
    g->quantized = g->sec_quantized;
    z->live += seg_len(z, s);
    dt_mem_account(DT_MEM_PARAMS, (long long)(seg_len(z, s) * dt_zero_esz(z)));
    return 0;
}

/* hpZ: after a primary gather, this rank's secondary piece of it kept,
 * for backward (until the next update). */
static void keep_secondary(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!z->sec || g->from_sec || g->sec_valid) return;
    size_t n = sec_count(z, s), esz = dt_zero_esz(z);
    memcpy(sec_piece(z, s), seg_working(z, s) + (size_t)z->hpz_me * n * esz, n * esz);
    g->sec_valid = 1;
    g->sec_quantized = g->quantized;
}

static int gather(zero *z, int s, int exact)
{
    zero_seg *g = &z->seg[s];
    const int int8 = z->o.quant_weights && !exact;
    if (g->gathered && !(exact && g->quantized)) return 0;
    if (g->gathered) { /* an int8 copy: gathered again exactly where it is */
        if (wait_gather(z, s)) return -1;
        g->gathered = 0;
        z->live -= seg_len(z, s);
        dt_mem_account(DT_MEM_PARAMS, -(long long)(seg_len(z, s) * dt_zero_esz(z)));
    }
    dt_zero_note(z, "gather", s);
    if (!slot_of(z, s) && place_segment(z, s)) return -1;
    if (z->backward && g->sec_valid && !exact) return gather_secondary(z, s);
    if (settle(z, s) || piece_ready(z, s)) return -1;
    int rc = int8 ? gather_int8(z, s)
                  : dt_iallgather(z->comm, piece_to_send(z, s), seg_working(z, s),
                                  z->map.piece[s], working_type(z), &g->ag);
    if (rc) return dt_zero_fail(z, rc, "parameter gather");
    g->gathered = 1;
    g->quantized = int8;
    z->live += seg_len(z, s);
    dt_mem_account(DT_MEM_PARAMS, (long long)(seg_len(z, s) * dt_zero_esz(z)));
    return 0;
}

static int wait_gather(zero *z, int s)
{
    zero_seg *g = &z->seg[s];
    if (!g->ag) return 0;
    uint64_t t0 = dt_now_ns(), start = 0, end = 0;
    int rc = dt_wait_timed(g->ag, &start, &end);
    g->ag = NULL;
    z->wait_ms += (double)(dt_now_ns() - t0) * 1e-6; /* compute stood still */
    if (rc) return dt_zero_fail(z, rc, "parameter gather");
    free_piece(z, s);
    size_t bytes = seg_len(z, s) * dt_zero_esz(z);
    if (g->qbuf) {
        bytes = dt_zero_packet_bytes(z, s, 8) * (size_t)z->n;
        dequantize(z, s);
    }
    /* The working type's bytes (the fp32 master weights' gather: half of
     * them), or qwZ's int8 and scales. */
    dt_zero_trace(z, g->from_sec ? "allgather_hpz" : "allgather", start, end, bytes);
    keep_secondary(z, s);
    g->from_sec = 0;
    return 0;
}

static int release(zero *z, int s, int force)
{
    zero_seg *g = &z->seg[s];
    if (!g->gathered || (g->persistent && !force)) return 0;
    if (wait_gather(z, s)) return -1;
    unplace_segment(z, s);
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
    int k = 0, t = next_use(z, s, use);
    for (; k < z->o.prefetch && t >= 0; k++, t = next_use(z, t, use)) {
        if (z->seg[t].gathered) continue;
        if (z->o.max_live_floats && z->live + seg_len(z, t) > z->o.max_live_floats) break;
        if (gather(z, t, 0)) return -1;
    }
    /* offload_param: the piece of the next segment to gather comes off
     * the disk while this one computes. */
    return t >= 0 && !z->seg[t].gathered ? read_piece(z, t) : 0;
}

static int hold_grads(zero *z, int s)
{
    if (z->o.stage < 2 || z->seg[s].grads_held) return 0;
    if (dt_gpt_grads_hold(z->m, s)) return -1; /* zeroed: backward adds into them */
    z->seg[s].grads_held = 1;
    dt_gpt_grads_zeroed(z->m, seg_lo(z, s), seg_lo(z, s) + seg_len(z, s));
    return 0;
}

/* The initialisation writes a whole segment of fp32 parameters (and the
 * model rounds it into params16) where this rank keeps only its piece. */
static size_t init_bytes(const zero *z, int s)
{
    return seg_len(z, s) * (sizeof(float) + (z->window16 ? sizeof(uint16_t) : 0));
}

static int need(zero *z, int s, int use)
{
    if (z->error) return -1;
    if (use == DT_USE_BACKWARD && hold_grads(z, s)) return -1;
    /* The embeddings' gradients come right after the first layer's, with
     * no use of their parameters to hold them at when the head is not
     * tied to them. */
    if (use == DT_USE_BACKWARD && s == 1 && hold_grads(z, 0)) return -1;
    if (use == DT_USE_INIT && dt_zero_keeps_pieces(z)) {
        /* Only this rank's piece is drawn: the rest is dropped unread. */
        const dt_flat_range *p = &z->map.mine[s];
        z->m->init_lo = p->lo > z->m->init_lo ? p->lo : z->m->init_lo;
        z->m->init_hi = p->hi < z->m->init_hi ? p->hi : z->m->init_hi;
        if (z->m->init_hi < z->m->init_lo) z->m->init_hi = z->m->init_lo;
        dt_mem_account(DT_MEM_PARAMS, (long long)init_bytes(z, s));
        return 0;
    }
    if (z->o.stage < 3 || use == DT_USE_INIT) return 0;
    z->backward = use == DT_USE_BACKWARD;
    if (use == DT_USE_FORWARD && s == z->L + 1) z->in_head = 1;
    if (gather(z, s, 0) || prefetch(z, s, use) || wait_gather(z, s)) return -1;
    dt_zero_note(z, use == DT_USE_FORWARD ? "forward" : "backward", s);
    return 0;
}

static void done(zero *z, int s, int use)
{
    if (z->error) return;
    if (use == DT_USE_INIT && dt_zero_keeps_pieces(z)) {
        /* Keep this rank's piece of the initial values; let the rest go. */
        if (dt_zero_keep_piece(z, s)) return;
        dt_zero_drop_segment(z, z->m->params, sizeof(float), s, DT_MEM_PARAMS, 0);
        if (z->window16)
            dt_zero_drop_segment(z, z->m->mixed.params16, sizeof(uint16_t), s, DT_MEM_PARAMS, 0);
        dt_mem_account(DT_MEM_PARAMS, -(long long)init_bytes(z, s));
        z->inited = 1;
        return;
    }
    if (z->o.stage < 3 || use == DT_USE_INIT) return;
    dt_zero_note(z, use == DT_USE_FORWARD ? "forward_end" : "backward_end", s);
    if (use == DT_USE_FORWARD && z->in_head && (s == 0 || s == z->L + 1)) {
        /* The head's segments are backward's first: keep them. */
        if (s == 0) z->in_head = 0;
        return;
    }
    if (use == DT_USE_FORWARD && !z->o.reshard_after_forward) return;
    release(z, s, 0);
}

/* The model's hooks: this layer's, then those of the layer above (a
 * pipeline lets the segments it does not hold go after initialisation). */
int dt_zero_param_need(void *ctx, int s, int use)
{
    zero *z = ctx;
    if (need(z, s, use)) return -1;
    return z->prev_need ? z->prev_need(z->prev_ctx, s, use) : 0;
}

void dt_zero_param_done(void *ctx, int s, int use)
{
    zero *z = ctx;
    done(z, s, use);
    if (z->prev_done) z->prev_done(z->prev_ctx, s, use);
}

/* Mixed precision: the updated fp32 pieces rounded into the bf16 pieces
 * that are gathered (stage 3's shard, or in place in params16). */
static void round_pieces(zero *z)
{
    for (int s = 0; z->mixed && s < z->nseg; s++) {
        if (z->seg[s].stale) continue; /* rounded when settled */
        const dt_flat_range *p = &z->map.mine[s];
        uint16_t *dst = z->o.stage >= 3 ? z->shard16 + p->at : z->m->mixed.params16 + p->lo;
        dt_cast_f32_to_bf16(dst, z->shard_p + p->at, p->hi - p->lo);
    }
}

int dt_zero_params_refresh(zero *z)
{
    dt_optimizer *o = z->S->rank->opt;
    int deferred = o && o->store && dt_opt_store_pending(o->store);
    for (int s = 0; s < z->nseg; s++) z->seg[s].stale = deferred && dt_zero_has(z, s);
    round_pieces(z);
    if (z->o.stage < 3) {
        for (int s = 0; s < z->nseg; s++) {
            if (!dt_zero_has(z, s)) continue;
            char *w = working_at(z, seg_lo(z, s));
            int rc = dt_iallgather(z->comm, piece_to_send(z, s), w, z->map.piece[s],
                                   working_type(z), &z->seg[s].ag);
            if (rc) return dt_zero_fail(z, rc, "parameter all-gather");
        }
        for (int s = 0; s < z->nseg; s++)
            if (wait_gather(z, s)) return -1;
        return 0;
    }
    if (reread_pieces(z)) return -1;
    for (int s = 0; s < z->nseg; s++) {
        z->seg[s].sec_valid = 0; /* hpZ: the next primary gather refills it */
        if (release(z, s, 1)) return -1;
        /* Deferred, a persistent segment waits for its first need: the
         * stream reaches it in order (the final LayerNorm is last). */
        if (z->seg[s].persistent && !z->seg[s].stale && gather(z, s, 0)) return -1;
    }
    return 0;
}

int dt_zero_gather_one(zero *z, int s) { return gather(z, s, 1) || wait_gather(z, s) ? -1 : 0; }

void dt_zero_release_one(zero *z, int s) { release(z, s, 0); }

/* Mixed precision: the fp32 master weights of every held segment, whole,
 * into the model's params window on the group's first rank, the one that
 * writes them (the job's writer, or a pipeline stage's, which sends them
 * on); accounted as parameters there until dt_zero_drop_all. */
static int gather_master(zero *z)
{
    if (z->master_whole) return 0;
    float *p = z->m->params;
    for (int s = 0; s < z->nseg; s++) /* a prefetch in flight holds the request slot */
        if (wait_gather(z, s)) return -1;
    for (int s = 0; s < z->nseg; s++) {
        if (!dt_zero_has(z, s)) continue;
        int rc = dt_igather(z->comm, z->shard_p + z->map.mine[s].at, p + seg_lo(z, s),
                            z->map.piece[s], DT_F32, 0, &z->seg[s].ag);
        if (rc) return dt_zero_fail(z, rc, "master weights gather");
    }
    for (int s = 0; s < z->nseg; s++) {
        uint64_t start = 0, end = 0;
        if (!z->seg[s].ag) continue;
        int rc = dt_wait_timed(z->seg[s].ag, &start, &end);
        z->seg[s].ag = NULL;
        if (rc) return dt_zero_fail(z, rc, "master weights gather");
        dt_zero_trace(z, "gather", start, end, seg_len(z, s) * sizeof(float));
    }
    if (z->me != 0) return 0;
    z->master_whole = 1;
    dt_mem_account(DT_MEM_PARAMS, (long long)(z->held_floats * sizeof(float)));
    return 0;
}

int dt_zero_gather_all(zero *z)
{
    if (dt_zero_settle_all(z)) return -1;
    if (z->mixed) return gather_master(z);
    if (z->o.stage < 3) return 0;
    /* Whole, in the window, where the save and evaluation read it: what a
     * slot holds (the persistent segments, a prefetch) is let go first. */
    for (int s = 0; s < z->nseg; s++)
        if (slot_of(z, s) && release(z, s, 1)) return -1;
    z->into_window = 1;
    int rc = 0;
    for (int s = 0; s < z->nseg && !rc; s++) rc = gather(z, s, 1);
    for (int s = 0; s < z->nseg && !rc; s++) rc = wait_gather(z, s);
    z->into_window = 0;
    return rc;
}

void dt_zero_drop_all(zero *z)
{
    if (z->master_whole) {
        dt_window_drop(z->m->params, 0, z->m->n_floats * sizeof(float));
        dt_mem_account(DT_MEM_PARAMS, -(long long)(z->held_floats * sizeof(float)));
        z->master_whole = 0;
    }
    if (z->o.stage < 3) return;
    for (int s = 0; s < z->nseg; s++) release(z, s, 0);
}
