/* A pipeline rank's programs for the layout's step (layout.h): its action
 * list walked in order, each chunk's segments (the embeddings, the layers,
 * the final norm with an untied head's weight, and on the last stage the
 * tied copy of the embeddings that a tied head multiplies by) one after
 * another. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ddp.h"
#include "sim/layout_internal.h"

#define OPT_BYTES_PER_PARAM 28.0 /* AdamW reads p, g, m, v and writes p, m, v */

typedef struct {
    lay *L;
    int r;                   /* pipeline rank */
    dt_sim_prog *cp, *cm;    /* its compute and comm programs */
    int ev;                  /* events used */
    double pend;             /* compute not yet appended, of label pend_label */
    const char *pend_label;
    int *uses, nuses, issued, used; /* ZeRO-3: segments in order of use; gathers issued, used */
    int *gathered;           /* [nuses] each gather's done event */
    int *end, nend, capend;  /* done events the optimizer waits for */
    size_t *bk_bytes;        /* DDP's buckets of this rank's stages */
    int *bk_low, nbk;        /* each bucket's lowest segment: done last in backward */
    int fail;
    char *err;
    size_t len;
} bld;

/* ---- appending ------------------------------------------------------------- */

static void flush(bld *b)
{
    if (b->pend > 0 && dt_sim_prog_add(b->cp, dt_sim_compute(b->pend, b->pend_label)))
        b->fail = 1;
    b->pend = 0;
}

static void add(bld *b, dt_sim_prog *p, dt_sim_op op)
{
    if (p == b->cp) flush(b);
    if (dt_sim_prog_add(p, op)) b->fail = 1;
}

/* Computing for `sec`: runs of one label become one operation (fewer
 * events at ten thousand ranks). */
static void compute(bld *b, double sec, const char *label)
{
    if (b->pend_label != label) flush(b);
    b->pend_label = label;
    b->pend += sec;
    b->L->busy[b->r] += sec;
}

/* A collective for the comm stream, issued now: its done event. On a CPU
 * host with no spare core it runs on the compute stream, in turn. */
static int issue(bld *b, int over, dt_coll_kind kind, size_t bytes, int cls)
{
    int id = lay_coll_id(b->L, over, kind, bytes, b->err, b->len);
    if (id < 0) {
        b->fail = 2;
        return 0;
    }
    int go = b->ev++, done = b->ev++;
    if (over == LAY_REPLICAS) {
        b->L->dp_n[b->r]++;
        b->L->dp_pred[b->r] += b->L->coll[id].c.by_shape[0].predicted;
    }
    if (b->L->o->cpu_comm) {
        add(b, b->cp, dt_sim_coll_as(id, cls));
        add(b, b->cp, dt_sim_signal(done));
        return done;
    }
    add(b, b->cp, dt_sim_signal(go));
    add(b, b->cm, dt_sim_wait(go));
    add(b, b->cm, dt_sim_coll_as(id, cls));
    add(b, b->cm, dt_sim_signal(done));
    return done;
}

static void wait_at_end(bld *b, int ev)
{
    if (b->nend == b->capend) {
        int cap = b->capend ? 2 * b->capend : 64;
        int *v = realloc(b->end, (size_t)cap * sizeof *v);
        if (!v) {
            b->fail = 1;
            return;
        }
        b->end = v, b->capend = cap;
    }
    b->end[b->nend++] = ev;
}

/* ---- the model's pieces ------------------------------------------------------- */

/* Chunk k's segments in forward order; L + 2 is the last stage's tied
 * copy of segment 0 (an untied head's weight is in segment L + 1). */
static int chunk_segs(const lay *L, int k, int *out)
{
    int n = 0;
    if (k == 0) out[n++] = 0;
    for (int l = L->cut[k]; l < L->cut[k + 1]; l++) out[n++] = 1 + l;
    if (k == L->S - 1) out[n++] = L->L + 1;
    if (k == L->S - 1 && k > 0 && L->tied) out[n++] = L->L + 2;
    return n;
}

static int is_layer(const lay *L, int seg) { return seg >= 1 && seg <= L->L; }

/* Seconds of segment seg's forward: the head's products go with the
 * tied embeddings on the last stage, with the final norm's segment when
 * one stage holds everything or the head is untied (its weight is
 * there). */
static double seg_fwd(const lay *L, int seg)
{
    if (is_layer(L, seg)) return L->layer_f;
    if (seg == L->L + 2 || (seg == L->L + 1 && (L->S == 1 || !L->tied))) return L->head_f;
    return 0;
}

