/* The planner's memory of a layout (dt_plan_memory, over the pieces its
 * memo keeps: plan/places.c) against the run's own places, worked out
 * anew for each layout as `dtrain train --dry-run` does: the ddp kind's
 * places hook (dt_mesh_places) on the whole model's layout, each place
 * turned into bytes by dt_mem_plan_held, the rank that holds the most
 * taken. Over every layout the planner enumerates for:
 *  - gpt2-medium on 2 hosts of 4 (tied head, learned positions);
 *  - llama3-1b on a host of 8 (the Llama family with its tied head);
 *  - llama3-8b on 2 hosts of 4 (grouped-query attention, SwiGLU) at a
 *    sequence of 1024, its head tied; and untied without a pipeline (with
 *    one the planner leaves out the embeddings' copy that the pipeline's
 *    stage arithmetic still counts on the last stage for every family:
 *    test_plan_llama.py checks those by hand);
 *  - mixtral-mini on 2 hosts of 4 (experts, expert parallelism);
 * the bytes by kind, the total, the floats held, whether it fits and why
 * not are the same, to the bit. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli/cli.h"
#include "parallel/registry.h"
#include "plan/plan.h"
#include "sim/links.h"
#include "train/memory/plan_pp.h"

/* The configuration a run of layout l would parse (plan/memory.c's). */
static void config_of(const dt_plan_input *in, const dt_plan_layout *l, dt_train_config *c)
{
    dt_config_defaults(c);
    c->tp = l->tp, c->cp = l->cp, c->pp = l->pp, c->ep = l->ep;
    c->sequence_parallel = l->sp;
    c->zero_stage = l->zero;
    c->batch_size = l->B;
    c->grad_accum = l->M;
    c->seq_len = in->T;
    c->pp_virtual = l->V;
    snprintf(c->pp_schedule, sizeof c->pp_schedule, "%s", dt_pp_kind_name(l->sched));
    snprintf(c->recompute, sizeof c->recompute, "%s", dt_recompute_name(l->rc));
    if (in->bf16) {
        snprintf(c->dtype, sizeof c->dtype, "bf16");
        snprintf(c->grad_accum_dtype, sizeof c->grad_accum_dtype, "bf16");
    }
}

static double total(const dt_mem_plan *p)
{
    return dt_mem_plan_state(p) + p->bytes[DT_MEM_ACTS] + p->window_params + p->window_grads +
           p->window_widened;
}

/* The run's places of layout l and their plans: the rank that holds the
 * most into row. 0, or -1. */
static int reference(const dt_plan_input *in, const dt_plan_layout *l, dt_plan_row *row)
{
    dt_train_config cfg;
    dt_gpt lay;
    dt_places pl;
    char err[512];
    config_of(in, l, &cfg);
    if (dt_gpt_create_layout(&lay, &in->model, in->bf16 ? DT_PREC_BF16 : DT_PREC_F32, err,
                             sizeof err)) {
        CHECK(0, "%s", err);
        return -1;
    }
    lay.acts.recompute = l->rc;
    dt_parallel_opts o = dt_config_parallel_opts(&cfg);
    o.zero.stage = 0;
    dt_places_job job = {&o, &lay, l->tp * l->cp * l->dp * l->pp, l->B, in->T};
    int rc = dt_strategy_find("ddp")->places(&job, &pl, err, sizeof err);
    CHECK(rc == 0, "places: %s", err);
    double most = -1;
    for (int i = 0; rc == 0 && i < pl.n; i++) {
        dt_mem_plan p;
        rc = dt_mem_plan_held(&lay, &cfg, pl.at[i].mem.copies, &pl.at[i].mem, &p, err,
                              sizeof err);
        CHECK(rc == 0, "plan of place %d: %s", i, err);
        if (rc || total(&p) <= most) continue;
        most = total(&p);
        memcpy(row->mem, p.bytes, sizeof row->mem);
        row->psi = p.psi;
        snprintf(row->why, sizeof row->why, "stage %d, tp rank %d", pl.at[i].stage,
                 pl.at[i].tp_rank);
    }
    row->mem_total = most;
    row->fits = most <= in->mem;
    if (rc == 0) dt_places_free(&pl);
    dt_gpt_destroy(&lay);
    return rc;
}

