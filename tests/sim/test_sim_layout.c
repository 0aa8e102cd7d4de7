/*
 * Collectives over groups of ranks (sim/group.h) and a layout's step
 * (sim/layout.h), against closed forms and hand-counted schedules:
 *  - a ring all-reduce in every host's group of 4 at once takes the ring's
 *    closed form on the host links (the groups share nothing), one
 *    recording for all four groups;
 *  - groups strided one rank per host: the closed form on the links across
 *    hosts with a NIC per rank, and with one NIC per host the four groups'
 *    messages share it (beta four times over);
 *  - groups of two ranks on a host and across two hosts: two shapes, and
 *    the step lasts as long as the cross-host group's closed form;
 *  - tp 2 with free compute: the step is 2 all-reduces a layer each way,
 *    one after another (4 L ring all-reduces of the micro-batch's
 *    activations);
 *  - ZeRO-3 with free compute: every use's all-gather (forward and
 *    backward, each segment) and every segment's reduce-scatter, one after
 *    another on the comm stream, each by the ring's closed form over the
 *    model's real segment sizes;
 *  - expert parallelism (ep 2 of a mixture of experts, 2 ranks on a host)
 *    with free compute and DDP's one bucket after the last backward: per
 *    moe layer and micro-batch an all-to-all of the E counts and 4 of the
 *    rows (B T K C fp32 times the skew, a rank's), each one pairwise
 *    exchange (alpha + beta n / 2), one after another on the compute
 *    stream; 5 L M of them, 4 L M B T K C 4 skew / 2 bytes to the other
 *    rank; none at ep 1; ep on a dense model or not dividing the experts
 *    refused;
 *  - a Llama-family pipeline of 2 stages (4 layers of width 64, 4 heads
 *    and 2 key/value heads of 16, SwiGLU of 128, a vocabulary of 1024):
 *    the last rank holds its 2 layers (2 C^2 + 2 C KV D + 3 C F + 2 C
 *    each), the final norm (C) and the untied head (V C), no copy of the
 *    embeddings, and the model holds both V C; with the head tied, the
 *    last rank holds the embeddings' copy in its place and the model one
 *    V C less;
 *  - the pipeline bubble of 1f1b, gpipe, zb1p and interleaved (V 2) at
 *    p = 8, 16, 32, 64, with equal stages (the head's share made
 *    negligible: a vocabulary of 1) and a free network: idle / (p x step)
 *    equals dt_pp_bubble_formula's to 2e-3.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h" /* tests/check.h */
#include "sim/engine.h"
#include "sim/group.h"
#include "sim/layout.h"

static const double ALPHA = 1e-6, BETA = 1.0 / 10e9, GAMMA = 1.0 / 5e9;
static const double ALPHA_X = 20e-6, BETA_X = 1.0 / 1e9;

static int world(dt_sim_world *w, int p, int per_host, int free_net)
{
    dt_cost_model m;
    char err[256];
    dt_cost_model_defaults(&m);
    m.link[DT_LINK_SHM] = (dt_link_cost){ALPHA, BETA, GAMMA};
    m.link[DT_LINK_TCP] = (dt_link_cost){ALPHA_X, BETA_X, GAMMA};
    if (free_net)
        for (int k = 0; k < DT_LINK_KINDS; k++) m.link[k] = (dt_link_cost){0, 1e-21, 0};
    int rc = dt_sim_world_init(w, p, per_host, &m, err, sizeof err);
    CHECK(rc == 0, "world of %d: %s", p, err);
    return rc;
}

/* ring all-reduce of n bytes over p ranks */
static double ring(int p, double n, double alpha, double beta)
{
    return 2 * (p - 1) * (alpha + beta * n / p) + (p - 1) * GAMMA * n / p;
}

static int stride4(void *ctx, int g, int i) { return (void)ctx, g + 4 * i; }
static int adjacent(void *ctx, int g, int i) { return *(int *)ctx * g + i; }

/* Every group all-reduces n bytes by ring at once: the makespan. */
static double groups_run(dt_sim_world *w, int nics, const dt_sim_groups *g, double n)
{
    char err[512];
    dt_sim_group_coll c;
    double t = -1;
    if (dt_sim_group_coll_record(&c, g, w, DT_COLL_ALLREDUCE, "ring", (size_t)n, err,
                                 sizeof err)) {
        CHECK(0, "record: %s", err);
        return -1;
    }
    dt_sim_engine *e = dt_sim_engine_new(w, nics, 1, 1, err, sizeof err);
    dt_sim_prog prog = {0};
    int id = e ? dt_sim_engine_add_group_coll(e, &c) : -1;
    if (id >= 0 && dt_sim_prog_add(&prog, dt_sim_coll(id)) == 0) {
        for (int r = 0; r < w->ranks; r++) dt_sim_engine_program(e, r, 0, &prog);
        CHECK(dt_sim_engine_run(e, err, sizeof err) == 0, "run: %s", err);
        t = dt_sim_engine_makespan(e);
    }
    dt_sim_prog_free(&prog);
    dt_sim_engine_free(e);
    dt_sim_group_coll_free(&c);
    return t;
}

