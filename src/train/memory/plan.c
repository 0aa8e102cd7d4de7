/* Per-rank memory by the ZeRO formulas, and the table that sets them
 * beside what the ranks hold. See memory/plan.h. */
#include "train/memory/plan.h"

#include <math.h>
#include <string.h>

#include "core/str.h"
#include "train/metrics.h"

/* K: the optimizer's bytes per parameter. Mixed precision adds the fp32
 * master weights to the moments. */
static int optim_bytes(dt_opt_kind opt, double momentum, dt_precision prec)
{
    int moments = opt == DT_OPT_SGD ? (momentum != 0.0 ? 4 : 0) : 8;
    return moments + (prec == DT_PREC_BF16 ? 4 : 0);
}

static int check_opts(const dt_gpt *layout, const dt_mem_plan_opts *o, char *err, size_t n)
{
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return dt_strf(err, n, "ZeRO stage %d: the stages are 0 (plain data parallelism), 1 "
                       "(optimizer state sharded), 2 (and gradients), 3 (and parameters)",
                       o->zero_stage), -1;
    if (o->ranks < 1)
        return dt_strf(err, n, "%d data-parallel ranks: the state is sharded over at least 1 "
                       "rank", o->ranks), -1;
    if (o->prec != DT_PREC_F32 && o->prec != DT_PREC_BF16)
        return dt_strf(err, n, "precision %d: fp32 or bf16", (int)o->prec), -1;
    if (o->opt != DT_OPT_ADAMW && o->opt != DT_OPT_ADAM && o->opt != DT_OPT_SGD)
        return dt_strf(err, n, "optimizer %d: adamw, adam or sgd", (int)o->opt), -1;
    if (o->B < 1 || o->T < 1 || o->T > layout->cfg.block_size)
        return dt_strf(err, n, "micro-batch %d x %d: needs at least 1 x 1 and a length up to "
                       "block_size %d", o->B, o->T, layout->cfg.block_size), -1;
    if (o->prefetch < 0)
        return dt_strf(err, n, "prefetch %d: 0 or more segments ahead", o->prefetch), -1;
    return 0;
}

/* "4 Psi", "4 Psi / N", or "0". */
static void term(char *buf, size_t n, int bytes, int sharded)
{
    if (bytes == 0) dt_strf(buf, n, "0");
    else dt_strf(buf, n, "%d Psi%s", bytes, sharded ? " / N" : "");
}

/* The largest layer's segment, in floats. */
static size_t largest_layer(const dt_gpt *layout)
{
    size_t most = 0;
    for (int s = 1; s <= layout->cfg.n_layer; s++) {
        size_t len = dt_gpt_segment_start(layout, s + 1) - dt_gpt_segment_start(layout, s);
        if (len > most) most = len;
    }
    return most;
}

/* The optimizer's moments on NVMe: their bytes go to the file, and memory
 * holds the stream's buffers (for the rank's share of the flat layout)
 * and mixed precision's fp32 masters, which stay. */
static void offload_optim(dt_mem_plan *p, const dt_gpt *layout, int N)
{
    size_t n = (layout->n_floats + (size_t)N - 1) / (size_t)N;
    dt_mem_plan_offload(p, p->o.offload, (double)p->psi / N, n);
}

void dt_mem_plan_offload(dt_mem_plan *p, const dt_offload_opts *o, double share, size_t n)
{
    const int moments = optim_bytes(p->o.opt, p->o.momentum, DT_PREC_F32);
    const int states = moments / 4 + (p->o.offload_params && p->o.zero_stage >= 3);
    p->nvme = moments * share;
    p->bytes[DT_MEM_OPTIM] = (p->optim_bytes - moments) * share +
                             (double)dt_offload_buffer_bytes(o, states, n);
}

