/*
 * Defects of the training configuration found by trying dtrain as a new
 * user would (issue 10); each case failed before its fix: text after the
 * JSON object of --config, an unbounded --threads, ZeRO stages accepted and
 * ignored, and model sizes judged before a file (--init, --resume) gave
 * them. The end-to-end side of the last: test_init_sizes.sh. Then a
 * hostile user's (issue 9 and after): offload_optimizer and offload_param
 * with different nvme_paths (one was used), a snake_case key beside the
 * DeepSpeed key for the same option with another value (the snake_case
 * one won), and a key written twice in one object (the last won).
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "config_util.h"

/* Text after the first JSON object was ignored: refused, naming the file
 * and the line:column (and byte) where the extra text starts. */
static void test_json_trailing_text(void)
{
    static const char *const cases[][2] = {
        {"{\"lr\": 1e-3} garbage", ":1:14: text after the JSON object (byte 13)"},
        {"{\"lr\": 1e-3}\n{\"steps\": 2}\n", ":2:1: text after the JSON object (byte 13)"},
        {"{\"lr\": 1e-3},", ":1:13:"},
        {"{}\n\n  ]", ":3:3:"},
    };
    dt_train_config c;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_config_defaults(&c);
        int rc = dt_config_load_json(&c, write_json(cases[i][0]), err, sizeof err);
        CHECK(rc == -1 && strstr(err, json_path) && strstr(err, cases[i][1]),
              "'%s': rc %d, message '%s' lacks the path or '%s'", cases[i][0], rc, err,
              cases[i][1]);
    }
    /* Blank space after the object is no extra text. */
    dt_config_defaults(&c);
    CHECK(dt_config_load_json(&c, write_json("\n{\"steps\": 7}\n\t \r\n"), err, sizeof err) == 0 &&
              c.steps == 7,
          "trailing blanks: %s", err);
}

/* --threads 65535 passed and crashed OpenMP: at most 1024 per rank, and the
 * message says why; with --strategy dp each device runs that many. */
static void test_threads_bound(void)
{
    dt_train_config c;
    dt_config_defaults(&c);
    CHECK(parse_line(&c, "--threads 65535") == -1 && strstr(err, "--threads: 65535") &&
              strstr(err, "[0, 1024]") && strstr(err, "cores"),
          "--threads 65535: %s", err);
    CHECK(run_line(&c, "--threads 1024", 1) == 0 && c.threads == 1024, "1024: %s", err);
    CHECK(run_line(&c, "--threads 1025", 1) == -1 && strstr(err, "1025"), "1025: %s", err);
    dt_config_defaults(&c);
    c.threads = 5000; /* set by a program, not a flag */
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 && strstr(err, "threads: 5000"),
          "program-set threads: %s", err);
    /* dp: 4 devices x 300 threads each is 1200 threads in one process. */
    CHECK(run_line(&c, "--strategy dp --devices 4 --threads 300", 4) == -1 &&
              strstr(err, "1200") && strstr(err, "1024"),
          "dp devices x threads: %s", err);
    CHECK(run_line(&c, "--strategy dp --devices 4 --threads 256", 4) == 0, "dp 4 x 256: %s", err);
}

/* ZeRO stages 0-3 are accepted by flag, by dtrain's JSON key and by
 * DeepSpeed's (the ZeRO strategies make them act); a stage outside 0-3
 * names the stages, and a stage with a strategy that shares the state its
 * own way (dp, ps) is refused. */
static void test_zero_stage(void)
{
    dt_train_config c;
    for (int s = 0; s <= 3; s++) {
        char line[64];
        snprintf(line, sizeof line, "--zero-stage %d", s);
        CHECK(run_line(&c, line, 2) == 0 && c.zero_stage == s, "%s: %s", line, err);
        char json[96];
        snprintf(json, sizeof json, "{\"zero_optimization\": {\"stage\": %d}}", s);
        dt_config_defaults(&c);
        CHECK(dt_config_load_json(&c, write_json(json), err, sizeof err) == 0 &&
                  c.zero_stage == s, "%s: %s", json, err);
        snprintf(json, sizeof json, "{\"zero_stage\": %d}", s);
        dt_config_defaults(&c);
        CHECK(dt_config_load_json(&c, write_json(json), err, sizeof err) == 0 &&
                  c.zero_stage == s, "%s: %s", json, err);
    }
    dt_config_defaults(&c);
    c.zero_stage = 4; /* set by a program */
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 &&
              strstr(err, "zero_stage: 4 must be in [0, 3]"), "program-set stage 4: %s", err);
    c.zero_stage = -1;
    CHECK(dt_config_validate(&c, 1, err, sizeof err) == -1 &&
              strstr(err, "zero_stage: -1 must be in [0, 3]"), "program-set stage -1: %s", err);
    CHECK(run_line(&c, "--zero-stage 2 --strategy ps", 1) == -1 && strstr(err, "ZeRO stage 2") &&
              strstr(err, "--strategy ps") && strstr(err, "ddp"), "stage 2 with ps: %s", err);
    CHECK(run_line(&c, "--strategy dp --zero-stage 1", 1) == -1 && strstr(err, "--strategy dp"),
          "stage 1 with dp: %s", err);
    CHECK(run_line(&c, "--strategy dp --zero-stage 0", 1) == 0, "stage 0 with dp: %s", err);
}

