/*
 * `dtrain ckpt`: looking into checkpoints.
 *
 *   dtrain ckpt info DIR
 *       a checkpoint's layout: whole-model or sharded (stage, rank count,
 *       each shard's pieces), step, data position, model sizes, the
 *       experts' bias; its files are checked first, as a load checks them.
 *   dtrain ckpt consolidate DIR --out FILE|OUTDIR/ [--dtype fp32|bf16|fp16]
 *       the whole model of a checkpoint of either kind, as one safetensors
 *       file with Hugging Face names (what --save-final writes); atomic.
 *       An --out that ends in '/' gets a Hugging Face model directory
 *       instead (config.json and the weights, in shards above 5 GB;
 *       weights/hf_dir.h). The output lies outside the checkpoint, and a
 *       run still training in the directory read or written (its lock,
 *       ckpt/lock.h) refuses it.
 *
 * DIR is a checkpoint directory, or a run directory (its `latest`).
 */
#include "cli/cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/str.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/lock.h"
#include "train/ckpt/shard.h"
#include "train/weights/hf_dir.h"
#include "train/weights/weights.h"

static void ckpt_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain ckpt info DIR\n"
            "       dtrain ckpt consolidate DIR --out FILE|OUTDIR/ [--dtype fp32|bf16|fp16]\n"
            "\n"
            "info         print a checkpoint's layout: whole-model or sharded (ZeRO stage,\n"
            "             rank count, each shard's tensor pieces), step, data position,\n"
            "             model sizes and the experts' bias, if any. Every file is checked\n"
            "             first (present, whole, each shard of the size and checksum its\n"
            "             manifest records).\n"
            "consolidate  write the whole model of a checkpoint (whole-model or sharded, of\n"
            "             any rank count) to FILE as safetensors with Hugging Face names.\n"
            "             Every shard is checked first; FILE appears whole or not at all,\n"
            "             and must lie outside the checkpoint. A run still training in the\n"
            "             checkpoint's directory (or FILE's) holds its lock: wait for it.\n"
            "             OUTDIR/ (a name ending in '/'): a Hugging Face model\n"
            "             directory instead, config.json and model.safetensors (shards\n"
            "             and model.safetensors.index.json above 5 GB), as from_pretrained\n"
            "             reads it; new, empty, or a model directory whose weights it\n"
            "             replaces.\n"
            "             --dtype: the values stored as bf16 or fp16 (rounded to nearest\n"
            "             even; fp16 refuses a value past its range), fp32 by default.\n"
            "\n"
            "DIR is a checkpoint directory or a run directory (its `latest` is used).\n"
            "\n"
            "examples:\n"
            "  dtrain ckpt info runs/gpt/latest-run\n"
            "  dtrain ckpt consolidate runs/gpt --out model.safetensors\n"
            "  dtrain ckpt consolidate runs/llama --out llama-hf/ --dtype bf16\n");
}

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "dtrain ckpt: %s%s\nRun 'dtrain ckpt --help' for usage.\n", msg, arg);
    return CLI_EXIT_USAGE;
}

static void print_record(const char *dir, const dt_ckpt_record *r)
{
    const dt_gpt_config *c = &r->model;
    printf("checkpoint: %s\n", dir);
    printf("step: %ld  optimizer: %s (step %ld)\n", r->run.step, dt_opt_kind_name(r->optimizer),
           r->optimizer_step);
    printf("data: %llu sequences consumed, global batch %ld, seq_len %d, seed %llu, shuffle %d\n",
           (unsigned long long)r->run.seq_counter, r->run.global_batch, r->run.seq_len,
           (unsigned long long)r->run.seed, r->run.shuffle);
    printf("model: n_layer %d, n_head %d, n_embd %d, vocab_size %d, block_size %d (%zu "
           "parameters)\n",
           c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size,
           c->n_layer ? dt_gpt_param_count(c) : 0);
}

/* One line per shard: its size, pieces, and the first and last of them. */
static void print_shards(const dt_ckpt_manifest *m, const dt_gpt *layout)
{
    for (int s = 0; s < m->nshards; s++) {
        const dt_ckpt_shard *sh = &m->shards[s];
        unsigned long long elems = 0;
        for (int i = 0; i < sh->npieces; i++) elems += sh->pieces[i].hi - sh->pieces[i].lo;
        printf("  %s  %llu bytes  %d pieces  %llu elements", sh->file,
               (unsigned long long)sh->bytes, sh->npieces, elems);
        if (sh->npieces > 0) {
            const dt_ckpt_piece *a = &sh->pieces[0], *z = &sh->pieces[sh->npieces - 1];
            printf("  %s[%llu:%llu] .. %s[%llu:%llu]", layout->tensors[a->tensor].name,
                   (unsigned long long)a->lo, (unsigned long long)a->hi,
                   layout->tensors[z->tensor].name, (unsigned long long)z->lo,
                   (unsigned long long)z->hi);
        }
        printf("\n");
    }
}

