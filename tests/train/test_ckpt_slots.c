/*
 * Snapshots in two slots (train/ckpt/shard.h), one process, a small GPT:
 *
 *   - the streamed checksum is the file checksum's definition (four
 *     interleaved FNV-1a lanes over 8-byte words, then the tail), written
 *     here again, whatever the cuts between calls;
 *   - a snapshot written and recovered loads back bit for bit; the next
 *     goes to the other slot; a snapshot begun and not written (a rank
 *     killed during its copy) leaves the one before to recover; a process
 *     that opens the slots again (a restarted job) keeps the files and
 *     writes first into the slot it did not recover from;
 *   - --save-every's save from a slot publishes a checkpoint with its values,
 *     and one that fails leaves none;
 *   - a value changed in a recovered shard fails the load on its checksum.
 *
 *   test_ckpt_slots          (in a scratch directory of its own, removed after)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/sum.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/shard.h"

static const dt_gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 24, .vocab_size = 53,
                                  .block_size = 12};

/* The checksum as the checkpoint format defines it. */
static uint64_t reference_sum(const unsigned char *b, size_t n)
{
    const uint64_t prime = 1099511628211ull;
    uint64_t h[4] = {1469598103934665603ull, 1, 2, 3}, x;
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 4; l++) {
            uint64_t w = 0;
            for (int k = 7; k >= 0; k--) w = (w << 8) | b[i + 8 * (size_t)l + (size_t)k];
            h[l] = (h[l] ^ w) * prime;
        }
    x = h[0];
    for (int l = 1; l < 4; l++) x = (x ^ h[l]) * prime;
    for (; i < n; i++) x = (x ^ b[i]) * prime;
    return (x ^ (uint64_t)n) * prime;
}

static void test_streamed_sum(void)
{
    for (int trial = 0; trial < 20; trial++) {
        const size_t n = 1 + rnd_u64() % 5000;
        unsigned char *b = malloc(n);
        for (size_t i = 0; i < n; i++) b[i] = (unsigned char)rnd_u64();
        dt_sum s;
        dt_sum_init(&s);
        for (size_t at = 0; at < n;) {
            size_t cut = 1 + rnd_u64() % (trial % 2 ? 7 : 300);
            if (cut > n - at) cut = n - at;
            dt_sum_add(&s, b + at, cut);
            at += cut;
        }
        const uint64_t want = reference_sum(b, n);
        CHECK(dt_sum_end(&s) == want, "streamed sum of %zu bytes differs", n);
        /* Copied and summed at once, cut as above, the destination at the
         * stream's place modulo 32 (a file's mapping) or anywhere. */
        unsigned char *d = aligned_alloc(64, (n + 127) / 64 * 64);
        const size_t skew = trial % 3 == 0 ? 5 : 0;
        dt_sum_init(&s);
        for (size_t at = 0; at < n;) {
            size_t cut = 1 + rnd_u64() % (trial % 2 ? 7 : 3000);
            if (cut > n - at) cut = n - at;
            dt_sum_copy(&s, d + skew + at, b + at, cut);
            at += cut;
        }
        CHECK(dt_sum_end(&s) == want && memcmp(d + skew, b, n) == 0,
              "copied and summed %zu bytes (skew %zu): sum or bytes differ", n, skew);
        free(d);
        CHECK(dt_sum64(b, n) == want, "one-call sum of %zu bytes differs", n);
        free(b);
    }
}

typedef struct {
    dt_gpt m;
    float *mom[2];
    dt_optimizer o;
    dt_flat_range all;
    dt_flat_ranges mine;
} state;

static void fill(state *s, float base)
{
    for (size_t i = 0; i < s->m.n_floats; i++) {
        s->m.params[i] = base + (float)i * 1e-3f;
        s->mom[0][i] = base * 0.5f - (float)i * 1e-4f;
        s->mom[1][i] = base * 0.25f + (float)(i % 13) * 1e-5f;
    }
}

static void make_state(state *s)
{
    char err[256];
    if (dt_gpt_create(&s->m, &cfg, DT_PREC_F32, err, sizeof err)) exit(1);
    for (int b = 0; b < 2; b++) s->mom[b] = calloc(s->m.n_floats, sizeof(float));
    s->o = (dt_optimizer){.kind = DT_OPT_ADAMW, .m = s->mom[0], .v = s->mom[1], .t = 3,
                          .n = s->m.n_floats};
    s->all = (dt_flat_range){0, s->m.n_floats, 0};
    s->mine = (dt_flat_ranges){1, &s->all, s->m.n_floats};
}

