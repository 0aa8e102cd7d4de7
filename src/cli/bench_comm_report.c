/*
 * What `dtrain bench comm` prints: per op and algorithm, the nccl-tests
 * table (or CSV rows), or with --explain the cost model's prediction
 * beside the measured time of every algorithm at every size. Rank 0
 * prints; every rank runs the same loops (each point is collective).
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_comm.h"

/* ---- algorithms ------------------------------------------------------------ */

typedef struct {
    const char *name[BENCH_MAX_ALGOS];
    int n;
    int with_auto; /* --explain --algo auto,...: auto's pick alone may be all */
} algo_list;

static void list_add(algo_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->name[i], name)) return;
    if (l->n < BENCH_MAX_ALGOS) l->name[l->n++] = name;
}

/* DTRAIN_<OP>_ALGO, which the communicator read at init, or NULL. */
static const char *env_algo(bench_op op, char *var, size_t len)
{
    size_t o = (size_t)snprintf(var, len, "DTRAIN_");
    for (const char *s = bench_op_names[op]; *s && o + 1 < len; s++)
        var[o++] = (char)toupper((unsigned char)*s);
    snprintf(var + o, len - o, "_ALGO");
    const char *v = getenv(var);
    return v && *v ? v : NULL;
}

/* What the op runs when --algo is not given: the environment's choice or auto. */
static const char *default_algo(bench_op op)
{
    char var[64];
    const char *v = env_algo(op, var, sizeof var);
    return v ? v : "auto";
}

static int set_algo(bench_ctx *b, bench_op op, const char *algo)
{
    return dt_comm_set_algo(b->c, bench_op_names[op], algo);
}

/* Whether op's "mpi" algorithm can run here; if not, why. */
static int mpi_usable(bench_ctx *b, bench_op op, char *why, size_t len)
{
    int rc = set_algo(b, op, "mpi");
    if (rc) snprintf(why, len, "%s", dt_comm_error(b->c));
    set_algo(b, op, default_algo(op));
    return rc == 0;
}

/* The algorithms to measure for op. `all` skips an unusable "mpi" with a
 * note; --explain measures every algorithm unless --algo narrows it. */
static void algos_for(bench_ctx *b, bench_op op, algo_list *l)
{
    const char *names[BENCH_MAX_ALGOS];
    int n = dt_comm_algo_names(bench_op_names[op], names, BENCH_MAX_ALGOS);
    l->n = l->with_auto = 0;
    const char *spec = b->o->algo ? b->o->algo : b->o->explain ? "all" : default_algo(op);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "all")) {
            for (int i = 0; i < n; i++) {
                char why[800];
                if (!strcmp(names[i], "mpi") && !mpi_usable(b, op, why, sizeof why)) {
                    if (b->rank == 0)
                        fprintf(b->note, "# note: %s: skipping algorithm mpi: %s\n",
                                bench_op_names[op], why);
                    continue;
                }
                list_add(l, names[i]);
            }
        } else if (!strcmp(t, "auto")) {
            if (!b->o->explain) list_add(l, "auto");
            else l->with_auto = 1; /* explain_op adds auto's pick at each size */
        } else {
            for (int i = 0; i < n; i++)
                if (!strcmp(names[i], t)) list_add(l, names[i]);
        }
    }
    if (b->o->explain && b->o->peer_mpi) list_add(l, "mpi");
}

/* Force algo (or auto) for op; an algorithm that cannot run here is a
 * usage error (exit 2), said once. */
static int force(bench_ctx *b, bench_op op, const char *algo)
{
    if (set_algo(b, op, algo) == 0) return 0;
    if (b->rank == 0) fprintf(stderr, BENCH ": --algo %s: %s\n", algo, dt_comm_error(b->c));
    return 2;
}

/* ---- formatting helpers ------------------------------------------------------ */

static const char *redop(bench_op op)
{
    return op == B_ALLREDUCE || op == B_REDUCE_SCATTER ? "sum" : "none";
}

static int root_of(bench_op op) { return op == B_BROADCAST ? 0 : -1; }

static double algbw(size_t bytes, double us) { return us > 0 ? (double)bytes / us / 1e3 : 0; }

