/* Cutting the layers into pipeline stages. See partition.h. */
#include "parallel/pipeline/partition.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"

int dt_pp_part_parse(const char *name, dt_pp_part_kind *out)
{
    static const char *const names[] = {"uniform", "params", "cost"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) return *out = (dt_pp_part_kind)i, 0;
    return -1;
}

static int too_few_layers(int L, int S, char *err, size_t errlen)
{
    return dt_strf(err, errlen, "%d pipeline stages need at least %d layers (one per stage); "
                   "the model has %d: lower --pp (or --pp-virtual) or raise --n-layer", S, S, L),
           -1;
}

int dt_pp_cut_uniform(int L, int S, int *cut, char *err, size_t errlen)
{
    if (S < 1 || S > L) return too_few_layers(L, S, err, errlen);
    cut[0] = 0;
    for (int k = 0; k < S; k++) cut[k + 1] = cut[k] + L / S + (k < L % S);
    return 0;
}

/* best[k][j]: the lightest heaviest stage when stages 0..k hold layers
 * 0..j-1; from[k][j] the first layer of stage k there. */
int dt_pp_cut_balanced(int L, int S, const double *w, double first, double last, int *cut,
                       char *err, size_t errlen)
{
    if (S < 1 || S > L) return too_few_layers(L, S, err, errlen);
    double *pre = calloc((size_t)L + 1, sizeof *pre);
    double *best = malloc((size_t)S * (L + 1) * sizeof *best);
    int *from = malloc((size_t)S * (L + 1) * sizeof *from);
    if (!pre || !best || !from) {
        free(pre), free(best), free(from);
        return dt_strf(err, errlen, "pipeline partition: out of memory"), -1;
    }
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + w[l];
#define AT(a, k, j) a[(size_t)(k) * (L + 1) + (j)]
    for (int k = 0; k < S; k++) {
        for (int j = k + 1; j <= L - (S - 1 - k); j++) {
            AT(best, k, j) = -1;
            for (int i = k == 0 ? 0 : k; i <= (k == 0 ? 0 : j - 1); i++) {
                double stage = pre[j] - pre[i] + (k == 0 ? first : 0) + (k == S - 1 ? last : 0);
                double worst = k == 0 ? stage : AT(best, k - 1, i) > stage ? AT(best, k - 1, i)
                                                                           : stage;
                if (AT(best, k, j) < 0 || worst < AT(best, k, j)) {
                    AT(best, k, j) = worst;
                    AT(from, k, j) = i;
                }
            }
        }
    }
    cut[S] = L;
    for (int k = S - 1; k >= 0; k--) cut[k] = AT(from, k, cut[k + 1]);
#undef AT
    free(pre), free(best), free(from);
    return 0;
}

/* The weights dt_pp_cut_balanced balances: parameters held, or measured
 * times. 0, or -1 out of memory. */
static int balanced(const dt_gpt *m, int S, const dt_pp_costs *costs, int *cut, char *err,
                    size_t errlen)
{
    const int L = m->cfg.n_layer;
    const double layer = (double)dt_gpt_layer_param_count(&m->cfg);
    double *w = malloc((size_t)L * sizeof *w);
    if (!w) return dt_strf(err, errlen, "pipeline partition: out of memory"), -1;
    double embed = (double)dt_gpt_segment_start(m, 1), first = embed;
    double last = embed + (double)dt_gpt_final_norm_param_count(&m->cfg);
    for (int l = 0; l < L; l++) w[l] = costs ? costs->layer_ms : layer;
    if (costs) first = costs->embed_ms, last = costs->head_ms;
    int rc = dt_pp_cut_balanced(L, S, w, first, last, cut, err, errlen);
    free(w);
    return rc;
}

int dt_pp_cut(const dt_gpt *m, int S, dt_pp_part_kind part, int interleaved,
              const dt_pp_costs *costs, int *cut, char *err, size_t errlen)
{
    const int L = m->cfg.n_layer;
    if (interleaved && L % S != 0)
        return dt_strf(err, errlen, "--pp-schedule interleaved cuts the %d layers into pp x "
                       "pp-virtual = %d equal stages: choose them so that %d divides the layer "
                       "count", L, S, S), -1;
    if (part == DT_PP_PART_UNIFORM || S > L) /* S > L: refused there */
        return dt_pp_cut_uniform(L, S, cut, err, errlen);
    if (part == DT_PP_PART_COST && !costs)
        return dt_strf(err, errlen, "--pp-partition cost: the cut depends on times measured "
                       "when the run starts"), -1;
    return balanced(m, S, part == DT_PP_PART_COST ? costs : NULL, cut, err, errlen);
}
