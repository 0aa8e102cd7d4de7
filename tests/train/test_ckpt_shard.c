/*
 * Sharded checkpoints by range arithmetic: the driver of
 * test_ckpt_reshard.sh. Values are functions of (tensor, element), so a
 * rank's expected shard is known in any layout without the code under
 * test. Two layouts of one model: "flat" (dt_gpt's own) and "pad" (every
 * segment followed by padding, as ZeRO pads them, so flat offsets differ).
 * Ranks hold ZeRO's equal slices of the layout ("zero"), or each slice cut
 * in two with a gap between them in the shard buffers ("split"); padding
 * in the shard buffers holds NaN when saving, and must read back as zero.
 *
 *   test_ckpt_shard save OUT STEP LAYOUT MODE     collective (dtrain launch)
 *   test_ckpt_shard full OUT STEP                 a whole-model checkpoint
 *   test_ckpt_shard check DIR LAYOUT N MODE STEP  load as N ranks, and whole
 *   test_ckpt_shard ref FILE                      the weights, dt_weights_save
 *   test_ckpt_shard nan OUT STEP                  a save with a NaN on rank 1
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtrain/comm.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/shard.h"
#include "train/weights/weights.h"

#define OPT_T 17

static const dt_gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 24, .vocab_size = 50,
                                  .block_size = 12};
static dt_gpt ref; /* the flat layout, with the reference parameters */

/* Buffer b's value of element e of tensor k: parameters from the GPT-2
 * initialisation, moments from a formula (second moments positive). */
static float value(int b, int k, size_t e)
{
    if (b == 0) return ref.params[ref.tensors[k].offset + e];
    if (b == 1) return sinf((float)(k * 1000 + (int)e)) * 1e-3f;
    return (float)(k + (int)(e % 7)) * 1e-4f + 1e-8f;
}

/* A copy of ref's layout with 3 + 5 s floats of padding after segment s. */
static void make_layout(const char *kind, dt_gpt *out)
{
    *out = ref;
    out->params = NULL;
    out->tensors = malloc((size_t)ref.n_tensors * sizeof *ref.tensors);
    memcpy(out->tensors, ref.tensors, (size_t)ref.n_tensors * sizeof *ref.tensors);
    if (strcmp(kind, "pad") != 0) return;
    size_t shift = 0;
    int segs = dt_gpt_segments(&ref);
    for (int s = 0; s < segs; s++) {
        for (int k = 0; k < ref.n_tensors; k++) {
            size_t off = ref.tensors[k].offset;
            if (off >= dt_gpt_segment_start(&ref, s) && off < dt_gpt_segment_start(&ref, s + 1))
                out->tensors[k].offset = off + shift;
        }
        shift += 3 + 5 * (size_t)s;
    }
    out->n_floats = ref.n_floats + shift;
}

/* Buffer b in a layout: tensor elements, `pad` elsewhere. */
static float *layout_buffer(const dt_gpt *l, int b, float pad)
{
    float *x = malloc(l->n_floats * sizeof *x);
    for (size_t i = 0; i < l->n_floats; i++) x[i] = pad;
    for (int k = 0; k < l->n_tensors; k++)
        for (size_t e = 0; e < l->tensors[k].numel; e++) x[l->tensors[k].offset + e] = value(b, k, e);
    return x;
}

/* Rank r's ranges of n: an equal slice of the layout padded to n slices,
 * in one range or two with a gap of 5 floats between them. */
static dt_flat_ranges ranges_of(const dt_gpt *l, int r, int n, const char *mode,
                                dt_flat_range rr[2])
{
    size_t slice = (l->n_floats + (size_t)n - 1) / (size_t)n;
    size_t lo = (size_t)r * slice, hi = lo + slice;
    if (lo > l->n_floats) lo = l->n_floats;
    if (hi > l->n_floats) hi = l->n_floats;
    if (strcmp(mode, "split") != 0) {
        rr[0] = (dt_flat_range){lo, hi, 0};
        return (dt_flat_ranges){1, rr, slice};
    }
    size_t mid = lo + (hi - lo) / 2;
    rr[0] = (dt_flat_range){lo, mid, 0};
    rr[1] = (dt_flat_range){mid, hi, mid - lo + 5};
    return (dt_flat_ranges){2, rr, slice + 5};
}