int dt_mem_plan_make(const dt_gpt *layout, const dt_mem_plan_opts *o, dt_mem_plan *p, char *err,
                     size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (check_opts(layout, o, err, errlen)) return -1;
    p->o = *o;
    p->psi = o->psi ? o->psi : dt_gpt_param_count(&layout->cfg);
    p->param_bytes = o->prec == DT_PREC_BF16 ? 2 : 4;
    p->grad_bytes = o->prec == DT_PREC_BF16 && o->grads_bf16 ? 2 : 4;
    p->optim_bytes = optim_bytes(o->opt, o->momentum, o->prec);
    const int shard_params = o->zero_stage >= 3, shard_grads = o->zero_stage >= 2,
              shard_optim = o->zero_stage >= 1;
    const double psi = (double)p->psi, N = o->ranks;
    p->bytes[DT_MEM_PARAMS] = p->param_bytes * psi / (shard_params ? N : 1);
    p->bytes[DT_MEM_GRADS] = p->grad_bytes * psi / (shard_grads ? N : 1);
    p->bytes[DT_MEM_OPTIM] = p->optim_bytes * psi / (shard_optim ? N : 1);
    if (o->offload && optim_bytes(o->opt, o->momentum, DT_PREC_F32) > 0)
        offload_optim(p, layout, shard_optim ? o->ranks : 1);
    p->o.offload = NULL; /* the caller's; only the figures stay */
    p->bytes[DT_MEM_ACTS] = (double)dt_gpt_acts_floats(layout, o->B, o->T) * sizeof(float);
    term(p->formula[DT_MEM_PARAMS], sizeof p->formula[0], p->param_bytes, shard_params);
    term(p->formula[DT_MEM_GRADS], sizeof p->formula[0], p->grad_bytes, shard_grads);
    term(p->formula[DT_MEM_OPTIM], sizeof p->formula[0], p->optim_bytes, shard_optim);
    if (p->nvme > 0) dt_strf(p->formula[DT_MEM_OPTIM], sizeof p->formula[0], "NVMe buffers");
    dt_strf(p->formula[DT_MEM_ACTS], sizeof p->formula[0], "B x T arena");
    /* What ZeRO holds whole beyond its pieces (parallel/zero): the
     * embeddings' gradient from the head's backward to the end (the tied
     * weight's last term comes last) with the layer being computed and the
     * one whose reduce-scatter is in flight; the layer in use and those
     * prefetched, or at the head the embeddings with the final norm. */
    const int L = layout->cfg.n_layer;
    double emb = (double)dt_gpt_segment_start(layout, 1);
    double layer = L > 0 ? (double)largest_layer(layout) : 0.0;
    double head = emb + (double)(layout->n_floats - dt_gpt_segment_start(layout, L + 1));
    double lead = layer * (o->prefetch + 1);
    /* Backward adds in fp32 whatever the accumulation's precision: ZeRO-2/3
     * into their window, bf16 accumulation into a widened segment, fp32
     * accumulation after the first micro-batch into a segment apart (the
     * embeddings' from the head on, with the segment in progress). */
    if (shard_grads) {
        p->window_grads = (emb + 2 * layer) * sizeof(float);
    } else if (p->grad_bytes == 2 || o->accum > 1) {
        p->window_grads = (head > emb + layer ? head : emb + layer) * sizeof(float);
    }
    if (shard_params) p->window_params = (lead > head ? lead : head) * p->param_bytes;
    if (shard_params && o->hpz > 1) { /* hpZ's secondary partition */
        p->bytes[DT_MEM_PARAMS] += p->param_bytes * psi / o->hpz;
        dt_strf(p->formula[DT_MEM_PARAMS], sizeof p->formula[0], "%dPsi/N + %dPsi/hpZ",
                p->param_bytes, p->param_bytes);
    }
    if (shard_params && o->offload_params) {
        /* Each piece is read into its own buffer a segment ahead of its
         * gather: the segments gathered ahead and one more. */
        double seg = emb > layer ? emb : layer;
        p->nvme_params = p->param_bytes * psi / N;
        p->bytes[DT_MEM_PARAMS] = (o->prefetch + 2) * ceil(seg / N) * p->param_bytes;
        dt_strf(p->formula[DT_MEM_PARAMS], sizeof p->formula[0], "read-ahead pieces");
    }
    if (o->prec == DT_PREC_BF16) p->window_widened = (layer > head ? layer : head) * sizeof(float);
    return 0;
}

