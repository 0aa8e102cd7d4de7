/*
 * Embedding forward (exact: one fp32 addition per element) and backward
 * (accumulated onto existing gradients, repeated tokens, against a double
 * reference); the backward bits must not depend on the thread count.
 * The vocabulary-range forms, the ranks simulated in one process: the sum
 * over slices of the range forwards is dt_embedding_forward's output bit for
 * bit, and the range backwards give its dwte rows and dwpe bit for bit.
 */
#include "kernel_test.h"
#include "kernels/crossentropy_split.h"
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

/* the SUM all-reduce of the slices' forwards, in slice order, against the
 * unsplit forward; with wpe NULL against the token rows themselves */
static void check_range_forward(const int32_t *tokens, const float *wte, const float *wpe,
                                int B, int T, int C, int V, int S)
{
    size_t n = (size_t)B * T * C;
    float *want = rnd_array(n, 1.0f), *sum = calloc(n, sizeof *sum), *out = malloc(n * sizeof *out);
    float *sum_nopos = calloc(n, sizeof *sum_nopos);
    dt_embedding_forward(want, tokens, wte, wpe, B, T, C);
    int stray = 0, v0, Vl;
    for (int r = 0; r < S; r++) {
        dt_vocab_slice(V, S, r, &v0, &Vl);
        for (int pos = 0; pos <= 1; pos++) {
            for (size_t i = 0; i < n; i++) out[i] = NAN; /* every element must be written */
            dt_embedding_forward_range(out, tokens, wte + (size_t)v0 * C, pos ? wpe : NULL, B, T,
                                       C, v0, Vl);
            for (size_t i = 0; i < n; i++) (pos ? sum : sum_nopos)[i] += out[i];
            for (int bt = 0; bt < B * T; bt++)
                for (int c = 0; c < C && (tokens[bt] < v0 || tokens[bt] >= v0 + Vl); c++)
                    stray += out[(size_t)bt * C + c] != 0.0f;
        }
    }
    CHECK(stray == 0, "range forward S=%d: %d elements written outside the slice's tokens", S,
          stray);
    CHECK(bits_equal(sum, want, n), "range forward S=%d: the sum over slices differs", S);
    int bad = 0;
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++)
            bad += sum_nopos[(size_t)bt * C + c] != wte[(size_t)tokens[bt] * C + c];
    CHECK(bad == 0, "range forward S=%d without wpe: %d elements wrong", S, bad);
    free(want), free(sum), free(out), free(sum_nopos);
}

/* each slice's range backward onto its rows of the same starting dwte, and
 * onto its own copy of dwpe, against the unsplit backward */
static void check_range_backward(const int32_t *tokens, const float *dout, int B, int T, int C,
                                 int V, int S)
{
    size_t nw = (size_t)V * C, np = (size_t)T * C;
    float *dwte = rnd_array(nw, 1.0f), *dwpe = rnd_array(np, 1.0f);
    float *split = fcopy(dwte, nw), *split_nopos = fcopy(dwte, nw);
    float *dwpe_start = fcopy(dwpe, np), *dwpe_r = malloc(np * sizeof *dwpe_r);
    dt_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    int v0, Vl;
    for (int r = 0; r < S; r++) {
        dt_vocab_slice(V, S, r, &v0, &Vl);
        memcpy(dwpe_r, dwpe_start, np * sizeof *dwpe_r);
        dt_embedding_backward_range(split + (size_t)v0 * C, dwpe_r, dout, tokens, B, T, C, v0, Vl);
        dt_embedding_backward_range(split_nopos + (size_t)v0 * C, NULL, dout, tokens, B, T, C, v0,
                                    Vl);
        CHECK(bits_equal(dwpe_r, dwpe, np), "range backward S=%d: slice %d's dwpe differs", S, r);
    }
    CHECK(bits_equal(split, dwte, nw) && bits_equal(split_nopos, dwte, nw),
          "range backward S=%d: the slices' dwte rows differ", S);
    free(dwte), free(dwpe), free(split), free(split_nopos), free(dwpe_r), free(dwpe_start);
}

/* tokens over the whole vocabulary, so that every slice has some */
static void check_range(int B, int T, int C, int V)
{
    size_t n = (size_t)B * T * C;
    float *wte = rnd_array((size_t)V * C, 1.0f), *wpe = rnd_array((size_t)T * C, 1.0f);
    float *dout = rnd_array(n, 1.0f);
    int32_t *tokens = malloc((size_t)B * T * sizeof *tokens);
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)(rnd_u64() % (uint64_t)V);
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (int S = 1; S <= 4; S++) {
            check_range_forward(tokens, wte, wpe, B, T, C, V, S);
            check_range_backward(tokens, dout, B, T, C, V, S);
        }
    }
    free(wte), free(wpe), free(dout), free(tokens);
}

int main(void)
{
    check_shape(1, 1, 1, 1);
    check_shape(1, 1, 16, 3);
    check_shape(3, 5, 17, 7);
    check_shape(2, 33, 130, 4);
    check_shape(8, 256, 384, 256);
    check_range(3, 40, 130, 67); /* slices of 67 entries: 34 + 33, 23 + 23 + 21, 17 * 3 + 16 */
    check_range(2, 9, 17, 9);    /* 4 slices of 9 leave the last empty */
    check_range(1, 1, 1, 1);
    return finish("test_embedding");
}