static const char *factor_text(bench_op op)
{
    return op == B_ALLREDUCE ? "2(n-1)/n" : op == B_BROADCAST ? "1" : "(n-1)/n";
}

static void fail_msg(bench_ctx *b)
{
    fprintf(stderr, BENCH ": rank %d: %s\n", b->rank, dt_comm_error(b->c));
}

/* ---- tables and CSV ------------------------------------------------------------ */

static const char csv_header[] =
    "op,algo,ran,auto_pick,ranks,transport,dtype,redop,root,bytes,count,inplace,iters,"
    "time_us,min_us,avg_us,algbw_gbps,busbw_gbps,wrong,mem_eff_pct,predicted_us,peer,"
    "peer_busbw_gbps,vs_peer";

static void csv_num(double v, int ok)
{
    if (ok) printf(",%.6g", v);
    else printf(",");
}

static void csv_row(bench_ctx *b, bench_op op, const char *algo, const char *ran,
                    const char *pick, const bench_size *s, int inplace, const bench_point *pt,
                    const char *peer, double peer_bus)
{
    double alg = algbw(s->bytes, pt->us), bus = alg * bench_bus_factor(op, b->size);
    double pred = dt_comm_predict_us(b->c, bench_op_names[op], ran, bench_algo_count(b, op, s),
                                     b->o->dtype);
    printf("%s,%s,%s,%s,%d,%s,%s,%s,%d,%zu,%zu,%d,%d", bench_op_names[op], algo, ran, pick,
           b->size, dt_comm_transport(b->c), dt_dtype_name(b->o->dtype), redop(op), root_of(op),
           s->bytes, s->bytes / b->esz, inplace, pt->iters);
    csv_num(pt->us, 1);
    csv_num(pt->min_us, 1);
    csv_num(pt->avg_us, 1);
    csv_num(alg, 1);
    csv_num(bus, 1);
    printf(",%ld", pt->wrong);
    csv_num(b->copy_gbps > 0 ? 100 * bus / b->copy_gbps : 0, b->copy_gbps > 0);
    csv_num(pred, pred >= 0);
    printf(",%s", peer);
    csv_num(peer_bus, peer_bus > 0);
    csv_num(peer_bus > 0 ? bus / peer_bus : 0, peer_bus > 0);
    printf("\n");
}

/* A line built piecewise, printed without trailing blanks. */
typedef struct {
    char s[512];
    size_t n;
} line;

static void add(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(line *l, const char *fmt, ...)
{
    if (l->n >= sizeof l->s) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->s + l->n, sizeof l->s - l->n, fmt, ap);
    va_end(ap);
    if (k > 0) l->n += (size_t)k;
    if (l->n >= sizeof l->s) l->n = sizeof l->s - 1;
}

static void end_line(line *l)
{
    while (l->n > 0 && l->s[l->n - 1] == ' ') l->n--;
    l->s[l->n] = '\0';
    puts(l->s);
    l->n = 0;
}

static void table_header(bench_ctx *b, bench_op op, const char *algo)
{
    char var[64];
    const char *env = env_algo(op, var, sizeof var);
    const char *coll = bench_op_names[op];
    int is_auto = !strcmp(algo, "auto"), peer = b->o->peer_mpi;
    printf("#\n# %s, algorithm %s", coll, algo);
    if (is_auto) printf(" (the cost model's choice at each size: column \"algo\")");
    else if (!b->o->algo && env) printf(" (%s): %s", var, dt_comm_algo_summary(coll, algo));
    else printf(": %s", dt_comm_algo_summary(coll, algo));
    printf("\n# busbw = algbw x %s = %.4g\n", factor_text(op), bench_bus_factor(op, b->size));
    line l = {.n = 0};
    add(&l, "#%46s %-46s %s", "", "out-of-place", "in-place");
    end_line(&l);
    add(&l, "#%11s %12s %6s %6s %5s  %10s %9s %9s %7s %6s  %10s %9s %9s %7s %6s", "size", "count",
        "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "mem%", "time", "algbw",
        "busbw", "#wrong", "mem%");
    if (is_auto) add(&l, "  %-12s", "algo");
    if (peer) add(&l, " %9s %8s", "mpi busbw", "ours/mpi");
    end_line(&l);
    add(&l, "#%11s %12s %6s %6s %5s  %10s %9s %9s %7s %6s  %10s %9s %9s %7s %6s", "(B)",
        "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)", "(GB/s)",
        "", "");
    if (is_auto) add(&l, "  %-12s", "");
    if (peer) add(&l, " %9s %8s", "(GB/s)", "");
    end_line(&l);
}

