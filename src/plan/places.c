/* The ddp kind's places of a layout for `dtrain plan`: what each (pipeline
 * stage, tensor slice) of the mesh holds, as dt_mesh_places works it out
 * (parallel/mesh_places.c), from pieces kept across layouts. That call
 * builds its share layouts (each a table of the model's named tensors,
 * several times over) and its schedule anew; a plan weighs thousands of
 * layouts that share a handful of (tp, ep) and schedules. The pieces are
 * the same functions' (dt_gpt_peer_layout, dt_pp_cut, dt_pp_stage_slots,
 * dt_pp_stage_memory_of, dt_places_layout_mem), and the test
 * plan.places holds the two equal over layouts of several models. See
 * plan_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/context/cp.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/stage.h"
#include "plan/plan_internal.h"
#include "train/config/config.h"

#define MAX_SCHEDS 1024 /* schedules kept; past them the memo starts again */

static void shares_free(dt_plan_shares *s, int made)
{
    for (int k = 0; k < made; k++) dt_gpt_destroy(&s->lay[k]);
    free(s->lay), free(s->like);
}

static void stages_free(dt_plan_sched *s)
{
    for (int q = 0; s->parts && q < s->p; q++) free(s->parts[q]);
    free(s->parts), free(s->slots), free(s->cut);
    s->parts = NULL, s->slots = NULL, s->cut = NULL;
}

static void sched_free(dt_plan_sched *s)
{
    stages_free(s);
    dt_pp_schedule_free(&s->s);
}

void dt_plan_places_memo_free(dt_plan_memo *c)
{
    for (int i = 0; i < c->nshares; i++)
        shares_free(&c->shares[i], c->shares[i].tp * c->shares[i].ep);
    for (int i = 0; i < c->nscheds; i++) sched_free(&c->scheds[i]);
    free(c->shares), free(c->scheds), free(c->places.at);
    c->shares = NULL, c->scheds = NULL, c->places.at = NULL;
    c->nshares = c->nscheds = c->capscheds = 0;
}

/* Share k of (tp, ep): mesh_places.c's share_layout. */
static int share_layout(const dt_gpt *whole, int tp, int ep, int k, dt_gpt *lay, char *err,
                        size_t n)
{
    if (dt_gpt_peer_layout(whole, k / ep, tp, lay, err, n)) return -1;
    if (dt_gpt_set_ep(lay, k % ep, ep) == 0) return 0;
    dt_strf(err, n, "%s", lay->error);
    dt_gpt_destroy(lay);
    return -1;
}

/* Whether two shares hold the same sizes: what a place holds is counted
 * from the sizes alone, not from which slice or experts they are. */
static int same_sizes(const dt_gpt *a, const dt_gpt *b)
{
    if (a->n_tensors != b->n_tensors || a->n_floats != b->n_floats ||
        a->tp.heads != b->tp.heads || a->tp.attn != b->tp.attn ||
        a->tp.kv_heads != b->tp.kv_heads || a->tp.mlp != b->tp.mlp ||
        a->tp.vocab != b->tp.vocab || a->ep.experts != b->ep.experts)
        return 0;
    for (int i = 0; i < a->n_tensors; i++)
        if (a->tensors[i].offset != b->tensors[i].offset ||
            a->tensors[i].numel != b->tensors[i].numel)
            return 0;
    return 1;
}

static dt_plan_shares *shares_of(dt_plan_memo *c, int tp, int ep, char *err, size_t n)
{
    for (int i = 0; i < c->nshares; i++)
        if (c->shares[i].tp == tp && c->shares[i].ep == ep) return &c->shares[i];
    dt_plan_shares *v = realloc(c->shares, (size_t)(c->nshares + 1) * sizeof *v);
    if (!v) return dt_strf(err, n, "plan: out of memory"), NULL;
    c->shares = v;
    dt_plan_shares *s = &v[c->nshares];
    const size_t ns = (size_t)tp * (size_t)ep;
    *s = (dt_plan_shares){tp, ep, calloc(ns, sizeof *s->lay), calloc(ns, sizeof *s->like)};
    if (!s->lay || !s->like) {
        shares_free(s, 0);
        return dt_strf(err, n, "plan: out of memory"), NULL;
    }
    for (int k = 0; k < tp * ep; k++) {
        if (share_layout(&c->whole, tp, ep, k, &s->lay[k], err, n)) {
            shares_free(s, k);
            return NULL;
        }
        s->like[k] = k;
        for (int j = 0; j < k && s->like[k] == k; j++)
            if (same_sizes(&s->lay[j], &s->lay[k])) s->like[k] = j;
    }
    c->nshares++;
    return s;
}

