/* What a run prints and logs: the header, evaluations, the memory table,
 * the replica check, the JSON log. See run.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "train/memory/plan_pp.h"
#include "train/metrics.h"
#include "train/run.h"

/* Mean loss over up to eval_batches micro-batches of the validation data,
 * always the same sequences (the first ones, in order), split over the
 * ranks of comm (NULL: this rank alone). */
static int evaluate(dt_run *t, dt_comm *comm, double *loss_out)
{
    int B = t->r.B, T = t->r.T;
    uint64_t nseq = dt_dataset_nseq(t->val, T);
    uint64_t want = (uint64_t)t->cfg->eval_batches * (uint64_t)B;
    uint64_t total = want < nseq ? want : nseq;
    uint64_t index = comm ? (uint64_t)dt_comm_rank(comm) : 0;
    uint64_t size = comm ? (uint64_t)dt_comm_size(comm) : 1;
    double sum[1] = {0};
    /* Rank r evaluates micro-batches r, r + size, ...; the sums are added. */
    for (uint64_t first = index * B; first < total; first += (uint64_t)B * size) {
        int b = (int)(total - first < (uint64_t)B ? total - first : (uint64_t)B);
        if (dt_dataset_batch(t->val, &t->val_order, first, b, T, t->r.inputs, t->r.targets,
                             ERR(t)))
            return -1;
        double loss;
        if (dt_strategy_eval_loss(&t->S, t->r.inputs, t->r.targets, b, &loss)) return -1;
        sum[0] += loss * b;
    }
    if (comm && dt_allreduce(comm, sum, sum, 1, DT_F64, DT_SUM))
        return comm_failed(t, comm, "evaluation");
    *loss_out = sum[0] / (double)total;
    return 0;
}

int dt_run_eval(dt_run *t, int final)
{
    if (!t->val || t->cfg->eval_batches == 0) return 0;
    dt_comm *group;
    if (!dt_strategy_eval_group(&t->S, final, &group)) return 0;
    if (dt_dataset_check(t->val, t->r.T, ERR(t))) return -1;
    double loss = 0;
    if (evaluate(t, group, &loss)) return -1;
    fprintf(t->out, "val loss %.4f (step %ld)\n", loss, t->step);
    return t->json ? dt_run_log_failed(t, dt_log_json_eval(t->json, t->step - 1, loss)) : 0;
}

/* Every rank's snapshot (train/metrics.h; the most ever held, or what is
 * held now), gathered on rank 0 into *all (NULL elsewhere; free it).
 * Collective over the job. */
static int gather_memory(dt_run *t, int peak, unsigned long long **all)
{
    unsigned long long mine[DT_MEM_SNAPSHOT];
    dt_memory_snapshot(mine, peak);
    *all = NULL;
    if (t->r.rank == 0 && !(*all = malloc((size_t)t->r.size * sizeof mine)))
        return dt_strf(ERR(t), "out of memory"), -1;
    if (!t->r.world) {
        memcpy(*all, mine, sizeof mine);
        return 0;
    }
    if (dt_gather(t->r.world, mine, *all, DT_MEM_SNAPSHOT, DT_I64, 0)) {
        free(*all);
        *all = NULL;
        return comm_failed(t, t->r.world, "gathering memory use");
    }
    return 0;
}

/* Whether the stack says every rank holds the whole model, so that the
 * ZeRO formulas hold for each. */
static int every_rank_whole(dt_run *t)
{
    dt_rank_mem m;
    for (int r = 0; r < t->r.size; r++)
        if (dt_strategy_mem_plan(&t->S, r, &m) <= 0 || m.floats) return 0;
    return 1;
}

/* Rank r's plan by the stack's arithmetic (a pipeline stage's, or the
 * whole model's), where it has one: 1 with *p, else 0. */
static int rank_plan(dt_run *t, int r, dt_mem_plan *p)
{
    dt_rank_mem held;
    char why[256];
    int rc = dt_strategy_mem_plan(&t->S, r, &held);
    if (rc < 0) fprintf(t->out, "    (no plan for rank %d: %s)\n", r, t->r.err);
    if (rc <= 0) return 0;
    int copies = held.copies ? held.copies : t->S.dp_size;
    return dt_mem_plan_held(&t->model, t->cfg, copies, &held, p, why, sizeof why) == 0;
}

/* One line per rank with its role (the ranks of some strategies hold very
 * different things), each followed by its plan where the strategy has
 * one. */
