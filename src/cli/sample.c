/* `dtrain sample`: generate text from a checkpoint or a weights file, so a
 * user sees what the model learned. The prompt is encoded and the tokens
 * decoded with the tokenizer the checkpoint records (its training data's),
 * or the one --tokenizer names; a model of 256 tokens without one reads
 * bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/rand.h"
#include "core/str.h"
#include "kernels/threads.h"
#include "model/gpt.h"
#include "tokenizer/tokenizer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/shard.h"
#include "train/weights/hf_dir.h"
#include "train/weights/weights.h"
#include "core/parse.h"

typedef struct {
    const char *ckpt;
    const char *prompt;
    long tokens;
    double temperature;
    long top_k;
    unsigned long long seed;
    long threads;
    long moe_topk; /* 0: the file's */
    const char *tokenizer; /* NULL: the checkpoint's */
} sample_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain sample --ckpt PATH [--prompt TEXT] [options]\n"
            "\n"
            "Generates text from a trained model, with the tokenizer its data was\n"
            "prepared with (the checkpoint records it).\n"
            "  --ckpt PATH         a run directory (its latest checkpoint), a checkpoint\n"
            "                      directory, a .safetensors weights file, or a Hugging\n"
            "                      Face model directory (config.json and its weights)\n"
            "  --prompt TEXT       the text to continue (default: a newline for bytes, the\n"
            "                      end-of-text token for a tokenizer: a new document)\n"
            "  --tokenizer T       bytes, gpt2, a directory of GPT-2's files or a ranks\n"
            "                      file: for a weights file or a checkpoint that records\n"
            "                      none (default: bytes at a vocabulary of 256); for one\n"
            "                      that does, where to find it (it must be the same)\n"
            "  --tokens N          tokens to generate (default 256)\n"
            "  --temperature T     softmax temperature, > 0 (default 0.8)\n"
            "  --top-k K           sample among the K likeliest tokens; 0 = all (default 40)\n"
            "  --seed S            random seed (default 1337)\n"
            "  --threads N         compute threads (default 1)\n"
            "  --moe-router-topk K a mixture of experts' top K, for a weights file that\n"
            "                      does not record it (default: the file's)\n");
}