static void compare(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l)
{
    dt_plan_row got = {.l = *l}, want = {.l = *l};
    char name[160], err[512];
    dt_plan_layout_name(l, name, sizeof name);
    check_set_label("%s: %s: ", in->model_name, name);
    if (reference(in, l, &want)) return;
    CHECK(dt_plan_memory(in, c, l, &got, err, sizeof err) == 0, "%s", err);
    CHECK(got.mem_total == want.mem_total, "total %.17g bytes, the run's places %.17g",
          got.mem_total, want.mem_total);
    for (int k = 0; k < DT_MEM_KIND_COUNT; k++)
        CHECK(got.mem[k] == want.mem[k], "%s %.17g bytes, the run's places %.17g",
              dt_mem_kind_name((dt_mem_kind)k), got.mem[k], want.mem[k]);
    CHECK(got.psi == want.psi, "holds %zu floats, the run's places %zu", got.psi, want.psi);
    CHECK(got.fits == want.fits, "fits %d, the run's places %d", got.fits, want.fits);
    if (!got.fits) CHECK(strstr(got.why, want.why), "why '%s', the rank at %s", got.why, want.why);
}

/* Every layout of `model` (with `flag`, or NULL) on nodes x per_node
 * ranks; with `no_pp` those without a pipeline. */
static void each_layout(const char *model, const char *flag, int no_pp, int T, int nodes,
                        int per_node, long batch, double gib)
{
    char *argv[8] = {"plan", "--model", (char *)model}, seq[16], err[512];
    int argc = 3;
    if (flag) argv[argc++] = (char *)flag;
    dt_train_config tc;
    dt_plan_input in = {.nodes = nodes, .per_node = per_node, .batch = batch, .bf16 = 1,
                        .flops = 100e12, .opt_Bps = 1e12, .mem = gib * (1 << 30)};
    snprintf(seq, sizeof seq, "%d", T);
    argv[argc++] = "--seq-len", argv[argc++] = seq;
    memset(&in.pin, -1, sizeof in.pin);
    snprintf(in.model_name, sizeof in.model_name, "%s%s%s", model, flag ? " " : "",
             flag ? flag : "");
    if (cli_model_options(argv, &argc, 8, &tc, &in.model, &in.T, err, sizeof err) ||
        dt_sim_links("nvlink-ib", &in.links, err, sizeof err)) {
        CHECK(0, "%s: %s", model, err);
        return;
    }
    dt_plan_layout *ls;
    dt_plan_memo *c;
    int n;
    if (dt_plan_layouts(&in, &ls, &n, err, sizeof err) ||
        dt_plan_memo_open(&c, &in, err, sizeof err)) {
        CHECK(0, "%s: %s", model, err);
        return;
    }
    CHECK(n > 50, "%s: %d layouts", model, n);
    for (int i = 0; i < n; i++)
        if (!no_pp || ls[i].pp == 1) compare(&in, c, &ls[i]);
    dt_plan_memo_close(c);
    free(ls);
}

int main(void)
{
    each_layout("gpt2-medium", NULL, 0, 1024, 2, 4, 16, 24);
    each_layout("llama3-1b", NULL, 0, 1024, 1, 8, 16, 24);
    each_layout("llama3-8b", "--tie-word-embeddings", 0, 1024, 2, 4, 8, 80);
    each_layout("llama3-8b", NULL, 1, 1024, 2, 4, 8, 80);
    each_layout("mixtral-mini", NULL, 0, 1024, 2, 4, 16, 8);
    return finish("test_plan_places");
}
