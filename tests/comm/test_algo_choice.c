/*
 * The cost model and auto's choice, against the textbook formulas
 * (written out here independently of the dry runs that produce them).
 * Run under `dtrain launch -n N` with DTRAIN_COMM_MODEL pointing at a
 * model file (alpha, beta, gamma given), on one host:
 *  - every rank picks the same algorithm for every collective and size;
 *  - with p a power of two, each all-reduce algorithm's prediction equals
 *    its textbook cost (alpha, beta and gamma terms) to rounding;
 *  - auto's all-reduce is the cheapest by those formulas, so small
 *    messages go to a latency algorithm and large ones to a bandwidth one;
 *  - the model in use is the file's.
 * Across two hosts of two ranks each (DTRAIN_HOSTNAME=h0,h0,h1,h1) and
 * with the TCP numbers given too, the hierarchical all-reduce's
 * prediction equals its own formula, and auto takes it for large
 * messages, where it sends a quarter of what the ring sends across hosts.
 * Usage: test_algo_choice ALPHA_US BANDWIDTH_GBPS REDUCE_GBPS
 *        [TCP_ALPHA_US TCP_BANDWIDTH_GBPS TCP_REDUCE_GBPS]
 * (the file's numbers, so the formulas need not parse JSON).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* tests/check.h */
#include "dtrain/comm.h"

static int rank, size;

static const char *colls[] = {"allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall"};

/* Textbook all-reduce costs (Thakur, Rabenseifner and Gropp, 2005), n bytes. */
static double formula(const char *algo, double n, int p, double a, double b, double g)
{
    double lg = log2((double)p), f = (double)(p - 1) / p;
    if (!strcmp(algo, "naive")) return (p - 1) * a + (p - 1) * n * b + (p - 1) * n * g;
    if (!strcmp(algo, "ps")) return 2 * (p - 1) * a + 2 * (p - 1) * n * b + (p - 1) * n * g;
    if (!strcmp(algo, "tree")) return 2 * lg * a + 2 * n * lg * b + n * lg * g;
    if (!strcmp(algo, "butterfly")) return lg * a + n * lg * b + n * lg * g;
    if (!strcmp(algo, "ring") || !strcmp(algo, "hier")) /* hier on one host is the ring */
        return 2 * (p - 1) * a + 2 * n * f * b + n * f * g;
    if (!strcmp(algo, "rhd")) return 2 * lg * a + 2 * n * f * b + n * f * g;
    return -1;
}

static unsigned long name_hash(const char *s)
{
    unsigned long h = 5381;
    for (; s && *s; s++) h = h * 33 + (unsigned char)*s;
    return h;
}

