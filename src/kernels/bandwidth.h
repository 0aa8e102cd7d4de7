/* The memory bandwidth a roofline bounds memory-bound kernels with. */
#ifndef DT_KERNELS_BANDWIDTH_H
#define DT_KERNELS_BANDWIDTH_H

/* Bytes a second that the kernels' threads move copying a buffer far
 * larger than the caches (each byte read and each written counts), the
 * best of a few runs; 0 when memory runs out. Takes about a quarter of a
 * second. */
double dt_copy_bandwidth(void);

#endif
