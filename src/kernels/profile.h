/* Where a step's compute time goes, by part (`dtrain train --profile`):
 * the kernels time themselves when the profile is on and add their time,
 * their floating-point operations and the bytes they move (both counted
 * from the shapes, as a roofline counts them) to their part. Off, a kernel
 * pays one relaxed load. Any thread may add; parts are summed atomically. */
#ifndef DT_KERNELS_PROFILE_H
#define DT_KERNELS_PROFILE_H

#include <stdatomic.h>
#include <stdint.h>

typedef enum {
    DT_PROF_MATMUL,       /* every matrix product (dt_matmul_solve) */
    DT_PROF_ATTENTION,    /* the attention core: scores, softmax, weighted values (ring
                           * attention's blocks and merges too) */
    DT_PROF_NORM,         /* LayerNorm, RMSNorm */
    DT_PROF_ACTIVATION,   /* GELU, SwiGLU */
    DT_PROF_CROSSENTROPY, /* the head's softmax and cross-entropy, whole or a vocabulary
                           * slice's */
    DT_PROF_EMBEDDING,    /* token and position embeddings, rotary ones included */
    DT_PROF_ROUTER,       /* a mixture of experts' routing */
    DT_PROF_OPTIMIZER,    /* the update */
    DT_PROF_GRAD_NORM,    /* the gradient's norm, for clipping */
    DT_PROF_BIAS_GRAD,    /* the linear layers' bias gradients (column sums) */
    DT_PROF_NKINDS
} dt_prof_kind;

typedef struct {
    uint64_t ns;
    double flops, bytes;
    long calls;
} dt_prof_part;

extern atomic_int dt_prof_enabled;

void dt_prof_enable(int on);
/* A kernel's start: 0 when the profile is off. */
uint64_t dt_prof_begin(void);
/* Its end (nothing when t0 is 0): the nanoseconds it added. */
uint64_t dt_prof_end(dt_prof_kind k, uint64_t t0, double flops, double bytes);
/* The parts since the last call, and zeroes them. */
void dt_prof_take(dt_prof_part out[DT_PROF_NKINDS]);
/* "matrix products", ... */
const char *dt_prof_name(dt_prof_kind k);

/* The matrix products again, by shape and path: which of them loses the
 * time. A shape is C[M, N] = op(A)[M, K] op(B)[K, N]; the path is how it
 * ran ("sgemm", "matmul" for oneDNN's primitive, "bf16" on its bf16
 * kernel, "bf16 in fp32" emulated). Shapes past DT_PROF_SHAPES add to one
 * last entry whose M is 0. */
#define DT_PROF_SHAPES 48

typedef struct {
    int M, N, K, transA, transB;
    const char *path; /* a string constant */
    uint64_t ns;
    double flops;
    long calls;
} dt_prof_shape;

/* Adds a product that began at t0 (nothing when 0) and took ns. */
void dt_prof_shape_add(const dt_prof_shape *key, uint64_t t0, uint64_t ns, double flops);
/* Adds ns, flops and calls to key's entry of table (*n entries, at most
 * DT_PROF_SHAPES), which it creates; a full table's last entry takes every
 * shape it lacks, as "other shapes" (M 0). */
void dt_prof_shapes_add(dt_prof_shape *table, int *n, const dt_prof_shape *key, uint64_t ns,
                        double flops, long calls);
/* The shapes since the last call (their count), and zeroes them. */
int dt_prof_take_shapes(dt_prof_shape out[DT_PROF_SHAPES]);

#endif