/* This rank's slice of segment seg, in bytes. */
static size_t seg_bytes(const lay *L, int seg)
{
    size_t b = L->seg_bytes[seg == L->L + 2 ? 0 : seg];
    return (b / (size_t)L->o->tp + 3) / 4 * 4;
}

/* ---- data parallelism -------------------------------------------------------- */

static int zero(const bld *b) { return b->L->o->zero; }
static int replicas(const bld *b) { return b->L->groups[LAY_REPLICAS].n > 1; }

/* Segment seg's gradients are final in this backward: DDP's buckets that
 * it completes, or ZeRO's reduce-scatter of it. */
static void seg_done(bld *b, int seg)
{
    if (!replicas(b)) return;
    if (zero(b) == 0) {
        for (int i = 0; i < b->nbk; i++)
            if (b->bk_low[i] == seg)
                wait_at_end(b, issue(b, LAY_REPLICAS, DT_COLL_ALLREDUCE, b->bk_bytes[i],
                                     DT_SIM_CLS_GRADS));
        return;
    }
    wait_at_end(b, issue(b, LAY_REPLICAS, DT_COLL_REDUCE_SCATTER, seg_bytes(b->L, seg),
                         DT_SIM_CLS_GRADS));
}

/* ZeRO-3: the next use of a segment's parameters. Gathers are issued up
 * to `prefetch` uses ahead (the comm stream runs them in that order), and
 * the compute waits for this use's. */
static void use(bld *b)
{
    if (zero(b) != 3 || !replicas(b)) return;
    while (b->issued < b->nuses && b->issued <= b->used + b->L->o->prefetch) {
        size_t bytes = seg_bytes(b->L, b->uses[b->issued]);
        b->gathered[b->issued++] = issue(b, LAY_REPLICAS, DT_COLL_ALLGATHER, bytes,
                                         DT_SIM_CLS_GATHER);
    }
    add(b, b->cp, dt_sim_wait(b->gathered[b->used++]));
}

/* The segments in the order the compute stream uses them (for use()). */
static int plan_uses(bld *b, const dt_pp_action *a, int n)
{
    int *segs = malloc(((size_t)b->L->L + 3) * sizeof *segs), cap = 0;
    if (!segs) return -1;
    for (int j = 0; j < n; j++) {
        if (a[j].op != DT_PP_F && a[j].op != DT_PP_B && a[j].op != DT_PP_I) continue;
        int ns = chunk_segs(b->L, a[j].stage, segs);
        if (b->nuses + ns > cap) {
            cap = 2 * (b->nuses + ns);
            int *v = realloc(b->uses, (size_t)cap * sizeof *v);
            if (!v) return free(segs), -1;
            b->uses = v;
        }
        for (int s = 0; s < ns; s++)
            b->uses[b->nuses++] = a[j].op == DT_PP_F ? segs[s] : segs[ns - 1 - s];
    }
    free(segs);
    b->gathered = calloc((size_t)b->nuses + 1, sizeof *b->gathered);
    return b->gathered ? 0 : -1;
}

/* ---- the actions ------------------------------------------------------------ */

/* A layer's (or other segment's) share of an action: under tp a layer's
 * two all-reduces split it in halves, on this stream. */
static void piece(bld *b, int seg, double sec, const char *label, int tp_reduces)
{
    lay *L = b->L;
    if (!tp_reduces || !is_layer(L, seg) || L->groups[LAY_TP].n < 2) {
        compute(b, sec, label);
        return;
    }
    int id = lay_coll_id(L, LAY_TP, DT_COLL_ALLREDUCE, (size_t)L->act_bytes, b->err, b->len);
    if (id < 0) {
        b->fail = 2;
        return;
    }
    for (int h = 0; h < 2; h++) {
        compute(b, sec / 2, label);
        add(b, b->cp, dt_sim_coll_as(id, DT_SIM_CLS_TP));
    }
}

/* A moe layer's exchanges over its ep group, on the compute stream (the
 * layer waits for them): forward the counts, the rows out and back;
 * backward the rows' gradients out and back. */
