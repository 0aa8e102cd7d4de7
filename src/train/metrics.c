/* Step lines, JSON log, MFU and the memory table. See metrics.h. */
#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <sys/resource.h>

#include "core/alloc.h"
#include "core/shared_mem.h"
#include "core/str.h"
#include "core/window.h"
#include "train/peak.h"

double dt_peak_flops(int threads, int bf16)
{
    double peak;
    char desc[512];
    if (dt_mfu_peak(threads, 1, bf16, &peak, desc, sizeof desc) != 0) {
        fprintf(stderr, "dtrain: MFU not shown: %s\n", desc);
        return -1;
    }
    return peak > 0 ? peak : -1;
}

/* One warning per process: every step would repeat it. */
static atomic_int mfu_warned;

static double mfu_capped(double mfu)
{
    if (!(mfu > 1.0)) return mfu;
    if (!atomic_exchange(&mfu_warned, 1))
        fprintf(stderr, "dtrain: warning: MFU came out at %.1f%%, above 100%%: the peak it is "
                "measured against is underestimated (is DTRAIN_PEAK_GFLOPS too low?). MFU is "
                "shown capped, as 100%%*.\n", 100.0 * mfu);
    return 1.0;
}

double dt_mfu(double flops_per_s, double peak_flops)
{
    if (!(peak_flops > 0) || !(flops_per_s >= 0)) return -1;
    return mfu_capped(flops_per_s / peak_flops);
}

