/* DDP overlaps communication with backward: with buckets smaller than the
 * model, the first bucket's all-reduce has started (by the progress
 * thread's own timestamp) before backward returns. Run under
 * `dtrain launch -n 2`. Checked from recorded timestamps, not timing. */
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/comm.h"
#include "kernels/threads.h"
#include "model/gpt.h"
#include "parallel/ddp.h"
#include "check.h"

/* A setup step that failed: nothing after it can run. */
#define REQUIRE(cond, ...)                                                                    \
    do {                                                                                      \
        int ok_ = (cond);                                                                     \
        CHECK(ok_, __VA_ARGS__);                                                              \
        if (!ok_) return finish("test_ddp_overlap");                                          \
    } while (0)

int main(void)
{
    dt_comm *c;
    REQUIRE(dt_comm_init(&c) == 0, "%s", dt_last_error());
    int rank = dt_comm_rank(c);
    dt_kernels_set_threads(1);
    const int B = 4, T = 64;
    dt_gpt_config cfg = {.n_layer = 6, .n_head = 4, .n_embd = 128, .vocab_size = 256,
                         .block_size = T};
    dt_gpt m;
    char err[256];
    REQUIRE(dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err) == 0, "%s", err);
    REQUIRE(dt_gpt_alloc_grads(&m) == 0 && dt_gpt_alloc_acts(&m, B, T) == 0, "%s", m.error);
    dt_gpt_init_weights(&m, 1);
    dt_ddp d;
    /* One segment per bucket (each layer is ~0.8 MB): 8 buckets. */
    REQUIRE(dt_ddp_init(&d, c, &m, 1, NULL) == 0, "ddp init");
    int32_t tok[4 * 64], tgt[4 * 64];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7 + rank) % 256;
        tgt[i] = (i * 11 + 3) % 256;
    }
    int overlapped_steps = 0;
    for (int step = 0; step < 3; step++) {
        REQUIRE(dt_gpt_forward(&m, tok, tgt, B, T) >= 0, "%s", m.error);
        dt_ddp_begin_backward(&d, 1);
        REQUIRE(dt_gpt_backward(&m, tok, B, T, 1.0f / (B * T)) == 0, "%s", m.error);
        REQUIRE(dt_ddp_finish(&d) == 0, "finish: %s", dt_comm_error(c));
        int started = 0;
        for (int i = 0; i < d.nbuckets; i++)
            started += d.buckets[i].start_ns != 0 && d.buckets[i].start_ns < d.backward_end_ns;
        printf("rank %d step %d: %d buckets; first started %.3f ms before backward ended; "
               "%d of them started during backward\n",
               rank, step, d.nbuckets,
               d.buckets[0].start_ns ? (double)(d.backward_end_ns - d.buckets[0].start_ns) * 1e-6
                                     : -1.0,
               started);
        CHECK(d.nbuckets >= 4, "rank %d: expected several buckets, got %d", rank, d.nbuckets);
        overlapped_steps += d.buckets[0].start_ns != 0 &&
                            d.buckets[0].start_ns < d.backward_end_ns;
    }
    /* Every step should overlap; one of three must, even on a loaded machine. */
    CHECK(overlapped_steps > 0, "rank %d: the first bucket never started before backward ended",
          rank);
    dt_ddp_free(&d);
    dt_gpt_destroy(&m);
    dt_comm_destroy(c);
    return finish("test_ddp_overlap");
}
