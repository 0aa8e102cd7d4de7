/* Why no layout has the sizes asked for: the enumeration run again with
 * fewer of them fixed finds the size that has no layout on its own, or the
 * two that have none together, and the values that would work. See
 * plan_internal.h. */
#include <stdio.h>
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "plan/plan_internal.h"

enum { PINS = 8, MAX_VALUE = 4096 };

static const char *const flags[PINS] = {"--tp", "--cp", "--pp", "--zero-stage", "--micro-batch",
                                        "--recompute", "--pp-schedule", "--ep"};

static int *pin(dt_plan_input *in, int i)
{
    int *at[PINS] = {&in->pin.tp, &in->pin.cp, &in->pin.pp, &in->pin.zero, &in->pin.B,
                     &in->pin.rc, &in->pin.sched, &in->pin.ep};
    return at[i];
}

/* Field i of a layout as the pins hold it; -1 where it has none (a
 * schedule without a pipeline). */
static int field(const dt_plan_layout *l, int i)
{
    const int v[PINS] = {l->tp, l->cp, l->pp, l->zero, l->B, (int)l->rc,
                         l->pp > 1 ? (int)l->sched : -1, l->ep};
    return v[i];
}

static void value_text(char *buf, size_t n, int i, int v)
{
    if (i == 5) dt_strf(buf, n, "%s", dt_recompute_name((dt_recompute)v));
    else if (i == 6) dt_strf(buf, n, "%s", dt_pp_kind_name((dt_pp_kind)v));
    else dt_strf(buf, n, "%d", v);
}

/* The rule of tp (0), cp (1) or pp (2) alone; the length written. */
static int size_rule(char *buf, size_t n, const dt_plan_input *in, int i)
{
    const dt_gpt_config *m = &in->model;
    const int tp_max = in->max_tp > 0 ? in->max_tp : in->per_node;
    if (i == 0) {
        char kv[48] = "";
        if (dt_gpt_kv_heads(m) != m->n_head)
            dt_strf(kv, sizeof kv, " (with their %d key/value heads)", dt_gpt_kv_heads(m));
        return dt_strf(buf, n, "tensor parallelism stays within a host (%d ranks), divides the "
                       "ranks and splits the %d heads%s and the MLP's %d columns evenly (and "
                       "the vocabulary of %d, every slice some)", tp_max, m->n_head, kv,
                       dt_gpt_ffn(m), m->vocab_size);
    }
    if (i == 1)
        return dt_strf(buf, n, "context parallelism is a power of two up to 16 that divides the "
                       "ranks, with 2 cp chunks dividing the sequence of %d", in->T);
    return dt_strf(buf, n, "a pipeline divides the ranks into at most 64 stages and no more "
                   "than the %d layers", m->n_layer);
}

/* The rule each size keeps (layouts.c); the sizes' too, which leave the
 * data-parallel size to divide the batch. */
static void rule_text(char *buf, size_t n, const dt_plan_input *in, int i)
{
    if (i <= 2) {
        size_t at = (size_t)size_rule(buf, n, in, i);
        dt_strf(buf + at, n - at, ", and what tp x cp x pp leaves of the %d ranks, the "
                "data-parallel size, must divide the batch of %ld", in->nodes * in->per_node,
                in->batch);
        return;
    }
    switch (i) {
    case 3:
        dt_strf(buf, n, "ZeRO shards over the data-parallel (and cp) ranks, and a pipeline "
                "runs ZeRO-0 or ZeRO-1 only");
        break;
    case 4:
        dt_strf(buf, n, "a micro-batch is at most 64 sequences and divides a data-parallel "
                "replica's share of the batch of %ld", in->batch);
        break;
    case 6:
        dt_strf(buf, n, "interleaved needs the micro-batch count a multiple of pp and the "
                "layers a multiple of 2 pp");
        break;
    case 7:
        if (!in->model.moe.experts) {
            dt_strf(buf, n, "expert parallelism splits a mixture of experts: the model has "
                    "none (add --num-experts E, or leave --ep out)");
            break;
        }
        dt_strf(buf, n, "expert parallelism divides the data-parallel size and the model's %d "
                "experts (--num-experts)", in->model.moe.experts);
        break;
    default:
        dt_strf(buf, n, "every size together must divide the ranks and the batch");
    }
}

