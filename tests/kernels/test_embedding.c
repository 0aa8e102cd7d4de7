/*
 * Embedding forward (exact: one fp32 addition per element) and backward
 * (accumulated onto existing gradients, repeated tokens, against a double
 * reference); the backward bits must not depend on the thread count.
 */
#include "kernel_test.h"
#include "kernels/embedding.h"
#include "kernels/threads.h"

static void check_shape(int B, int T, int C, int V)
{
    size_t n = (size_t)B * T * C;
    float *wte = rnd_array((size_t)V * C, 1.0f), *wpe = rnd_array((size_t)T * C, 1.0f);
    float *out = rnd_array(n, 1.0f), *dout = rnd_array(n, 1.0f);
    int32_t *tokens = malloc((size_t)B * T * sizeof *tokens);
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)(rnd_u64() % (uint64_t)(V < 5 ? V : 5));
    int bad = 0;
    dt_embedding_forward(out, tokens, wte, wpe, B, T, C);
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            float want = wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
            bad += out[(size_t)bt * C + c] != want;
        }
    CHECK(bad == 0, "forward B=%d T=%d C=%d: %d elements wrong", B, T, C, bad);

    float *dwte = rnd_array((size_t)V * C, 1.0f), *dwpe = rnd_array((size_t)T * C, 1.0f);
    double *want_dwte = dalloc((size_t)V * C), *want_dwpe = dalloc((size_t)T * C);
    for (size_t i = 0; i < (size_t)V * C; i++) want_dwte[i] = dwte[i];
    for (size_t i = 0; i < (size_t)T * C; i++) want_dwpe[i] = dwpe[i];
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            want_dwte[(size_t)tokens[bt] * C + c] += dout[(size_t)bt * C + c];
            want_dwpe[(size_t)(bt % T) * C + c] += dout[(size_t)bt * C + c];
        }
    float *dwte1 = fcopy(dwte, (size_t)V * C), *dwpe1 = fcopy(dwpe, (size_t)T * C);
    dt_kernels_set_threads(1);
    dt_embedding_backward(dwte1, dwpe1, dout, tokens, B, T, C);
    dt_kernels_set_threads(2);
    dt_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    CHECK_CLOSE(dwte, want_dwte, (size_t)V * C, 1e-6, "dwte B=%d T=%d C=%d", B, T, C);
    CHECK_CLOSE(dwpe, want_dwpe, (size_t)T * C, 1e-6, "dwpe B=%d T=%d C=%d", B, T, C);
    CHECK(bits_equal(dwte, dwte1, (size_t)V * C) && bits_equal(dwpe, dwpe1, (size_t)T * C),
          "backward bits differ between 1 and 2 threads B=%d T=%d C=%d", B, T, C);
    free(wte), free(wpe), free(out), free(dout), free(tokens), free(dwte), free(dwpe);
    free(want_dwte), free(want_dwpe), free(dwte1), free(dwpe1);
}

int main(void)
{
    check_shape(1, 1, 1, 1);
    check_shape(1, 1, 16, 3);
    check_shape(3, 5, 17, 7);
    check_shape(2, 33, 130, 4);
    check_shape(8, 256, 384, 256);
    return finish("test_embedding");
}
