/* GPT-2's activation arena: one piece shared by every micro-batch
 * (backward's scratch, and the layer's worth that the recompute mode
 * rebuilds), then one slot per micro-batch in flight, each carved for its
 * part of the model. One process training alone has one slot of the whole
 * model; a pipeline stage has as many as its schedule keeps in flight.
 * See gpt.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "model/gpt.h"

/* Every buffer starts on a 64-byte boundary, so kernels see aligned rows. */
#define ACT_ALIGN_FLOATS 16

static void take(float *base, size_t *used, float **ptr, size_t n)
{
    if (base) *ptr = base + *used;
    *used += (n + ACT_ALIGN_FLOATS - 1) / ACT_ALIGN_FLOATS * ACT_ALIGN_FLOATS;
}

/* The widths of a layer's activations on this rank: C the residual
 * stream's, A attention's (its heads' share of C), F the MLP's, NH its
 * heads (tensor parallelism splits the last three), S what attention
 * keeps for backward (its lse, NH; context parallelism's `saved`). */
typedef struct {
    size_t C, A, F, NH, S;
} widths;

static widths widths_of(const dt_gpt *m)
{
    const size_t A = (size_t)m->tp.attn, NH = (size_t)m->tp.heads;
    return (widths){(size_t)m->cfg.n_embd, A, (size_t)m->tp.mlp, NH,
                    NH + (size_t)m->cp.saved_widths * A};
}

/* Rows of the arena for micro-batches of B x T: context parallelism
 * keeps this rank's rows of each sequence. */
static size_t arena_rows(const dt_gpt *m, int B, int T)
{
    return (size_t)B * (size_t)dt_gpt_rows(m, T);
}

/* The rows of the regions between the products among N: sequence
 * parallelism keeps this rank's 1/size of them. */
static size_t region_rows(const dt_gpt *m, size_t N)
{
    return m->tp.sp ? N / (size_t)m->tp.size : N;
}

/* A layer's buffers but res3: the products' outputs when mm, the
 * element-wise parts when ew. */
static void take_layer(float *base, size_t *used, dt_gpt_layer_acts *a, int mm, int ew,
                       size_t N, size_t R, widths w)
{
    float **ew_bufs[] = {&a->ln1, &a->ln2, &a->fc_gelu, &a->ln1_mean, &a->ln1_rstd,
                         &a->ln2_mean, &a->ln2_rstd};
    const size_t ew_len[] = {N * w.C, N * w.C, N * w.F, R, R, R, R};
    float **mm_bufs[] = {&a->qkv, &a->att, &a->res2, &a->fc, &a->lse};
    const size_t mm_len[] = {N * 3 * w.A, N * w.A, R * w.C, N * w.F, w.S * N};
    for (size_t i = 0; ew && i < sizeof ew_len / sizeof ew_len[0]; i++)
        take(base, used, ew_bufs[i], ew_len[i]);
    for (size_t i = 0; mm && i < sizeof mm_len / sizeof mm_len[0]; i++)
        take(base, used, mm_bufs[i], mm_len[i]);
}

static int shared_mm(const dt_gpt *m) { return m->recompute == DT_RECOMPUTE_FULL; }
static int shared_ew(const dt_gpt *m) { return m->recompute != DT_RECOMPUTE_NONE; }

/* What every slot shares: the rebuilt layer and backward's scratch.
 * Assigns the pointers into m when base is given, else only counts. */
static size_t carve_common(dt_gpt *m, float *base, size_t N)
{
    const widths w = widths_of(m);
    size_t used = 0;
    dt_gpt_layer_acts sh = {0};
    float *d_res, *d_c, *d_qkv, *d_fc, *sp_full = NULL, *sp_ln = NULL;
    take_layer(base, &used, &sh, shared_mm(m), shared_ew(m), N, region_rows(m, N), w);
    take(base, &used, &d_res, N * w.C);
    take(base, &used, &d_c, N * w.C);
    take(base, &used, &d_qkv, N * 3 * w.A);
    take(base, &used, &d_fc, N * w.F);
    if (m->tp.sp) { /* a gathered [N, C], and a LayerNorm's own weight gradients */
        take(base, &used, &sp_full, N * w.C);
        take(base, &used, &sp_ln, 2 * w.C);
    }
    if (base) {
        m->shared = sh;
        m->d_res = d_res, m->d_c = d_c, m->d_qkv = d_qkv, m->d_fc = d_fc;
        m->sp_full = sp_full, m->sp_ln = sp_ln;
    }
    return used;
}

/* One micro-batch of part p: its input, each of its layers' own buffers
 * (the shared ones named from m->shared) and res3 (with split_backward,
 * the products' output gradients and the input's), and with the head the
 * final LayerNorm, logits and losses. Binds the pointers when base is
 * given (after carve_common), else only counts. */