static int parse_number(const char *flag, const char *v, double lo, double hi, double *out)
{
    double x;
    if (dt_parse_double(v, lo, hi, &x)) {
        fprintf(stderr, "dtrain sample: %s: '%s' is not a number in [%g, %g]\n", flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_args(int argc, char **argv, sample_args *a)
{
    *a = (sample_args){NULL, NULL, 256, 0.8, 40, 1337, 1, 0, NULL};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            usage(stdout);
            return 1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dtrain sample: %s needs a value (see --help)\n", f);
            return -1;
        }
        const char *v = argv[++i];
        double x;
        if (strcmp(f, "--ckpt") == 0) a->ckpt = v;
        else if (strcmp(f, "--prompt") == 0) a->prompt = v;
        else if (strcmp(f, "--tokenizer") == 0) a->tokenizer = v;
        else if (strcmp(f, "--tokens") == 0) {
            if (parse_number(f, v, 1, 1e7, &x)) return -1;
            a->tokens = (long)x;
        } else if (strcmp(f, "--temperature") == 0) {
            if (parse_number(f, v, 1e-4, 1e4, &a->temperature)) return -1;
        } else if (strcmp(f, "--top-k") == 0) {
            if (parse_number(f, v, 0, 1e9, &x)) return -1;
            a->top_k = (long)x;
        } else if (strcmp(f, "--seed") == 0) {
            if (parse_number(f, v, 0, 1.8e19, &x)) return -1;
            a->seed = (unsigned long long)x;
        } else if (strcmp(f, "--threads") == 0) {
            if (parse_number(f, v, 1, 1024, &x)) return -1;
            a->threads = (long)x;
        } else if (strcmp(f, "--moe-router-topk") == 0) {
            if (parse_number(f, v, 1, DT_MOE_MAX_EXPERTS, &x)) return -1;
            a->moe_topk = (long)x;
        } else {
            fprintf(stderr, "dtrain sample: unknown option %s (see --help)\n", f);
            return -1;
        }
    }
    if (a->prompt && !a->prompt[0]) {
        fprintf(stderr, "dtrain sample: --prompt is empty; give at least one character\n");
        return -1;
    }
    if (!a->ckpt) {
        fprintf(stderr, "dtrain sample: --ckpt is required (see --help)\n");
        return -1;
    }
    return 0;
}

/* The weights file behind --ckpt and the model's sizes: a checkpoint's
 * from its state.json (checked against the weights), a bare weights
 * file's from the file, a model directory's from its config.json. */
static int resolve_model(const char *ckpt, char *path, size_t len, int *is_ckpt,
                         dt_gpt_config *cfg, char *err, size_t errlen)
{
    *is_ckpt = 0;
    struct stat st;
    if (stat(ckpt, &st) != 0) {
        dt_strf(err, errlen, "--ckpt %s: no such file or directory", ckpt);
        return -1;
    }
    if (!S_ISDIR(st.st_mode) || dt_hf_is_model_dir(ckpt)) { /* a Hugging Face directory too */
        dt_strf(path, len, "%s", ckpt);
        return dt_weights_inspect(path, cfg, err, errlen);
    }
    char dir[4200];
    if (dt_ckpt_resolve(ckpt, dir, sizeof dir, err, errlen)) return -1;
    dt_strf(path, len, "%s", dir);
    *is_ckpt = 1; /* whole or in shards (ZeRO): loaded as one range */
    return dt_ckpt_model_config(dir, cfg, err, errlen);
}

/* A mixture of experts routes as it trained: GPT-2's blocks with a moe
 * branch (a weights file records no blocks), and the top K the file
 * records, or the one asked for. */
static int moe_routing(dt_gpt_config *cfg, const sample_args *a, const char *path, char *err,
                       size_t errlen)
{
    if (!cfg->moe.experts) {
        if (a->moe_topk)
            return dt_strf(err, errlen, "--moe-router-topk: %s has no experts", path), -1;
        return 0;
    }
    if (!cfg->blocks[0]) dt_strf(cfg->blocks, sizeof cfg->blocks, "%s", dt_gpt_blocks(cfg));
    if (a->moe_topk) cfg->moe.topk = (int)a->moe_topk;
    if (!cfg->moe.topk)
        return dt_strf(err, errlen, "%s does not record its experts' top K: give "
                       "--moe-router-topk K (the value it trained with)", path), -1;
    if (cfg->moe.topk > cfg->moe.experts)
        return dt_strf(err, errlen, "--moe-router-topk %d with %d experts: K <= %d",
                       cfg->moe.topk, cfg->moe.experts, cfg->moe.experts), -1;
    return 0;
}

static int float_desc(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a < b) - (a > b);
}

/* Draws from softmax(logits / temperature) over the top_k largest logits;
 * scratch holds V floats. */
static int draw(const float *logits, int V, const sample_args *a, uint64_t *rng, float *scratch,
                double *prob)
{
    float kth = -INFINITY;
    if (a->top_k > 0 && a->top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof *scratch);
        qsort(scratch, (size_t)V, sizeof *scratch, float_desc);
        kth = scratch[a->top_k - 1];
    }
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        prob[i] = logits[i] >= kth ? exp((logits[i] - mx) / a->temperature) : 0.0;
        sum += prob[i];
    }
    double u = dt_uniform01(rng) * sum;
    for (int i = 0; i < V; i++) {
        u -= prob[i];
        if (u < 0) return i;
    }
    return V - 1;
}

/* Finite weights can still overflow on the way to the logits; sampling
 * from them would print noise. */
