/*
 * The (batch, head) slices of an attention call, spread over the kernels'
 * threads. Every attention kernel (full-sequence and ring, forward and
 * backward) runs this way: a slice belongs to one thread, and each thread
 * has a scratch of its own (zeroed once, 64-byte aligned), so nothing is
 * shared and no slice waits on another.
 */
#ifndef DT_KERNELS_ATTENTION_SLICES_H
#define DT_KERNELS_ATTENTION_SLICES_H

#include <stddef.h>

typedef struct {
    size_t scratch_bytes;
    /* one slice, with the calling thread's scratch */
    void (*run)(const void *ctx, void *scratch, int b, int h);
    /* a slice whose thread got no scratch: its outputs to NaN */
    void (*fail)(const void *ctx, int b, int h);
    const void *ctx;
    const char *what; /* logged when a scratch could not be had */
} attn_slices;

/* Runs every slice of B x NH; returns -1 (after logging `what`) if a
 * thread's scratch could not be allocated, 0 otherwise. */
int attn_run_slices(const attn_slices *job, int B, int NH);

/* A scratch layout as data: n arrays, each `floats[i]` long, one after
 * another from base (when base is given, *at[i] is pointed at array i).
 * Returns the bytes they take, so that one list gives both the size and
 * the pointers, and the two cannot disagree. */
size_t attn_scratch_carve(float *base, float **const at[], const size_t floats[], int n);

/* x[t * ld + j] = NaN for t < rows, j < HS: a slice's output when its
 * thread had no scratch, so the failure cannot pass unseen. */
void attn_fill_nan(float *x, size_t ld, int rows, int HS);

#endif