/* The cut of the whole model's layers (the run's partition) and each
 * rank's slots. */
static int stages_of(const dt_plan_memo *c, dt_plan_sched *s, char *err, size_t n)
{
    const int S = s->p * s->V;
    s->cut = malloc(((size_t)S + 1) * sizeof *s->cut);
    s->slots = calloc((size_t)s->p, sizeof *s->slots);
    s->parts = calloc((size_t)s->p, sizeof *s->parts);
    if (!s->cut || !s->slots || !s->parts) return dt_strf(err, n, "plan: out of memory"), -1;
    dt_train_config cfg;
    dt_pp_part_kind part;
    dt_config_defaults(&cfg);
    if (dt_pp_part_parse(cfg.pp_partition, &part) ||
        dt_pp_cut(&c->whole, S, part, s->kind == DT_PP_INTERLEAVED, NULL, s->cut, err, n))
        return -1;
    for (int q = 0; q < s->p; q++)
        if ((s->slots[q] = dt_pp_stage_slots(&s->s, s->cut, q, &s->parts[q])) < 1)
            return dt_strf(err, n, "pipeline stage %d: out of memory for its plan", q), -1;
    return 0;
}

const dt_plan_sched *dt_plan_sched_of(dt_plan_memo *c, dt_pp_kind kind, int p, int V, int M,
                                      int stages, char *err, size_t errlen)
{
    dt_plan_sched *s = NULL;
    for (int i = 0; !s && i < c->nscheds; i++)
        if (c->scheds[i].kind == (int)kind && c->scheds[i].p == p && c->scheds[i].V == V &&
            c->scheds[i].M == M)
            s = &c->scheds[i];
    if (!s) {
        if (c->nscheds == MAX_SCHEDS) {
            for (int i = 0; i < c->nscheds; i++) sched_free(&c->scheds[i]);
            c->nscheds = 0;
        }
        if (c->nscheds == c->capscheds) {
            int cap = c->capscheds ? 2 * c->capscheds : 64;
            dt_plan_sched *v = realloc(c->scheds, (size_t)cap * sizeof *v);
            if (!v) return dt_strf(err, errlen, "plan: out of memory"), NULL;
            c->scheds = v, c->capscheds = cap;
        }
        s = &c->scheds[c->nscheds];
        *s = (dt_plan_sched){.kind = (int)kind, .p = p, .V = V, .M = M};
        if (dt_pp_schedule_build(&s->s, kind, p, V, M, err, errlen)) return NULL;
        c->nscheds++;
    }
    if (stages && !s->cut && stages_of(c, s, err, errlen))
        return stages_free(s), NULL; /* asked again next time */
    return s;
}

static dt_plan_place *places_alloc(dt_plan_places *P, int n, char *err, size_t errlen)
{
    if (n > P->cap) {
        dt_plan_place *v = realloc(P->at, (size_t)n * sizeof *v);
        if (!v) return dt_strf(err, errlen, "plan: out of memory for %d places", n), NULL;
        P->at = v, P->cap = n;
    }
    P->n = n;
    memset(P->at, 0, (size_t)n * sizeof *P->at);
    return P->at;
}

/* The run's context and sequence parallelism and recompute mode on each
 * share, and the micro-batch checked on a slice as mesh_places.c's
 * set_rows checks it. */
static int set_rows(const dt_plan_layout *l, const dt_plan_shares *sh, int T, char *err, size_t n)
{
    dt_train_config cfg;
    dt_shard_kind kind;
    int widths;
    dt_config_defaults(&cfg);
    dt_cp_algo_shape(cfg.cp_algo, &kind, &widths);
    for (int k = 0; k < sh->tp * sh->ep; k++) {
        dt_gpt *m = &sh->lay[k];
        m->acts.recompute = l->rc;
        m->tp.sp = l->sp && l->tp > 1;
        if (dt_gpt_set_cp(m, 0, l->cp, kind, widths))
            return dt_strf(err, n, "%s", m->error), -1;
    }
    if (dt_gpt_check_micro_batch(&sh->lay[0], l->B, T))
        return dt_strf(err, n, "%s", sh->lay[0].error), -1;
    return 0;
}