static int check_logits(const float *logits, int V, size_t n, char *err, size_t errlen)
{
    for (int i = 0; i < V; i++) {
        if (isfinite(logits[i])) continue;
        dt_strf(err, errlen,
                "the logits after %zu tokens are not finite (%s for token %d): the weights "
                "overflow",
                n, isnan(logits[i]) ? "nan" : logits[i] > 0 ? "inf" : "-inf", i);
        return -1;
    }
    return 0;
}

/* The prompt's tokens into seq (room for its bytes, or one), printed: 0
 * when memory runs out. */
static size_t encode_prompt(dt_tokenizer *tok, const sample_args *a, int32_t *seq, char *err,
                            size_t errlen)
{
    const dt_tok_ref *ref = dt_tokenizer_ref(tok);
    if (!a->prompt && ref->eot >= 0) { /* a new document: nothing to print */
        seq[0] = ref->eot;
        return 1;
    }
    const char *prompt = a->prompt ? a->prompt : "\n";
    dt_tok_ids ids = {0};
    size_t used;
    if (dt_tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &used) != 0) {
        dt_tok_ids_free(&ids);
        dt_strf(err, errlen, "out of memory encoding the prompt");
        return 0;
    }
    for (size_t i = 0; i < ids.n; i++) seq[i] = (int32_t)ids.v[i];
    size_t n = ids.n;
    dt_tok_ids_free(&ids);
    fputs(prompt, stdout);
    return n;
}

/* Ids past the tokenizer's (a vocabulary padded for speed, a gap in the
 * ranks) are never drawn: they have no text. */
static void mask_untokens(dt_tokenizer *tok, float *logits, int V)
{
    size_t len;
    for (int i = 0; i < V; i++)
        if (!dt_tokenizer_decode(tok, (uint32_t)i, &len)) logits[i] = -INFINITY;
}

static int generate(dt_gpt *m, dt_tokenizer *tok, const sample_args *a, char *err, size_t errlen)
{
    const int V = m->cfg.vocab_size, maxT = m->cfg.block_size;
    size_t cap = (a->prompt ? strlen(a->prompt) : 1) + (size_t)a->tokens;
    int32_t *seq = malloc(cap * sizeof *seq);
    double *prob = malloc((size_t)V * sizeof *prob);
    float *scratch = malloc((size_t)V * sizeof *scratch);
    float *logits = malloc((size_t)V * sizeof *logits);
    int rc = seq && prob && scratch && logits ? 0 : (dt_strf(err, errlen, "out of memory"), -1);
    size_t n = rc == 0 ? encode_prompt(tok, a, seq, err, errlen) : 0;
    if (n == 0) rc = -1;
    uint64_t rng = a->seed;
    for (long k = 0; k < a->tokens && rc == 0; k++) {
        int t = n > (size_t)maxT ? maxT : (int)n;
        if (dt_gpt_forward(m, seq + n - t, NULL, 1, t) < 0) {
            dt_strf(err, errlen, "%s", m->error);
            rc = -1;
            break;
        }
        memcpy(logits, m->acts.logits + (size_t)(t - 1) * V, (size_t)V * sizeof *logits);
        if (check_logits(logits, V, n, err, errlen) != 0) {
            rc = -1;
            break;
        }
        mask_untokens(tok, logits, V);
        int id = draw(logits, V, a, &rng, scratch, prob);
        seq[n++] = id;
        size_t len;
        const unsigned char *bytes = dt_tokenizer_decode(tok, (uint32_t)id, &len);
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
    }
    putchar('\n');
    free(seq);
    free(prob);
    free(scratch);
    free(logits);
    return rc;
}

/* The tokenizer to read and write text with: the checkpoint's record
 * (found where --tokenizer says, if given), else --tokenizer, else bytes
 * for a model of 256 tokens. */