static void free_state(state *s)
{
    dt_gpt_destroy(&s->m);
    free(s->mom[0]);
    free(s->mom[1]);
}

static dt_ckpt_slots *open_slots(state *s, const char *dir)
{
    dt_ckpt_slots *sl = NULL;
    char err[1024];
    if (dt_ckpt_slots_open(&sl, dir, &s->m, &s->mine, &s->mine, s->m.params, &s->o, 0, NULL,
                           err, sizeof err)) {
        fprintf(stderr, "open: %s\n", err);
        exit(1);
    }
    return sl;
}

static int snapshot(dt_ckpt_slots *sl, state *s, long step, int write)
{
    char err[1024];
    dt_ckpt_state st = {.step = step, .seq_counter = (uint64_t)step * 4, .seed = 7, .shuffle = 1,
                        .seq_len = 12, .global_batch = 4, .data_tokens = 1000};
    if (dt_ckpt_slots_begin(sl, &s->o, &st, NULL, NULL, err, sizeof err) ||
        (write && dt_ckpt_slots_write(sl, err, sizeof err)))
        return fprintf(stderr, "snapshot %ld: %s\n", step, err), -1;
    return 0;
}

/* Recovers dir and loads it into a fresh state; the step, or -1. */
static long recover_load(const char *dir, state *got, char *err, size_t errlen)
{
    long step = -1;
    uint64_t moved[2];
    char where[1024];
    dt_ckpt_state st;
    if (dt_ckpt_slots_recover(dir, NULL, &step, moved, err, errlen) != 0 ||
        dt_ckpt_resolve(dir, where, sizeof where, err, errlen) ||
        dt_ckpt_load_ranges(where, &got->m, &got->mine, got->m.params, &got->o, &st, err, errlen))
        return -1;
    CHECK(st.step == step, "the state loaded is of step %ld, the slot's %ld", st.step, step);
    return step;
}

static void expect_state(const state *got, const state *want, const char *what)
{
    size_t bad = 0, n = 0;
    for (int k = 0; k < want->m.n_tensors; k++) { /* the padding between them is not saved */
        const dt_param_tensor *t = &want->m.tensors[k];
        for (size_t i = t->offset; i < t->offset + t->numel; i++, n++)
            bad += memcmp(&got->m.params[i], &want->m.params[i], 4) != 0 ||
                   memcmp(&got->mom[0][i], &want->mom[0][i], 4) != 0 ||
                   memcmp(&got->mom[1][i], &want->mom[1][i], 4) != 0;
    }
    CHECK(bad == 0 && n > 10000, "%s: %zu of %zu floats differ", what, bad, n);
}

/* Overwrites one float of the newest slot's shard (as memory gone bad). */
static void damage(const char *dir)
{
    char path[1100], where[1024], err[256];
    if (dt_ckpt_resolve(dir, where, sizeof where, err, sizeof err)) return;
    snprintf(path, sizeof path, "%s/shard-00000-of-00001.safetensors", where);
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, -8, SEEK_END);
    fputc(0x5a, f);
    fclose(f);
}

/* --save-every from a slot: a checkpoint in the run directory with the
 * snapshot's values; a save whose directory went away fails and leaves
 * no checkpoint, and the slots go on. */
static void test_save(dt_ckpt_slots *sl, state *s, const char *dir)
{
    char out[1100], err[1024], path[4096], where[1024];
    snprintf(out, sizeof out, "%s/out", dir);
    dt_ckpt_state st = {.step = 9, .seq_counter = 36, .seed = 7, .shuffle = 1, .seq_len = 12,
                        .global_batch = 4, .data_tokens = 1000};
    atomic_int abandon = 0;
    fill(s, 5.0f);
    int rc = dt_ckpt_slots_begin(sl, &s->o, &st, out, NULL, err, sizeof err) ||
             dt_ckpt_slots_write(sl, err, sizeof err) ||
             dt_ckpt_slots_save(sl, 2, &abandon, path, sizeof path, err, sizeof err);
    CHECK(rc == 0 && strstr(path, "ckpt-00000009"), "save from the slot: %s (%s)", err, path);
    state got;
    make_state(&got);
    dt_ckpt_state back;
    rc = dt_ckpt_resolve(out, where, sizeof where, err, sizeof err) ||
         dt_ckpt_load_ranges(where, &got.m, &got.mine, got.m.params, &got.o, &back, err,
                             sizeof err);
    CHECK(rc == 0 && back.step == 9, "the saved checkpoint loads: %s", err);
    expect_state(&got, s, "the checkpoint saved from the slot");
    free_state(&got);
    st.step = 10;
    rc = dt_ckpt_slots_begin(sl, &s->o, &st, out, NULL, err, sizeof err) ||
         dt_ckpt_slots_write(sl, err, sizeof err);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "rm -rf %s/.ckpt-00000010.tmp.*", out);
    CHECK(rc == 0 && system(tmp) == 0, "snapshot 10: %s", err);
    rc = dt_ckpt_slots_save(sl, 2, &abandon, path, sizeof path, err, sizeof err);
    snprintf(tmp, sizeof tmp, "%s/ckpt-00000010", out);
    CHECK(rc != 0 && access(tmp, F_OK) != 0, "a failed save left %s (rc %d)", tmp, rc);
    long step;
    uint64_t moved[2];
    CHECK(dt_ckpt_slots_recover(dir, NULL, &step, moved, err, sizeof err) == 0 && step == 10,
          "the snapshot of the failed save is still whole (%ld)", step);
}

