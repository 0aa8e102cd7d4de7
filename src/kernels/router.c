/* A mixture-of-experts router's math: see router.h. Every loop runs in a
 * fixed order, so the same rows give the same bits however the batch is
 * split. */
#include "kernels/router.h"

#include <math.h>
#include <string.h>

#include "core/rand.h"
#include "kernels/profile.h"

void dt_router_hash_logits(float *logits, int E, uint64_t salt)
{
    const uint64_t h = dt_mix64(salt + 0x9E3779B97F4A7C15ull);
    for (int e = 0; e < E; e++)
        logits[e] = (float)((double)(dt_mix64(h + (uint64_t)e) >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void router_softmax_body(float *probs, float *lse, const float *logits, int N, int E)
{
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * E;
        float *p = probs + (size_t)i * E, mx = x[0], sum = 0.0f;
        for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        for (int e = 0; e < E; e++) sum += p[e] = expf(x[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        lse[i] = mx + logf(sum);
    }
}

void dt_router_softmax(float *probs, float *lse, const float *logits, int N, int E)
{
    const uint64_t t0 = dt_prof_begin();
    router_softmax_body(probs, lse, logits, N, E);
    dt_prof_end(DT_PROF_ROUTER, t0, 4.0 * (double)N * E, 4.0 * (2.0 * (double)N * E + N));
}

void dt_router_topk(int32_t *choice, float *weight, const float *probs, const float *bias,
                    int N, int E, int K)
{
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * E;
        int32_t *c = choice + (size_t)i * K;
        float *w = weight + (size_t)i * K, sum = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            float top = 0.0f;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k && !taken; j++) taken = c[j] == e;
                const float s = bias ? p[e] + bias[e] : p[e];
                if (!taken && (best < 0 || s > top)) best = e, top = s; /* ties: lower index */
            }
            c[k] = best;
            sum += w[k] = p[best];
        }
        for (int k = 0; k < K; k++) w[k] /= sum;
    }
}

long dt_router_capacity(int32_t *keep, const int32_t *choice, int b, int t, int K, int E,
                        int cap)
{
    int32_t taken[256]; /* E <= DT_MOE_MAX_EXPERTS */
    long dropped = 0;
    for (size_t i = 0; i < (size_t)b * t * K; i++) keep[i] = 1;
    if (cap <= 0) return 0;
    for (int s = 0; s < b; s++) {
        memset(taken, 0, (size_t)E * sizeof *taken);
        for (size_t i = (size_t)s * t * K; i < (size_t)(s + 1) * t * K; i++)
            if (taken[choice[i]]++ >= cap) keep[i] = 0, dropped++;
    }
    return dropped;
}

int dt_router_sort(int32_t *order, int32_t *count, int32_t *pos, const int32_t *choice,
                   const int32_t *keep, int N, int E, int K)
{
    const size_t slots = (size_t)N * K;
    memset(count, 0, (size_t)E * sizeof *count);
    for (size_t i = 0; i < slots; i++)
        if (!keep || keep[i]) count[choice[i]]++;
    int32_t next[256 + 1], total = 0; /* E <= DT_MOE_MAX_EXPERTS */
    for (int e = 0; e < E; e++) next[e] = total, total += count[e];
    for (size_t i = 0; i < slots; i++) {
        pos[i] = -1;
        if (keep && !keep[i]) continue;
        pos[i] = next[choice[i]]++;
        order[pos[i]] = (int32_t)i;
    }
    return total;
}

void dt_router_seq_counts(int32_t *cnt, const int32_t *choice, int b, int t, int K, int E)
{
    memset(cnt, 0, (size_t)b * E * sizeof *cnt);
    for (int s = 0; s < b; s++)
        for (size_t i = (size_t)s * t * K; i < (size_t)(s + 1) * t * K; i++)
            cnt[(size_t)s * E + choice[i]]++;
}

void dt_router_stats(const float *probs, const float *lse, const int32_t *choice,
                     const int32_t *keep, const int32_t *cnt, int b, int t, int T, int E, int K,
                     double *aux_sum, double *z_sum, double *load)
{
    for (int s = 0; s < b; s++) {
        double aux = 0;
        for (int e = 0; e < E; e++) {
            double P = 0;
            for (int i = s * t; i < (s + 1) * t; i++) P += probs[(size_t)i * E + e];
            aux += (double)E / ((double)K * T) * cnt[(size_t)s * E + e] * (P / T);
        }
        *aux_sum += aux;
    }
    for (size_t i = 0; i < (size_t)b * t; i++) *z_sum += (double)lse[i] * lse[i];
    for (size_t i = 0; i < (size_t)b * t * K; i++)
        if (!keep || keep[i]) load[choice[i]] += 1;
}

void dt_router_backward(float *dlogits, const float *dweight, const float *probs,
                        const float *lse, const int32_t *choice, const float *weight,
                        const int32_t *seq_cnt, int b, int t, int T, int E, int K,
                        float aux_scale, float z_scale)
{
    float dp[256];
    for (int s = 0; s < b; s++) {
        const int32_t *cnt = seq_cnt + (size_t)s * E;
        for (int i = s * t; i < (s + 1) * t; i++) {
            const float *p = probs + (size_t)i * E, *w = weight + (size_t)i * K;
            const float *dw = dweight + (size_t)i * K;
            const int32_t *c = choice + (size_t)i * K;
            float *dl = dlogits + (size_t)i * E;
            /* w_k = p_{c_k} / S: dL/dp_{c_k} = (dw_k - sum_j w_j dw_j) / S. */
            float S = 0.0f, wdw = 0.0f, dot = 0.0f;
            for (int k = 0; k < K; k++) S += p[c[k]], wdw += w[k] * dw[k];
            for (int e = 0; e < E; e++)
                dp[e] = aux_scale * (float)((double)E / ((double)K * T) * cnt[e]) / (float)T;
            for (int k = 0; k < K; k++) dp[c[k]] += (dw[k] - wdw) / S;
            for (int e = 0; e < E; e++) dot += dp[e] * p[e];
            for (int e = 0; e < E; e++)
                dl[e] = p[e] * (dp[e] - dot) + z_scale * 2.0f * lse[i] * p[e];
        }
    }
}
