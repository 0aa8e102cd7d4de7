/*
 * Checkpoints at the API: an exact round trip, state.json refused when a
 * number is out of its range, the experts' bias kept to the bit (and
 * refused with a wrong count or a non-finite value), non-finite values
 * never saved, a save that
 * fails half way leaving the directory as it was, pruning past step
 * 99999999, resuming a run without `latest`, and the lock that keeps a
 * second run out of an output directory (taken from two processes).
 *
 *   test_checkpoint unit
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "model/gpt.h"
#include "model/optimizer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/lock.h"
#include "train/weights/weights.h"

static char root[256];

static const char *path_in(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The names in dir, sorted and joined by spaces ("." and ".." left out). */
static const char *listing(const char *dir)
{
    static char out[1024];
    char *names[64];
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 64)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
    if (d) closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", i ? " " : "", names[i]);
        free(names[i]);
    }
    return out;
}

static void remove_all(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", path);
}

static dt_gpt model;
static dt_optimizer opt;

static void make_model(void)
{
    char err[256];
    dt_gpt_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 16,
                         .block_size = 4};
    if (dt_gpt_create(&model, &cfg, DT_PREC_F32, err, sizeof err) != 0 ||
        dt_optimizer_init(&opt, DT_OPT_ADAMW, model.n_floats, 0.9, 0.95, 1e-8, 0.1, 0) != 0) {
        fprintf(stderr, "setup: %s\n", err);
        exit(1);
    }
    dt_gpt_init_weights(&model, 11);
    for (int k = 0; k < model.n_tensors; k++) { /* the padding between tensors stays 0 */
        const dt_param_tensor *p = &model.tensors[k];
        for (size_t i = p->offset; i < p->offset + p->numel; i++) {
            opt.m[i] = 0.001f * (float)(i % 17) - 0.008f;
            opt.v[i] = 1e-6f * (float)(i % 5);
        }
    }
    opt.t = 3;
}

static dt_ckpt_state state_at(long step)
{
    return (dt_ckpt_state){.step = step, .seq_counter = (uint64_t)step * 8, .seed = 7,
                           .shuffle = 1, .seq_len = 4, .global_batch = 8, .last_loss = 2.5,
                           .data_tokens = 1000};
}

static int save(const char *out, long step, long keep, char *err, size_t errlen)
{
    dt_ckpt_state s = state_at(step);
    return dt_ckpt_save(out, &model, &opt, &s, keep, NULL, 0, err, errlen);
}

static const char *latest_of(const char *out)
{
    static char line[64];
    char path[600];
    snprintf(path, sizeof path, "%s/latest", out);
    FILE *f = fopen(path, "r");
    line[0] = '\0';
    if (f && !fgets(line, sizeof line, f)) line[0] = '\0';
    if (f) fclose(f);
    line[strcspn(line, "\n")] = '\0';
    return line;
}

static void test_round_trip(void)
{
    char err[1024], dir[600];
    char out[600];
    snprintf(out, sizeof out, "%s", path_in("rt"));
    CHECK(save(out, 3, 2, err, sizeof err) == 0, "save: %s", err);
    CHECK(dt_ckpt_resolve(out, dir, sizeof dir, err, sizeof err) == 0, "resolve: %s", err);
    CHECK(strcmp(dir, path_in("rt/ckpt-00000003")) == 0, "resolved %s", dir);
    dt_gpt_config cfg;
    CHECK(dt_ckpt_model_config(dir, &cfg, err, sizeof err) == 0, "model config: %s", err);
    CHECK(cfg.n_layer == 1 && cfg.n_head == 2 && cfg.n_embd == 8 && cfg.vocab_size == 16 &&
              cfg.block_size == 4,
          "sizes %d %d %d %d %d", cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size,
          cfg.block_size);
    dt_gpt m2;
    dt_optimizer o2;
    if (dt_gpt_create(&m2, &cfg, DT_PREC_F32, err, sizeof err) != 0 ||
        dt_optimizer_init(&o2, DT_OPT_ADAMW, m2.n_floats, 0.9, 0.95, 1e-8, 0.1, 0) != 0) {
        CHECK(0, "second model: %s", err);
        return;
    }
    dt_ckpt_state s;
    CHECK(dt_ckpt_load(dir, &m2, &o2, &s, err, sizeof err) == 0, "load: %s", err);
    CHECK(s.step == 3 && s.seq_counter == 24 && s.seed == 7 && s.shuffle == 1 && s.seq_len == 4 &&
              s.global_batch == 8 && s.last_loss == 2.5 && s.data_tokens == 1000,
          "state differs");
    CHECK(o2.t == 3, "optimizer step %ld", o2.t);
    CHECK(memcmp(m2.params, model.params, model.n_floats * sizeof(float)) == 0, "weights");
    CHECK(memcmp(o2.m, opt.m, model.n_floats * sizeof(float)) == 0, "first moments");
    CHECK(memcmp(o2.v, opt.v, model.n_floats * sizeof(float)) == 0, "second moments");
    dt_optimizer_free(&o2);
    dt_gpt_destroy(&m2);
}