static void ep_exchanges(bld *b, int seg, int forward)
{
    lay *L = b->L;
    const int N = L->groups[LAY_EP].n;
    if (!L->moe || N < 2 || !is_layer(L, seg)) return;
    int rows = lay_coll_id(L, LAY_EP, DT_COLL_ALLTOALL, L->ep_rows, b->err, b->len);
    int counts = forward ? lay_coll_id(L, LAY_EP, DT_COLL_ALLTOALL, L->ep_counts, b->err, b->len)
                         : 0;
    if (rows < 0 || counts < 0) {
        b->fail = 2;
        return;
    }
    for (int k = 0; k < L->moe; k++) {
        if (forward) add(b, b->cp, dt_sim_coll_as(counts, DT_SIM_CLS_EP));
        for (int x = 0; x < 2; x++) add(b, b->cp, dt_sim_coll_as(rows, DT_SIM_CLS_EP));
        L->ep_n[b->r] += forward ? 3 : 2;
        L->ep_bytes[b->r] += 2.0 * (double)L->ep_rows * (N - 1) / N;
    }
}

/* Whether micro-batch i's backward reduces the gradients: every one under
 * ZeRO-2/3 (each rank keeps its pieces only), the last one otherwise. */
static int reduces(const bld *b, int i)
{
    return zero(b) >= 2 || i == b->L->o->accum - 1;
}

static void compute_action(bld *b, const dt_pp_action *a)
{
    int segs[4096], ns = chunk_segs(b->L, a->stage, segs);
    if (a->op == DT_PP_F) {
        for (int s = 0; s < ns; s++) {
            use(b);
            piece(b, segs[s], seg_fwd(b->L, segs[s]), "forward", 1);
            ep_exchanges(b, segs[s], 1);
        }
        return;
    }
    static const char *const names[] = {"", "backward", "backward input", "backward weights"};
    double part = a->op == DT_PP_B ? 2 : 1; /* I and W: half the backward each */
    for (int s = ns - 1; s >= 0; s--) {
        if (a->op != DT_PP_W) use(b);
        piece(b, segs[s], part * seg_fwd(b->L, segs[s]), names[a->op], a->op != DT_PP_W);
        if (a->op != DT_PP_W) ep_exchanges(b, segs[s], 0);
        if (a->op != DT_PP_I && reduces(b, a->micro)) seg_done(b, segs[s]);
    }
}

static void action(bld *b, const dt_pp_action *a)
{
    const lay *L = b->L;
    int stride = L->o->tp * L->o->cp * L->o->dp, k = a->stage;
    int off = (a->peer - b->r) * stride;
    dt_sim_op op;
    switch (a->op) {
    case DT_PP_SEND_F:
        add(b, b->cp, dt_sim_send(off, L->msg_bytes, 2 * k));
        return;
    case DT_PP_SEND_B:
        add(b, b->cp, dt_sim_send(off, L->msg_bytes, 2 * (k - 1) + 1));
        return;
    case DT_PP_RECV_F:
    case DT_PP_RECV_B:
        op = a->op == DT_PP_RECV_F
                 ? dt_sim_recv(off, L->msg_bytes, 2 * (k - 1), "receive activation")
                 : dt_sim_recv(off, L->msg_bytes, 2 * k + 1, "receive gradient");
        op.cls = DT_SIM_CLS_PP;
        add(b, b->cp, op);
        return;
    default:
        compute_action(b, a);
    }
}

/* ---- DDP's buckets ------------------------------------------------------------- */

/* The flat ranges of rank r's stages, ascending, adjacent ones merged. */
static int held_ranges(const lay *L, const dt_gpt *m, int r, dt_flat_range *out)
{
    int n = 0, p = L->o->pp;
    if (r == (L->S - 1) % p && L->S > 1 && r != 0 && L->tied)
        out[n++] = (dt_flat_range){0, dt_gpt_segment_start(m, 1), 0};
    for (int k = r; k < L->S; k += p) {
        int first = k == 0 ? 0 : L->cut[k] + 1, last = k == L->S - 1 ? L->L + 1 : L->cut[k + 1];
        size_t lo = dt_gpt_segment_start(m, first), hi = dt_gpt_segment_start(m, last + 1);
        if (n && out[n - 1].hi == lo)
            out[n - 1].hi = hi;
        else
            out[n++] = (dt_flat_range){lo, hi, 0};
    }
    return n;
}

/* parallel/ddp.c's buckets over this rank's stages (the cap scaled by tp,
 * each rank holding a tp-th of every layer), each with the segment whose
 * backward completes it: the one holding its lowest float. */
