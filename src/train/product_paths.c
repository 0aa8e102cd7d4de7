/* The file of measured matrix-product paths for this CPU (product_paths.h). */
#include "train/product_paths.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/hash.h"
#include "core/str.h"
#include "kernels/matmul_paths.h"
#include "kernels/peak.h"
#include "train/data/corpus.h"

/* <cache dir>/matmul/<hash of the CPU>.txt, its directory made; -1 when
 * there is no cache directory or it cannot be made (the rule then). */
static int default_file(char *path, size_t len)
{
    char dir[DT_PATH_MAX], why[256], cpu[192];
    if (dt_cache_dir(dir, sizeof dir, why, sizeof why) != 0) return -1;
    if (dt_strf(dir + strlen(dir), sizeof dir - strlen(dir), "/matmul") < 0) return -1;
    if (dt_mkdir_p(dir, why, sizeof why) != 0) return -1;
    dt_cpu_identity(cpu, sizeof cpu);
    int n = snprintf(path, len, "%s/%016" PRIx64 ".txt", dir, dt_fnv1a64_str(cpu));
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int dt_product_paths_start(char *used, size_t usedlen, char *err, size_t errlen)
{
    const char *env = getenv("DTRAIN_MATMUL_PATHS");
    char path[DT_PATH_MAX];
    if (env && !*env) {
        dt_strf(err, errlen, "DTRAIN_MATMUL_PATHS is empty: give \"rule\" or a file");
        return -1;
    }
    const char *file = NULL;
    if (env && strcmp(env, "rule") != 0) file = env;
    else if (!env && default_file(path, sizeof path) == 0) file = path;
    dt_strf(used, usedlen, "%s", file ? file : "the fixed rule");
    return dt_mm_paths_use(file, err, errlen);
}
