/*
 * Measured product paths (kernels/matmul_paths.h), with timings made up
 * here so that every decision is known in advance:
 *   - shape classes against the rounding written out by hand;
 *   - a path 2x faster replaces the rule, one 5% faster does not, and the
 *     decision lands in the file as one line; a slow product is timed in
 *     two rounds, not five; a long reduction (K at least M and N) is timed
 *     in pieces of K too, and a path in pieces wins like any other;
 *   - a class already decided (in this process, or in the file by another)
 *     is not timed again, and the file's answer wins over what timing would
 *     say; a line cut short is skipped;
 *   - small products, no file, a failed timing: the rule, nothing written;
 *   - two processes deciding the same class at once, with opposite
 *     timings, take the same path, and the file holds one line for it;
 *   - dt_matmul with the file forcing each of the four paths: an
 *     accumulating fp32 product is C + (the product formed alone), bit for
 *     bit, also when it runs in blocks of rows, the product matches a double
 *     reference, and a bias is added once (not once per piece of K).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kernels/matmul.h"
#include "kernels/matmul_paths.h"
#include "kernels/matmul_problem.h"

typedef struct {
    double sgemm_s, primitive_s; /* what each timing returns */
    double sgemm_pieces_s, primitive_pieces_s; /* 0: twice the whole path's */
    int calls, fail;
    int sleep_ms;
} fake;

