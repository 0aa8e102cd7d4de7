/*
 * The cost model of the collectives (Hockney's; docs/comm.md): a
 * message of b bytes over a link costs alpha + beta * b seconds, reducing b
 * bytes costs gamma * b, copying them copy * b. One alpha/beta/gamma per
 * kind of link, measured by dt_comm_calibrate (calibrate.c) or read from a
 * file (DTRAIN_COMM_MODEL); built-in defaults were measured on the
 * reference machine. Rank 0's model is the job's, so every rank predicts,
 * and chooses, the same.
 */
#ifndef DT_COMM_COST_MODEL_H
#define DT_COMM_COST_MODEL_H

#include <stddef.h>

#include "comm/topo.h"

typedef struct {
    double alpha; /* seconds per message */
    double beta;  /* seconds per byte moved */
    double gamma; /* seconds per byte reduced */
} dt_link_cost;

typedef struct {
    dt_link_cost link[DT_LINK_KINDS];
    double copy;      /* seconds per byte of a local copy */
    char source[200]; /* "built-in defaults", a file's path, "calibrated on ..." */
} dt_cost_model;

/* What a model may hold, in the file's units: beyond these a figure is a
 * typo or a broken measurement (1e-300 GB/s would make every message last
 * longer than the universe), and the simulator's and auto's sums stop
 * meaning anything. Files are refused outside them; calibration clamps
 * what it measures into them, so that its file always loads. */
#define DT_COST_ALPHA_US_MIN 0.001 /* 1 ns */
#define DT_COST_ALPHA_US_MAX 1e5   /* 0.1 s */
#define DT_COST_GBPS_MIN 0.001     /* 1 MB/s */
#define DT_COST_GBPS_MAX 1e4       /* 10 TB/s */

void dt_cost_model_defaults(dt_cost_model *m);
/* JSON file (see docs/comm.md): 0, or -1 with a message naming the file,
 * the field and what was wrong in it (a figure outside the ranges above
 * among them). */
int dt_cost_model_load(dt_cost_model *m, const char *path, char *err, size_t len);
/* Written atomically (temporary file, then rename). */
int dt_cost_model_save(const dt_cost_model *m, const char *path, char *err, size_t len);
/* Median seconds per byte of a memcpy of `bytes` (calibrate.c); 0 when
 * the buffers cannot be had. */
double dt_measure_copy(size_t bytes);
/* One line per link kind, for --explain. */
void dt_cost_model_describe(const dt_cost_model *m, char *buf, size_t len);

#endif