int dt_mem_plan_from_config(const dt_gpt *layout, const dt_train_config *c, int ranks,
                            dt_mem_plan *p, char *err, size_t errlen)
{
    return dt_mem_plan_from_config_psi(layout, c, ranks, 0, p, err, errlen);
}

int dt_mem_plan_from_config_psi(const dt_gpt *layout, const dt_train_config *c, int ranks,
                                size_t psi, dt_mem_plan *p, char *err, size_t errlen)
{
    dt_mem_plan_opts o = {.zero_stage = c->zero_stage, .ranks = ranks, .psi = psi,
                          .prec = strcmp(c->dtype, "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32,
                          .grads_bf16 = strcmp(c->grad_accum_dtype, "bf16") == 0,
                          .momentum = c->momentum, .B = c->batch_size,
                          .accum = c->grad_accum,
                          .T = c->seq_len ? c->seq_len : layout->cfg.block_size,
                          .prefetch = c->zero_prefetch};
    dt_offload_opts off = dt_config_offload_opts(c);
    if (strcmp(c->offload_optimizer, "nvme") == 0) o.offload = &off;
    o.offload_params = strcmp(c->offload_param, "nvme") == 0;
    o.hpz = c->zero_hpz;
    if (dt_opt_kind_parse(c->optimizer, &o.opt))
        return dt_strf(err, errlen, "optimizer '%s': adamw, adam or sgd", c->optimizer), -1;
    return dt_mem_plan_make(layout, &o, p, err, errlen);
}

double dt_mem_plan_state(const dt_mem_plan *p)
{
    return p->bytes[DT_MEM_PARAMS] + p->bytes[DT_MEM_GRADS] + p->bytes[DT_MEM_OPTIM];
}

/* The model state's formula in one line: "4 Psi + 12 Psi / N". */
static void state_formula(const dt_mem_plan *p, char *buf, size_t n)
{
    int whole = 0, split = 0, stage = p->o.zero_stage;
    /* Offloaded, the moments are on NVMe: their buffers are added apart. */
    const int optim = p->nvme > 0 ? p->optim_bytes - optim_bytes(p->o.opt, p->o.momentum,
                                                                 DT_PREC_F32)
                                  : p->optim_bytes;
    const int b[3] = {p->nvme_params > 0 ? 0 : p->param_bytes, p->grad_bytes, optim};
    for (int k = 0; k < 3; k++) {
        int sharded = stage >= 3 - k; /* optim from stage 1, grads 2, params 3 */
        if (sharded) split += b[k];
        else whole += b[k];
    }
    char a[16] = "", s[16] = "";
    if (whole) dt_strf(a, sizeof a, "%d Psi", whole);
    if (split) dt_strf(s, sizeof s, "%d Psi / N", split);
    dt_strf(buf, n, "%s%s%s%s", a, whole && split ? " + " : "", s,
            p->nvme + p->nvme_params > 0 ? " + buffers" : "");
    if (!whole && !split) dt_strf(buf, n, p->nvme + p->nvme_params > 0 ? "buffers" : "0");
    if (p->o.hpz > 1 && stage >= 3) dt_strf(buf + strlen(buf), n - strlen(buf), " + hpZ");
}

#define MIB(x) ((double)(x) / 1048576.0)
#define COL "%-18s " /* a space after the widest: "4 Psi / N + buffers" */

static const dt_mem_kind shown[] = {DT_MEM_PARAMS, DT_MEM_GRADS, DT_MEM_OPTIM};

static void print_heading(FILE *f, const dt_mem_plan *p, const char *title)
{
    const char *opt = dt_opt_kind_name(p->o.opt);
    fprintf(f, "%s: Psi = %zu parameters, %s, %s (K = %d bytes/parameter), ZeRO stage %d, "
            "N = %d data-parallel rank%s, micro-batch %d x %d\n", title, p->psi,
            p->o.prec == DT_PREC_BF16 ? "bf16 mixed precision" : "fp32", opt, p->optim_bytes,
            p->o.zero_stage, p->o.ranks, p->o.ranks == 1 ? "" : "s", p->o.B, p->o.T);
    char state[40];
    state_formula(p, state, sizeof state);
    fprintf(f, "  %-9s", "");
    for (size_t i = 0; i < 3; i++) fprintf(f, COL, dt_mem_kind_name(shown[i]));
    fprintf(f, COL COL "%s\n", "model state", "acts (estimate)", "total");
    fprintf(f, "  %-9s", "formula");
    for (size_t i = 0; i < 3; i++) fprintf(f, COL, p->formula[shown[i]]);
    fprintf(f, COL COL "%s\n", state, p->formula[DT_MEM_ACTS], "state + acts");
    fprintf(f, "  %-9s", "MiB");
    for (size_t i = 0; i < 3; i++) fprintf(f, "%-19.1f", MIB(p->bytes[shown[i]]));
    double state_b = dt_mem_plan_state(p), acts = p->bytes[DT_MEM_ACTS];
    fprintf(f, "%-19.1f%-19.1f%.1f\n", MIB(state_b), MIB(acts), MIB(state_b + acts));
}

/* "474.9 x1.0004": a measured figure and its ratio to the formula's. */
static void cell(FILE *f, double measured, double formula)
{
    char buf[40];
    if (formula > 0) dt_strf(buf, sizeof buf, "%.1f x%.4f", MIB(measured), measured / formula);
    else dt_strf(buf, sizeof buf, "%.1f", MIB(measured));
    fprintf(f, COL, buf);
}

static void print_rank(FILE *f, const dt_mem_plan *p, int r, const unsigned long long *snap)
{
    char label[24];
    dt_strf(label, sizeof label, "rank %d", r);
    fprintf(f, "  %-9s", label);
    double state = 0;
    for (size_t i = 0; i < 3; i++) {
        cell(f, (double)snap[shown[i]], p->bytes[shown[i]]);
        state += (double)snap[shown[i]];
    }
    cell(f, state, dt_mem_plan_state(p));
    cell(f, (double)snap[DT_MEM_ACTS], p->bytes[DT_MEM_ACTS]);
    char pooled[128];
    dt_memory_rss_notes(pooled, sizeof pooled, snap, ""); /* the table is in MiB */
    fprintf(f, "comm %.1f, other %.1f, peak RSS %.1f%s\n", MIB(snap[DT_MEM_COMM]),
            MIB(snap[DT_MEM_OTHER]), MIB(snap[DT_MEM_SNAP_RSS]), pooled);
}

void dt_mem_plan_print(FILE *f, const dt_mem_plan *p, const char *title,
                       const unsigned long long *measured, int nrows)
{
    print_heading(f, p, title);
    for (int r = 0; measured && r < nrows; r++)
        print_rank(f, p, r, measured + (size_t)r * DT_MEM_SNAPSHOT);
    if (p->nvme > 0)
        fprintf(f, "  optimizer moments on NVMe: %.1f MiB per rank (%d Psi%s), in files under "
                "--nvme-path; memory holds the buffers they stream through\n", MIB(p->nvme),
                optim_bytes(p->o.opt, p->o.momentum, DT_PREC_F32),
                p->o.zero_stage >= 1 ? " / N" : "");
    if (p->nvme_params > 0)
        fprintf(f, "  parameter pieces on NVMe: %.1f MiB per rank (%d Psi / N), in the same "
                "files; each is read just ahead of its gather\n", MIB(p->nvme_params),
                p->param_bytes);
    const char *sep = "  transient, beyond the formula: ";
    if (p->window_grads > 0) {
        fprintf(f, "%sfp32 gradients of a micro-batch during backward (the embeddings', %s), "
                "at most %.1f MiB", sep,
                p->o.zero_stage >= 2 ? "two layers'" : "a layer's or ln_f's", MIB(p->window_grads));
        sep = "; ";
    }
    if (p->window_params > 0) {
        fprintf(f, "%sgathered parameters (%d layers, or the head's), at most %.1f MiB", sep,
                p->o.prefetch + 1, MIB(p->window_params));
        sep = "; ";
    }
    if (p->window_widened > 0)
        fprintf(f, "%sparameters widened to fp32 while in use (a layer, or the head's), at "
                "most %.1f MiB", sep, MIB(p->window_widened));
    if (p->window_grads > 0 || p->window_params > 0 || p->window_widened > 0) fputc('\n', f);
}