static size_t seg_len(const dt_gpt *m, int s)
{
    return dt_gpt_segment_start(m, s + 1) - dt_gpt_segment_start(m, s);
}

/* An untied head's last pipeline rank holds lm_head with the final norm
 * (the last segment) and no copy of the embeddings, which only a tied
 * head multiplies by; the pipeline's stage arithmetic
 * (parallel/pipeline/stage.c) counts that copy on it for every family (the
 * Llama family's pipeline is not wired yet), so it is taken out here,
 * where its ranges hold it, with what it adds to the segments in use. */
static void untie(const dt_gpt *lay, const dt_plan_sched *s, int q, dt_rank_mem *mem)
{
    const int last = (s->p * s->V - 1) % s->p, L = lay->cfg.n_layer;
    dt_flat_range r[DT_PP_MAX_RANGES];
    if (dt_gpt_tied(&lay->cfg) || q != last || q == 0) return;
    dt_flat_ranges h = dt_pp_held_ranges(lay, s->cut, s->p, s->V, q, r);
    if (h.n == 0 || r[0].lo != 0 || r[0].hi != seg_len(lay, 0)) return;
    size_t most = seg_len(lay, L + 1);
    for (int c = 0; c < s->V; c++)
        for (int l = s->cut[c * s->p + q]; l < s->cut[c * s->p + q + 1]; l++)
            if (seg_len(lay, 1 + l) > most) most = seg_len(lay, 1 + l);
    mem->floats -= seg_len(lay, 0);
    mem->in_use = mem->grads_open = most;
}

/* Every stage on each share's layout (mesh_places.c's stage_places), or
 * each share's place without a pipeline (slice_places). */
static int mesh(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l, char *err,
                size_t n)
{
    const int ep = l->ep > 1 ? l->ep : 1, ns = l->tp * ep, copies = l->cp * l->dp / ep;
    const dt_plan_shares *sh = shares_of(c, l->tp, ep, err, n);
    const dt_plan_sched *s = NULL;
    if (!sh || set_rows(l, sh, in->T, err, n)) return -1;
    if (l->pp > 1 && !(s = dt_plan_sched_of(c, l->sched, l->pp, l->V, l->M, 1, err, n)))
        return -1;
    dt_plan_place *at = places_alloc(&c->places, l->pp * ns, err, n);
    if (!at) return -1;
    for (int q = 0; q < l->pp; q++)
        for (int k = 0; k < ns; k++) {
            dt_plan_place *p = &at[q * ns + k];
            if (sh->like[k] != k) {
                p->mem = at[q * ns + sh->like[k]].mem;
            } else if (s) {
                dt_pp_stage_mem sm;
                dt_pp_stage_memory_of(&sh->lay[k], &s->s, s->cut, q, l->B, in->T, s->slots[q],
                                      s->parts[q], &sm);
                p->mem = (dt_rank_mem){.floats = sm.floats, .in_use = sm.in_use,
                                       .grads_open = sm.grads_open, .acts = sm.acts};
                untie(&sh->lay[k], s, q, &p->mem);
            } else {
                dt_places_layout_mem(&sh->lay[k], l->B, in->T, &p->mem);
            }
            p->mem.copies = copies;
            p->stage = q, p->tp_rank = k / ep;
        }
    return 0;
}

int dt_plan_places_of(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                      char *err, size_t errlen)
{
    dt_plan_places *P = &c->places;
    dt_plan_layout key = *l;
    key.zero = 0;
    if (P->have && !memcmp(&key, &P->key, sizeof key)) return 0;
    P->have = 0;
    c->whole.acts.recompute = l->rc;
    if (l->tp > 1 || l->cp > 1 || l->pp > 1 || l->ep > 1) { /* on the mesh (registry.c) */
        if (mesh(in, c, l, err, errlen)) return -1;
    } else { /* every rank holds the whole model (dt_places_whole) */
        dt_plan_place *at = places_alloc(P, 1, err, errlen);
        if (!at) return -1;
        at->mem = (dt_rank_mem){.floats = 0, .copies = l->dp};
    }
    P->key = key;
    P->have = 1;
    return 0;
}
