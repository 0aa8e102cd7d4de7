/*
 * The training configuration: defaults, presets, JSON (dtrain and DeepSpeed
 * keys) under flags, both flag forms, batch inference, every error message
 * (each must name the flag, key or field at fault), the learning-rate
 * schedule against its formula, warnings, and the example configs.
 * argv[1]: the configs/ directory of the source tree.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config_util.h"

/* ---- capturing stderr (warnings) or stdout (--help) ---------------- */

static int saved_fd = -1;
static FILE *cap_file;
static char captured[65536];

static void capture_begin(int fd)
{
    fflush(stdout), fflush(stderr);
    cap_file = tmpfile();
    saved_fd = dup(fd);
    dup2(fileno(cap_file), fd);
}

static const char *capture_end(int fd)
{
    fflush(stdout), fflush(stderr);
    dup2(saved_fd, fd);
    close(saved_fd);
    rewind(cap_file);
    size_t n = fread(captured, 1, sizeof captured - 1, cap_file);
    captured[n] = 0;
    fclose(cap_file);
    return captured;
}

/* ---- tests ----------------------------------------------------------- */

static void test_defaults(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    CHECK(!strcmp(c.model, "tiny") && c.n_layer == 4 && c.n_head == 4 && c.n_embd == 128 &&
              c.block_size == 128 && c.vocab_size == 0,
          "tiny sizes");
    CHECK(c.batch_size == 8 && c.seq_len == 0 && c.grad_accum == 1 && c.train_batch_size == 0,
          "batch defaults");
    CHECK(c.steps == 200 && c.lr == 1e-3 && c.min_lr == 0 && !strcmp(c.lr_schedule, "cosine") &&
              c.warmup_steps == 0,
          "schedule defaults");
    CHECK(!strcmp(c.optimizer, "adamw") && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8 &&
              c.weight_decay == 0.01 && c.momentum == 0 && c.grad_clip == 1.0,
          "optimizer defaults");
    CHECK(c.seed == 1337 && c.shuffle == 1 && c.threads == 0 && !strcmp(c.dtype, "fp32") &&
              c.val_fraction == 0.1,
          "run defaults");
    CHECK(c.eval_every == 0 && c.eval_batches == 8 && c.save_every == 0 && c.keep_last == 3 &&
              c.print_every == 1 && c.zero_stage == 0 && !c.resume_flag,
          "eval/ckpt defaults");
    CHECK(!c.data[0] && !c.val_data[0] && !c.init[0] && !c.out_dir[0] && !c.save_final[0] &&
              !c.log_json[0] && !c.resume[0],
          "paths unset");
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == 0, "defaults validate: %s", err);
    CHECK(c.seq_len == 128 && c.train_batch_size == 8, "inferred seq_len %d tb %ld", c.seq_len,
          c.train_batch_size);
    CHECK(dt_config_validate(&c, 4, err, sizeof err) == 0 && c.train_batch_size == 32,
          "dp 4: tb %ld", c.train_batch_size);
}

