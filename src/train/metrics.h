/* What a training run reports: the per-step line on the terminal, the JSON
 * log (one object per optimizer step), MFU, and the memory table. */
#ifndef DT_TRAIN_METRICS_H
#define DT_TRAIN_METRICS_H

#include <stdio.h>

typedef struct {
    long step;        /* from 0 */
    long steps;       /* total */
    double loss;
    double grad_norm;
    double lr;
    double ms;        /* wall time of the step */
    double tokens_per_s;
    double mfu;       /* fraction of peak, or < 0 when unknown */
    double eta_s;
    int ranks;            /* data-parallel ranks; 1 in one process */
    double comm_ms;       /* communication not hidden behind compute */
    unsigned long long bytes_sent; /* by this rank in the step */
} dt_step_stats;

/* Peak FLOP/s the MFU is measured against: DTRAIN_PEAK_GFLOPS per thread if
 * set, else 110 GFLOP/s per thread in fp32 and 220 in bf16: the best matrix
 * product rates measured on the reference CPU (bench_kernels: 108 and 204-212;
 * REFERENCE.md says "about 100 and 200"), so that MFU stays below 100%. */
double dt_peak_flops(int threads, int bf16);

void dt_print_step(FILE *f, const dt_step_stats *s);
/* The JSON log, one line per object, each flushed as it is written, so
 * that a full disk shows at the step it hits. Each returns 0, or the errno
 * of the failed write (ENOSPC...): the caller stops with
 * "--log-json FILE: write failed: <strerror>". */
/* {"step":..,"loss":..,"lr":..,"ms":..,"tokens_per_s":..,"grad_norm":..,"mfu":..} */
int dt_log_json_step(FILE *f, const dt_step_stats *s);
/* {"step":..,"val_loss":..} */
int dt_log_json_eval(FILE *f, long step, double val_loss);
/* The bytes held per kind (parameters, gradients, optimizer, activations)
 * and the process's peak resident set. */
void dt_print_memory(FILE *f, const char *title);
/* The same as numbers, so ranks can send theirs to the one that prints:
 * bytes held per dt_mem_kind (now, or the most ever held), then the peak
 * resident set. */
#define DT_MEM_SNAPSHOT 7
void dt_memory_snapshot(unsigned long long snap[DT_MEM_SNAPSHOT], int peak);
void dt_print_memory_snapshot(FILE *f, const char *title,
                              const unsigned long long snap[DT_MEM_SNAPSHOT]);
/* Peak resident set size of this process in bytes. */
size_t dt_peak_rss(void);

#endif
