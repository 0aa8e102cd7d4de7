/* Measuring what a layer, the embeddings and the head cost. See
 * partition_cost.h. */
#include "parallel/pipeline/partition_cost.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rand.h"
#include "core/str.h"
#include "core/timer.h"

#define PARTS 3
#define SEED 0x5eed0c057ull

static double ms_since(uint64_t t0) { return (double)(dt_now_ns() - t0) * 1e-6; }

/* One micro-batch forward through parts 0, 1, 2 and backward through 2,
 * 1, 0, handing activations and gradients on as the stages would (not
 * timed); t[k] = part k's forward + backward, in ms. 0 or -1 (m->error). */
static int pass(dt_gpt *m, const int32_t *tokens, const int32_t *targets, int B, int T,
                double *t)
{
    const size_t bytes = (size_t)B * T * m->cfg.n_embd * sizeof(float);
    for (int k = 0; k < PARTS; k++) {
        if (k > 0) {
            const float *prev = dt_gpt_slot_output(m, k - 1);
            memcpy(dt_gpt_slot_input(m, k), prev, bytes);
        }
        uint64_t t0 = dt_now_ns();
        if (dt_gpt_forward_slot(m, k, k == 0 ? tokens : NULL, k == PARTS - 1 ? targets : NULL,
                                B, T) < 0)
            return -1;
        t[k] = ms_since(t0);
    }
    for (int k = PARTS - 1; k >= 0; k--) {
        /* The next part's input gradient (its backward left it there). */
        const float *d_out = k == PARTS - 1 ? NULL : dt_gpt_slot_input(m, k + 1);
        uint64_t t0 = dt_now_ns();
        if (dt_gpt_backward_slot(m, k, d_out, 1.0f / (float)(B * T))) return -1;
        t[k] += ms_since(t0);
    }
    return 0;
}

/* The throwaway model's buffers, in the modes of `like`. */
static int build(dt_gpt *m, const dt_gpt *like, int B, int T, char *err, size_t errlen)
{
    static const dt_gpt_part parts[PARTS] = {{0, 1}, {1, 2}, {2, 3}};
    dt_gpt_config cfg = like->cfg;
    cfg.n_layer = PARTS;
    if (dt_gpt_create_layout(m, &cfg, like->prec, err, errlen)) return -1;
    m->acts.recompute = like->acts.recompute;
    if ((like->mixed.on && dt_gpt_set_mixed(m)) || (like->accum.bf16 && dt_gpt_set_grads16(m)) ||
        dt_gpt_alloc_params(m) || dt_gpt_alloc_grads(m) ||
        dt_gpt_alloc_slots(m, B, T, PARTS, parts))
        return dt_strf(err, errlen, "%s", m->error), -1;
    dt_gpt_init_weights(m, SEED);
    return 0;
}

static int measure(dt_gpt *m, const dt_gpt *like, int B, int T, int32_t *tokens,
                   dt_pp_costs *out, char *err, size_t errlen)
{
    if (build(m, like, B, T, err, errlen)) return -1;
    const size_t N = (size_t)B * T;
    uint64_t state = SEED;
    for (size_t i = 0; i < 2 * N; i++)
        tokens[i] = (int32_t)(dt_splitmix64(&state) % (uint64_t)m->cfg.vocab_size);
    double best[PARTS] = {0}, t[PARTS];
    if (pass(m, tokens, tokens + N, B, T, t)) /* the warm-up: kernels and pages first touched */
        return dt_strf(err, errlen, "%s", m->error), -1;
    /* As many passes as fit in the budget: at least one, at most
     * DT_PP_COST_MAX_REPS (the minimum of more is less at the mercy of
     * whatever else runs on the cores). */
    const uint64_t start = dt_now_ns();
    const double budget_ms = DT_PP_COST_BUDGET_S * 1e3;
    for (int r = 0; r < DT_PP_COST_MAX_REPS && (r == 0 || ms_since(start) < budget_ms); r++) {
        if (pass(m, tokens, tokens + N, B, T, t)) return dt_strf(err, errlen, "%s", m->error), -1;
        for (int k = 0; k < PARTS; k++)
            if (r == 0 || t[k] < best[k]) best[k] = t[k];
    }
    out->layer_ms = best[1];
    out->embed_ms = best[0] > best[1] ? best[0] - best[1] : 0;
    out->head_ms = best[2] > best[1] ? best[2] - best[1] : 0;
    return 0;
}

int dt_pp_measure_costs(const dt_gpt *like, int B, int T, dt_pp_costs *out, char *err,
                        size_t errlen)
{
    /* The kinds the model allocates; communication buffers are others'. */
    static const dt_mem_kind kinds[] = {DT_MEM_PARAMS, DT_MEM_GRADS, DT_MEM_OPTIM, DT_MEM_ACTS};
    size_t peak[sizeof kinds / sizeof kinds[0]];
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) peak[i] = dt_mem_peak(kinds[i]);
    dt_gpt m;
    memset(&m, 0, sizeof m);
    int32_t *tokens = B > 0 && T > 0 ? malloc(2 * (size_t)B * T * sizeof *tokens) : NULL;
    int rc = tokens ? measure(&m, like, B, T, tokens, out, err, errlen)
                    : (dt_strf(err, errlen, "micro-batch %d x %d: no tokens to time", B, T), -1);
    free(tokens);
    dt_gpt_destroy(&m);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        dt_mem_restore_peak(kinds[i], peak[i]);
    return rc;
}