static void test_presets(void)
{
    static const struct { const char *name; int L, H, C, T, V; } want[] = {
        {"tiny", 4, 4, 128, 128, 0},         {"gpt2", 12, 12, 768, 1024, 50257},
        {"gpt2-medium", 24, 16, 1024, 1024, 50257}, {"gpt2-large", 36, 20, 1280, 1024, 50257},
        {"gpt2-xl", 48, 25, 1600, 1024, 50257}, {"bench", 6, 6, 384, 256, 256},
    };
    dt_train_config c;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char line[64];
        snprintf(line, sizeof line, "--model %s", want[i].name);
        CHECK(run_line(&c, line, 1) == 0, "%s: %s", line, err);
        CHECK(!strcmp(c.model, want[i].name) && c.n_layer == want[i].L && c.n_head == want[i].H &&
                  c.n_embd == want[i].C && c.block_size == want[i].T &&
                  c.vocab_size == want[i].V && c.seq_len == want[i].T,
              "preset %s: L%d H%d C%d T%d V%d", want[i].name, c.n_layer, c.n_head, c.n_embd,
              c.block_size, c.vocab_size);
    }
    /* Explicit sizes win over the preset, whichever comes first. */
    CHECK(run_line(&c, "--n-layer 2 --model gpt2 --block-size 256", 1) == 0, "%s", err);
    CHECK(c.n_layer == 2 && c.n_embd == 768 && c.block_size == 256 && c.seq_len == 256,
          "explicit before preset: L%d C%d T%d", c.n_layer, c.n_embd, c.block_size);
    CHECK(run_line(&c, "--model gpt2 --n-layer 3", 1) == 0 && c.n_layer == 3 && c.n_head == 12,
          "explicit after preset");
    CHECK(run_line(&c, "--model=GPT2-Medium", 1) == 0 && !strcmp(c.model, "gpt2-medium") &&
              c.n_layer == 24,
          "preset names are case-insensitive: %s", err);
    CHECK(parse_line(&c, "--model gpt3") == -1 && strstr(err, "--model") && strstr(err, "gpt3"),
          "unknown preset: %s", err);
    /* A JSON size survives a preset given by flag. */
    dt_config_defaults(&c);
    char line[512];
    snprintf(line, sizeof line, "--model bench --config %s",
             write_json("{\"model\": \"gpt2\", \"n_embd\": 96, \"n_head\": 4}"));
    CHECK(parse_line(&c, line) == 0, "%s", err);
    CHECK(!strcmp(c.model, "bench") && c.n_embd == 96 && c.n_head == 4 && c.n_layer == 6 &&
              c.block_size == 256,
          "json sizes + flag preset: L%d H%d C%d", c.n_layer, c.n_head, c.n_embd);
}

static void test_json_then_flags(void)
{
    dt_train_config c;
    const char *p = write_json("{\"lr\": 0.01, \"steps\": 50, \"data\": \"a.bin\", "
                               "\"lr_schedule\": \"constant\", \"shuffle\": false, "
                               "\"seed\": 7, \"log_json\": \"-\", \"out\": \"ck\"}");
    char line[512];
    /* --config at the end is still read before the flags. */
    snprintf(line, sizeof line, "--lr 0.02 --shuffle=1 --config %s", p);
    CHECK(run_line(&c, line, 1) == 0, "%s", err);
    CHECK(c.lr == 0.02 && c.steps == 50 && !strcmp(c.data, "a.bin") &&
              !strcmp(c.lr_schedule, "constant") && c.shuffle == 1 && c.seed == 7 &&
              !strcmp(c.log_json, "-") && !strcmp(c.out_dir, "ck"),
          "json under flags: lr %g steps %ld shuffle %d", c.lr, c.steps, c.shuffle);
}

static void test_flag_forms(void)
{
    dt_train_config c;
    CHECK(run_line(&c, "--lr=3e-4 --steps=1e3 --data=x=y.txt --optimizer=SGD --momentum 0.9 "
                       "--dtype=BF16 --seed=18446744073709551615 --threads=2 --min-lr=1e-5 "
                       "--warmup-steps 10 --lr-schedule=linear --eval-every=5 --save-final=w.st",
                   1) == 0,
          "%s", err);
    CHECK(c.lr == 3e-4 && c.steps == 1000 && !strcmp(c.data, "x=y.txt") &&
              !strcmp(c.optimizer, "sgd") && c.momentum == 0.9 && !strcmp(c.dtype, "bf16") &&
              c.seed == 18446744073709551615ull && c.threads == 2 && c.min_lr == 1e-5 &&
              c.warmup_steps == 10 && !strcmp(c.lr_schedule, "linear") && c.eval_every == 5 &&
              !strcmp(c.save_final, "w.st"),
          "flag forms");
    /* --resume: bare (latest in --out), =DIR, or a separate DIR. */
    CHECK(run_line(&c, "--out ck --resume", 1) == 0 && c.resume_flag && !c.resume[0], "%s", err);
    CHECK(run_line(&c, "--resume=ck/step_100", 1) == 0 && c.resume_flag &&
              !strcmp(c.resume, "ck/step_100"),
          "%s", err);
    CHECK(run_line(&c, "--resume ck/step_5 --steps 9", 1) == 0 && !strcmp(c.resume, "ck/step_5") &&
              c.steps == 9,
          "%s", err);
    CHECK(run_line(&c, "--resume --out ck", 1) == 0 && c.resume_flag && !c.resume[0] &&
              !strcmp(c.out_dir, "ck"),
          "%s", err);
    CHECK(run_line(&c, "--min-lr-ratio 0.1 --lr 2e-3", 1) == 0 && fabs(c.min_lr - 2e-4) < 1e-18,
          "min-lr-ratio: %g", c.min_lr);
    CHECK(run_line(&c, "--min-lr-ratio 0.1 --min-lr 1e-5", 1) == 0 && c.min_lr == 1e-5,
          "later min-lr wins: %g", c.min_lr);
}