static int ddp_buckets(bld *b, const dt_gpt *m)
{
    lay *L = b->L;
    dt_flat_range *rg = malloc(((size_t)L->S + 2) * sizeof *rg);
    if (!rg) return -1;
    dt_flat_ranges held = {held_ranges(L, m, b->r, rg), rg, 0};
    dt_ddp d;
    int rc = dt_ddp_init(&d, NULL, (dt_gpt *)m, L->o->bucket_bytes * (size_t)L->o->tp, &held);
    free(rg);
    if (rc) return -1;
    b->bk_bytes = malloc(((size_t)d.nbuckets + 1) * sizeof *b->bk_bytes);
    b->bk_low = malloc(((size_t)d.nbuckets + 1) * sizeof *b->bk_low);
    for (int i = 0; b->bk_bytes && b->bk_low && i < d.nbuckets; i++) {
        int seg = 0;
        while (seg + 1 <= L->L + 1 && dt_gpt_segment_start(m, seg + 1) <= d.buckets[i].lo) seg++;
        int tied = seg == 0 && !(b->r == 0) && L->S > 1;
        b->bk_low[i] = tied ? L->L + 2 : seg;
        size_t bytes = (d.buckets[i].hi - d.buckets[i].lo) * sizeof(float) / (size_t)L->o->tp;
        b->bk_bytes[i] = (bytes + 3) / 4 * 4;
    }
    b->nbk = d.nbuckets;
    dt_ddp_free(&d);
    return b->bk_bytes && b->bk_low ? 0 : -1;
}

/* ---- the whole program ----------------------------------------------------------- */

/* After the last backward: the reductions, the optimizer on what this rank
 * updates, and ZeRO-1/2's gathers of the updated parameters. */
static void finish(bld *b)
{
    lay *L = b->L;
    for (int i = 0; i < b->nend; i++) add(b, b->cp, dt_sim_wait(b->end[i]));
    size_t params = L->held[b->r];
    if (zero(b) > 0) params /= (size_t)L->groups[LAY_REPLICAS].n;
    double opt = OPT_BYTES_PER_PARAM * (double)params / (L->o->mem_GBps * 1e9);
    L->opt_s[b->r] = opt;
    compute(b, opt, "optimizer");
    flush(b);
    if ((zero(b) != 1 && zero(b) != 2) || !replicas(b)) return;
    int segs[4096];
    b->nend = 0;
    for (int k = b->r; k < L->S; k += L->o->pp) {
        int ns = chunk_segs(L, k, segs);
        for (int s = 0; s < ns; s++)
            wait_at_end(b, issue(b, LAY_REPLICAS, DT_COLL_ALLGATHER, seg_bytes(L, segs[s]),
                                 DT_SIM_CLS_GATHER));
    }
    for (int i = 0; i < b->nend; i++) add(b, b->cp, dt_sim_wait(b->end[i]));
}

/* The parameters rank r holds: its tp slice of its stages' segments. */
static size_t held_params(const lay *L, int r)
{
    int segs[4096];
    size_t n = 0;
    for (int k = r; k < L->S; k += L->o->pp) {
        int ns = chunk_segs(L, k, segs);
        for (int s = 0; s < ns; s++) n += seg_bytes(L, segs[s]) / sizeof(float);
    }
    return n;
}

int lay_programs(lay *L, int r, char *err, size_t len)
{
    bld b = {.L = L, .r = r, .cp = &L->compute[r], .cm = &L->comm[r], .err = err, .len = len};
    const dt_pp_action *a = L->o->pp > 1 ? L->sch.acts[r] : L->solo;
    int n = L->o->pp > 1 ? L->sch.n[r] : 2 * L->o->accum;
    L->held[r] = held_params(L, r);
    dt_gpt m;
    if (dt_gpt_create_layout(&m, &L->o->cfg, DT_PREC_F32, err, len)) return -1;
    int rc = plan_uses(&b, a, n);
    if (rc == 0 && zero(&b) == 0) rc = ddp_buckets(&b, &m);
    dt_gpt_destroy(&m);
    if (rc) snprintf(err, len, "out of memory for pipeline rank %d's program", r);
    for (int j = 0; rc == 0 && j < n && !b.fail; j++) action(&b, &a[j]);
    if (rc == 0 && !b.fail) finish(&b);
    if (rc == 0 && b.fail == 1) snprintf(err, len, "out of memory for pipeline rank %d's program",
                                         r);
    L->events[r] = b.ev;
    free(b.uses);
    free(b.gathered);
    free(b.end);
    free(b.bk_bytes);
    free(b.bk_low);
    return rc || b.fail ? -1 : 0;
}
