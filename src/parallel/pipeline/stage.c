/* What a rank of a pipeline holds. See stage.h. */
#include "parallel/pipeline/stage.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pipeline/executor.h"

static void add_range(dt_flat_range *r, int *n, size_t lo, size_t hi)
{
    int i = *n;
    while (i > 0 && r[i - 1].lo > lo) i--; /* kept sorted */
    memmove(&r[i + 1], &r[i], (size_t)(*n - i) * sizeof *r);
    r[i] = (dt_flat_range){lo, hi, 0};
    (*n)++;
}

dt_flat_ranges dt_pp_held_ranges(const dt_gpt *m, const int *cut, int p, int V, int q,
                                 dt_flat_range *r)
{
    const int L = m->cfg.n_layer, last = (p * V - 1) % p;
    int n = 0, w = 0;
    for (int c = 0; c < V; c++) {
        int k = c * p + q;
        add_range(r, &n, dt_gpt_segment_start(m, 1 + cut[k]),
                  dt_gpt_segment_start(m, 1 + cut[k + 1]));
    }
    if (q == 0 || (q == last && dt_gpt_tied(&m->cfg)))
        add_range(r, &n, 0, dt_gpt_segment_start(m, 1));
    if (q == last) add_range(r, &n, dt_gpt_segment_start(m, L + 1), m->n_floats);
    for (int i = 0; i < n; i++) {
        if (w > 0 && r[w - 1].hi == r[i].lo) r[w - 1].hi = r[i].hi;
        else r[w++] = r[i];
    }
    dt_flat_ranges h = {w, r, 0};
    for (int i = 0; i < w; i++) {
        r[i].at = h.len;
        h.len += r[i].hi - r[i].lo;
    }
    return h;
}

static size_t seg_len(const dt_gpt *m, int s)
{
    return dt_gpt_segment_start(m, s + 1) - dt_gpt_segment_start(m, s);
}

/* The largest of rank q's layers' segments. */
static size_t largest_layer(const dt_gpt *m, const int *cut, int p, int V, int q)
{
    size_t most = 0;
    for (int c = 0; c < V; c++)
        for (int l = cut[c * p + q]; l < cut[c * p + q + 1]; l++)
            if (seg_len(m, 1 + l) > most) most = seg_len(m, 1 + l);
    return most;
}

/* The most floats of rank q's segments in use at once: a layer, the
 * embeddings (stage 0's), or the head's segment (the final norm, and an
 * untied head) with the tied copy when the head is the embedding (the
 * head's forward and backward use both). */
static size_t in_use(const dt_gpt *m, const int *cut, int p, int V, int q)
{
    const int L = m->cfg.n_layer;
    size_t most = largest_layer(m, cut, p, V, q);
    const size_t head = (dt_gpt_tied(&m->cfg) ? seg_len(m, 0) : 0) + seg_len(m, L + 1);
    if (q == 0 && seg_len(m, 0) > most) most = seg_len(m, 0);
    if (q == (p * V - 1) % p && head > most) most = head;
    return most;
}

int dt_pp_stage_slots(const dt_pp_schedule *s, const int *cut, int q, dt_gpt_part **parts)
{
    int cap = s->V * s->M + 1;
    if (!(*parts = malloc((size_t)cap * sizeof **parts))) return -1;
    int slots = dt_pp_exec_slots(s, q, cut, *parts, cap);
    if (slots < 1) {
        free(*parts);
        *parts = NULL;
        return -1;
    }
    return slots;
}

void dt_pp_stage_memory_of(const dt_gpt *layout, const dt_pp_schedule *s, const int *cut, int q,
                           int B, int T, int slots, const dt_gpt_part *parts,
                           dt_pp_stage_mem *out)
{
    memset(out, 0, sizeof *out);
    dt_flat_range r[DT_PP_MAX_RANGES];
    out->floats = dt_pp_held_ranges(layout, cut, s->p, s->V, q, r).len;
    out->in_use = in_use(layout, cut, s->p, s->V, q);
    out->grads_open = out->in_use;
    out->slots = slots;
    /* The arena as the trainer carves it: zb1p's halves need their slots
     * carved with split_backward (pipeline.c sets it before they exist). */
    dt_gpt probe = *layout;
    probe.acts.split_backward = s->kind == DT_PP_ZB1P;
    out->model_floats = dt_gpt_slots_floats(&probe, B, T, slots, parts);
    /* Whole sequences' tokens and targets; the received gradient is this
     * rank's rows (executor.c). */
    const size_t N = (size_t)B * T, msg = dt_gpt_boundary_floats(layout, B, T);
    out->exec_bytes = (size_t)slots * (2 * N * sizeof(int32_t) + msg * sizeof(float));
    out->acts = (double)out->model_floats * sizeof(float) + (double)out->exec_bytes;
}

int dt_pp_stage_memory(const dt_gpt *layout, const dt_pp_schedule *s, const int *cut, int q,
                       int B, int T, dt_pp_stage_mem *out)
{
    dt_gpt_part *parts;
    int slots = dt_pp_stage_slots(s, cut, q, &parts);
    memset(out, 0, sizeof *out);
    if (slots < 1) return -1;
    dt_pp_stage_memory_of(layout, s, cut, q, B, T, slots, parts, out);
    free(parts);
    return 0;
}