static void test_batch_inference(void)
{
    dt_train_config c;
    CHECK(run_line(&c, "--train-batch-size 64 --batch-size 8", 2) == 0 && c.grad_accum == 4,
          "accum inferred: %d (%s)", c.grad_accum, err);
    CHECK(run_line(&c, "--train-batch-size 64 --grad-accum 4", 2) == 0 && c.batch_size == 8,
          "micro inferred: %d (%s)", c.batch_size, err);
    CHECK(run_line(&c, "--train-batch-size 64", 2) == 0 && c.batch_size == 8 && c.grad_accum == 4,
          "tb alone holds the micro-batch: %d x %d", c.batch_size, c.grad_accum);
    CHECK(run_line(&c, "--batch-size 4 --grad-accum 3", 2) == 0 && c.train_batch_size == 24,
          "tb inferred: %ld", c.train_batch_size);
    CHECK(run_line(&c, "--train-batch-size 32 --batch-size 8 --grad-accum 2", 2) == 0, "%s", err);
    CHECK(run_line(&c, "--train-batch-size 64 --batch-size 8 --grad-accum 2", 2) == -1 &&
              strstr(err, "train_batch_size 64") &&
              strstr(err, "batch_size_per_gpu (--batch-size) 8") &&
              strstr(err, "(--grad-accum) 2") && strstr(err, "data-parallel size 2 = 32"),
          "mismatch message: %s", err);
    CHECK(run_line(&c, "--train-batch-size 60 --batch-size 8", 2) == -1 &&
              strstr(err, "train_batch_size 60") && strstr(err, "16") &&
              strstr(err, "gradient_accumulation_steps"),
          "indivisible: %s", err);
    /* The same in DeepSpeed's words, with scientific notation. */
    dt_config_defaults(&c);
    char line[300];
    snprintf(line, sizeof line, "--config %s",
             write_json("{\"train_batch_size\": 1.28e2, \"gradient_accumulation_steps\": 4}"));
    CHECK(parse_line(&c, line) == 0 && dt_config_validate(&c, 4, err, sizeof err) == 0 &&
              c.train_batch_size == 128 && c.grad_accum == 4 && c.batch_size == 8,
          "deepspeed inference: %ld %d %d (%s)", c.train_batch_size, c.grad_accum, c.batch_size,
          err);
    dt_config_defaults(&c);
    snprintf(line, sizeof line, "--config %s",
             write_json("{\"train_batch_size\": 100, \"train_micro_batch_size_per_gpu\": 5, "
                        "\"gradient_accumulation_steps\": 4}"));
    CHECK(parse_line(&c, line) == 0 && dt_config_validate(&c, 2, err, sizeof err) == -1 &&
              strstr(err, "train_batch_size 100") && strstr(err, "5 x") && strstr(err, "4 x") &&
              strstr(err, "= 40"),
          "deepspeed mismatch: %s", err);
    /* Re-validating at another rank count re-infers (nothing is frozen). */
    CHECK(run_line(&c, "--train-batch-size 64", 1) == 0 && c.grad_accum == 8 &&
              dt_config_validate(&c, 4, err, sizeof err) == 0 && c.grad_accum == 2,
          "revalidate: %d", c.grad_accum);
}

