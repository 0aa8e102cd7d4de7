/* The activation arena (acts.h): what every micro-batch shares, then one
 * slot per micro-batch in flight, each carved for its part of the model
 * from the layer's blocks' own lists of buffers (model/block.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "model/model_internal.h"

/* Every buffer starts on a 64-byte boundary, so kernels see aligned rows. */
#define ACT_ALIGN_FLOATS 16

static void take(float *base, size_t *used, float **ptr, size_t n)
{
    if (base) *ptr = base + *used;
    *used += (n + ACT_ALIGN_FLOATS - 1) / ACT_ALIGN_FLOATS * ACT_ALIGN_FLOATS;
}

/* Rows of the arena for micro-batches of B x T: context parallelism
 * keeps this rank's rows of each sequence. */
static size_t arena_rows(const dt_gpt *m, int B, int T)
{
    return (size_t)B * (size_t)dt_gpt_rows(m, T);
}

/* Where a block's buffer lives in the arena's recompute mode. */
enum { NOWHERE, PER_LAYER, SHARED };

static int placement(const dt_gpt *m, const dt_block *b, int j, dt_act_class cls)
{
    const dt_recompute mode = m->acts.recompute;
    if (j == 0 && b->last) return PER_LAYER; /* the layer's output */
    switch (cls) {
    case DT_ACT_ELEMENTWISE: return mode == DT_RECOMPUTE_NONE ? PER_LAYER : SHARED;
    case DT_ACT_PRODUCT: return mode == DT_RECOMPUTE_FULL ? SHARED : PER_LAYER;
    case DT_ACT_SPLIT: return m->acts.split ? PER_LAYER : NOWHERE;
    default: return SHARED;
    }
}

size_t dt_gpt_layer_acts_bytes(const dt_gpt *m, int B, int T, size_t *shared)
{
    const size_t N = arena_rows(m, B, T), R = dt_model_region_rows(m, N);
    dt_act_spec spec[DT_BLOCK_MAX_ACTS];
    size_t bytes[3] = {0, 0, 0};
    for (int i = 0; i < m->n_blocks; i++) {
        const dt_block *b = &m->blocks[i];
        b->kind->acts(m, N, R, spec);
        for (int j = 0; j < b->n_acts; j++)
            if (spec[j].cls != DT_ACT_SCRATCH && spec[j].cls != DT_ACT_SPLIT)
                bytes[placement(m, b, j, spec[j].cls)] += spec[j].floats * sizeof(float);
    }
    if (shared) *shared = bytes[SHARED];
    return bytes[PER_LAYER];
}

size_t dt_gpt_config_layer_act_bytes(const dt_gpt_config *cfg, int B, int T)
{
    dt_gpt lay;
    char err[256];
    if (dt_gpt_create_layout(&lay, cfg, DT_PREC_F32, err, sizeof err)) return 0;
    size_t bytes = dt_gpt_layer_acts_bytes(&lay, B, T, NULL);
    dt_gpt_destroy(&lay);
    return bytes;
}

/* The buffers of one layer that live in `where`, into bufs[per_layer]
 * (when base is given); the floats they take. */
static size_t take_layer(dt_gpt *m, float *base, float **bufs, int where, size_t N)
{
    const size_t R = dt_model_region_rows(m, N);
    dt_act_spec spec[DT_BLOCK_MAX_ACTS];
    size_t used = 0;
    for (int i = 0; i < m->n_blocks; i++) {
        const dt_block *b = &m->blocks[i];
        b->kind->acts(m, N, R, spec);
        for (int j = 0; j < b->n_acts; j++) {
            float *p = NULL;
            if (placement(m, b, j, spec[j].cls) != where) continue;
            take(base, &used, &p, spec[j].floats);
            if (base) bufs[b->act0 + j] = p;
        }
    }
    return used;
}

/* What every slot shares: the rebuilt layer, the blocks' scratch, and
 * backward's gradients. Assigns the pointers into m when base is given,
 * else only counts. */
static size_t carve_common(dt_gpt *m, float *base, size_t N)
{
    const size_t C = (size_t)m->cfg.n_embd;
    dt_gpt_acts *a = &m->acts;
    size_t used = take_layer(m, base, a->shared, SHARED, N);
    float *scratch; /* where pointers go when only counting */
    take(base, &used, base ? &a->d_res : &scratch, N * C);
    take(base, &used, base ? &a->d_c : &scratch, N * C);
    if (m->tp.sp) { /* a gathered [N, C], and a norm's own weight gradients */
        take(base, &used, base ? &a->sp_full : &scratch, N * C);
        take(base, &used, base ? &a->sp_ln : &scratch, 2 * C);
    }
    return used;
}

/* The head's: the final norm's buffers, logits and losses, and with the
 * vocabulary split the loss's statistics (the rows' max, two doubles a
 * row). */