static void same_everywhere(dt_comm *c, const char *coll, size_t count, const char *name)
{
    int64_t h = (int64_t)name_hash(name), lo, hi;
    if (dt_allreduce(c, &h, &lo, 1, DT_I64, DT_MIN) || dt_allreduce(c, &h, &hi, 1, DT_I64, DT_MAX)) {
        fprintf(stderr, "rank %d: allreduce failed: %s\n", rank, dt_comm_error(c));
        exit(1);
    }
    CHECK(lo == hi, "%s of %zu elements: ranks chose different algorithms (ours %s)", coll, count,
          name ? name : "(null)");
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 7) {
        fprintf(stderr, "usage: %s ALPHA_US BANDWIDTH_GBPS REDUCE_GBPS [TCP_ALPHA_US "
                "TCP_BANDWIDTH_GBPS TCP_REDUCE_GBPS]\n", argv[0]);
        return 2;
    }
    double a = atof(argv[1]) * 1e-6, b = 1 / (atof(argv[2]) * 1e9), g = 1 / (atof(argv[3]) * 1e9);
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    check_set_label("rank %d: ", rank);
    char model[1024];
    dt_comm_describe_model(c, model, sizeof model);
    CHECK(strstr(model, "model_test.json") != NULL, "the model in use is not the file's: %s", model);

    /* The same choice on every rank, every collective, 4 B to 256 MiB. */
    for (int k = 0; k < 5; k++)
        for (size_t bytes = 4; bytes <= (256u << 20); bytes *= 4) {
            size_t count = bytes / 4;
            if (strcmp(colls[k], "allreduce") && strcmp(colls[k], "broadcast")) count /= (size_t)size;
            if (!count) count = 1;
            same_everywhere(c, colls[k], count, dt_comm_algo_for(c, colls[k], count, DT_F32));
        }

    if (argc == 7) {
        double ta = atof(argv[4]) * 1e-6, tb = 1 / (atof(argv[5]) * 1e9), tg = 1 / (atof(argv[6]) * 1e9);
        CHECK(size == 4 && dt_comm_local_size(c) == 2, "the two-host check wants 2 hosts x 2 ranks");
        (void)tg; /* hier reduces what arrives over TCP with gamma of the link it came by */
        for (size_t bytes = 64; size == 4 && bytes <= (256u << 20); bytes *= 4) {
            double n = (double)bytes;
            /* Local reduce-scatter and all-gather of halves over shared
             * memory; the column ring's two steps of quarters over TCP. */
            double want = 2 * (a + b * n / 2) + g * n / 2 + 2 * (ta + tb * n / 4) + tg * n / 4;
            double got = dt_comm_predict_us(c, "allreduce", "hier", bytes / 4, DT_F32) * 1e-6;
            CHECK(fabs(got - want) <= 1e-9 * want, "hier, %zu bytes, 2 x 2 ranks: predicted %.6g "
                  "us, the formula says %.6g us", bytes, got * 1e6, want * 1e6);
        }
        const char *big = dt_comm_algo_for(c, "allreduce", (256u << 20) / 4, DT_F32);
        CHECK(big && !strcmp(big, "hier"), "256 MiB across two hosts went to %s, not hier", big);
        if (rank == 0)
            printf("test_algo_choice: 2 hosts x 2 ranks: %ld checks, %d failed on rank 0 (256 MiB -> %s)\n",
                   checks, failures, big ? big : "-");
        dt_comm_destroy(c);
        return failures ? 1 : 0;
    }

    int pow2 = (size & (size - 1)) == 0 && size > 1;
    const char *algos[16];
    int nalgos = dt_comm_algo_names("allreduce", algos, 16);
    const char *small = NULL, *large = NULL;
    for (size_t bytes = 64; pow2 && bytes <= (256u << 20); bytes *= 4) {
        size_t count = bytes / 4;
        const char *best = NULL;
        double best_t = 0;
        for (int i = 0; i < nalgos; i++) {
            double want = formula(algos[i], (double)bytes, size, a, b, g);
            if (want < 0) continue; /* mpi: not costed */
            double got = dt_comm_predict_us(c, "allreduce", algos[i], count, DT_F32) * 1e-6;
            CHECK(fabs(got - want) <= 1e-9 * want, "%s, %zu bytes, %d ranks: predicted %.6g us, "
                  "the formula says %.6g us", algos[i], bytes, size, got * 1e6, want * 1e6);
            if (!best || want < best_t * (1 - 1e-12)) best = algos[i], best_t = want;
        }
        const char *chosen = dt_comm_algo_for(c, "allreduce", count, DT_F32);
        double chosen_t = formula(chosen, (double)bytes, size, a, b, g);
        CHECK(chosen_t <= best_t * (1 + 1e-12), "%zu bytes: auto chose %s (%.3f us), but %s costs "
              "%.3f us", bytes, chosen, chosen_t * 1e6, best, best_t * 1e6);
        if (!small) small = chosen;
        large = chosen;
    }
    if (pow2) {
        CHECK(!strcmp(small, "butterfly") || !strcmp(small, "tree"),
              "64 B all-reduce went to %s, not a latency algorithm", small);
        CHECK(!strcmp(large, "ring") || !strcmp(large, "rhd"),
              "256 MiB all-reduce went to %s, not a bandwidth algorithm", large);
    }
    if (rank == 0)
        printf("test_algo_choice: %d ranks: %ld checks, %d failed on rank 0 (small -> %s, large -> %s)\n",
               size, checks, failures, small ? small : "-", large ? large : "-");
    dt_comm_destroy(c);
    return failures ? 1 : 0;
}