static void test_scientific(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    CHECK(dt_config_load_json(&c, write_json("{\"steps\": 1e3, \"warmup_steps\": 1E2, "
                                             "\"n_layer\": 2.0, \"seed\": 4.2e1}"),
                              err, sizeof err) == 0,
          "%s", err);
    CHECK(c.steps == 1000 && c.warmup_steps == 100 && c.n_layer == 2 && c.seed == 42,
          "scientific integers: %ld %ld %d %llu", c.steps, c.warmup_steps, c.n_layer, c.seed);
    CHECK(dt_config_load_json(&c, write_json("{\"n_layer\": 2.5}"), err, sizeof err) == -1 &&
              strstr(err, "n_layer") && strstr(err, "not an integer") && strstr(err, json_path),
          "fraction for an integer: %s", err);
    CHECK(dt_config_load_json(&c, write_json("{\"steps\": 1e300}"), err, sizeof err) == -1 &&
              strstr(err, "steps"),
          "huge: %s", err);
}

/* Each bad command line must fail with a message containing the needle. */
/* --comm-algo: accepted pairs are kept as given and walked in order. */
static int collect_algo(void *ctx, const char *coll, const char *algo, char *e, size_t n)
{
    (void)e, (void)n;
    char *out = ctx;
    snprintf(out + strlen(out), 128 - strlen(out), "%s:%s;", coll, algo);
    return 0;
}

static void test_comm_algo(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    int rc = parse_line(&c, "--comm-algo allreduce=hier,broadcast=auto,alltoall=bruck");
    char seen[128] = "";
    CHECK(rc == 0, "--comm-algo with good pairs refused: %s", err);
    CHECK(dt_config_each_comm_algo(c.comm_algo, collect_algo, seen, err, sizeof err) == 0 &&
              !strcmp(seen, "allreduce:hier;broadcast:auto;alltoall:bruck;"),
          "--comm-algo pairs walked as '%s'", seen);
    const char *path = write_json("{\"comm_algo\": \"allgather=rd\"}");
    dt_config_defaults(&c);
    char line[300];
    snprintf(line, sizeof line, "--config %s", path);
    CHECK(parse_line(&c, line) == 0 && !strcmp(c.comm_algo, "allgather=rd"),
          "comm_algo from JSON: rc, value '%s' (%s)", c.comm_algo, err);
}

static void test_flag_errors(void)
{
    static const char *const cases[][2] = {
        {"--lr abc", "--lr: 'abc' is not a number"},
        {"--steps 1.5", "--steps: '1.5' is not an integer"},
        {"--batch-size 0", "--batch-size: 0 must be >= 1"},
        {"--n-layer -2", "--n-layer: -2 must be >= 1"},
        {"--steps 0x10", "--steps"},
        {"--seed -1", "--seed"},
        {"--shuffle maybe", "--shuffle"},
        {"--bogus 1", "unknown option '--bogus' (see --help)"},
        {"--lrr 1", "did you mean --lr?"},
        {"--batchsize 1", "did you mean --batch-size?"},
        {"--optimizer lamb", "--optimizer: unknown value 'lamb' (one of adamw|adam|sgd)"},
        {"--dtype fp16", "--dtype: unknown value 'fp16'"},
        {"--lr-schedule step", "--lr-schedule: unknown value 'step'"},
        {"--beta1 1", "--beta1: 1 must be in [0, 1)"},
        {"--beta2 -0.1", "--beta2"},
        {"--eps 0", "--eps: 0 must be > 0"},
        {"--weight-decay -1", "--weight-decay: -1 must be >= 0"},
        {"--grad-clip -0.5", "--grad-clip: -0.5 must be >= 0"},
        {"--lr -1", "--lr: -1 must be >= 0"},
        {"--keep-last 0", "--keep-last: 0 must be >= 1"},
        {"--zero-stage 4", "--zero-stage: 4 must be in [0, 3]"},
        {"--val-fraction 1", "--val-fraction"},
        {"--n-head 3000000000", "--n-head"},
        {"--out", "--out needs a value"},
        {"--data --steps 3", "--data needs a value"},
        {"stray", "unexpected argument 'stray'"},
        {"--help=1", "--help takes no value"},
        {"--config /nonexistent/x.json", "/nonexistent/x.json"},
        {"--model", "--model needs a value"},
        {"--comm-algo allreduce=rung", "--comm-algo: 'rung' is not one of the allreduce algorithms (choices: auto, ring"},
        {"--comm-algo reduce=ring", "--comm-algo: 'reduce' has no choice of algorithms"},
        {"--comm-algo allreduce", "--comm-algo: 'allreduce' is not COLLECTIVE=ALGORITHM"},
        {"--comm-algo allreduce=ring,alltoall=", "--comm-algo: 'alltoall=' is not COLLECTIVE=ALGORITHM"},
    };
    dt_train_config c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_config_defaults(&c);
        int rc = parse_line(&c, cases[i][0]);
        CHECK(rc == -1 && strstr(err, cases[i][1]), "'%s': rc %d, message '%s' lacks '%s'",
              cases[i][0], rc, err, cases[i][1]);
    }
}