static size_t carve_head(dt_gpt *m, float *base, size_t N)
{
    const size_t V = (size_t)m->tp.vocab, R = dt_model_region_rows(m, N);
    dt_gpt_acts *a = &m->acts;
    dt_act_spec spec[DT_BLOCK_MAX_ACTS];
    size_t used = 0;
    float *scratch, *sums;
    const int n = m->final_norm.kind->acts(m, N, R, spec);
    for (int j = 0; j < n; j++) take(base, &used, base ? &a->final[j] : &scratch, spec[j].floats);
    take(base, &used, base ? &a->logits : &scratch, N * V);
    take(base, &used, base ? &a->losses : &scratch, N);
    if (m->tp.size == 1) return used;
    take(base, &used, base ? &a->ce_max : &scratch, N);
    take(base, &used, &sums, 4 * N);
    if (base) a->ce_sums = (double *)sums;
    return used;
}

/* One micro-batch of part p: its input, each of its layers' own buffers
 * (the shared ones pointed at the common piece), with split_backward the
 * input's gradient, and with the head the head's. Binds the pointers when
 * base is given (after carve_common), else only counts. */
static size_t carve_slot(dt_gpt *m, float *base, dt_gpt_part p, size_t N)
{
    const size_t C = (size_t)m->cfg.n_embd, R = dt_model_region_rows(m, N);
    const size_t per = (size_t)m->acts.per_layer;
    dt_gpt_acts *a = &m->acts;
    size_t used = 0;
    float *scratch; /* where pointers go when only counting */
    take(base, &used, base ? &a->encoded : &scratch, R * C);
    for (int l = p.l0; l < p.l1; l++) {
        float **bufs = base ? a->layer + (size_t)l * per : NULL;
        if (bufs) memcpy(bufs, a->shared, per * sizeof *bufs);
        used += take_layer(m, base ? base + used : NULL, bufs, PER_LAYER, N);
    }
    if (a->split) take(base, &used, base ? &a->dinput : &scratch, N * C);
    if (p.l1 < m->cfg.n_layer) return used;
    return used + carve_head(m, base ? base + used : NULL, N);
}

size_t dt_gpt_slots_floats(const dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts)
{
    dt_gpt probe = *m; /* counting writes nothing, but the functions take a model */
    probe.acts.split = m->acts.split_backward;
    const size_t N = arena_rows(m, B, T);
    size_t total = carve_common(&probe, NULL, N);
    for (int k = 0; k < n; k++) total += carve_slot(&probe, NULL, parts[k], N);
    return total;
}

size_t dt_gpt_acts_floats(const dt_gpt *m, int B, int T)
{
    dt_gpt_part whole = {0, m->cfg.n_layer};
    return dt_gpt_slots_floats(m, B, T, 1, &whole);
}

void dt_gpt_bind_slot(dt_gpt *m, int k)
{
    dt_gpt_acts *a = &m->acts;
    if (k == a->slot) return;
    carve_slot(m, a->slots[k].base, a->slots[k].part, arena_rows(m, a->B, a->T));
    a->slot = k;
}

size_t dt_gpt_boundary_floats(const dt_gpt *m, int b, int t)
{
    return dt_model_region_rows(m, (size_t)b * (size_t)dt_gpt_rows(m, t)) * (size_t)m->cfg.n_embd;
}

float *dt_gpt_slot_input(dt_gpt *m, int k)
{
    dt_gpt_bind_slot(m, k);
    return m->acts.encoded;
}

float *dt_gpt_slot_input_grad(dt_gpt *m, int k)
{
    dt_gpt_bind_slot(m, k);
    return m->acts.slots[k].input_grad_apart ? m->acts.dinput : m->acts.encoded;
}

const float *dt_gpt_slot_output(dt_gpt *m, int k)
{
    dt_gpt_bind_slot(m, k);
    return dt_model_layer_output(m, m->acts.slots[k].part.l1 - 1);
}

static void free_arena(dt_gpt *m)
{
    dt_gpt_acts *a = &m->acts;
    dt_free(a->mem);
    free(a->layer);
    free(a->shared);
    free(a->slots);
    free(m->cp.tokens);
    free(m->cp.targets);
    m->cp.tokens = m->cp.targets = NULL;
    a->mem = NULL;
    a->layer = a->shared = NULL;
    a->slots = NULL;
    a->dinput = NULL;
    a->nslots = 0;
    a->B = a->T = 0;
}

int dt_gpt_check_micro_batch(dt_gpt *m, int B, int T)
{
    if (B <= 0 || T <= 0 || T > m->cfg.block_size)
        return dt_strf(m->error, sizeof m->error,
                       "model: micro-batch %d x %d does not fit (block_size %d)", B, T,
                       m->cfg.block_size), -1;
    char who[32];
    snprintf(who, sizeof who, "--cp %d", m->cp.size);
    if (m->cp.size > 1 && dt_seq_shard_check(who, B, T, m->tp.attn, m->tp.heads, m->cp.size,
                                             m->cp.kind, m->error, sizeof m->error))
        return -1;
    const int rows = B * dt_gpt_rows(m, T);
    if (m->tp.sp && rows % m->tp.size)
        return dt_strf(m->error, sizeof m->error, "--sequence-parallel: the %d rows of a "
                       "micro-batch (B x T%s) do not split over %d tensor-parallel ranks; "
                       "use a batch or sequence length that makes them a multiple of %d", rows,
                       m->cp.size > 1 ? " / cp" : "", m->tp.size, m->tp.size), -1;
    return 0;
}