static void group_collectives(void)
{
    const double n = 4 * 4096.0 * 12;
    dt_sim_world w;
    dt_sim_groups g;
    char err[256];
    int four = 4, two = 2;
    if (world(&w, 16, 4, 0)) return;
    CHECK(dt_sim_groups_init(&g, &w, 4, adjacent, &four, err, sizeof err) == 0, "%s", err);
    CHECK(g.nshapes == 1, "hosts' groups: %d shapes", g.nshapes);
    double t = groups_run(&w, 1, &g, n), want = ring(4, n, ALPHA, BETA);
    CHECK(fabs(t - want) <= 1e-9 * want, "a host's group: %.9g s, want %.9g", t, want);
    dt_sim_groups_free(&g);

    CHECK(dt_sim_groups_init(&g, &w, 4, stride4, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(g.nshapes == 1, "strided groups: %d shapes", g.nshapes);
    t = groups_run(&w, 4, &g, n), want = ring(4, n, ALPHA_X, BETA_X);
    CHECK(fabs(t - want) <= 1e-9 * want, "across hosts, a NIC each: %.9g s, want %.9g", t, want);
    t = groups_run(&w, 1, &g, n), want = ring(4, n, ALPHA_X, 4 * BETA_X);
    CHECK(fabs(t - want) <= 1e-9 * want, "across hosts, one NIC: %.9g s, want %.9g", t, want);
    dt_sim_groups_free(&g);
    dt_sim_world_free(&w);

    if (world(&w, 6, 3, 0)) return;
    CHECK(dt_sim_groups_init(&g, &w, 2, adjacent, &two, err, sizeof err) == 0, "%s", err);
    CHECK(g.nshapes == 2, "pairs over hosts of 3: %d shapes, want 2", g.nshapes);
    t = groups_run(&w, 1, &g, n), want = ring(2, n, ALPHA_X, BETA_X);
    CHECK(fabs(t - want) <= 1e-9 * want, "the cross-host pair: %.9g s, want %.9g", t, want);
    dt_sim_groups_free(&g);
    dt_sim_world_free(&w);
}

static dt_sim_layout_opts layout(int L, int C, int V, int T)
{
    dt_sim_layout_opts o = {.cfg = {L, 1, C, V, T}, .seq = T, .tp = 1, .cp = 1, .pp = 1, .V = 1,
                            .micro = 1, .accum = 1, .sched = DT_PP_1F1B, .prefetch = 1,
                            .flops_per_s = 1e12, .mem_GBps = 1e30, .bucket_bytes = 25u << 20,
                            .nics = 1};
    return o;
}

static int run(dt_sim_layout_opts *o, int ranks, int per_host, int free_net, dt_sim_layout *out)
{
    dt_sim_world w;
    char err[512];
    if (world(&w, ranks, per_host, free_net)) return -1;
    int rc = dt_sim_layout_check(o, ranks, err, sizeof err);
    CHECK(rc == 0, "check: %s", err);
    if (rc == 0) rc = dt_sim_layout_run(&w, o, NULL, NULL, out, err, sizeof err);
    CHECK(rc == 0, "run: %s", err);
    dt_sim_world_free(&w);
    return rc;
}

static void tensor_parallel(void)
{
    dt_sim_layout_opts o = layout(3, 64, 32, 16);
    o.tp = 2, o.cfg.n_head = 2, o.micro = 2, o.flops_per_s = 1e30, o.algo = "ring";
    dt_sim_layout out;
    if (run(&o, 2, 2, 0, &out)) return;
    double act = 2.0 * 16 * 64 * 4, want = 4 * 3 * ring(2, act, ALPHA, BETA);
    CHECK(fabs(out.step_s - want) <= 1e-6 * want, "tp 2: step %.9g s, want %.9g", out.step_s,
          want);
    CHECK(out.mean.exposed_cls[DT_SIM_CLS_TP] >= 0.999 * want, "tp exposed %.9g s",
          out.mean.exposed_cls[DT_SIM_CLS_TP]);
}

/* ring all-gather and reduce-scatter of n bytes (all ranks' together) */
static double ring_ag(int p, double n) { return (p - 1) * (ALPHA + BETA * n / p); }
static double ring_rs(int p, double n) { return ring_ag(p, n) + (p - 1) * GAMMA * n / p; }

static void zero3(void)
{
    dt_sim_layout_opts o = layout(2, 64, 32, 16);
    o.zero = 3, o.flops_per_s = 1e30, o.algo = "ring";
    dt_sim_layout out;
    if (run(&o, 2, 2, 0, &out)) return;
    dt_gpt m;
    char err[256];
    if (dt_gpt_create_layout(&m, &o.cfg, DT_PREC_F32, err, sizeof err)) {
        CHECK(0, "layout: %s", err);
        return;
    }
    double want = 0;
    for (int s = 0; s < dt_gpt_segments(&m); s++) {
        double n = (double)(dt_gpt_segment_start(&m, s + 1) - dt_gpt_segment_start(&m, s)) * 4;
        want += 2 * ring_ag(2, n) + ring_rs(2, n); /* gathered twice, reduced once */
    }
    dt_gpt_destroy(&m);
    CHECK(fabs(out.step_s - want) <= 1e-6 * want, "ZeRO-3: step %.9g s, want %.9g", out.step_s,
          want);
}

static void expert_parallel(void)
{
    const int L = 2, C = 64, T = 16, B = 2, M = 2, E = 4, K = 2;
    const double skew = 1.5;
    dt_sim_layout_opts o = layout(L, C, 32, T);
    o.cfg.moe = (dt_moe_config){.experts = E, .topk = K};
    snprintf(o.cfg.blocks, sizeof o.cfg.blocks, "%s", dt_blocks_gpt2_moe);
    o.micro = B, o.accum = M, o.flops_per_s = 1e30, o.bucket_bytes = (size_t)1 << 40;
    o.ep = 2, o.moe_skew = skew;
    dt_sim_layout out;
    if (run(&o, 2, 2, 0, &out)) return;
    const double n = (double)B * T * K * C * 4 * skew;
    const double want = L * M * ((ALPHA + BETA * E * 4 / 2) + 4 * (ALPHA + BETA * n / 2));
    const double got = out.mean.exposed_cls[DT_SIM_CLS_EP];
    CHECK(fabs(got - want) <= 1e-6 * want, "ep 2: all-to-alls exposed %.9g s, want %.9g", got,
          want);
    CHECK(out.step_s >= got, "ep 2: the step %.9g s holds them", out.step_s);
    CHECK(out.ep_colls == 5 * L * M, "ep 2: %d all-to-alls a step, want %d", out.ep_colls,
          5 * L * M);
    CHECK(fabs(out.ep_bytes - 4 * L * M * n / 2) <= 1e-9 * n, "ep 2: %.9g bytes to the other "
          "rank a step, want %.9g", out.ep_bytes, 4 * L * M * n / 2);
    o.ep = 1, o.dp = 0;
    if (run(&o, 2, 2, 0, &out)) return;
    CHECK(out.ep_colls == 0 && out.mean.exposed_cls[DT_SIM_CLS_EP] == 0, "ep 1: no all-to-alls");
    char err[256];
    o.ep = 4, o.dp = 0;
    CHECK(dt_sim_layout_check(&o, 2, err, sizeof err) && strstr(err, "--ep 4"),
          "ep 4 of 2 ranks refused: %s", err);
    o.ep = 2, o.dp = 0, o.cfg.moe.experts = 0, o.cfg.blocks[0] = 0;
    CHECK(dt_sim_layout_check(&o, 2, err, sizeof err) && strstr(err, "--num-experts"),
          "ep 2 of a dense model refused: %s", err);
}

static void llama_pipeline(int tied)
{
    const double C = 64, KV = 2, D = 16, F = 128, V = 1024;
    const double layer = 2 * C * C + 2 * C * KV * D + 3 * C * F + 2 * C;
    dt_sim_layout_opts o = layout(4, 64, 1024, 16);
    o.cfg.n_head = 4, o.cfg.arch = DT_ARCH_LLAMA, o.cfg.n_kv_head = 2, o.cfg.ffn = 128;
    o.cfg.tie = tied;
    o.pp = 2, o.accum = 2;
    dt_sim_layout out;
    if (run(&o, 2, 1, 1, &out)) return;
    const double last = 2 * layer + C + V * C, model = 4 * layer + C + (tied ? 1 : 2) * V * C;
    CHECK((double)out.params_rank == last, "llama pp 2, %s head: the last rank holds %zu, want "
          "%.0f", tied ? "tied" : "untied", out.params_rank, last);
    CHECK((double)out.params == model, "llama, %s head: %zu parameters, want %.0f",
          tied ? "tied" : "untied", out.params, model);
}

static void bubble(dt_pp_kind kind, int p, int V, int M)
{
    dt_sim_layout_opts o = layout(p * V, 256, 1, 16);
    o.pp = p, o.V = V, o.accum = M, o.sched = kind;
    dt_sim_layout out;
    if (run(&o, p, 1, 1, &out)) return;
    double idle = out.mean.idle / out.step_s, want = dt_pp_bubble_formula(kind, p, V, M);
    printf("%-11s p %2d V %d M %3d: idle %.5f, formula %.5f (%.2f s simulating)\n",
           dt_pp_kind_name(kind), p, V, M, idle, want, out.run_s);
    CHECK(fabs(idle - want) <= 2e-3, "%s p %d V %d M %d: idle %.5f, formula %.5f",
          dt_pp_kind_name(kind), p, V, M, idle, want);
}

int main(void)
{
    group_collectives();
    tensor_parallel();
    zero3();
    expert_parallel();
    llama_pipeline(0);
    llama_pipeline(1);
    for (int p = 8; p <= 64; p *= 2) {
        bubble(DT_PP_1F1B, p, 1, 2 * p);
        bubble(DT_PP_GPIPE, p, 1, p);
        bubble(DT_PP_ZB1P, p, 1, 2 * p);
        bubble(DT_PP_INTERLEAVED, p, 2, 2 * p);
    }
    return finish("test_sim_layout");
}
