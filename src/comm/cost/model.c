/*
 * The cost model's numbers: built-in defaults, and the JSON file that
 * `dtrain bench comm --calibrate FILE` writes and DTRAIN_COMM_MODEL reads.
 * The file speaks in the units people quote (microseconds, GB/s); the
 * struct in seconds and seconds per byte.
 *
 *   {"format": "dtrain-comm-model/1", "source": "...", "copy_GBps": 12.4,
 *    "links": {"shm": {"alpha_us": 0.3, "bandwidth_GBps": 9, "reduce_GBps": 11},
 *              "tcp": {...}, "mpi": {...}}}
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/cost/model.h"
#include "core/atomic_file.h"
#include "core/file.h"

#define FORMAT "dtrain-comm-model/1"

static dt_link_cost link_from(double alpha_us, double bw_gbps, double reduce_gbps)
{
    return (dt_link_cost){alpha_us * 1e-6, 1.0 / (bw_gbps * 1e9), 1.0 / (reduce_gbps * 1e9)};
}

/* shm and mpi: `dtrain bench comm --nproc 2 --calibrate` on the reference
 * machine (2 Zen 4 cores; mpi under mpirun with DTRAIN_TRANSPORT=mpi),
 * rounded. tcp: loopback measures 4.3 us and 4.1 GB/s there, which no
 * network between hosts matches, so the default assumes a 25 Gb/s-class
 * one; calibrate on the cluster for its own numbers. */
void dt_cost_model_defaults(dt_cost_model *m)
{
    memset(m, 0, sizeof *m);
    m->link[DT_LINK_SHM] = link_from(0.30, 18.0, 8.5);
    m->link[DT_LINK_TCP] = link_from(12.0, 3.0, 8.5);
    m->link[DT_LINK_MPI] = link_from(0.40, 11.0, 8.5);
    m->copy = 1.0 / 15.0e9;
    snprintf(m->source, sizeof m->source, "built-in defaults");
}

static int bad(char *err, size_t len, const char *path, const char *what)
{
    snprintf(err, len, "%s: %s", path, what);
    return -1;
}

/* A number member of obj within [lo, hi] (microseconds or GB/s); where
 * is obj's place in the file ("links.tcp"), "" at the top. */