static double fake_time(void *ctx, dt_mm_path path)
{
    fake *f = ctx;
    f->calls++;
    if (f->sleep_ms) {
        struct timespec ts = {0, f->sleep_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (f->fail) return -1;
    switch (path) {
    case DT_MM_SGEMM: return f->sgemm_s;
    case DT_MM_PRIMITIVE: return f->primitive_s;
    case DT_MM_SGEMM_PIECES: return f->sgemm_pieces_s ? f->sgemm_pieces_s : 2 * f->sgemm_s;
    case DT_MM_PRIMITIVE_PIECES:
        return f->primitive_pieces_s ? f->primitive_pieces_s : 2 * f->primitive_s;
    default: return -1;
    }
}

static char dir[] = "/tmp/dtrain_paths_XXXXXX";

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

static int lines_of(const char *file, const char *needle)
{
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (!needle || strstr(line, needle)) n++;
    fclose(f);
    return n;
}

static void use(const char *file)
{
    char err[256] = "";
    CHECK(dt_mm_paths_use(file, err, sizeof err) == 0, "dt_mm_paths_use %s: %s", file, err);
}

static void test_classes(void)
{
    static const int in[] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 384, 385, 1152, 1536, 1537, 2048, 50257};
    static const int want[] = {0, 1, 2, 3, 4, 6, 6, 8, 12, 384, 512, 1536, 1536, 2048, 2048, 65536};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        CHECK(dt_mm_class_size(in[i]) == want[i], "class of %d: %d, want %d", in[i],
              dt_mm_class_size(in[i]), want[i]);
}

static void test_decisions(void)
{
    char file[256];
    path_of(file, sizeof file, "decide.txt");
    use(file);
    /* 2 x 1536 x 384 x 2048 flops: over the threshold; K 2048 is at least M
     * and N, so the class is timed in pieces too (4 paths). */
    int classes0, classes1;
    double seconds0, seconds1;
    dt_mm_paths_timed(&classes0, &seconds0);
    fake f = {.sgemm_s = 2.0e-3, .primitive_s = 1.0e-3, .sgemm_pieces_s = 4.0e-3,
              .primitive_pieces_s = 5.0e-3};
    CHECK(dt_mm_path_choose(1, 0, 1536, 384, 2048, DT_MM_SGEMM, 1e9, fake_time, &f) ==
              DT_MM_PRIMITIVE,
          "the primitive at twice sgemm's speed replaces the rule's sgemm");
    CHECK(f.calls == 20, "5 rounds of the 4 paths timed, got %d calls", f.calls);
    dt_mm_paths_timed(&classes1, &seconds1);
    CHECK(classes1 == classes0 + 1 && fabs(seconds1 - seconds0 - 60e-3) < 1e-9,
          "the process counts 1 class and 60 ms timed, got %d and %g s", classes1 - classes0,
          seconds1 - seconds0);
    CHECK(lines_of(file, "1 0 1536 384 2048 primitive 500.0 1000.0 250.0 200.0") == 1,
          "the decision is in the file, with the 4 paths' rates of the 1 GFLOP timed");
    /* Products of over a quarter second: two rounds (one to warm up). */
    fake slow = {.sgemm_s = 0.4, .primitive_s = 0.3};
    CHECK(dt_mm_path_choose(0, 0, 4096, 4096, 4096, DT_MM_PRIMITIVE, 1e9, fake_time, &slow) ==
                  DT_MM_PRIMITIVE &&
              slow.calls == 8,
          "a slow product is timed twice each way, got %d calls", slow.calls);
    /* The same class (1200 -> 1536, 2000 -> 2048) is not timed again. */
    fake again = {.sgemm_s = 1.0e-3, .primitive_s = 2.0e-3};
    CHECK(dt_mm_path_choose(1, 0, 1200, 384, 2000, DT_MM_SGEMM, 1e9, fake_time, &again) ==
                  DT_MM_PRIMITIVE &&
              !again.calls,
          "a decided class keeps its path untimed (calls %d)", again.calls);
    /* 5% faster is not enough to leave the rule, either way; K below M:
     * the two whole paths only. */
    fake close = {.sgemm_s = 1.0e-3, .primitive_s = 0.95e-3, .sgemm_pieces_s = 0.1e-3};
    CHECK(dt_mm_path_choose(0, 0, 2048, 1536, 384, DT_MM_SGEMM, 1e9, fake_time, &close) ==
                  DT_MM_SGEMM &&
              close.calls == 10,
          "5%% faster keeps the rule's sgemm, and a short K is not timed in pieces (%d calls)",
          close.calls);
    fake close2 = {.sgemm_s = 0.95e-3, .primitive_s = 1.0e-3};
    CHECK(dt_mm_path_choose(0, 1, 2048, 384, 1536, DT_MM_PRIMITIVE, 1e9, fake_time, &close2) ==
              DT_MM_PRIMITIVE,
          "5%% faster keeps the rule's primitive");
    /* A weight gradient [384, 1536] over 2048 tokens: pieces 20% faster
     * than either whole path win; pieces 5% faster than the rule do not. */
    fake pieces = {.sgemm_s = 1.0e-3, .primitive_s = 1.05e-3, .sgemm_pieces_s = 0.8e-3,
                   .primitive_pieces_s = 0.85e-3};
    CHECK(dt_mm_path_choose(1, 0, 384, 1536, 2048, DT_MM_SGEMM, 1e9, fake_time, &pieces) ==
              DT_MM_SGEMM_PIECES,
          "sgemm in pieces of K, 20%% faster, replaces the rule");
    CHECK(lines_of(file, "1 0 384 1536 2048 sgemm/k256 1000.0 952.4 1250.0 1176.5") == 1,
          "the pieces' decision is in the file");
    fake near = {.sgemm_s = 1.0e-3, .primitive_s = 1.2e-3, .sgemm_pieces_s = 1.1e-3,
                 .primitive_pieces_s = 0.95e-3};
    CHECK(dt_mm_path_choose(1, 0, 384, 384, 2048, DT_MM_SGEMM, 1e9, fake_time, &near) ==
              DT_MM_SGEMM,
          "the primitive in pieces, 5%% faster, keeps the rule");
    CHECK(lines_of(file, NULL) == 6, "one line per class decided, got %d", lines_of(file, NULL));
    /* Small: the rule, untimed. */
    fake small = {.sgemm_s = 9.0e-3, .primitive_s = 1.0e-3};
    CHECK(dt_mm_path_choose(0, 0, 64, 64, 64, DT_MM_SGEMM, 1e9, fake_time, &small) ==
                  DT_MM_SGEMM &&
              !small.calls,
          "a small product takes the rule untimed");
    /* A path that fails: the rule, and nothing recorded. */
    fake broken = {.fail = 1};
    CHECK(dt_mm_path_choose(0, 0, 4096, 4096, 64, DT_MM_PRIMITIVE, 1e9, fake_time, &broken) ==
              DT_MM_PRIMITIVE,
          "a failed timing leaves the rule");
    CHECK(lines_of(file, "4096 4096 64") == 0, "a failed timing writes nothing");

    /* Another process's view: the file read afresh, nothing timed. */
    use(file);
    fake other = {.sgemm_s = 1.0e-3, .primitive_s = 9.0e-3};
    CHECK(dt_mm_path_choose(1, 0, 1536, 384, 2048, DT_MM_SGEMM, 1e9, fake_time, &other) ==
                  DT_MM_PRIMITIVE &&
              !other.calls,
          "the file's decision holds in another process");
    CHECK(dt_mm_path_choose(1, 0, 384, 1536, 2048, DT_MM_SGEMM, 1e9, fake_time, &other) ==
                  DT_MM_SGEMM_PIECES &&
              !other.calls,
          "the file's pieces hold in another process");
    /* No file: the rule for all. */
    use(NULL);
    fake none = {.sgemm_s = 9.0e-3, .primitive_s = 1.0e-3};
    CHECK(dt_mm_path_choose(1, 0, 1536, 384, 2048, DT_MM_SGEMM, 1e9, fake_time, &none) ==
                  DT_MM_SGEMM &&
              !none.calls,
          "without a file the rule holds");
}

static void test_file_written_by_another(void)
{
    char file[256];
    path_of(file, sizeof file, "given.txt");
    FILE *f = fopen(file, "w");
    fprintf(f, "# written by hand\n0 0 2048 2048 512 primitive 100.0 120.0\n"
               "1 0 768 3072 8192 primitive/k256 100.0 90.0 95.0 130.0\n"
               "1 0 768 768 8192 sgemm/k512 100.0 90.0 95.0 130.0\n0 0 3072 3072 32");
    fclose(f);
    use(file);
    fake t = {.sgemm_s = 1.0e-3, .primitive_s = 5.0e-3};
    CHECK(dt_mm_path_choose(0, 0, 2048, 2000, 500, DT_MM_SGEMM, 1e9, fake_time, &t) ==
                  DT_MM_PRIMITIVE &&
              !t.calls,
          "the file's primitive wins over a timing that favours sgemm");
    CHECK(dt_mm_path_choose(1, 0, 700, 3000, 8000, DT_MM_SGEMM, 1e9, fake_time, &t) ==
                  DT_MM_PRIMITIVE_PIECES &&
              !t.calls,
          "the file's primitive in pieces (a line of 4 rates) is taken untimed");
    fake w = {.sgemm_s = 1.0e-3, .primitive_s = 5.0e-3};
    CHECK(dt_mm_path_choose(1, 0, 768, 768, 8192, DT_MM_SGEMM, 1e9, fake_time, &w) ==
                  DT_MM_SGEMM &&
              w.calls == 20,
          "a path the file does not know (sgemm/k512) is skipped and the class measured");
    fake u = {.sgemm_s = 1.0e-3, .primitive_s = 5.0e-3};
    CHECK(dt_mm_path_choose(0, 0, 3072, 3072, 30, DT_MM_PRIMITIVE, 1e9, fake_time, &u) ==
                  DT_MM_SGEMM &&
              u.calls == 10,
          "a line cut short is skipped and the class measured");
    CHECK(lines_of(file, "0 0 3072 3072 32 sgemm") == 1 && lines_of(file, NULL) == 7,
          "the measurement appended on a line of its own (%d lines)", lines_of(file, NULL));
    /* A file in a directory that does not exist: warned, the rule. */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/no/such/dir/paths.txt", dir);
    use(missing);
    fake v = {.sgemm_s = 9.0e-3, .primitive_s = 1.0e-3};
    CHECK(dt_mm_path_choose(0, 0, 2048, 2048, 512, DT_MM_SGEMM, 1e9, fake_time, &v) ==
              DT_MM_SGEMM,
          "an unwritable file leaves the rule");
}

/* Two processes decide one class at once with opposite timings. */
static void test_two_processes(void)
{
    char file[256];
    path_of(file, sizeof file, "race.txt");
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        if ((pid[i] = fork()) == 0) {
            char err[256];
            if (dt_mm_paths_use(file, err, sizeof err)) _exit(90);
            fake f = {.sgemm_s = i ? 1e-3 : 3e-3, .primitive_s = i ? 3e-3 : 1e-3, .sleep_ms = 20};
            _exit(10 + (int)dt_mm_path_choose(1, 0, 3072, 768, 8192, DT_MM_SGEMM, 1e9,
                                              fake_time, &f));
        }
    }
    int got[2];
    for (int i = 0; i < 2; i++) {
        int st;
        waitpid(pid[i], &st, 0);
        got[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    CHECK((got[0] == 10 + DT_MM_PRIMITIVE || got[0] == 10 + DT_MM_SGEMM) && got[0] == got[1],
          "both processes take the same path (exits %d, %d)", got[0], got[1]);
    CHECK(lines_of(file, "1 0 3072 768 8192") == 1, "one line for the class, got %d",
          lines_of(file, "1 0 3072 768 8192"));
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(rnd_u64() >> 11) * 0x1p-53 - 0.5);
}

/* C [M, N] += A^T B with A stored [K, M]: M x N over the 4 Mi elements of a
 * block of rows, so the accumulation runs in two blocks (and in pieces, 8
 * pieces of K). Then A^T B + bias, overwriting. */
static void test_accumulate_whole(const char *path)
{
    const int M = 2300, N = 1900, K = 2048;
    char file[256], name[64];
    snprintf(name, sizeof name, "forced_%s", path);
    for (char *c = name; *c; c++)
        if (*c == '/') *c = '_';
    path_of(file, sizeof file, name);
    FILE *f = fopen(file, "w");
    fprintf(f, "1 0 %d %d %d %s 1.0 1.0\n", dt_mm_class_size(M), dt_mm_class_size(N),
            dt_mm_class_size(K), path);
    fclose(f);
    use(file);
    check_set_label("%s: ", path);
    float *A = malloc(sizeof(float) * K * M), *B = malloc(sizeof(float) * K * N);
    float *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
    float *P = malloc(sizeof(float) * M * N), *Pb = malloc(sizeof(float) * M * N);
    float *bias = malloc(sizeof(float) * N);
    fill(A, (size_t)K * M), fill(B, (size_t)K * N), fill(C0, (size_t)M * N), fill(bias, N);
    memcpy(C, C0, sizeof(float) * M * N);
    CHECK(dt_matmul(DT_PREC_F32, 1, 0, M, N, K, 1.0f, A, M, B, N, 0.0f, P, N) == 0, "%s",
          dt_matmul_error());
    CHECK(dt_matmul(DT_PREC_F32, 1, 0, M, N, K, 1.0f, A, M, B, N, 1.0f, C, N) == 0, "%s",
          dt_matmul_error());
    dt_matmul_problem with_bias = {.prec = DT_PREC_F32, .transA = 1, .M = M, .N = N, .K = K,
                                   .alpha = 1.0f, .A = A, .B = B, .lda = M, .ldb = N, .ldc = N,
                                   .bias = bias, .C = Pb};
    CHECK(dt_matmul_solve(&with_bias) == 0, "%s", dt_matmul_error());
    long differ = 0;
    double worst = 0, worst_bias = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            size_t at = (size_t)i * N + j;
            float want = C0[at] + P[at];
            if (memcmp(&want, &C[at], sizeof want)) differ++;
            double eb = fabs((double)Pb[at] - ((double)P[at] + bias[j]));
            if (eb > worst_bias) worst_bias = eb;
            if (i % 97 == 0 && j % 13 == 0) {
                double ref = 0;
                for (int k = 0; k < K; k++) ref += (double)A[(size_t)k * M + i] * B[(size_t)k * N + j];
                double e = fabs(P[at] - ref);
                if (e > worst) worst = e;
            }
        }
    CHECK(differ == 0, "%ld elements of C += A^T B differ from C + (A^T B) formed alone", differ);
    CHECK(worst < 1e-5, "the product is off the double reference by %g", worst);
    CHECK(worst_bias < 1e-5, "A^T B + bias is off the product plus the bias by %g", worst_bias);
    check_set_label("%s", "");
    free(A), free(B), free(C0), free(C), free(P), free(Pb), free(bias);
}

int main(void)
{
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    test_classes();
    test_decisions();
    test_file_written_by_another();
    test_two_processes();
    test_accumulate_whole("sgemm");
    test_accumulate_whole("primitive");
    test_accumulate_whole("sgemm/k256");
    test_accumulate_whole("primitive/k256");
    use(NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    return finish("matmul_paths");
}