/* Sizes a weights file (--init) or a checkpoint (--resume) will give are
 * judged by the trainer once merged; validation judged the preset's width
 * instead ("n_embd = 128 is not divisible by n_head = 12"). Sizes given
 * without a file are still checked here. */
static void test_sizes_from_file(void)
{
    static const char *const ok[] = {
        "--init w.safetensors --n-head 12",
        "--init w.safetensors --n-head 7",      /* the trainer checks 7 against the file */
        "--resume=ck/ckpt-00000010 --n-head 12",
        "--out ck --resume --n-head 12",
        "--init w.safetensors --seq-len 1024",  /* the file's block may be that long */
    };
    static const char *const bad[][2] = {
        {"--n-head 12", "n_embd = 128 is not divisible by n_head = 12"},
        {"--init w.safetensors --n-embd 100 --n-head 3",
         "n_embd = 100 is not divisible by n_head = 3"},
        {"--init w.safetensors --block-size 64 --seq-len 100",
         "seq_len = 100 exceeds block_size = 64"},
        {"--seq-len 1024", "seq_len = 1024 exceeds block_size = 128"},
    };
    dt_train_config c;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK(run_line(&c, ok[i], 1) == 0, "'%s' refused: %s", ok[i], err);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_line(&c, bad[i][0], 1);
        CHECK(rc == -1 && strstr(err, bad[i][1]), "'%s': rc %d, '%s' lacks '%s'", bad[i][0], rc,
              err, bad[i][1]);
    }
}

/* Loads text as a --config file onto defaults: 0, or -1 with err. */
static int load(dt_train_config *c, const char *text)
{
    dt_config_defaults(c);
    err[0] = 0;
    return dt_config_load_json(c, write_json(text), err, sizeof err);
}

#define OFFLOAD(opt, par)                                                                      \
    "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\"" opt \
    "}, \"offload_param\": {\"device\": \"nvme\"" par "}}}"

/* offload_optimizer's and offload_param's nvme_path: dtrain has one file
 * for both, and a second path was silently dropped. Two paths are refused
 * naming both; one path in either section, or the same in both, sets it. */
static void test_offload_paths(void)
{
    dt_train_config c;
    static const char *const two[] = {
        OFFLOAD(", \"nvme_path\": \"/mnt/a\"", ", \"nvme_path\": \"/mnt/b\""),
        "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
        "\"nvme_path\": \"/mnt/b\"}, \"offload_optimizer\": {\"device\": \"nvme\", "
        "\"nvme_path\": \"/mnt/a\"}}}"};
    for (int i = 0; i < 2; i++)
        CHECK(load(&c, two[i]) == -1 && strstr(err, json_path) &&
                  strstr(err, "offload_optimizer.nvme_path (/mnt/a)") &&
                  strstr(err, "offload_param.nvme_path (/mnt/b)") &&
                  strstr(err, "one directory") && strstr(err, "give both the same value"),
              "two nvme_paths (%s first): refused naming both and what works: %s",
              i ? "offload_param" : "offload_optimizer", err);
    static const char *const one[] = {
        OFFLOAD(", \"nvme_path\": \"/mnt/a\"", ", \"nvme_path\": \"/mnt/a\""),
        OFFLOAD(", \"nvme_path\": \"/mnt/a\"", ""), OFFLOAD("", ", \"nvme_path\": \"/mnt/a\"")};
    for (int i = 0; i < 3; i++)
        CHECK(load(&c, one[i]) == 0 && !strcmp(c.nvme_path, "/mnt/a") &&
                  !strcmp(c.offload_param, "nvme"),
              "one nvme_path (case %d): %s '%s'", i, err, c.nvme_path);
}