/* Counters past what a double holds exactly travel as strings. */
static void test_state_ranges(void)
{
    char err[1024];
    dt_ckpt_record r;
    const char *head = "{\"format\": 1, \"step\": 2, \"shuffle\": 0, \"seq_len\": 4, "
                       "\"global_batch\": 1, \"last_loss\": null, \"optimizer\": \"sgd\", "
                       "\"optimizer_step\": 2, ";
    char text[512];
    snprintf(text, sizeof text, "%s\"seq_counter\": \"9223372036854775807\", "
             "\"seed\": \"18446744073709551615\"}", head);
    CHECK(dt_ckpt_state_parse("s.json", text, &r, err, sizeof err) == 0, "largest: %s", err);
    CHECK(r.run.seq_counter == 9223372036854775807ull && r.run.seed == UINT64_MAX &&
              isnan(r.run.last_loss) && r.model.n_layer == 0 && r.run.data_tokens == 0,
          "largest values read back wrong");
    snprintf(text, sizeof text, "%s\"seq_counter\": \"9223372036854775808\", \"seed\": \"1\"}",
             head);
    CHECK_ERR(dt_ckpt_state_parse("s.json", text, &r, err, sizeof err), err,
              "s.json: \"seq_counter\" is \"9223372036854775808\"");
    snprintf(text, sizeof text, "%s\"seq_counter\": \"8\", \"seed\": \"1\"} {}", head);
    CHECK_ERR(dt_ckpt_state_parse("s.json", text, &r, err, sizeof err), err,
              "s.json: not valid JSON");
    snprintf(text, sizeof text, "%s\"seq_counter\": \"8\", \"seed\": \"1\", "
             "\"model\": {\"n_layer\": 1, \"n_head\": 3, \"n_embd\": 8, \"vocab_size\": 16, "
             "\"block_size\": 4}}", head);
    CHECK_ERR(dt_ckpt_state_parse("s.json", text, &r, err, sizeof err), err,
              "s.json: \"model\" does not describe a model", "divisible");
    snprintf(text, sizeof text, "%s\"seq_counter\": \"8\", \"seed\": \"1\", "
             "\"model\": {\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 0, "
             "\"block_size\": 4}}", head);
    CHECK_ERR(dt_ckpt_state_parse("s.json", text, &r, err, sizeof err), err,
              "s.json: \"model.vocab_size\" is 0; it must be an integer from 1 to 2147483647");
}

/* state.json's text of a model of 2 layers of 3 experts, holding bias (or
 * none), with "moe_expert_bias" then replaced by the JSON `replace` when
 * it is not NULL (malloc'd). */
static char *moe_state(const float *bias, const char *replace)
{
    dt_ckpt_record r = {.run = {.step = 1, .seq_counter = 1, .seed = 1, .seq_len = 4,
                                .global_batch = 1, .last_loss = 1, .moe_bias = bias},
                        .optimizer = DT_OPT_ADAMW, .optimizer_step = 1,
                        .model = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 16,
                                  .block_size = 4, .moe = {.experts = 3, .topk = 2}}};
    snprintf(r.model.blocks, sizeof r.model.blocks, "%s", dt_blocks_gpt2_moe);
    char *text = dt_ckpt_state_format(&r);
    if (!replace || !text) return text;
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON_DeleteItemFromObject(j, "moe_expert_bias");
    cJSON_AddItemToObject(j, "moe_expert_bias", cJSON_Parse(replace));
    text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