/* One table (or its CSV rows) for op forced to algo. picks[i]: auto's
 * choice at size i; peer/peer_ok: MPI's out-of-place points, measured
 * on first need and shared by the op's tables. */
static int one_table(bench_ctx *b, bench_op op, const char *algo, const bench_size *sz, int n,
                     const char **picks, bench_point *peer, int *peer_ok, int *status)
{
    int rc = force(b, op, algo);
    if (rc) return rc;
    int csv = b->o->csv, is_auto = !strcmp(algo, "auto");
    if (!csv && b->rank == 0) table_header(b, op, algo);
    double bus_sum = 0;
    long wrong = 0;
    int modes = bench_has_inplace(op) ? 2 : 1; /* out of place, and in place where there is one */
    for (int i = 0; i < n; i++) {
        bench_point pt[2] = {{0}};
        for (int ip = 0; ip < modes && rc == 0; ip++)
            rc = bench_measure(b, op, &sz[i], ip, &pt[ip]);
        if (rc == 0 && b->o->peer_mpi && !peer_ok[i]) {
            rc = force(b, op, "mpi");
            if (rc == 0) rc = bench_measure(b, op, &sz[i], 0, &peer[i]);
            if (rc == 0) peer_ok[i] = 1;
            if (rc == 0 && peer[i].wrong) *status = 1;
            if (rc == 0 && csv && b->rank == 0)
                csv_row(b, op, "mpi", "mpi", picks[i], &sz[i], 0, &peer[i], "mpi", 0);
            if (rc == 0) rc = force(b, op, algo);
        }
        if (rc) {
            if (rc < 0) fail_msg(b);
            return rc < 0 ? 1 : rc;
        }
        const char *ran = dt_comm_algo_for(b->c, bench_op_names[op],
                                           bench_algo_count(b, op, &sz[i]), b->o->dtype);
        if (!ran) ran = algo;
        double f = bench_bus_factor(op, b->size), bus[2], alg[2];
        for (int ip = 0; ip < 2; ip++) {
            alg[ip] = algbw(sz[i].bytes, pt[ip].us);
            bus[ip] = alg[ip] * f;
        }
        double peer_bus = peer_ok[i] ? algbw(sz[i].bytes, peer[i].us) * f : 0;
        bus_sum += bus[0];
        wrong += pt[0].wrong + pt[1].wrong;
        if (b->rank != 0) continue;
        if (csv) {
            for (int ip = 0; ip < modes; ip++)
                csv_row(b, op, algo, ran, picks[i], &sz[i], ip, &pt[ip], "", peer_bus);
            continue;
        }
        line l = {.n = 0};
        add(&l, " %11zu %12zu %6s %6s %5d", sz[i].bytes, sz[i].bytes / b->esz,
            dt_dtype_name(b->o->dtype), redop(op), root_of(op));
        for (int ip = 0; ip < 2; ip++)
            if (ip < modes)
                add(&l, "  %10.2f %9.3f %9.3f %7ld %6.1f", pt[ip].us, alg[ip], bus[ip],
                    pt[ip].wrong, b->copy_gbps > 0 ? 100 * bus[ip] / b->copy_gbps : 0);
            else
                add(&l, "  %10s %9s %9s %7s %6s", "-", "-", "-", "-", "-");
        if (is_auto) add(&l, "  %-12s", ran);
        if (b->o->peer_mpi) add(&l, " %9.3f %8.2f", peer_bus, peer_bus > 0 ? bus[0] / peer_bus : 0);
        end_line(&l);
    }
    if (wrong) *status = 1;
    if (!csv && b->rank == 0) {
        printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.3f GB/s\n", n ? bus_sum / n : 0);
    }
    fflush(stdout);
    return 0;
}

/* ---- --explain ---------------------------------------------------------------- */

