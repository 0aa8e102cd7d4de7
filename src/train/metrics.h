/* What a training run reports: the per-step line on the terminal, the JSON
 * log (one object per optimizer step), MFU, and the memory table. */
#ifndef DT_TRAIN_METRICS_H
#define DT_TRAIN_METRICS_H

#include <stdio.h>

#include "train/step_waits.h"

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
    int ranks;            /* ranks (or devices) of the job: communication shown above 1 */
    double comm_ms;       /* this rank's wait for communication */
    int rank;             /* the rank the line is about */
    dt_step_waits waits;  /* the lockstep ranks' waits compared (known 0: alone) */
    unsigned long long bytes_sent; /* by this rank in the step */
    int offload;          /* the optimizer state streams from a file: I/O shown */
    double io_ms;         /* the step's I/O not hidden behind compute (the optimizer's
                           * stream, offload_param's reads) */
    double io_wall_ms;    /* the optimizer step's stream, start to end */
    unsigned long long io_bytes; /* read and written by the stream */
    unsigned long long io_param_bytes; /* offload_param: the parameters' pieces read */
    int moe;              /* a mixture of experts: its balance terms shown */
    double aux_loss, z_loss; /* added to the loss differentiated, not to `loss` */
    double dropped;       /* routing slots the capacity dropped */
    double ep_skew;       /* busiest expert-parallel rank's slots / mean (0: no ep) */
    /* --profile: the step's milliseconds by part (names[i], prof_ms[i]), in
     * the log's "profile_ms" object; nprof 0 when off. */
    int nprof;
    const char *const *prof_names;
    const double *prof_ms;
} dt_step_stats;

/* The peak FLOP/s of `threads` threads in fp32 or bf16 (train/peak.h:
 * measured on this CPU and cached, or DTRAIN_PEAK_GFLOPS per thread), or -1
 * when unknown (no peak loop runs on this CPU, or the variable is
 * malformed: then a line on stderr says so). dt_mfu_peak is the same with
 * ranks and the line saying what the peak is. */
double dt_peak_flops(int threads, int bf16);

/* MFU as a fraction of peak: flops_per_s / peak_flops, capped at 1. Above 1
 * the peak is underestimated (a DTRAIN_PEAK_GFLOPS set too low): the first
 * time, a warning on stderr says so with the uncapped value. -1 when the
 * peak is unknown (<= 0). dt_print_step shows a capped MFU as "100%*". */
double dt_mfu(double flops_per_s, double peak_flops);

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
 * resident set, then the bytes of the window pools (core/window.h): pages
 * kept between uses, outside the resident set while idle. */
#define DT_MEM_SNAPSHOT 9
#define DT_MEM_SNAP_RSS DT_MEM_KIND_COUNT
#define DT_MEM_SNAP_POOLED (DT_MEM_KIND_COUNT + 1)
#define DT_MEM_SNAP_PEERS (DT_MEM_KIND_COUNT + 2) /* peers' shared buffers mapped, at most */
/* ", pooled windows 12.0" and `unit` where a window pool holds pages, else "". */
void dt_memory_rss_notes(char *buf, size_t n, const unsigned long long snap[DT_MEM_SNAPSHOT],
                           const char *unit);
void dt_memory_snapshot(unsigned long long snap[DT_MEM_SNAPSHOT], int peak);
void dt_print_memory_snapshot(FILE *f, const char *title,
                              const unsigned long long snap[DT_MEM_SNAPSHOT]);
/* Peak resident set size of this process in bytes. */
size_t dt_peak_rss(void);

#endif