static int info_sharded(const char *dir, char *err, size_t errlen)
{
    dt_ckpt_manifest m;
    dt_gpt layout;
    if (dt_ckpt_manifest_read(dir, &m, err, errlen) != 0) return -1;
    int rc = dt_gpt_create_layout(&layout, &m.record.model, DT_PREC_F32, err, errlen);
    if (rc == 0 && (rc = dt_ckpt_manifest_check(dir, &m, &layout, err, errlen)) == 0) {
        print_record(dir, &m.record);
        printf("format: sharded (" DT_CKPT_MANIFEST " version %d), ZeRO stage %d, %d ranks, %d "
               "optimizer buffer(s) per piece\n",
               DT_CKPT_SHARD_VERSION, m.stage, m.ranks, m.moments);
        print_shards(&m, &layout);
    }
    dt_gpt_destroy(&layout);
    dt_ckpt_manifest_free(&m);
    return rc;
}

/* The experts' bias of aux-loss-free balancing, a line per layer, when the
 * checkpoint holds it (each value as %.9g: the float exactly). */
static int print_moe_bias(const char *dir, char *err, size_t errlen)
{
    dt_ckpt_record r;
    if (dt_ckpt_read_record(dir, &r, err, errlen) != 0) return -1;
    if (r.moe_bias_n == 0) return 0;
    const int L = r.model.n_layer, E = r.model.moe.experts;
    float *b = malloc(r.moe_bias_n * sizeof *b);
    if (!b) return dt_strf(err, errlen, "out of memory for the experts' bias"), -1;
    int rc = dt_ckpt_read_moe_bias(dir, b, r.moe_bias_n, err, errlen);
    if (rc == 0) printf("experts' bias (--moe-router-enable-expert-bias): %d layers x %d "
                        "experts\n", L, E);
    for (int l = 0; rc == 0 && l < L; l++) {
        printf("  layer %d:", l);
        for (int e = 0; e < E; e++) printf(" %.9g", (double)b[(size_t)l * E + e]);
        printf("\n");
    }
    free(b);
    return rc < 0 ? -1 : 0;
}

/* Nothing is printed of a checkpoint that would not load: its files are
 * checked first, as a load checks them, and the report says so. */
static int run_info(const char *dir, char *err, size_t errlen)
{
    int nfiles, sharded = dt_ckpt_is_sharded(dir);
    dt_ckpt_record r;
    if (dt_ckpt_check_files(dir, &nfiles, err, errlen) != 0) return -1;
    if (sharded && info_sharded(dir, err, errlen) != 0) return -1;
    if (!sharded) {
        if (dt_ckpt_read_record(dir, &r, err, errlen) != 0) return -1;
        print_record(dir, &r);
        printf("format: whole model (model.safetensors, optimizer.safetensors, state.json)\n");
    }
    if (print_moe_bias(dir, err, errlen) != 0) return -1;
    printf("checked: %d file(s): each present and whole, holding every tensor the checkpoint "
           "needs in its shape%s (values not read)\n",
           nfiles, sharded ? ", of the size and checksum recorded" : "");
    return 0;
}

/* What `name` in dir_real (a canonical directory) is of the checkpoint
 * ck_real and of the run directory holding it, or NULL when nothing. */
static const char *part_of_checkpoint(const char *ck_real, const char *dir_real,
                                      const char *name)
{
    char run[PATH_MAX];
    size_t n = strlen(ck_real);
    if (strncmp(dir_real, ck_real, n) == 0 && (dir_real[n] == '\0' || dir_real[n] == '/'))
        return "inside the checkpoint it reads";
    dt_dir_of(ck_real, run, sizeof run);
    if (strcmp(dir_real, run) != 0) return NULL;
    if (strcmp(name, "latest") == 0) return "the `latest` of the run directory it reads";
    if (strcmp(name, ".lock") == 0) return "the lock of the run directory it reads";
    return NULL;
}

/* --out must not change the checkpoint it is made from: the file written
 * (to target: out with its links followed), the `..` of its path
 * followed too, lies outside it. */
static int check_out(const char *dir, const char *out, char *target, size_t len, char *err,
                     size_t errlen)
{
    char parent[DT_PATH_MAX], ck_real[PATH_MAX], dir_real[PATH_MAX];
    char why[DT_PATH_MAX + 64];
    dt_out_kind kind;
    if (dt_output_target(out, target, len, &kind, why, sizeof why) != 0)
        return dt_strf(err, errlen, "--out %s", why), -1;
    dt_dir_of(target, parent, sizeof parent);
    /* A device is written in place, and a directory that does not resolve
     * makes the write fail, naming it. */
    if (kind == DT_OUT_STREAM || !realpath(dir, ck_real) || !realpath(parent, dir_real)) return 0;
    const char *slash = strrchr(target, '/');
    const char *part = part_of_checkpoint(ck_real, dir_real, slash ? slash + 1 : target);
    if (!part) return 0;
    dt_strf(err, errlen,
            "--out %s: %s (%s); writing it would change what it reads; give a file outside "
            "the checkpoint",
            out, part, dir);
    return -1;
}