/* Errors found by dt_config_validate, each naming the field and value. */
static void test_validate_errors(void)
{
    static const char *const cases[][2] = {
        {"--n-embd 130", "n_embd = 130 is not divisible by n_head = 4"},
        {"--seq-len 256", "seq_len = 256 exceeds block_size = 128"},
        {"--warmup-steps 300", "warmup_steps = 300 exceeds steps = 200"},
        {"--resume", "--resume without a directory needs --out"},
        {"--min-lr 0.1", "min_lr = 0.1 exceeds lr = 0.001"},
        {"--save-every 10", "save_every = 10 needs --out"},
    };
    dt_train_config c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_line(&c, cases[i][0], 1);
        CHECK(rc == -1 && strstr(err, cases[i][1]), "'%s': rc %d, message '%s' lacks '%s'",
              cases[i][0], rc, err, cases[i][1]);
    }
    /* Values set by a program, not through flags, are checked as well. */
    dt_config_defaults(&c);
    c.lr = -1;
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 && strstr(err, "lr: -1 must be >= 0"),
          "%s", err);
    dt_config_defaults(&c);
    strcpy(c.optimizer, "lion");
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 && strstr(err, "optimizer") &&
              strstr(err, "lion"),
          "%s", err);
    dt_config_defaults(&c);
    strcpy(c.dtype, "BF16");
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == 0 && !strcmp(c.dtype, "bf16"),
          "canonical dtype: %s", err);
    dt_config_defaults(&c);
    c.n_layer = 0;
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 && strstr(err, "n_layer: 0"), "%s",
          err);
    dt_config_defaults(&c);
    c.beta2 = 1.0;
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 && strstr(err, "beta2: 1"), "%s", err);
    dt_config_defaults(&c);
    CHECK(dt_config_validate(&c, 0, err, sizeof err) == -1 && strstr(err, "data-parallel"),
          "%s", err);
}

/* JSON errors: each names the file and the key, and the expected type. */
static void test_json_errors(void)
{
    static const char *const cases[][2] = {
        {"{\"lr\": \"fast\"}", "lr: expected a number"},
        {"{\"steps\": true}", "steps: expected an integer"},
        {"{\"data\": 5}", "data: expected a string"},
        {"{\"shuffle\": \"yes\"}", "shuffle: expected a boolean"},
        {"{\"batch_size\": 0}", "batch_size: 0 must be >= 1"},
        {"{\"train_micro_batch_size_per_gpu\": -1}", "train_micro_batch_size_per_gpu: -1 must"},
        {"{\"gradient_clipping\": -1}", "gradient_clipping: -1 must be >= 0"},
        {"{\"optimizer\": \"lamb\"}", "optimizer: unknown value 'lamb'"},
        {"{\"optimizer\": {\"type\": \"Lamb\"}}", "optimizer.type: unsupported optimizer 'Lamb'"},
        {"{\"optimizer\": {\"params\": {}}}", "optimizer: missing \"type\""},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9]}}}",
         "optimizer.params.betas: expected an array of 2 numbers"},
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.5]}}}",
         "optimizer.params.betas[1]: 1.5 must be in [0, 1)"},
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"x\"}}}",
         "optimizer.params.lr: expected a number"},
        {"{\"scheduler\": {\"type\": \"OneCycle\"}}", "scheduler.type: unsupported scheduler"},
        {"{\"scheduler\": \"cosine\"}", "scheduler: expected an object"},
        {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 1.5}}}",
         "scheduler.params.warmup_num_steps: 1.5 is not an integer"},
        {"{\"fp16\": {\"enabled\": true}}", "fp16 with loss scaling is not supported yet"},
        {"{\"bf16\": {\"enabled\": \"auto\"}}", "bf16.enabled: expected a boolean"},
        {"{\"bf16\": true}", "bf16: expected an object"},
        {"{\"zero_optimization\": {\"stage\": 5}}", "zero_optimization.stage: 5 must be in [0, 3]"},
        {"{\"model\": \"gpt5\"}", "model: unknown value 'gpt5'"},
        {"{\"lr\": 1e-3,\n \"steps\": }", ":2:"},
        {"[1, 2]", "top level must be a JSON object"},
        {"{\"resume\": 3}", "resume: expected a string or true"},
    };
    dt_train_config c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_config_defaults(&c);
        int rc = dt_config_load_json(&c, write_json(cases[i][0]), err, sizeof err);
        CHECK(rc == -1 && strstr(err, cases[i][1]) && strstr(err, json_path),
              "%s: rc %d, message '%s' lacks '%s' or the path", cases[i][0], rc, err, cases[i][1]);
    }
}