/* A snake_case key and DeepSpeed's key for one option, with different
 * values: the snake_case one won unseen. Refused naming both keys and
 * values; with the same value it is one setting. DeepSpeed's own rule
 * stands (the scheduler's peak rate replaces optimizer.params.lr), and a
 * section's implied setting is a default dtrain's key may refine. */
static void test_key_conflicts(void)
{
    dt_train_config c;
    static const char *const bad[][3] = {
        {"{\"lr\": 1e-3, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}}",
         "optimizer.params.lr (0.002) and lr (0.001) both set --lr", NULL},
        {"{\"grad_clip\": 0.5, \"gradient_clipping\": 1.0}",
         "gradient_clipping (1) and grad_clip (0.5) both set --grad-clip", NULL},
        {"{\"dtype\": \"fp32\", \"bf16\": {\"enabled\": true}}",
         "bf16.enabled (bf16) and dtype (fp32) both set --dtype", NULL},
        {"{\"lr_schedule\": \"linear\", \"scheduler\": {\"type\": \"WarmupCosineLR\"}}",
         "scheduler.type (cosine) and lr_schedule (linear)", NULL},
        {"{\"batch_size\": 4, \"train_micro_batch_size_per_gpu\": 8}",
         "train_micro_batch_size_per_gpu (8) and batch_size (4)", NULL},
        {"{\"lr\": 5e-4, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
         "{\"warmup_max_lr\": 1e-3}}}",
         "scheduler.params.warmup_max_lr (0.001) and lr (0.0005)", NULL},
        {"{\"lr\": 1e-3, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": "
         "0.0010000000000000002}}}",
         "optimizer.params.lr (0.0010000000000000002) and lr (0.001)", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(load(&c, bad[i][0]) == -1 && strstr(err, json_path) && strstr(err, bad[i][1]) &&
                  strstr(err, "keep one of the keys"),
              "%s: refused naming '%s': %s", bad[i][0], bad[i][1], err);
    CHECK(load(&c, "{\"grad_clip\": 0.5, \"gradient_clipping\": 0.5, \"bf16\": {\"enabled\": "
                   "true}, \"dtype\": \"bf16\"}") == 0 &&
              c.grad_clip == 0.5 && !strcmp(c.dtype, "bf16"),
          "both keys with one value: one setting: %s", err);
    CHECK(load(&c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}, "
                   "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": "
                   "1e-3}}}") == 0 && c.lr == 1e-3,
          "warmup_max_lr replaces optimizer.params.lr, as in DeepSpeed: %g %s", c.lr, err);
    CHECK(load(&c, "{\"recompute\": \"selective\", \"activation_checkpointing\": {}}") == 0 &&
              !strcmp(c.recompute, "selective"),
          "activation_checkpointing's full recomputation, refined by recompute: %s %s",
          c.recompute, err);
}

/* A key twice in one object: JSON keeps both and the last won unseen.
 * Refused naming the key and where it is, whatever the values. */
static void test_duplicate_keys(void)
{
    dt_train_config c;
    static const char *const bad[][2] = {
        {"{\"lr\": 1e-3, \"steps\": 5, \"lr\": 2e-3}", "key 'lr' appears twice"},
        {"{\"lr\": 1e-3, \"lr\": 1e-3}", "key 'lr' appears twice"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1, \"lr\": 2}}}",
         "key 'optimizer.params.lr' appears twice"},
        {OFFLOAD(", \"nvme_path\": \"/a\", \"nvme_path\": \"/b\"", ""),
         "key 'zero_optimization.offload_optimizer.nvme_path' appears twice"},
        {"{\"zero_optimization\": {\"stage\": 1}, \"zero_optimization\": {\"stage\": 2}}",
         "key 'zero_optimization' appears twice"},
        {"{\"x\": [{\"a\": 1}, {\"b\": 1, \"b\": 2}]}", "key 'x[1].b' appears twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(load(&c, bad[i][0]) == -1 && strstr(err, json_path) && strstr(err, bad[i][1]) &&
                  strstr(err, "write it once"),
              "%s: refused naming '%s': %s", bad[i][0], bad[i][1], err);
    CHECK(load(&c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {}}, "
                   "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {}}}") == 0,
          "type and params in two objects are no duplicates: %s", err);
}

int main(void)
{
    setenv("DTRAIN_LOG", "error", 1);
    json_path_init("test_config_defects");
    test_json_trailing_text();
    test_threads_bound();
    test_zero_stage();
    test_sizes_from_file();
    test_offload_paths();
    test_key_conflicts();
    test_duplicate_keys();
    remove(json_path);
    return finish("test_config_defects");
}