/* --out DIR/, a model directory: it lies outside the checkpoint, and
 * holds nothing but a model's files (dt_hf_check_output). */
static int check_out_dir(const char *dir, const char *out, char *err, size_t errlen)
{
    char ck_real[PATH_MAX], at[DT_PATH_MAX], out_real[PATH_MAX];
    if (dt_hf_check_output("--out", out, err, errlen)) return -1;
    /* Where its files go: the directory, or the one it will be made in. */
    dt_strf(at, sizeof at, "%s", out);
    while (!realpath(at, out_real) && strcmp(at, "/") && strcmp(at, ".")) {
        char up[DT_PATH_MAX];
        dt_dir_of(at, up, sizeof up);
        dt_strf(at, sizeof at, "%s", up);
    }
    if (!realpath(dir, ck_real) || !realpath(at, out_real) ||
        !part_of_checkpoint(ck_real, out_real, DT_HF_CONFIG))
        return 0;
    return dt_strf(err, errlen, "--out %s: inside the checkpoint it reads (%s); writing it "
                   "would change what it reads; give a directory outside the checkpoint",
                   out, dir), -1;
}

/* The lock of the run directory a path lies in (see ckpt/lock.h): no run
 * may replace or remove the checkpoint while it is read, nor own the
 * directory the output goes to. *fd: -1, or the lock to release. */
static int lock_run_of(const char *path, int *fd, char *err, size_t errlen)
{
    char run[DT_PATH_MAX];
    dt_dir_of(path, run, sizeof run);
    return dt_ckpt_lock_shared(run, fd, err, errlen);
}

/* The output checked, and the directory its files go in (a model
 * directory's own, or a file's). */
static int check_output(const char *dir, const char *out, char *where, size_t len, char *err,
                        size_t errlen)
{
    char target[DT_PATH_MAX];
    if (dt_hf_is_dir_path(out)) {
        dt_strf(where, len, "%s", out);
        return check_out_dir(dir, out, err, errlen);
    }
    if (check_out(dir, out, target, sizeof target, err, errlen)) return -1;
    dt_dir_of(target, where, len);
    return 0;
}

static int run_consolidate(const char *dir, const char *out, dt_st_dtype dtype, char *err,
                           size_t errlen)
{
    char where[DT_PATH_MAX];
    int locks[2] = {-1, -1};
    if (check_output(dir, out, where, sizeof where, err, errlen) != 0 ||
        lock_run_of(dir, &locks[0], err, errlen) != 0 ||
        dt_ckpt_lock_shared(where, &locks[1], err, errlen) != 0) {
        dt_ckpt_unlock(locks[0]);
        return -1;
    }
    dt_gpt_config cfg;
    dt_gpt m;
    int rc = -1;
    if (dt_ckpt_model_config(dir, &cfg, err, errlen) == 0 &&
        dt_gpt_create(&m, &cfg, DT_PREC_F32, err, errlen) == 0) {
        rc = dt_ckpt_load(dir, &m, NULL, NULL, err, errlen);
        if (rc == 0) rc = dt_weights_save_as(&m, out, dtype, err, errlen);
        if (rc == 0)
            printf("wrote %s: %zu parameters from %s, as %s\n", out, m.n_params, dir,
                   dt_weights_torch_dtype(dtype));
        dt_gpt_destroy(&m);
    }
    dt_ckpt_unlock(locks[0]);
    dt_ckpt_unlock(locks[1]);
    return rc;
}

int cli_ckpt(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        ckpt_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    const char *verb = argv[1], *where = NULL, *out = NULL, *dtype_name = NULL;
    dt_st_dtype dtype = DT_ST_F32;
    if (strcmp(verb, "info") != 0 && strcmp(verb, "consolidate") != 0)
        return usage_error("unknown subcommand ", verb);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc)
            dtype_name = argv[++i];
        else if (argv[i][0] == '-')
            return usage_error("unknown option or missing value: ", argv[i]);
        else if (!where)
            where = argv[i];
        else
            return usage_error("one checkpoint at a time; extra argument ", argv[i]);
    }
    if (!where) return usage_error("a checkpoint or run directory is required", "");
    int consolidate = strcmp(verb, "consolidate") == 0;
    if (consolidate && !out) return usage_error("consolidate needs --out FILE or --out DIR/", "");
    if (!consolidate && (out || dtype_name))
        return usage_error(out ? "--out" : "--dtype", " is for consolidate");
    if (dtype_name && dt_weights_dtype_parse(dtype_name, &dtype))
        return usage_error("--dtype: one of fp32, bf16, fp16, not ", dtype_name);
    char dir[DT_PATH_MAX], err[2048];
    int rc = dt_ckpt_resolve(where, dir, sizeof dir, err, sizeof err);
    if (rc == 0) rc = consolidate ? run_consolidate(dir, out, dtype, err, sizeof err)
                                  : run_info(dir, err, sizeof err);
    if (rc == 0) return 0;
    fprintf(stderr, "dtrain ckpt %s: %s\n", verb, err);
    return 1;
}
