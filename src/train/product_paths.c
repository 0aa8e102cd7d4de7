/* The file of measured matrix-product paths for this CPU (product_paths.h). */
#include "train/product_paths.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/str.h"
#include "kernels/matmul_paths.h"
#include "kernels/peak.h"
#include "train/peak.h"

/* The CPU's file in the cache directory, its directory made; -1 when there
 * is no cache directory or it cannot be made (the rule then). The
 * directory is matmul2 since the paths in pieces of K came: a file in
 * matmul holds classes timed on the two whole paths only, which would
 * keep them. */
static int default_file(char *path, size_t len)
{
    char cpu[192], why[256], dir[DT_PATH_MAX];
    dt_cpu_identity(cpu, sizeof cpu);
    if (dt_cpu_cache_path("matmul2", cpu, path, len, why, sizeof why) != 0) return -1;
    dt_dir_of(path, dir, sizeof dir);
    return dt_mkdir_p(dir, why, sizeof why);
}

/* A file named by DTRAIN_MATMUL_PATHS: a path (with a '/', so that a word
 * meant as a setting is not taken for a file in the working directory), of
 * a regular file or of none yet. */
static int check_named_file(const char *file, char *err, size_t errlen)
{
    struct stat st;
    if (!strchr(file, '/'))
        return dt_strf(err, errlen,
                       "DTRAIN_MATMUL_PATHS=%s: give \"rule\" or a file's path with a '/' "
                       "(for example ./%s)", file, file), -1;
    if (stat(file, &st) == 0 && !S_ISREG(st.st_mode))
        return dt_strf(err, errlen,
                       "DTRAIN_MATMUL_PATHS=%s is not a regular file: give \"rule\" or a file "
                       "to keep the paths in", file), -1;
    return 0;
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
    if (env && strcmp(env, "rule") != 0) {
        if (check_named_file(env, err, errlen)) return -1;
        file = env;
    }
    else if (!env && default_file(path, sizeof path) == 0) file = path;
    dt_strf(used, usedlen, "%s", file ? file : "the fixed rule");
    return dt_mm_paths_use(file, err, errlen);
}