/* The shard buffers of ranges from a layout buffer; `pad` elsewhere. */
static float *shard_of(const float *flat, const dt_flat_ranges *mine, float pad)
{
    float *x = malloc((mine->len + 1) * sizeof *x);
    for (size_t i = 0; i < mine->len; i++) x[i] = pad;
    for (int i = 0; i < mine->n; i++)
        memcpy(x + mine->r[i].at, flat + mine->r[i].lo,
               (mine->r[i].hi - mine->r[i].lo) * sizeof *x);
    return x;
}

static dt_ckpt_state state_at(long step)
{
    return (dt_ckpt_state){.step = step, .seq_counter = (uint64_t)step * 8, .seed = 7,
                           .shuffle = 1, .seq_len = 12, .global_batch = 8, .last_loss = 2.5,
                           .data_tokens = 100000};
}

static int cmd_save(const char *out, long step, const char *kind, const char *mode, int nan_rank)
{
    dt_comm *c;
    if (dt_comm_init(&c) != 0) return fprintf(stderr, "%s\n", dt_last_error()), 1;
    int rank = dt_comm_rank(c), n = dt_comm_size(c);
    dt_gpt l;
    make_layout(kind, &l);
    dt_flat_range rr[2];
    dt_flat_ranges mine = ranges_of(&l, rank, n, mode, rr);
    float *shard[3];
    for (int b = 0; b < 3; b++) {
        float *flat = layout_buffer(&l, b, NAN);
        shard[b] = shard_of(flat, &mine, NAN);
        free(flat);
    }
    if (rank == nan_rank) shard[1][mine.r[0].at + 3] = INFINITY;
    dt_optimizer o = {.kind = DT_OPT_ADAMW, .m = shard[1], .v = shard[2], .t = OPT_T};
    dt_ckpt_state st = state_at(step);
    char err[1024], path[512];
    int rc = dt_ckpt_save_sharded(out, &l, &mine, shard[0], &o, &st, 3, c, 2, path, sizeof path,
                                  err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", rank, err);
    else if (rank == 0)
        printf("saved %s\n", path);
    for (int b = 0; b < 3; b++) free(shard[b]);
    free(l.tensors);
    dt_comm_destroy(c);
    return rc ? 1 : 0;
}

static int cmd_full(const char *out, long step)
{
    dt_gpt m;
    char err[1024];
    if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err) != 0) return 1;
    memcpy(m.params, ref.params, ref.n_floats * sizeof(float));
    dt_optimizer o;
    dt_optimizer_init(&o, DT_OPT_ADAMW, m.n_floats, 0.9, 0.95, 1e-8, 0.1, 0);
    float *mv[2] = {layout_buffer(&m, 1, 0), layout_buffer(&m, 2, 0)};
    memcpy(o.m, mv[0], m.n_floats * sizeof(float));
    memcpy(o.v, mv[1], m.n_floats * sizeof(float));
    o.t = OPT_T;
    dt_ckpt_state st = state_at(step);
    int rc = dt_ckpt_save(out, &m, &o, &st, 2, NULL, 0, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s\n", err);
    free(mv[0]);
    free(mv[1]);
    dt_optimizer_free(&o);
    dt_gpt_destroy(&m);
    return rc ? 1 : 0;
}

/* Bit for bit, so -0.0 and 0.0 differ. */
static void expect_same(const float *got, const float *want, size_t n, const char *what)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(got + i, want + i, sizeof(float)) == 0) continue;
        if (bad++ == 0)
            CHECK(0, "%s: float %zu is %a, want %a", what, i, (double)got[i], (double)want[i]);
    }
    CHECK(bad == 0, "%s: %zu of %zu floats differ", what, bad, n);
}

static void check_state(const dt_ckpt_state *st, long step, long t)
{
    CHECK(st->step == step && st->seq_counter == (uint64_t)step * 8 && st->seed == 7 &&
              st->data_tokens == 100000,
          "state: step %ld seq_counter %llu, want %ld, %llu", st->step,
          (unsigned long long)st->seq_counter, step, (unsigned long long)step * 8);
    CHECK(t == OPT_T, "optimizer step %ld, want %d", t, OPT_T);
}