static int explain_op(bench_ctx *b, bench_op op, const algo_list *l, const bench_size *sz, int n,
                      const char **picks, int *status)
{
    const char *coll = bench_op_names[op];
    if (b->rank == 0) {
        printf("#\n# %s, %d ranks over %s, %s %s: the cost model's prediction and the measured\n"
               "# time of each algorithm (out of place, the slowest rank's average, us); "
               "\"auto\" marks the\n# model's choice, \"fastest\" the measured best. "
               "busbw = algbw x %s.\n",
               coll, b->size, dt_comm_transport(b->c), dt_dtype_name(b->o->dtype), redop(op),
               factor_text(op));
        printf("#%11s  %-18s %13s %13s %9s %9s %7s\n", "size (B)", "algorithm", "predicted",
               "measured", "meas/pred", "busbw", "#wrong");
    }
    int right = 0, judged = 0, worst_i = -1;
    double loss_sum = 0, worst = 1;
    for (int i = 0; i < n; i++) {
        algo_list m = *l;
        if (picks[i][0] && strcmp(picks[i], "self")) list_add(&m, picks[i]);
        double us[BENCH_MAX_ALGOS];
        long wr[BENCH_MAX_ALGOS];
        int fastest = -1, picked = -1;
        for (int a = 0; a < m.n; a++) {
            bench_point pt;
            int rc = force(b, op, m.name[a]);
            if (rc == 0) rc = bench_measure(b, op, &sz[i], 0, &pt);
            if (rc) {
                if (rc < 0) fail_msg(b);
                return rc < 0 ? 1 : rc;
            }
            us[a] = pt.us;
            wr[a] = pt.wrong;
            if (pt.wrong) *status = 1;
            if (fastest < 0 || us[a] < us[fastest]) fastest = a;
            if (!strcmp(m.name[a], picks[i])) picked = a;
        }
        if (picked >= 0 && fastest >= 0) {
            judged++;
            double loss = us[picked] / us[fastest];
            if (picked == fastest) right++;
            else loss_sum += loss;
            if (loss > worst) worst = loss, worst_i = i;
        }
        if (b->rank != 0) continue;
        for (int a = 0; a < m.n; a++) {
            double pred = dt_comm_predict_us(b->c, coll, m.name[a],
                                             bench_algo_count(b, op, &sz[i]), b->o->dtype);
            char p[32] = "-", r[32] = "-";
            if (pred >= 0) {
                snprintf(p, sizeof p, "%.2f", pred);
                if (pred > 0) snprintf(r, sizeof r, "%.2f", us[a] / pred);
            }
            printf(" %11zu  %-18s %13s %13.2f %9s %9.3f %7ld%s%s%s%s\n", sz[i].bytes, m.name[a],
                   p, us[a], r, algbw(sz[i].bytes, us[a]) * bench_bus_factor(op, b->size), wr[a],
                   a == picked || a == fastest ? "  <-" : "", a == picked ? " auto" : "",
                   a == picked && a == fastest ? "," : "", a == fastest ? " fastest" : "");
        }
        printf("\n");
    }
    if (b->rank == 0 && judged) {
        printf("# %s: auto's pick was the fastest measured at %d of %d sizes", coll, right, judged);
        if (right < judged)
            printf("; elsewhere it took %.2fx the fastest's time on average (worst %.2fx at %zu B)",
                   loss_sum / (judged - right), worst, sz[worst_i].bytes);
        printf("\n");
    }
    fflush(stdout);
    return force(b, op, default_algo(op));
}

void bench_print_model(bench_ctx *b, FILE *f)
{
    char model[2048];
    dt_comm_describe_model(b->c, model, sizeof model);
    fputs("# ", f);
    for (const char *p = model; *p; p++) {
        fputc(*p, f);
        if (*p == '\n') fputs("# ", f);
    }
    fputc('\n', f);
}

/* ---- all ops -------------------------------------------------------------------- */

