/* The model's side of mixture-of-experts layers: the configuration's
 * checks, the capacity rule, the per-layer counts of the forwards and the
 * experts' bias of aux-loss-free balancing. The layer itself is the block
 * kind in blocks/moe.c. See moe.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "model/model_internal.h"

const char dt_blocks_gpt2_moe[] = "ln_1:layernorm,attn:attention,ln_2:layernorm,mlp:moe";

int dt_moe_capacity(const dt_moe_config *moe, int t)
{
    const double cap = ceil(moe->capacity * t * moe->topk / moe->experts - 1e-9);
    return cap < 1 ? 1 : (int)cap;
}

/* Whether the blocks have a moe branch. */
static int has_moe(const dt_block *b, int n)
{
    for (int i = 0; i < n; i++)
        if (b[i].kind->experts) return 1;
    return 0;
}

int dt_moe_config_check(const dt_gpt_config *cfg, const dt_block *b, int n, char *err,
                        size_t errlen)
{
    const dt_moe_config *mc = &cfg->moe;
    const int E = mc->experts, K = mc->topk;
    if (!has_moe(b, n))
        return E ? dt_strf(err, errlen, "model: --num-experts %d, but the layer's blocks (%s) "
                           "have no moe branch; leave --blocks out (its default with experts "
                           "is %s) or name one as mlp:moe", E,
                           dt_gpt_blocks(cfg), dt_blocks_gpt2_moe)
                 : 0;
    if (E < 1 || E > DT_MOE_MAX_EXPERTS)
        return dt_strf(err, errlen, "model: a moe branch needs --num-experts between 1 and %d "
                       "(got %d)", DT_MOE_MAX_EXPERTS, E), -1;
    if (K < 1 || K > E)
        return dt_strf(err, errlen, "model: --moe-router-topk %d with %d experts: each token "
                       "goes to K experts of the E, 1 <= K <= %d", K, E, E), -1;
    if (mc->ffn < 0 || mc->capacity < 0 || !isfinite(mc->capacity) || mc->aux_coeff < 0 ||
        mc->z_coeff < 0 || mc->bias_rate < 0)
        return dt_strf(err, errlen, "model: --moe-ffn-hidden-size, the capacity factor, the "
                       "loss coefficients and the bias rate cannot be negative"), -1;
    return 0;
}

int dt_model_moe_alloc(dt_gpt *m)
{
    const int L = m->cfg.n_layer, E = m->cfg.moe.experts;
    if (E == 0) return 0;
    m->moe.stats = calloc((size_t)L, sizeof *m->moe.stats);
    if (m->cfg.moe.expert_bias) m->moe.bias = calloc((size_t)L * E, sizeof *m->moe.bias);
    if (!m->moe.stats || (m->cfg.moe.expert_bias && !m->moe.bias))
        return dt_strf(m->error, sizeof m->error, "model: out of memory for the experts' "
                       "counts"), -1;
    return 0;
}

void dt_model_moe_free(dt_gpt *m)
{
    free(m->moe.stats);
    free(m->moe.bias);
}

void dt_gpt_moe_reset(dt_gpt *m)
{
    if (m->moe.stats) memset(m->moe.stats, 0, (size_t)m->cfg.n_layer * sizeof *m->moe.stats);
}

void dt_gpt_moe_update_bias(dt_gpt *m, int l, const double *load)
{
    const int E = m->cfg.moe.experts;
    if (!m->moe.bias) return;
    double mean = 0;
    for (int e = 0; e < E; e++) mean += load[e];
    mean /= E;
    float *b = m->moe.bias + (size_t)l * E;
    const float rate = (float)m->cfg.moe.bias_rate;
    /* Toward equal load: an expert under the mean is chosen more often next time. */
    for (int e = 0; e < E; e++) b[e] += load[e] < mean ? rate : load[e] > mean ? -rate : 0.0f;
}