static void test_deepspeed(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    const char *p = write_json(
        "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 5e-4, \"betas\": [0.8, 0.95],"
        " \"eps\": 1e-6, \"weight_decay\": 0.1, \"torch_adam\": true}},"
        " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 1e-5,"
        " \"warmup_max_lr\": 3e-4, \"warmup_num_steps\": 10, \"total_num_steps\": 100,"
        " \"warmup_type\": \"linear\"}},"
        " \"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": false, \"loss_scale\": 0},"
        " \"gradient_clipping\": 0.5, \"steps_per_print\": 20, \"wall_clock_breakdown\": false,"
        " \"zero_optimization\": {\"stage\": 0, \"overlap_comm\": true,"
        " \"reduce_bucket_size\": 5e8}}");
    capture_begin(2);
    int rc = dt_config_load_json(&c, p, err, sizeof err);
    const char *warn = capture_end(2);
    CHECK(rc == 0, "%s", err);
    CHECK(!warn[0], "no warnings expected, got: %s", warn);
    CHECK(!strcmp(c.optimizer, "adamw") && c.lr == 3e-4 && c.beta1 == 0.8 && c.beta2 == 0.95 &&
              c.eps == 1e-6 && c.weight_decay == 0.1,
          "optimizer mapping: %s lr %g", c.optimizer, c.lr);
    CHECK(!strcmp(c.lr_schedule, "linear") && c.min_lr == 1e-5 && c.warmup_steps == 10 &&
              c.steps == 100,
          "scheduler mapping");
    /* ZeRO's stage is test_zero_stage's and test_config_audit's; its
     * bucket is DDP's (5e8 fp32). */
    CHECK(!strcmp(c.dtype, "bf16") && c.grad_clip == 0.5 && c.print_every == 20 &&
              c.zero_stage == 0 && fabs(c.bucket_mb - 5e8 * 4 / 1048576.0) < 1e-9,
          "bf16/clip/print/zero: bucket %g MiB", c.bucket_mb);
}

static void test_deepspeed_precedence(void)
{
    dt_train_config c;
    /* Adam without decoupled decay; WarmupCosineLR's ratio follows a later --lr;
     * a flag beats the file. */
    dt_config_defaults(&c);
    char line[400];
    snprintf(line, sizeof line, "--lr 2e-3 --config %s",
             write_json("{\"optimizer\": {\"type\": \"adam\", \"params\":"
                        " {\"adam_w_mode\": false, \"lr\": 1}}, \"scheduler\": {\"type\":"
                        " \"WarmupCosineLR\", \"params\": {\"cos_min_ratio\": 0.25}},"
                        " \"bf16\": {\"enabled\": false}}"));
    CHECK(run_line(&c, line, 1) == 0, "%s", err);
    CHECK(!strcmp(c.optimizer, "adam") && c.lr == 2e-3 && fabs(c.min_lr - 5e-4) < 1e-18 &&
              !strcmp(c.lr_schedule, "cosine") && !strcmp(c.dtype, "fp32"),
          "adam_w_mode false / ratio: %s %g %g", c.optimizer, c.lr, c.min_lr);
    /* dtrain's own key beside DeepSpeed's for one option: the same value is
     * one setting (test_config_defects has the conflicts). */
    dt_config_defaults(&c);
    CHECK(dt_config_load_json(&c, write_json("{\"lr\": 1e-2, \"optimizer\": {\"type\": \"SGD\","
                                             " \"params\": {\"lr\": 1e-2, \"momentum\": 0.9}}}"),
                              err, sizeof err) == 0 &&
              c.lr == 1e-2 && !strcmp(c.optimizer, "sgd") && c.momentum == 0.9,
          "both keys, one value: %g (%s)", c.lr, err);
    /* resume in JSON: true = latest in out, a string = that directory. */
    dt_config_defaults(&c);
    CHECK(dt_config_load_json(&c, write_json("{\"resume\": true, \"out\": \"o\"}"), err,
                              sizeof err) == 0 &&
              c.resume_flag && !c.resume[0],
          "resume true");
    CHECK(dt_config_load_json(&c, write_json("{\"resume\": \"o/s\"}"), err, sizeof err) == 0 &&
              c.resume_flag && !strcmp(c.resume, "o/s"),
          "resume dir");
    CHECK(dt_config_load_json(&c, write_json("{\"resume\": false}"), err, sizeof err) == 0 &&
              !c.resume_flag,
          "resume false");
}