static void check_ranks(const char *dir, const char *kind, int n, const char *mode, long step)
{
    dt_gpt l;
    make_layout(kind, &l);
    float *flat[3];
    for (int b = 0; b < 3; b++) flat[b] = layout_buffer(&l, b, 0);
    for (int r = 0; r < n; r++) {
        check_set_label("%s layout, rank %d of %d (%s): ", kind, r, n, mode);
        dt_flat_range rr[2];
        dt_flat_ranges mine = ranges_of(&l, r, n, mode, rr);
        float *got[3], *want[3];
        for (int b = 0; b < 3; b++) {
            got[b] = malloc((mine.len + 1) * sizeof(float));
            for (size_t i = 0; i < mine.len; i++) got[b][i] = -1; /* must become 0 or a value */
            want[b] = shard_of(flat[b], &mine, 0);
        }
        dt_optimizer o = {.kind = DT_OPT_ADAMW, .m = got[1], .v = got[2]};
        dt_ckpt_state st;
        char err[1024];
        int rc = dt_ckpt_load_ranges(dir, &l, &mine, got[0], &o, &st, err, sizeof err);
        CHECK(rc == 0, "load: %s", err);
        if (rc == 0) {
            const char *what[3] = {"params", "exp_avg", "exp_avg_sq"};
            for (int b = 0; b < 3; b++) expect_same(got[b], want[b], mine.len, what[b]);
            check_state(&st, step, o.t);
        }
        for (int b = 0; b < 3; b++) free(got[b]), free(want[b]);
    }
    for (int b = 0; b < 3; b++) free(flat[b]);
    free(l.tensors);
}

/* The whole model through dt_ckpt_load, as DDP and one process load. */
static void check_whole(const char *dir, long step)
{
    check_set_label("whole model: ");
    dt_gpt m;
    dt_optimizer o;
    char err[1024];
    dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err);
    dt_optimizer_init(&o, DT_OPT_ADAMW, m.n_floats, 0.9, 0.95, 1e-8, 0.1, 0);
    dt_ckpt_state st;
    int rc = dt_ckpt_load(dir, &m, &o, &st, err, sizeof err);
    CHECK(rc == 0, "load: %s", err);
    if (rc == 0) {
        float *want[3];
        for (int b = 0; b < 3; b++) want[b] = layout_buffer(&m, b, 0);
        expect_same(m.params, want[0], m.n_floats, "params");
        expect_same(o.m, want[1], m.n_floats, "exp_avg");
        expect_same(o.v, want[2], m.n_floats, "exp_avg_sq");
        check_state(&st, step, o.t);
        for (int b = 0; b < 3; b++) free(want[b]);
    }
    dt_gpt_config got;
    CHECK(dt_ckpt_model_config(dir, &got, err, sizeof err) == 0 && got.n_embd == cfg.n_embd &&
              got.n_layer == cfg.n_layer && got.n_head == cfg.n_head,
          "model config: %s", err);
    dt_optimizer_free(&o);
    dt_gpt_destroy(&m);
}

int main(int argc, char **argv)
{
    char err[256];
    if (dt_gpt_create(&ref, &cfg, DT_PREC_F32, err, sizeof err) != 0) return 1;
    dt_gpt_init_weights(&ref, 5);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "save") == 0 && argc == 6)
        return cmd_save(argv[2], atol(argv[3]), argv[4], argv[5], -1);
    if (strcmp(cmd, "nan") == 0 && argc == 4)
        return cmd_save(argv[2], atol(argv[3]), "pad", "zero", 1);
    if (strcmp(cmd, "full") == 0 && argc == 4) return cmd_full(argv[2], atol(argv[3]));
    if (strcmp(cmd, "ref") == 0 && argc == 3) {
        int rc = dt_weights_save(&ref, argv[2], err, sizeof err);
        if (rc) fprintf(stderr, "%s\n", err);
        return rc ? 1 : 0;
    }
    if (strcmp(cmd, "check") == 0 && argc == 7) {
        char dir[4096];
        if (dt_ckpt_resolve(argv[2], dir, sizeof dir, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        check_ranks(dir, argv[3], atoi(argv[4]), argv[5], atol(argv[6]));
        check_whole(dir, atol(argv[6]));
        return finish("test_ckpt_shard check");
    }
    fprintf(stderr, "usage: see the comment at the top of test_ckpt_shard.c\n");
    return 2;
}