static void print_roles(dt_run *t, const char *title, const unsigned long long *all)
{
    dt_mem_plan plan;
    fprintf(t->out, "%s:\n", title);
    if (rank_plan(t, 0, &plan))
        dt_mem_plan_held_heading(t->out, &plan, t->cfg->pp > 1 ? "stage" : "rank");
    for (int r = 0; r < t->r.size; r++) {
        char role[64] = "", label[96];
        const unsigned long long *snap = all + (size_t)r * DT_MEM_SNAPSHOT;
        dt_strategy_rank_label(&t->S, r, role, sizeof role);
        dt_strf(label, sizeof label, "  rank %d%s%s%s", r, role[0] ? " (" : "", role,
                role[0] ? ")" : "");
        dt_print_memory_snapshot(t->out, label, snap);
        if (rank_plan(t, r, &plan)) dt_mem_plan_held_print(t->out, &plan, snap);
    }
}

/* Every rank's memory by kind, printed by rank 0 (collective): beside the
 * ZeRO formulas where every rank holds the whole model, else by role (and
 * beside the stack's plan of each rank, where it has one). */
static int print_memory(dt_run *t, const char *title, int peak)
{
    unsigned long long *all;
    dt_mem_plan plan;
    if (gather_memory(t, peak, &all)) return -1;
    if (!all) return 0;
    if (every_rank_whole(t) && rank_plan(t, 0, &plan))
        dt_mem_plan_print(t->out, &plan, title, all, t->r.size);
    else if (!t->r.world) dt_print_memory_snapshot(t->out, title, all);
    else print_roles(t, title, all);
    free(all);
    return 0;
}

int dt_run_print_memory(dt_run *t, const char *title) { return print_memory(t, title, 1); }

/* What the disk under dir moves, measured now, or why it was not: the
 * probe is a report, so a disk it cannot measure does not stop the run
 * (the state's own file is made and sized already). */
static void print_disk(FILE *out, const char *dir)
{
    const size_t most = 256u << 20;
    dt_disk_probe p;
    char why[512];
    if (dt_disk_bandwidth(dir, most, &p, why, sizeof why))
        fprintf(out, "disk under %s: not measured: %s\n", dir, why);
    else if (!p.bytes)
        fprintf(out, "disk under %s: not measured: %.1f MiB free after the state, and the probe "
                "writes half of what is free, at least 16 MiB\n", dir, (double)p.free / 1048576.0);
    else
        fprintf(out, "disk under %s: sequential write %.0f MB/s, read %.0f MB/s (%zu MiB "
                "measured%s, %s)\n", dir, p.write_bps / 1e6, p.read_bps / 1e6, p.bytes >> 20,
                p.bytes < most ? ", half of what is free" : "",
                p.direct ? "O_DIRECT" : "buffered: the file system has no O_DIRECT");
}

/* Where the optimizer state (and parameters) live, and (rank 0) what the disk under
 * --nvme-path moves. */
static int print_offload(dt_run *t)
{
    const dt_train_config *c = t->cfg;
    if (!strcmp(c->offload_optimizer, "cpu") || !strcmp(c->offload_param, "cpu"))
        fprintf(t->out, "offload: --offload-%s cpu keeps the %s in host memory, which is where "
                "it already is: this machine has no accelerator\n",
                strcmp(c->offload_optimizer, "cpu") ? "param" : "optimizer",
                strcmp(c->offload_optimizer, "cpu") ? "parameters" : "optimizer state");
    const dt_opt_store *s = t->opt.store;
    if (!s) return 0;
    fprintf(t->out, "offload: the optimizer's moments%s in %s (%.1f MiB on rank %d; no name "
            "leads to it, so it goes with the process however that ends), streamed through "
            "%.1f MiB of buffers (aio block %ld, depth %d)\n",
            dt_opt_store_has_params(s) ? " and the parameters' pieces" : "", dt_opt_store_path(s),
            (double)dt_opt_store_file_bytes(s) / 1048576.0, t->r.rank,
            (double)dt_opt_store_buffer_bytes(s) / 1048576.0, c->aio_block_size,
            c->aio_queue_depth);
    fprintf(t->out, "offload: the update %s\n", t->S.defer_update
            ? "streams each layer's pieces just before its next gather, in the next forward, "
              "so the disk reads while the layers before it compute (--offload-overlap)"
            : "streams every piece after backward");
    if (t->r.rank == 0) print_disk(t->out, c->nvme_path);
    return 0;
}