static void test_warnings(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    const char *p = write_json("{\"steps\": 5, \"foo\": 1, \"optimizer\": {\"type\": \"AdamW\","
                               " \"params\": {\"lr\": 1e-3, \"amsgrad\": true}},"
                               " \"scheduler\": {\"type\": \"WarmupLR\", \"params\":"
                               " {\"warmup_num_steps\": 2}}, \"config\": \"x\","
                               " \"activation_checkpointing\": {}}");
    capture_begin(2);
    int rc = dt_config_load_json(&c, p, err, sizeof err);
    const char *w = capture_end(2);
    CHECK(rc == 0 && c.steps == 5, "unknown keys are not errors: %s", err);
    CHECK(strstr(w, "unknown key 'foo'") && strstr(w, p), "top-level warning: %s", w);
    CHECK(strstr(w, "unknown key 'optimizer.params.amsgrad'"), "nested warning: %s", w);
    CHECK(strstr(w, "unknown key 'config'"), "flag-only option is no JSON key: %s", w);
    CHECK(strstr(w, "warms up linearly"), "log warmup warning: %s", w);
    /* The section asks for checkpointing: full recomputation, no warning. */
    CHECK(!strcmp(c.recompute, "full"), "activation_checkpointing gave recompute '%s'",
          c.recompute);
    CHECK(!strstr(w, "activation_checkpointing"), "a warning about the section: %s", w);
}

/* The schedule against its formula, computed here independently. */
static double ref_lr(const char *sched, double lr, double min_lr, long W, long S, long step)
{
    if (step < W) return lr * (step + 1) / (double)W;
    if (!strcmp(sched, "constant")) return lr;
    double p = S > W ? (double)(step - W) / (double)(S - W) : 1.0;
    if (p > 1) p = 1;
    if (!strcmp(sched, "cosine")) return min_lr + 0.5 * (lr - min_lr) * (1 + cos(acos(-1.0) * p));
    return min_lr + (lr - min_lr) * (1 - p);
}