/* What the layouts of a search hold: how many, and which values of one
 * field they take. */
typedef struct {
    int field;
    long n;
    unsigned char seen[MAX_VALUE + 1];
} tally;

static int count(void *ctx, const dt_plan_layout *l)
{
    tally *t = ctx;
    int v = field(l, t->field);
    t->n++;
    if (v >= 0 && v <= MAX_VALUE) t->seen[v] = 1;
    return 0;
}

/* The layouts of in with only the pins in `keep` (a bit a pin). */
static void search(const dt_plan_input *in, unsigned keep, int of, tally *t)
{
    dt_plan_input q = *in;
    for (int i = 0; i < PINS; i++)
        if (!(keep >> i & 1)) *pin(&q, i) = -1;
    memset(t, 0, sizeof *t);
    t->field = of;
    dt_plan_layouts_each(&q, count, t);
}

/* "1, 5, 25": the values t saw, the first few. */
static void values(char *buf, size_t n, const tally *t)
{
    size_t at = 0;
    int shown = 0;
    buf[0] = '\0';
    for (int v = 0; v <= MAX_VALUE && at < n; v++) {
        if (!t->seen[v]) continue;
        char one[32];
        value_text(one, sizeof one, t->field, v);
        if (shown++ == 12) {
            dt_strf(buf + at, n - at, ", ...");
            return;
        }
        at += (size_t)dt_strf(buf + at, n - at, "%s%s", shown > 1 ? ", " : "", one);
    }
}

static int batch_blame(const dt_plan_input *in, int world, char *err, size_t errlen)
{
    return dt_strf(err, errlen, "no layout of %d ranks splits this batch: the data-parallel "
                   "size must divide the batch of %ld sequences, tp the %d heads and the ranks "
                   "of a host, pp the %d layers, 2 cp the sequence of %d; use a batch that %d "
                   "divides, or fewer ranks", world, in->batch, in->model.n_head,
                   in->model.n_layer, in->T, world), -1;
}

int dt_plan_no_layout(const dt_plan_input *in, char *err, size_t errlen)
{
    const int world = in->nodes * in->per_node;
    dt_plan_input copy = *in;
    unsigned pinned = 0;
    for (int i = 0; i < PINS; i++)
        if (*pin(&copy, i) >= 0) pinned |= 1u << i;
    tally t, u;
    search(in, 0, 0, &t);
    if (t.n == 0) return batch_blame(in, world, err, errlen);
    char rule[512], ok[160], a[32], b[32];
    for (int i = 0; i < PINS; i++) {
        if (!(pinned >> i & 1)) continue;
        search(in, 1u << i, i, &t);
        if (t.n) continue;
        search(in, 0, i, &u);
        rule_text(rule, sizeof rule, in, i);
        values(ok, sizeof ok, &u);
        value_text(a, sizeof a, i, *pin(&copy, i));
        return dt_strf(err, errlen, "no layout of %d ranks has %s %s: %s; %s takes %s here",
                       world, flags[i], a, rule, flags[i], ok), -1;
    }
    for (int i = 0; i < PINS; i++)
        for (int j = i + 1; j < PINS; j++) {
            if (!(pinned >> i & 1) || !(pinned >> j & 1)) continue;
            search(in, 1u << i | 1u << j, j, &t);
            if (t.n) continue;
            search(in, 1u << i, j, &u);
            rule_text(rule, sizeof rule, in, j);
            values(ok, sizeof ok, &u);
            value_text(a, sizeof a, i, *pin(&copy, i));
            value_text(b, sizeof b, j, *pin(&copy, j));
            return dt_strf(err, errlen, "no layout of %d ranks has %s %s with %s %s: %s; with "
                           "%s %s, %s takes %s", world, flags[j], b, flags[i], a, rule,
                           flags[i], a, flags[j], ok), -1;
        }
    return dt_strf(err, errlen, "no layout of %d ranks has all the sizes asked for together, "
                   "though any two of them have one: fix fewer of --tp, --cp, --pp, --ep, "
                   "--zero-stage, --micro-batch, --recompute and --pp-schedule", world), -1;
}