static int open_tokenizer(const sample_args *a, const char *path, int is_ckpt,
                          const dt_gpt_config *cfg, dt_tokenizer **tok, char *err,
                          size_t errlen)
{
    dt_ckpt_record rec = {0};
    if (is_ckpt && dt_ckpt_read_record(path, &rec, err, errlen)) return -1;
    const dt_tok_ref *ref = &rec.run.tokenizer;
    const char *spec = a->tokenizer ? a->tokenizer : "bytes";
    if (!ref->spec[0] && !a->tokenizer && cfg->vocab_size != 256)
        return dt_strf(err, errlen, "%s has a vocabulary of %d and records no tokenizer: give "
                       "--tokenizer (gpt2, a directory of GPT-2's files, or a ranks file)",
                       path, cfg->vocab_size), -1;
    int rc = ref->spec[0] ? dt_tokenizer_open_ref(ref, a->tokenizer, tok, err, errlen)
                          : dt_tokenizer_open(spec, DT_SPLIT_NONE, -1, tok, err, errlen);
    if (rc != 0) return -1;
    int need = dt_tokenizer_ref(*tok)->vocab;
    if (need <= cfg->vocab_size) return 0;
    dt_strf(err, errlen, "%s has a vocabulary of %d, smaller than its tokenizer's (%s: %d)", path,
            cfg->vocab_size, dt_tokenizer_ref(*tok)->spec, need);
    dt_tokenizer_close(*tok);
    *tok = NULL;
    return -1;
}

int cli_sample(int argc, char **argv)
{
    sample_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc > 0 ? 0 : CLI_EXIT_USAGE;
    char path[4300], err[1024];
    dt_gpt_config cfg;
    dt_gpt m;
    dt_kernels_flush_denormals(); /* as the trainer runs the model (kernels/threads.h) */
    dt_kernels_set_threads((int)a.threads);
    int is_ckpt;
    if (resolve_model(a.ckpt, path, sizeof path, &is_ckpt, &cfg, err, sizeof err)) {
        fprintf(stderr, "dtrain sample: %s\n", err);
        return 1;
    }
    dt_tokenizer *tok = NULL;
    if (open_tokenizer(&a, path, is_ckpt, &cfg, &tok, err, sizeof err)) {
        fprintf(stderr, "dtrain sample: %s\n", err);
        return 1;
    }
    if (cfg.n_head == 0) {
        fprintf(stderr, "dtrain sample: %s does not record n_head\n", path);
        return 1;
    }
    if (moe_routing(&cfg, &a, path, err, sizeof err)) {
        fprintf(stderr, "dtrain sample: %s\n", err);
        return 1;
    }
    /* A checkpoint's experts' bias (aux-loss-free balancing) steers the
     * routing, so the model samples as it trained. */
    dt_ckpt_record rec = {0};
    if (is_ckpt && cfg.moe.experts && dt_ckpt_read_record(path, &rec, err, sizeof err)) {
        fprintf(stderr, "dtrain sample: %s\n", err);
        return 1;
    }
    cfg.moe.expert_bias = rec.moe_bias_n > 0;
    if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
        fprintf(stderr, "dtrain sample: %s\n", err);
        return 1;
    }
    rc = is_ckpt ? dt_ckpt_load(path, &m, NULL, NULL, err, sizeof err)
                 : dt_weights_load(&m, path, err, sizeof err);
    if (rc == 0 && m.moe.bias &&
        dt_ckpt_read_moe_bias(path, m.moe.bias, rec.moe_bias_n, err, sizeof err) < 0)
        rc = -1;
    if (rc == 0 && dt_gpt_alloc_acts(&m, 1, cfg.block_size) != 0) {
        dt_strf(err, sizeof err, "%s", m.error);
        rc = -1;
    }
    if (rc == 0) rc = generate(&m, tok, &a, err, sizeof err);
    if (rc != 0) fprintf(stderr, "dtrain sample: %s\n", err);
    dt_gpt_destroy(&m);
    dt_tokenizer_close(tok);
    return rc != 0;
}