static void test_schedule(void)
{
    static const char *const scheds[] = {"constant", "cosine", "linear"};
    static const long steps[] = {0, 1, 5, 9, 10, 11, 55, 99, 100, 150};
    dt_train_config c;
    for (int s = 0; s < 3; s++) {
        char line[200];
        /* A constant schedule has no floor: min_lr is refused with it. */
        snprintf(line, sizeof line, "--lr-schedule %s --lr 1e-3 %s --warmup-steps 10 --steps 100",
                 scheds[s], s == 0 ? "" : "--min-lr 1e-4");
        CHECK(run_line(&c, line, 1) == 0, "%s", err);
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            double got = dt_config_lr_at(&c, steps[i]);
            double want = ref_lr(scheds[s], 1e-3, 1e-4, 10, 100, steps[i]);
            CHECK(fabs(got - want) <= 1e-15, "%s step %ld: %.17g vs %.17g", scheds[s], steps[i],
                  got, want);
        }
    }
    /* Landmarks: the peak right after warmup, the midpoint, the floor. */
    CHECK(run_line(&c, "--lr 1e-3 --min-lr 1e-4 --warmup-steps 10 --steps 110", 1) == 0, "%s", err);
    CHECK(fabs(dt_config_lr_at(&c, 0) - 1e-4) < 1e-18, "first warmup step");
    CHECK(dt_config_lr_at(&c, 10) == 1e-3, "peak after warmup");
    CHECK(fabs(dt_config_lr_at(&c, 60) - 5.5e-4) < 1e-15, "cosine midpoint");
    CHECK(fabs(dt_config_lr_at(&c, 110) - 1e-4) < 1e-18, "floor at the end");
    CHECK(run_line(&c, "--warmup-steps 5 --steps 5", 1) == 0 &&
              fabs(dt_config_lr_at(&c, 4) - 1e-3) < 1e-18 && dt_config_lr_at(&c, 5) == 0,
          "warmup == steps");
    CHECK(run_line(&c, "--lr-schedule constant", 1) == 0 && dt_config_lr_at(&c, 0) == 1e-3 &&
              dt_config_lr_at(&c, 199) == 1e-3,
          "constant without warmup");
}

static void test_help_and_print(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    capture_begin(1);
    int rc = parse_line(&c, "--steps abc --help");
    const char *u = capture_end(1);
    CHECK(rc == 1, "--help returns 1, got %d", rc);
    static const char *const want[] = {"Model:", "Batch:", "Optimizer and schedule:",
                                       "--lr X", "[0.001]", "--resume[=DIR]",
                                       "--model tiny|gpt2", "[tiny]", "--config FILE",
                                       "train_micro_batch_size_per_gpu", "--zero-stage N"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(u, want[i]), "usage lacks '%s'", want[i]);
    for (const char *line = u; *line;) {
        size_t len = strcspn(line, "\n");
        CHECK(len <= 100, "usage line over 100 columns: %.*s", (int)len, line);
        line += len + (line[len] == '\n');
    }
    CHECK(run_line(&c, "--model gpt2 --data d.bin --out o", 2) == 0, "%s", err);
    capture_begin(1);
    dt_config_print(&c, stdout);
    const char *s = capture_end(1);
    CHECK(strstr(s, "gpt2") && strstr(s, "n_embd 768") && strstr(s, "d.bin") &&
              strstr(s, "16 seq per step") && strstr(s, "adamw"),
          "summary: %s", s);
}

/* The example configs load without warnings and validate at 1 and 2 ranks. */
static void test_examples(const char *dir)
{
    static const char *const files[] = {"tiny.json", "gpt2-small-bf16.json", "bench.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        for (int dp = 1; dp <= 2; dp++) {
            dt_train_config c;
            dt_config_defaults(&c);
            capture_begin(2);
            int rc = dt_config_load_json(&c, path, err, sizeof err);
            const char *w = capture_end(2);
            CHECK(rc == 0 && !w[0], "%s: %s %s", path, err, w);
            CHECK(dt_config_validate(&c, dp, err, sizeof err) == 0, "%s dp %d: %s", path, dp, err);
            if (strstr(files[i], "gpt2"))
                CHECK(!strcmp(c.dtype, "bf16") && c.n_embd == 768 && c.train_batch_size == 64 &&
                          c.grad_accum == 16 / dp && fabs(c.min_lr - 6e-5) < 1e-15,
                      "gpt2-small-bf16: %s C%d tb %ld accum %d", c.dtype, c.n_embd,
                      c.train_batch_size, c.grad_accum);
        }
    }
}

int main(int argc, char **argv)
{
    setenv("DTRAIN_LOG", "warn", 1); /* warnings are part of what is tested */
    json_path_init("test_config");
    test_defaults();
    test_presets();
    test_json_then_flags();
    test_flag_forms();
    test_batch_inference();
    test_scientific();
    test_flag_errors();
    test_comm_algo();
    test_validate_errors();
    test_json_errors();
    test_deepspeed();
    test_deepspeed_precedence();
    test_warnings();
    test_schedule();
    test_help_and_print();
    if (argc > 1) test_examples(argv[1]);
    remove(json_path);
    return finish("test_config");
}