static void test_slots(const char *dir)
{
    state s, got;
    char err[1024];
    make_state(&s);
    make_state(&got);
    dt_ckpt_slots *sl = open_slots(&s, dir);
    long step;
    uint64_t moved[2];
    CHECK(dt_ckpt_slots_recover(dir, NULL, &step, moved, err, sizeof err) == 1,
          "no snapshot yet, but recover found step %ld", step);
    fill(&s, 1.0f);
    CHECK(snapshot(sl, &s, 5, 1) == 0, "snapshot 5");
    CHECK(recover_load(dir, &got, err, sizeof err) == 5, "recover after step 5: %s", err);
    expect_state(&got, &s, "step 5");
    fill(&s, 2.0f);
    CHECK(snapshot(sl, &s, 6, 1) == 0, "snapshot 6");
    CHECK(recover_load(dir, &got, err, sizeof err) == 6, "recover after step 6: %s", err);
    expect_state(&got, &s, "step 6");
    state at6 = got;
    /* Begun, not copied: the rank died during its copy of step 7. */
    fill(&s, 3.0f);
    CHECK(snapshot(sl, &s, 7, 0) == 0, "snapshot 7 begun");
    make_state(&got);
    CHECK(recover_load(dir, &got, err, sizeof err) == 6,
          "a snapshot begun and not copied recovers the one before: %s", err);
    expect_state(&got, &at6, "step 6 after 7 was begun");
    CHECK(dt_ckpt_slots_write(sl, err, sizeof err) == 0, "snapshot 7 copied: %s", err);
    CHECK(recover_load(dir, &got, err, sizeof err) == 7, "recover after step 7: %s", err);
    expect_state(&got, &s, "step 7");
    dt_ckpt_slots_close(sl);
    /* A restarted job: the files kept, the first write into the slot of
     * step 6 (slot 1), not the one of step 7 just recovered (slot 0). */
    struct stat before, after;
    char shard[1100];
    snprintf(shard, sizeof shard, "%s/slot-0/shard-00000-of-00001.safetensors", dir);
    stat(shard, &before);
    sl = open_slots(&s, dir);
    stat(shard, &after);
    CHECK(before.st_ino == after.st_ino, "a restarted job made its shard file again");
    state at7 = got;
    fill(&s, 4.0f);
    CHECK(snapshot(sl, &s, 8, 0) == 0, "snapshot 8 begun");
    make_state(&got);
    CHECK(recover_load(dir, &got, err, sizeof err) == 7,
          "the restarted job's first snapshot went into the slot it recovered from: %s", err);
    expect_state(&got, &at7, "step 7 after 8 was begun");
    CHECK(dt_ckpt_slots_write(sl, err, sizeof err) == 0, "snapshot 8 copied: %s", err);
    free_state(&got);
    make_state(&got);
    CHECK(recover_load(dir, &got, err, sizeof err) == 8, "recover after step 8: %s", err);
    expect_state(&got, &s, "step 8");
    test_save(sl, &s, dir);
    dt_ckpt_slots_close(sl);
    damage(dir);
    CHECK(recover_load(dir, &got, err, sizeof err) == -1 && strstr(err, "checksum"),
          "a damaged shard loaded (%s)", err);
    free_state(&at6);
    free_state(&at7);
    free_state(&got);
    free_state(&s);
}

int main(void)
{
    char dir[] = "/tmp/dtrain-slots-XXXXXX", rm[64];
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    test_streamed_sum();
    test_slots(dir);
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return finish("test_ckpt_slots");
}