/* The bias's floats come back bit for bit (-0, a denormal, 1/3, the
 * largest float); a wrong count of layers or values, a word that is not 8
 * hexadecimal digits, a NaN or an infinity, and a bias without experts
 * are refused naming the file, the place and the counts. */
static void test_state_moe_bias(void)
{
    char err[1024];
    const float bias[6] = {-0.0f, 1e-40f, 1.0f / 3.0f, -2.0f, 3.4028235e38f, 0.1f};
    char *text = moe_state(bias, NULL);
    dt_ckpt_record r;
    float back[6];
    memset(back, 0x55, sizeof back);
    CHECK(text && dt_ckpt_state_parse("s.json", text, &r, err, sizeof err) == 0, "parse: %s",
          err);
    CHECK(r.moe_bias_n == 6 && r.run.moe_bias == NULL, "moe_bias_n %zu", r.moe_bias_n);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECK(dt_ckpt_state_moe_bias("s.json", j, &r, back, err, sizeof err) == 0, "read: %s", err);
    CHECK(memcmp(back, bias, sizeof bias) == 0, "the bias's bits differ after the round trip");
    CHECK(text && strstr(text, "\"80000000 000116c2 3eaaaaab\", \"c0000000 7f7fffff 3dcccccd\""),
          "state.json's words: %s", text);
    cJSON_Delete(j);
    free(text);
    const struct {
        const char *bias, *want;
    } bad[] = {
        {"[\"00000000 00000000 00000000\"]",
         "s.json: \"moe_expert_bias\" holds 1 layers; the model has 2 (\"model.n_layer\")"},
        {"[\"00000000 00000000 00000000\", \"00000000 00000000\"]",
         "s.json: \"moe_expert_bias\"[1] holds 2 values; the model has 3 experts a layer"},
        {"[\"00000000 00000000 00000000 00000000\", \"00000000 00000000 00000000\"]",
         "\"moe_expert_bias\"[0] holds 4 values; the model has 3 experts a layer"},
        {"[\"00000000 0000000g 00000000\", \"00000000 00000000 00000000\"]",
         "\"moe_expert_bias\"[0] value 1 is \"0000000g 000\"; it must be 8 hexadecimal digits"},
        {"[\"00000000 00000000 00000000\", \"00000000 7fc00000 00000000\"]",
         "\"moe_expert_bias\"[1] value 1 is 7fc00000 (nan); the experts' bias must be finite"},
        {"[\"ff800000 00000000 00000000\", \"00000000 00000000 00000000\"]",
         "\"moe_expert_bias\"[0] value 0 is ff800000 (inf)"},
        {"\"00000000\"", "\"moe_expert_bias\" is \"00000000\"; it must be an array of strings"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        text = moe_state(bias, bad[i].bias);
        CHECK_ERR(dt_ckpt_state_parse("s.json", text, &r, err, sizeof err), err, bad[i].want);
        free(text);
    }
    text = moe_state(NULL, NULL);
    CHECK(text && !strstr(text, "moe_expert_bias"), "a state without the bias records one");
    CHECK(text && dt_ckpt_state_parse("s.json", text, &r, err, sizeof err) == 0 &&
              r.moe_bias_n == 0, "no bias: %s", err);
    free(text);
    const char *dense = "{\"format\": 1, \"step\": 1, \"shuffle\": 0, \"seq_len\": 4, "
                        "\"global_batch\": 1, \"last_loss\": 1, \"optimizer\": \"sgd\", "
                        "\"optimizer_step\": 1, \"seq_counter\": \"1\", \"seed\": \"1\", "
                        "\"moe_expert_bias\": [\"00000000\"]}";
    CHECK_ERR(dt_ckpt_state_parse("s.json", dense, &r, err, sizeof err), err,
              "s.json: \"moe_expert_bias\" is recorded, but \"model\" records no experts");
}

static void test_non_finite(void)
{
    char err[1024];
    char out[600];
    snprintf(out, sizeof out, "%s", path_in("nf"));
    CHECK(save(out, 3, 3, err, sizeof err) == 0, "save: %s", err);
    char why[256];
    CHECK(dt_weights_check_finite(&model, model.params, "", why, sizeof why) == 0, "clean: %s",
          why);

    const dt_param_tensor *fc = NULL;
    for (int i = 0; i < model.n_tensors; i++)
        if (!strcmp(model.tensors[i].name, "h.0.mlp.c_fc.bias")) fc = &model.tensors[i];
    CHECK(fc != NULL, "no h.0.mlp.c_fc.bias");
    if (!fc) return;
    float keep = model.params[fc->offset + 7];
    model.params[fc->offset + 7] = -INFINITY;
    CHECK_ERR(dt_weights_check_finite(&model, model.params, "", why, sizeof why), why,
              "tensor h.0.mlp.c_fc.bias holds -inf at element 7");
    CHECK_ERR(save(out, 4, 3, err, sizeof err), err, "nf: refusing to save non-finite weights",
              "tensor h.0.mlp.c_fc.bias holds -inf at element 7");
    CHECK_ERR(dt_weights_save(&model, path_in("final.safetensors"), err, sizeof err), err,
              "final.safetensors: refusing to write non-finite values",
              "tensor h.0.mlp.c_fc.bias holds -inf");
    CHECK(!exists(path_in("final.safetensors")), "non-finite weights were written");
    model.params[fc->offset + 7] = keep;

    opt.m[fc->offset + 1] = NAN;
    CHECK_ERR(save(out, 4, 3, err, sizeof err), err, "optimizer.safetensors",
              "refusing to write non-finite values: tensor exp_avg.h.0.mlp.c_fc.bias holds nan "
              "at element 1");
    opt.m[fc->offset + 1] = 0;
    CHECK(strcmp(listing(out), "ckpt-00000003 latest") == 0, "after refused saves: %s",
          listing(out));
    CHECK(strcmp(latest_of(out), "ckpt-00000003") == 0, "latest %s", latest_of(out));
}

/* `latest` made unwritable: a directory of that name, so the rename onto
 * it fails exactly where a full disk would make the write fail. */
static void test_failed_latest(void)
{
    char err[1024], first[600];
    char out[600];
    snprintf(out, sizeof out, "%s", path_in("fl"));
    mkdir(out, 0777);
    mkdir(path_in("fl/latest"), 0777);
    mkdir(path_in("fl/latest/x"), 0777);
    CHECK_ERR(save(out, 2, 3, err, sizeof err), err, "latest",
              "the checkpoint of step 2 is withdrawn");
    CHECK(strcmp(listing(out), "latest") == 0, "the first save left: %s", listing(out));

    /* The same step saved again: the old checkpoint is swapped back. */
    remove_all(path_in("fl/latest"));
    CHECK(save(out, 2, 3, err, sizeof err) == 0, "save: %s", err);
    snprintf(first, sizeof first, "%s", path_in("fl/first.safetensors"));
    CHECK(rename(path_in("fl/ckpt-00000002/model.safetensors"), first) == 0 &&
              link(first, path_in("fl/ckpt-00000002/model.safetensors")) == 0,
          "keeping the first weights");
    CHECK(rename(path_in("fl/latest"), path_in("fl/latest.saved")) == 0, "move latest");
    mkdir(path_in("fl/latest"), 0777);
    mkdir(path_in("fl/latest/x"), 0777);
    model.params[0] += 1.0f;
    CHECK_ERR(save(out, 2, 3, err, sizeof err), err, "the checkpoint of step 2 is withdrawn");
    model.params[0] -= 1.0f;
    struct stat a, b;
    CHECK(stat(first, &a) == 0 && stat(path_in("fl/ckpt-00000002/model.safetensors"), &b) == 0 &&
              a.st_ino == b.st_ino,
          "the checkpoint of step 2 was not swapped back");
    CHECK(strcmp(listing(out), "ckpt-00000002 first.safetensors latest latest.saved") == 0,
          "after the failed second save: %s", listing(out));
}

static void test_prune_and_resolve(void)
{
    char err[1024], dir[600];
    char out[600];
    snprintf(out, sizeof out, "%s", path_in("pr"));
    mkdir(out, 0777);
    mkdir(path_in("pr/ckpt-notes"), 0777); /* not a checkpoint: never touched */
    const long steps[] = {99999998, 99999999, 100000000, 100000001};
    for (int i = 0; i < 4; i++)
        CHECK(save(out, steps[i], 2, err, sizeof err) == 0, "save %ld: %s", steps[i], err);
    CHECK(strcmp(listing(out), "ckpt-100000000 ckpt-100000001 ckpt-notes latest") == 0,
          "keep-last 2 past step 99999999 left: %s", listing(out));
    CHECK(strcmp(latest_of(out), "ckpt-100000001") == 0, "latest %s", latest_of(out));

    /* A crash between the checkpoint's rename and `latest`'s leaves no
     * `latest` in a new run: the newest checkpoint is the one to resume. */
    unlink(path_in("pr/latest"));
    CHECK(dt_ckpt_resolve(out, dir, sizeof dir, err, sizeof err) == 0, "resolve: %s", err);
    CHECK(strcmp(dir, path_in("pr/ckpt-100000001")) == 0, "resolved %s", dir);
    CHECK_ERR(dt_ckpt_resolve(path_in("nothing"), dir, sizeof dir, err, sizeof err), err,
              "no checkpoint to resume from");
}

/* Tries the lock in a new process: its exit status is 0 when it got it,
 * 1 when refused with a message naming dir and holder_pid. */
static int lock_in_child(const char *dir, long holder_pid)
{
    pid_t pid = fork();
    if (pid == 0) {
        char err[1024], want[128];
        int fd = dt_ckpt_lock(dir, err, sizeof err);
        if (fd >= 0) _exit(0);
        snprintf(want, sizeof want, "(pid %ld on ", holder_pid);
        int named = strstr(err, dir) && strstr(err, want) && strstr(err, "in use by another");
        if (!named) fprintf(stderr, "child: unexpected message: %s\n", err);
        _exit(named ? 1 : 2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

static void test_lock(void)
{
    char err[1024];
    char dir[600];
    snprintf(dir, sizeof dir, "%s", path_in("locked/run"));
    int fd = dt_ckpt_lock(dir, err, sizeof err);
    CHECK(fd >= 0, "lock: %s", err);
    CHECK(exists(dir), "the directory was not created");
    CHECK_ERR(dt_ckpt_lock(dir, err, sizeof err) >= 0 ? 0 : -1, err, dir,
              "is in use by another dtrain run (pid");
    CHECK(lock_in_child(dir, (long)getpid()) == 1, "another process got the held lock");
    dt_ckpt_unlock(fd);
    CHECK(lock_in_child(dir, 0) == 0, "the released lock was refused");

    /* A holder that dies without unlocking does not keep the directory. */
    pid_t pid = fork();
    if (pid == 0) {
        char e[256];
        _exit(dt_ckpt_lock(dir, e, sizeof e) >= 0 ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child could not lock");
    fd = dt_ckpt_lock(dir, err, sizeof err);
    CHECK(fd >= 0, "the lock of a dead process held on: %s", err);
    dt_ckpt_unlock(fd);
    CHECK(!dt_ckpt_exists(dir), "the lock file counts as a checkpoint");
}

int main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "unit") != 0) {
        fprintf(stderr, "usage: %s unit\n", argv[0]);
        return 2;
    }
    snprintf(root, sizeof root, "/tmp/dtrain_ckpt_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    make_model();
    test_round_trip();
    test_state_ranges();
    test_state_moe_bias();
    test_non_finite();
    test_failed_latest();
    test_prune_and_resolve();
    test_lock();
    dt_optimizer_free(&opt);
    dt_gpt_destroy(&model);
    remove_all(root);
    return finish("checkpoint");
}
