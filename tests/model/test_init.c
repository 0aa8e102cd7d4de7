/* The initial weights: each normal tensor's values are its own stream's
 * numbers in row-major order (model/init.c), whatever the threads. The
 * reference here draws the stream one number after another, as the rule
 * states it; the model draws each element's numbers directly, split over
 * threads, and a tensor-parallel slice draws only what it holds. Every
 * value must be the reference's bits. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "kernels/threads.h"
#include "model/gpt.h"

enum { L = 2, NH = 2, C = 32, V = 50257, BLOCK = 16 }; /* GPT-2's vocabulary */
static const uint64_t SEED = 1234;

/* splitmix64, a number at a time. */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double normal(uint64_t *s)
{
    double u1 = (double)(next(s) >> 11) / 9007199254740992.0 + 0.5 / 9007199254740992.0;
    double u2 = (double)(next(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Tensor i of the whole model against the reference stream. */
static void check_tensor(const dt_gpt *m, int i)
{
    const dt_param_tensor *t = &m->tensors[i];
    if (t->init != DT_INIT_NORMAL && t->init != DT_INIT_RESIDUAL) return;
    const double std = t->init == DT_INIT_NORMAL ? 0.02 : 0.02 / sqrt(2.0 * L);
    uint64_t s = SEED * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
    size_t bad = 0;
    for (size_t k = 0; k < t->numel; k++)
        bad += m->params[t->offset + k] != (float)(std * normal(&s));
    CHECK(bad == 0, "tensor %s: %zu of %zu values differ from its stream", t->name, bad,
          t->numel);
}

int main(void)
{
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    char err[256] = "";
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        dt_gpt m;
        if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
            CHECK(0, "model: %s", err);
            return finish("model.init");
        }
        dt_gpt_init_weights(&m, SEED);
        check_set_label(threads == 1 ? "1 thread: " : "2 threads: ");
        int normals = 0;
        for (int i = 0; i < m.n_tensors; i++) {
            check_tensor(&m, i);
            normals += m.tensors[i].init == DT_INIT_NORMAL || m.tensors[i].init == DT_INIT_RESIDUAL;
        }
        CHECK(normals >= 2 + 4 * L, "only %d tensors drawn from a normal", normals);
        dt_gpt_destroy(&m);
    }
    return finish("model.init");
}