static void format_duration(char *buf, size_t len, double s)
{
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, len, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void dt_print_step(FILE *f, const dt_step_stats *s)
{
    char eta[32];
    format_duration(eta, sizeof eta, s->eta_s);
    int width = snprintf(NULL, 0, "%ld", s->steps);
    fprintf(f, "step %*ld/%ld | loss %.4f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s", width,
            s->step + 1, s->steps, s->loss, s->grad_norm, s->lr, s->ms, s->tokens_per_s);
    if (s->mfu >= 0) {
        double mfu = mfu_capped(s->mfu);
        fprintf(f, " | MFU %.1f%%%s", 100.0 * mfu, mfu >= 1.0 ? "*" : "");
    }
    if (s->moe) {
        fprintf(f, " | aux %.4f", s->aux_loss);
        if (s->z_loss > 0) fprintf(f, " z %.4f", s->z_loss);
        if (s->dropped > 0) fprintf(f, " dropped %.0f", s->dropped);
    }
    if (s->ranks > 1 && s->waits.known)
        fprintf(f, " | comm %.1f ms exposed (rank %d waited %.1f, slowest rank %d), %.1f MB sent",
                s->waits.exposed_ms, s->rank, s->comm_ms, s->waits.slowest,
                (double)s->bytes_sent / 1e6);
    else if (s->ranks > 1)
        fprintf(f, " | comm %.1f ms exposed, %.1f MB sent", s->comm_ms,
                (double)s->bytes_sent / 1e6);
    if (s->offload)
        fprintf(f, " | I/O %.1f ms exposed, %.1f MB at %.0f MB/s", s->io_ms,
                (double)s->io_bytes / 1e6,
                s->io_wall_ms > 0 ? (double)s->io_bytes / 1e3 / s->io_wall_ms : 0.0);
    if (s->io_param_bytes)
        fprintf(f, " + %.1f MB of parameters read", (double)s->io_param_bytes / 1e6);
    fprintf(f, " | ETA %s\n", eta);
    fflush(f);
}

/* JSON has no NaN or infinity; a diverged loss is written as null.
 * Negative when the write fails. */
static int json_number(FILE *f, const char *key, double v, int last)
{
    if (isfinite(v)) return fprintf(f, "\"%s\":%.9g%s", key, v, last ? "" : ",");
    return fprintf(f, "\"%s\":null%s", key, last ? "" : ",");
}

/* Closes and flushes the line: 0, or the errno of whatever failed in it. */
static int end_line(FILE *f, int failed)
{
    failed |= fputs("}\n", f) < 0;
    failed |= fflush(f) != 0;
    if (!failed && !ferror(f)) return 0;
    return errno ? errno : EIO;
}

int dt_log_json_step(FILE *f, const dt_step_stats *s)
{
    errno = 0;
    int failed = fprintf(f, "{\"step\":%ld,", s->step) < 0;
    failed |= json_number(f, "loss", s->loss, 0) < 0;
    failed |= json_number(f, "lr", s->lr, 0) < 0;
    failed |= json_number(f, "ms", s->ms, 0) < 0;
    failed |= json_number(f, "tokens_per_s", s->tokens_per_s, 0) < 0;
    if (s->moe) {
        failed |= json_number(f, "moe_aux_loss", s->aux_loss, 0) < 0;
        failed |= json_number(f, "moe_z_loss", s->z_loss, 0) < 0;
        failed |= json_number(f, "moe_dropped", s->dropped, 0) < 0;
        if (s->ep_skew > 0) failed |= json_number(f, "moe_ep_skew", s->ep_skew, 0) < 0;
    }
    if (s->ranks > 1) {
        failed |= json_number(f, "comm_ms", s->comm_ms, 0) < 0;
        if (s->waits.known) {
            failed |= json_number(f, "comm_exposed_ms", s->waits.exposed_ms, 0) < 0;
            failed |= json_number(f, "comm_wait_max_ms", s->waits.most_ms, 0) < 0;
            failed |= fprintf(f, "\"slowest_rank\":%d,", s->waits.slowest) < 0;
        }
        failed |= fprintf(f, "\"bytes_sent\":%llu,", s->bytes_sent) < 0;
    }
    if (s->offload) {
        failed |= json_number(f, "io_ms", s->io_ms, 0) < 0;
        failed |= json_number(f, "io_wall_ms", s->io_wall_ms, 0) < 0;
        failed |= fprintf(f, "\"io_bytes\":%llu,", s->io_bytes) < 0;
        failed |= fprintf(f, "\"io_param_bytes\":%llu,", s->io_param_bytes) < 0;
    }
    if (s->nprof > 0) {
        failed |= fprintf(f, "\"profile_ms\":{") < 0;
        for (int i = 0; i < s->nprof; i++)
            failed |= json_number(f, s->prof_names[i], s->prof_ms[i], i == s->nprof - 1) < 0;
        failed |= fprintf(f, "},") < 0;
    }
    failed |= json_number(f, "grad_norm", s->grad_norm, s->mfu < 0) < 0;
    if (s->mfu >= 0) failed |= json_number(f, "mfu", s->mfu, 1) < 0;
    return end_line(f, failed);
}

int dt_log_json_eval(FILE *f, long step, double val_loss)
{
    errno = 0;
    int failed = fprintf(f, "{\"step\":%ld,", step) < 0;
    failed |= json_number(f, "val_loss", val_loss, 1) < 0;
    return end_line(f, failed);
}

size_t dt_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

_Static_assert(DT_MEM_SNAPSHOT == DT_MEM_KIND_COUNT + 3, "one slot per kind, RSS, pooled, peers");

void dt_memory_snapshot(unsigned long long snap[DT_MEM_SNAPSHOT], int peak)
{
    for (int k = 0; k < DT_MEM_KIND_COUNT; k++)
        snap[k] = peak ? dt_mem_peak((dt_mem_kind)k) : dt_mem_current((dt_mem_kind)k);
    snap[DT_MEM_SNAP_RSS] = dt_peak_rss();
    snap[DT_MEM_SNAP_POOLED] = dt_window_pools_bytes();
    snap[DT_MEM_SNAP_PEERS] = dt_shared_peer_peak();
}

void dt_memory_rss_notes(char *buf, size_t n, const unsigned long long snap[DT_MEM_SNAPSHOT],
                         const char *unit)
{
    buf[0] = 0;
    size_t at = 0;
    if (snap[DT_MEM_SNAP_POOLED])
        at = (size_t)dt_strf(buf, n, ", pooled windows %.1f%s",
                             (double)snap[DT_MEM_SNAP_POOLED] / 1048576.0, unit);
    if (snap[DT_MEM_SNAP_PEERS] && at < n) /* shared pages the RSS counts twice */
        dt_strf(buf + at, n - at, ", peers' buffers mapped %.1f%s of it",
                (double)snap[DT_MEM_SNAP_PEERS] / 1048576.0, unit);
}

void dt_print_memory_snapshot(FILE *f, const char *title,
                              const unsigned long long snap[DT_MEM_SNAPSHOT])
{
    double total = 0;
    fprintf(f, "%s:", title);
    for (int k = 0; k < DT_MEM_KIND_COUNT; k++) {
        double mib = (double)snap[k] / 1048576.0;
        total += mib;
        if (mib > 0) fprintf(f, " %s %.1f MiB |", dt_mem_kind_name((dt_mem_kind)k), mib);
    }
    char pooled[128];
    dt_memory_rss_notes(pooled, sizeof pooled, snap, " MiB");
    fprintf(f, " total %.1f MiB | peak RSS %.1f MiB%s\n", total,
            (double)snap[DT_MEM_SNAP_RSS] / 1048576.0, pooled);
}

void dt_print_memory(FILE *f, const char *title)
{
    unsigned long long snap[DT_MEM_SNAPSHOT];
    dt_memory_snapshot(snap, 0);
    dt_print_memory_snapshot(f, title, snap);
}