static size_t carve_slot(dt_gpt *m, float *base, dt_gpt_part p, size_t N)
{
    const widths w = widths_of(m);
    const size_t C = w.C, V = (size_t)m->tp.vocab, R = region_rows(m, N);
    size_t used = 0;
    float *scratch; /* where pointers go when only counting */
    take(base, &used, base ? &m->encoded : &scratch, R * C);
    for (int l = p.l0; l < p.l1; l++) {
        dt_gpt_layer_acts a = m->shared;
        take_layer(base, &used, &a, !shared_mm(m), !shared_ew(m), N, R, w);
        take(base, &used, &a.res3, R * C);
        if (m->acts_split) {
            take(base, &used, &a.d_fcp, N * C);
            take(base, &used, &a.d_proj, N * C);
            take(base, &used, &a.d_fc, N * w.F);
            take(base, &used, &a.d_qkv, N * 3 * w.A);
        }
        if (base) m->layer_acts[l] = a;
    }
    if (m->acts_split) take(base, &used, base ? &m->dinput : &scratch, N * C);
    if (p.l1 < m->cfg.n_layer) return used;
    take(base, &used, base ? &m->lnf : &scratch, N * C);
    take(base, &used, base ? &m->lnf_mean : &scratch, R);
    take(base, &used, base ? &m->lnf_rstd : &scratch, R);
    take(base, &used, base ? &m->logits : &scratch, N * V);
    take(base, &used, base ? &m->losses : &scratch, N);
    if (m->tp.size == 1) return used;
    /* The split loss's statistics: the rows' max, and two doubles a row. */
    float *sums;
    take(base, &used, base ? &m->ce_max : &scratch, N);
    take(base, &used, &sums, 4 * N);
    if (base) m->ce_sums = (double *)sums;
    return used;
}

size_t dt_gpt_slots_floats(const dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts)
{
    dt_gpt probe = *m; /* counting writes nothing, but the functions take a model */
    probe.acts_split = m->split_backward;
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
    if (k == m->slot) return;
    carve_slot(m, m->slots[k].base, m->slots[k].part, arena_rows(m, m->B, m->T));
    m->slot = k;
}

size_t dt_gpt_boundary_floats(const dt_gpt *m, int b, int t)
{
    return region_rows(m, (size_t)b * (size_t)dt_gpt_rows(m, t)) * (size_t)m->cfg.n_embd;
}

float *dt_gpt_slot_input(dt_gpt *m, int k)
{
    dt_gpt_bind_slot(m, k);
    return m->encoded;
}

float *dt_gpt_slot_input_grad(dt_gpt *m, int k)
{
    dt_gpt_bind_slot(m, k);
    return m->slots[k].input_grad_apart ? m->dinput : m->encoded;
}

const float *dt_gpt_slot_output(dt_gpt *m, int k)
{
    dt_gpt_bind_slot(m, k);
    return m->layer_acts[m->slots[k].part.l1 - 1].res3;
}

static void free_arena(dt_gpt *m)
{
    dt_free(m->acts_mem);
    free(m->layer_acts);
    free(m->slots);
    free(m->cp.tokens);
    free(m->cp.targets);
    m->cp.tokens = m->cp.targets = NULL;
    m->acts_mem = NULL;
    m->layer_acts = NULL;
    m->slots = NULL;
    m->dinput = NULL;
    m->nslots = 0;
    m->B = m->T = 0;
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
    for (int k = 0; k < n; k++)
        if (parts[k].l0 < 0 || parts[k].l0 >= parts[k].l1 || parts[k].l1 > m->cfg.n_layer)
            return dt_strf(m->error, sizeof m->error,
                           "model: part %d holds layers [%d, %d) of %d", k, parts[k].l0,
                           parts[k].l1, m->cfg.n_layer), -1;
    return n >= 1 ? 0 : (dt_strf(m->error, sizeof m->error, "model: no activation slot"), -1);
}

int dt_gpt_alloc_slots(dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts)
{
    if (check_parts(m, B, T, n, parts)) return -1;
    free_arena(m);
    const size_t N = arena_rows(m, B, T);
    size_t total = dt_gpt_slots_floats(m, B, T, n, parts);
    m->layer_acts = calloc((size_t)m->cfg.n_layer, sizeof *m->layer_acts);
    m->slots = calloc((size_t)n, sizeof *m->slots);
    m->acts_mem = dt_alloc(total * sizeof(float), DT_MEM_ACTS);
    if (m->cp.size > 1) { /* the rows' tokens and targets, picked at each forward */
        m->cp.tokens = malloc((size_t)n * N * sizeof *m->cp.tokens);
        m->cp.targets = malloc((size_t)n * N * sizeof *m->cp.targets);
    }
    if (!m->layer_acts || !m->slots || !m->acts_mem ||
        (m->cp.size > 1 && (!m->cp.tokens || !m->cp.targets))) {
        free_arena(m);
        return dt_strf(m->error, sizeof m->error, "model: cannot allocate activations "
                       "(%.1f MiB)", (double)total * 4 / 1048576.0), -1;
    }
    m->B = B;
    m->T = T;
    m->nslots = n;
    m->acts_split = m->split_backward; /* what carve_slot reads from here on */
    size_t at = carve_common(m, m->acts_mem, N);
    for (int k = 0; k < n; k++) {
        m->slots[k].part = parts[k];
        m->slots[k].base = m->acts_mem + at;
        at += carve_slot(m, NULL, parts[k], N);
    }
    m->acts_floats = total;
    m->acts_mode = m->recompute;
    m->rebuilt_layer = -1;
    m->slot = -1;
    dt_gpt_bind_slot(m, 0);
    return 0;
}

int dt_gpt_alloc_acts(dt_gpt *m, int B, int T)
{
    if (m->acts_mem && m->B == B && m->T == T && m->acts_mode == m->recompute &&
        m->acts_split == m->split_backward &&
        m->nslots == 1 && m->slots[0].part.l0 == 0 && m->slots[0].part.l1 == m->cfg.n_layer)
        return 0;
    dt_gpt_part whole = {0, m->cfg.n_layer};
    return dt_gpt_alloc_slots(m, B, T, 1, &whole);
}

void dt_gpt_free_acts(dt_gpt *m) { free_arena(m); }