static int check_parts(dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts)
{
    if (dt_gpt_check_micro_batch(m, B, T)) return -1;
    /* Row offsets are ints in the kernels: this rank's vocabulary rows of
     * the embedding and the head must stay indexable (a layout alone, as
     * `plan` builds for Llama 3 405B's 128256 x 16384, indexes nothing). */
    if ((double)m->tp.vocab * m->cfg.n_embd > 2e9)
        return dt_strf(m->error, sizeof m->error, "model: a vocabulary of %d rows of %d on a "
                       "rank is too large for the kernels (2e9 floats): split it with --tp",
                       m->tp.vocab, m->cfg.n_embd), -1;
    for (int k = 0; k < n; k++)
        if (parts[k].l0 < 0 || parts[k].l0 >= parts[k].l1 || parts[k].l1 > m->cfg.n_layer)
            return dt_strf(m->error, sizeof m->error,
                           "model: part %d holds layers [%d, %d) of %d", k, parts[k].l0,
                           parts[k].l1, m->cfg.n_layer), -1;
    return n >= 1 ? 0 : (dt_strf(m->error, sizeof m->error, "model: no activation slot"), -1);
}

/* The arrays of pointers and the arena; 0, or -1 with everything freed. */
static int alloc_arena(dt_gpt *m, int n, size_t N, size_t total)
{
    dt_gpt_acts *a = &m->acts;
    const size_t per = (size_t)a->per_layer;
    a->layer = calloc((size_t)m->cfg.n_layer * per + 1, sizeof *a->layer);
    a->shared = calloc(per + 1, sizeof *a->shared);
    a->slots = calloc((size_t)n, sizeof *a->slots);
    a->mem = dt_alloc_shared(total * sizeof(float), DT_MEM_ACTS);
    if (m->cp.size > 1) { /* the rows' tokens and targets, picked at each forward */
        m->cp.tokens = malloc((size_t)n * N * sizeof *m->cp.tokens);
        m->cp.targets = malloc((size_t)n * N * sizeof *m->cp.targets);
    }
    if (a->layer && a->shared && a->slots && a->mem &&
        (m->cp.size == 1 || (m->cp.tokens && m->cp.targets)))
        return 0;
    free_arena(m);
    return dt_strf(m->error, sizeof m->error, "model: cannot allocate activations (%.1f MiB)",
                   (double)total * 4 / 1048576.0), -1;
}

int dt_gpt_alloc_slots(dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts)
{
    dt_gpt_acts *a = &m->acts;
    if (check_parts(m, B, T, n, parts)) return -1;
    free_arena(m);
    const size_t N = arena_rows(m, B, T);
    size_t total = dt_gpt_slots_floats(m, B, T, n, parts);
    if (alloc_arena(m, n, N, total)) return -1;
    a->B = B;
    a->T = T;
    a->nslots = n;
    a->split = a->split_backward; /* what carve_slot reads from here on */
    a->mode = a->recompute;
    size_t at = carve_common(m, a->mem, N);
    for (int k = 0; k < n; k++) {
        a->slots[k].part = parts[k];
        a->slots[k].base = a->mem + at;
        at += carve_slot(m, NULL, parts[k], N);
    }
    a->floats = total;
    a->rebuilt_layer = -1;
    a->slot = -1;
    dt_gpt_bind_slot(m, 0);
    return 0;
}

int dt_gpt_alloc_acts(dt_gpt *m, int B, int T)
{
    const dt_gpt_acts *a = &m->acts;
    if (a->mem && a->B == B && a->T == T && a->mode == a->recompute &&
        a->split == a->split_backward && a->nslots == 1 && a->slots[0].part.l0 == 0 &&
        a->slots[0].part.l1 == m->cfg.n_layer)
        return 0;
    dt_gpt_part whole = {0, m->cfg.n_layer};
    return dt_gpt_alloc_slots(m, B, T, 1, &whole);
}

void dt_gpt_free_acts(dt_gpt *m) { free_arena(m); }

const float *dt_gpt_residual(const dt_gpt *m, int l, int block)
{
    if (!m->acts.layer || l < 0 || l >= m->cfg.n_layer || block < 0 || block >= m->n_blocks ||
        m->blocks[block].kind->role != DT_BLOCK_BRANCH)
        return NULL;
    return m->acts.layer[(size_t)l * (size_t)m->acts.per_layer + m->blocks[block].act0];
}
