/* Where a run's measured matrix-product paths live (kernels/matmul_paths.h):
 * one file per CPU in the cache directory, <cache dir>/matmul/<hash of the
 * CPU>.txt (cache dir as for the corpus), shared by every run on the host so
 * that they all multiply a shape the same way.
 *
 * DTRAIN_MATMUL_PATHS overrides it: "rule" keeps the fixed rule for every
 * product (nothing is timed or read), and any other value is the file to
 * use (a path with a '/', of a regular file or of none yet), for example
 * one on a filesystem the hosts of a cluster share, so that ranks on
 * different hosts also take the same paths. Without a cache directory the
 * rule holds. */
#ifndef DT_TRAIN_PRODUCT_PATHS_H
#define DT_TRAIN_PRODUCT_PATHS_H

#include <stddef.h>

/* Hands the file to the kernels; in used, its path or "the fixed rule".
 * 0, or -1 with a message in err (a file that cannot be read). */
int dt_product_paths_start(char *used, size_t usedlen, char *err, size_t errlen);

#endif