static int in_range(const cJSON *obj, const char *key, double lo, double hi, const char *unit,
                    double *out, const char *path, const char *where, char *err, size_t len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        snprintf(err, len, "%s: %s has no \"%s\"", path, *where ? where : "the model", key);
        return -1;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        char got[64];
        if (cJSON_IsNumber(v)) snprintf(got, sizeof got, "%g", v->valuedouble);
        else snprintf(got, sizeof got, "not a number");
        snprintf(err, len, "%s: %s%s%s is %s; it must be a number from %g to %g (%s)", path,
                 where, *where ? "." : "", key, got, lo, hi, unit);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

/* A rate in GB/s, within the model's range. */
static int rate(const cJSON *obj, const char *key, double *out, const char *path,
                const char *where, char *err, size_t len)
{
    return in_range(obj, key, DT_COST_GBPS_MIN, DT_COST_GBPS_MAX, "GB/s: 1 MB/s to 10 TB/s",
                    out, path, where, err, len);
}

static int read_link(const cJSON *obj, const char *name, dt_link_cost *out, const char *path,
                     char *err, size_t len)
{
    char where[64];
    snprintf(where, sizeof where, "links.%s", name);
    if (!cJSON_IsObject(obj)) return bad(err, len, path, "each of \"links\" must be an object");
    for (const cJSON *k = obj->child; k; k = k->next)
        if (strcmp(k->string, "alpha_us") && strcmp(k->string, "bandwidth_GBps") &&
            strcmp(k->string, "reduce_GBps")) {
            snprintf(err, len, "%s: %s has unknown key \"%s\" (known: alpha_us, bandwidth_GBps, "
                     "reduce_GBps)", path, where, k->string);
            return -1;
        }
    double a, bw, red;
    if (in_range(obj, "alpha_us", DT_COST_ALPHA_US_MIN, DT_COST_ALPHA_US_MAX,
                 "microseconds: 1 ns to 0.1 s", &a, path, where, err, len) ||
        rate(obj, "bandwidth_GBps", &bw, path, where, err, len) ||
        rate(obj, "reduce_GBps", &red, path, where, err, len))
        return -1;
    *out = link_from(a, bw, red);
    return 0;
}

static int parse_model(const cJSON *root, dt_cost_model *m, const char *path, char *err,
                       size_t len)
{
    if (!cJSON_IsObject(root)) return bad(err, len, path, "not a JSON object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT))
        return bad(err, len, path, "\"format\" is not \"" FORMAT "\" (write it with "
                   "dtrain bench comm --calibrate FILE)");
    double copy;
    if (rate(root, "copy_GBps", &copy, path, "", err, len)) return -1;
    m->copy = 1.0 / (copy * 1e9);
    const cJSON *links = cJSON_GetObjectItemCaseSensitive(root, "links");
    if (!cJSON_IsObject(links)) return bad(err, len, path, "\"links\" must be an object");
    for (const cJSON *l = links->child; l; l = l->next) {
        int k = 0;
        while (k < DT_LINK_KINDS && strcmp(l->string, dt_link_kind_name((dt_link_kind)k))) k++;
        if (k == DT_LINK_KINDS) {
            snprintf(err, len, "%s: unknown link kind \"%s\" (known: shm, tcp, mpi)", path,
                     l->string);
            return -1;
        }
        if (read_link(l, l->string, &m->link[k], path, err, len)) return -1;
    }
    return 0;
}

int dt_cost_model_load(dt_cost_model *m, const char *path, char *err, size_t len)
{
    size_t n;
    char *text = dt_read_file(path, 1 << 20, &n, err, len);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (!root) return bad(err, len, path, "not valid JSON");
    dt_cost_model tmp;
    dt_cost_model_defaults(&tmp); /* link kinds the file leaves out keep theirs */
    int rc = parse_model(root, &tmp, path, err, len);
    cJSON_Delete(root);
    if (rc) return rc;
    snprintf(tmp.source, sizeof tmp.source, "%s", path);
    *m = tmp;
    return 0;
}

static cJSON *link_json(const dt_link_cost *l)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "alpha_us", l->alpha * 1e6);
    cJSON_AddNumberToObject(o, "bandwidth_GBps", 1e-9 / l->beta);
    cJSON_AddNumberToObject(o, "reduce_GBps", 1e-9 / l->gamma);
    return o;
}

int dt_cost_model_save(const dt_cost_model *m, const char *path, char *err, size_t len)
{
    cJSON *root = cJSON_CreateObject(), *links = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", FORMAT);
    cJSON_AddStringToObject(root, "source", m->source);
    cJSON_AddNumberToObject(root, "copy_GBps", 1e-9 / m->copy);
    for (int k = 0; k < DT_LINK_KINDS; k++)
        cJSON_AddItemToObject(links, dt_link_kind_name((dt_link_kind)k), link_json(&m->link[k]));
    cJSON_AddItemToObject(root, "links", links);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return bad(err, len, path, "out of memory");
    size_t n = strlen(text);
    text[n] = '\n'; /* over the NUL: the file ends in a newline */
    int rc = dt_afile_write_file(path, text, n + 1, err, len);
    free(text);
    if (rc != 0) return -1;
    return 0;
}

void dt_cost_model_describe(const dt_cost_model *m, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "cost model (%s): copy %.1f GB/s", m->source,
                                1e-9 / m->copy);
    for (int k = 0; k < DT_LINK_KINDS && o < len; k++) {
        const dt_link_cost *l = &m->link[k];
        o += (size_t)snprintf(buf + o, len - o,
                              "\n  %-4s alpha %7.2f us  beta 1/(%6.2f GB/s)  gamma 1/(%6.2f GB/s)",
                              dt_link_kind_name((dt_link_kind)k), l->alpha * 1e6, 1e-9 / l->beta, 1e-9 / l->gamma);
    }
}