static void print_header(bench_ctx *b, size_t copy_bytes)
{
    if (b->o->csv) {
        printf("%s\n", csv_header);
        return;
    }
    printf("# dtrain bench comm: %d rank%s over %s, dtype %s, ", b->size, b->size == 1 ? "" : "s",
           dt_comm_transport(b->c), dt_dtype_name(b->o->dtype));
    if (b->o->warmup >= 0) printf("warm-up %d, ", b->o->warmup);
    else printf("warm-up a tenth of the timed calls (at least 5), ");
    if (b->o->iters) printf("%d timed iterations\n", b->o->iters);
    else printf("1000 timed iterations up to 64 KiB, 100 up to 4 MiB, 20 above\n");
    printf("# time: the slowest rank's average; algbw = size / time; busbw = algbw x the op's "
           "nccl-tests factor\n");
    printf("# copy bandwidth %.2f GB/s (memcpy of %zu MiB on rank 0, median of 5); mem%% = busbw "
           "/ copy bandwidth:\n#   each rank must move size x factor bytes through memory "
           "(see docs/bench_comm.md)\n",
           b->copy_gbps, copy_bytes >> 20);
    if (b->size > 1 && b->copy_gbps > 0)
        printf("# with all %d ranks copying at once, the slowest copies %.2f GB/s: a collective "
               "that moves data on every rank at once\n#   tops out near mem%% %.0f here\n",
               b->size, b->copy_all_gbps, 100 * b->copy_all_gbps / b->copy_gbps);
}

#define WARM_CALLS 100000 /* a few tens of milliseconds */

static int run_op(bench_ctx *b, bench_op op, int *status)
{
    algo_list l;
    algos_for(b, op, &l);
    if (l.n == 0 && !l.with_auto) {
        if (b->rank == 0)
            fprintf(b->note, "# note: %s: no algorithm of --algo %s applies; skipped\n",
                    bench_op_names[op], b->o->algo);
        return 0;
    }
    bench_size *sz;
    int n = bench_sizes(b, op, &sz);
    const char **picks = calloc((size_t)n + 1, sizeof *picks);
    bench_point *peer = calloc((size_t)n + 1, sizeof *peer);
    int *peer_ok = calloc((size_t)n + 1, sizeof *peer_ok);
    int rc = sz && picks && peer && peer_ok ? force(b, op, "auto") : 1;
    for (int i = 0; i < n && rc == 0; i++) {
        picks[i] = dt_comm_algo_for(b->c, bench_op_names[op], bench_algo_count(b, op, &sz[i]),
                                    b->o->dtype);
        if (!picks[i]) picks[i] = "";
    }
    if (rc == 0 && b->o->explain) rc = explain_op(b, op, &l, sz, n, picks, status);
    for (int a = 0; a < l.n && rc == 0 && !b->o->explain; a++)
        rc = one_table(b, op, l.name[a], sz, n, picks, peer, peer_ok, status);
    if (rc == 0) rc = force(b, op, default_algo(op));
    free(sz);
    free(picks);
    free(peer);
    free(peer_ok);
    return rc;
}

int bench_run_all(bench_ctx *b)
{
    if (b->o->peer_mpi)
        for (int op = 0; op < B_NOPS; op++) {
            char why[800];
            if (!b->o->op_on[op] || mpi_usable(b, (bench_op)op, why, sizeof why)) continue;
            if (b->rank == 0) fprintf(stderr, BENCH ": --peer mpi: %s\n", why);
            return 2;
        }
    size_t copy_bytes = 0;
    if (!b->o->explain) {
        int rc = bench_copy_bandwidth(b, &b->copy_gbps, &copy_bytes);
        if (rc) {
            fail_msg(b);
            return 1;
        }
    }
    if (b->rank == 0) {
        if (b->o->explain && !b->o->calibrate) bench_print_model(b, stdout);
        if (!b->o->explain) print_header(b, copy_bytes);
        fflush(stdout);
    }
    /* The first row would otherwise pay for cold CPUs (clocks ramping up,
     * pages not yet touched): spin the ranks up together first, and with
     * MPI too when it is measured alongside. */
    float warm[16] = {0}, warm_out[16];
    for (int i = 0; i < WARM_CALLS; i++)
        if (dt_allreduce(b->c, warm, warm_out, 16, DT_F32, DT_SUM)) {
            fail_msg(b);
            return 1;
        }
    int status = 0;
    for (int op = 0; op < B_NOPS; op++) {
        if (!b->o->op_on[op]) continue;
        int rc = run_op(b, (bench_op)op, &status);
        if (rc) return rc;
    }
    return status;
}