int dt_run_print_header(dt_run *t)
{
    const dt_gpt *m = &t->model;
    dt_config_print(t->cfg, t->out);
    char how[320] = "";
    if (m->prec == DT_PREC_BF16 && !dt_matmul_bf16_native())
        snprintf(how, sizeof how, " (%s)", dt_matmul_bf16_how());
    fprintf(t->out,
            "model: %d layers, %d heads, %d embd, vocab %d, block %d: %.2fM parameters | "
            "%s matmuls%s | %d threads\n",
            m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.vocab_size, m->cfg.block_size,
            (double)m->n_params / 1e6, m->prec == DT_PREC_BF16 ? "bf16" : "fp32", how,
            t->threads);
    if (m->acts.mem) { /* a rank that holds the model */
        size_t shared, kept = dt_gpt_layer_acts_bytes(m, t->r.B, t->r.T, &shared);
        fprintf(t->out, "activations: recompute %s, %.1f MiB per layer x %d + %.1f MiB shared\n",
                dt_recompute_name(m->acts.recompute), (double)kept / 1048576.0, m->cfg.n_layer,
                (double)shared / 1048576.0);
    }
    fprintf(t->out, "data: %s, %llu tokens (%llu sequences of %d)", dt_dataset_name(t->train),
            (unsigned long long)dt_dataset_ntokens(t->train),
            (unsigned long long)dt_dataset_nseq(t->train, t->r.T), t->r.T);
    if (t->val)
        fprintf(t->out, " | val: %s, %llu tokens", dt_dataset_name(t->val),
                (unsigned long long)dt_dataset_ntokens(t->val));
    fprintf(t->out, "\nbatch: %ld sequences per step = %d per micro-batch x %d accumulation",
            t->global_batch, t->r.B, t->r.accum);
    dt_strategy_describe(&t->S, t->out);
    fprintf(t->out, "\n%s\n", t->peak_desc);
    if (print_offload(t)) return -1;
    /* Where the stack plans the ranks (the whole model's formulas, a
     * pipeline's stages), every rank takes part; a strategy whose ranks do
     * not all get here (servers) keeps to rank 0's own line. */
    dt_rank_mem held;
    if (dt_strategy_mem_plan(&t->S, 0, &held) > 0)
        return print_memory(t, "memory per rank at the start", 0);
    dt_print_memory(t->out, t->r.world ? "memory of rank 0" : "memory");
    return 0;
}

/* Whether every rank holds the same weights at the end (collective). */
int dt_run_check_replicas(dt_run *t)
{
    uint64_t hash = 0;
    int same = dt_strategy_replicas_identical(&t->S, &hash);
    if (same < 0) return -1;
    if (same == 0) return dt_strf(ERR(t), "the ranks' weights differ at the end (a bug)"), -1;
    if (same == 1 && t->S.held)
        fprintf(t->out, "replicas: every copy of a part of the model (a stage's data-parallel "
                "replicas, the tied embedding's two ends) holds bit-identical weights\n");
    else if (same == 1)
        fprintf(t->out, "replicas: %d ranks hold bit-identical weights (hash %016llx)\n",
                t->r.size, (unsigned long long)hash);
    return 0;
}

/* Opens --log-json. A resumed run keeps the entries of the steps before the
 * checkpoint and drops later ones (steps a crashed run logged but did not
 * save), so the file reads as one run. */
int dt_run_open_log(dt_run *t, int resuming)
{
    const char *path = t->cfg->log_json;
    if (!path[0]) return 0;
    if (strcmp(path, "-") == 0) {
        t->json = stdout;
        return 0;
    }
    char *kept = NULL;
    size_t kept_len = 0;
    FILE *old = resuming ? fopen(path, "r") : NULL;
    if (old) {
        FILE *mem = open_memstream(&kept, &kept_len);
        char line[4096];
        long step;
        while (mem && fgets(line, sizeof line, old))
            if (sscanf(line, "{\"step\":%ld", &step) == 1 && step < t->step) fputs(line, mem);
        if (mem) fclose(mem);
        fclose(old);
    }
    t->json = fopen(path, "w");
    if (t->json && kept) fwrite(kept, 1, kept_len, t->json);
    free(kept);
    if (!t->json) return dt_strf(ERR(t), "--log-json %s: cannot open for writing", path), -1;
    return 0;
}

int dt_run_log_failed(dt_run *t, int e)
{
    if (!e) return 0;
    return dt_strf(ERR(t), "--log-json %s: write failed: %s", t->cfg->log_json, strerror(e)), -1;
}
