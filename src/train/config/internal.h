/* The training configuration's insides, shared by the files of train/config/:
 *
 *   table.c             the option table, the presets, defaults, lookups
 *   value.c             one value: parsed from text or JSON, range-checked, stored
 *   flags.c             the command line
 *   json.c              a --config file: reading it, dtrain's own keys
 *   deepspeed.c         DeepSpeed's keys and what each means in dtrain
 *   validate.c          the checks across options, inferred values
 *   usage.c             --help and the run's summary
 *   schedule.c          the learning rate of a step
 *   agree.c             the check that every rank of a job has the same options
 *
 * One table (dt_cfg_options) describes every option once: its flag, its
 * DeepSpeed alias, type, field, range and help. Flags, JSON keys, --help and
 * the range checks of dt_config_validate are all driven from it. */
#ifndef DT_TRAIN_CONFIG_INTERNAL_H
#define DT_TRAIN_CONFIG_INTERNAL_H

#include <stddef.h>

#include "train/config/config.h"

struct cJSON;

/* ---- the option table --------------------------------------------------- */

typedef enum { T_INT, T_LONG, T_U64, T_DBL, T_BOOL, T_STR, T_CHOICE, T_ACTION } dt_cfg_type;

enum {
    O_NOVAL = 1,    /* takes no value (--help) */
    O_OPTVAL = 2,   /* value optional: --resume or --resume=DIR */
    O_MINOPEN = 4,  /* value must be > min, not >= */
    O_MAXOPEN = 8,  /* value must be < max, not <= */
    O_EMPTYOK = 16, /* T_CHOICE: "" is allowed too */
};

enum { G_MODEL, G_DATA, G_BATCH, G_OPTIM, G_RUN, G_CKPT, G_LOG, G_MISC, G_COUNT };

typedef struct dt_cfg_opt {
    const char *flag;  /* without "--"; its snake_case form is the JSON key */
    const char *alias; /* DeepSpeed's JSON key for the same setting, or NULL */
    dt_cfg_type type;
    size_t off, size;  /* the field in dt_train_config */
    double min, max;
    const char *meta;  /* metavar in --help; for T_CHOICE the choices a|b|c */
    /* Runs after the value is stored: refuses it or derives other fields. */
    int (*hook)(dt_train_config *c, const char *who, char *err, size_t n);
    unsigned flags;
    int group;
    const char *help;
    const char *bound_why; /* appended to a range error: why the bound is where it is */
} dt_cfg_opt;

extern const dt_cfg_opt dt_cfg_options[];
extern const int dt_cfg_noptions;
extern const char *const dt_cfg_group_titles[G_COUNT];

/* Largest integer fields: far beyond any real run, and exact in a double. */
#define DT_CFG_IMAX 2147483647.0
#define DT_CFG_LMAX 1e15

/* Compute threads in one process (per rank; with --strategy dp, over all
 * its devices). No CPU these run on has that many hardware threads, and
 * OpenMP fails (crashes in libgomp) when asked for tens of thousands. */
#define DT_CFG_MAX_THREADS 1024

/* Index of the option that stores the field at `off`, or -1. */
int dt_cfg_opt_at(size_t off);
#define DT_CFG_IDX(field) dt_cfg_opt_at(offsetof(dt_train_config, field))
/* Index of the option spelled --name (len chars), or -1. */
int dt_cfg_find_flag(const char *name, size_t len);
/* Index of the option whose JSON key (or DeepSpeed alias: *is_alias) is key. */
int dt_cfg_find_json(const char *key, int *is_alias);

/* ZeRO's settings against the rest: a stage above 0 needs --strategy ddp,
 * the stage-3 settings need stage 3. 0, or -1 with a message. */
int dt_cfg_check_zero(const dt_train_config *c, char *err, size_t n);
int dt_cfg_check_offload(const dt_train_config *c, char *err, size_t n);

/* ---- values -------------------------------------------------------------- */

typedef struct {
    long long i;          /* T_INT, T_LONG, T_BOOL */
    unsigned long long u; /* T_U64 */
    double d;             /* T_DBL */
    const char *s;        /* T_STR, T_CHOICE */
} dt_cfg_val;

/* Stores v into option idx after its range and choice checks, marks it
 * given and runs its hook. `who` names the setting in messages: "--lr",
 * "FILE: optimizer.params.lr". 0 or -1. */
int dt_cfg_store(dt_train_config *c, int idx, dt_cfg_val v, const char *who, char *err, size_t n);
/* The same from a flag's text. */
int dt_cfg_set_text(dt_train_config *c, int idx, const char *who, const char *s, char *err,
                    size_t n);
/* The same from a JSON value under `key` of the file `path` (the message
 * names "path: key"). */
int dt_cfg_set_json(dt_train_config *c, int idx, const char *path, const char *key,
                    const struct cJSON *j, char *err, size_t n);
/* The option's field as a value (a T_STR/T_CHOICE value points into c). */
dt_cfg_val dt_cfg_read_field(const dt_train_config *c, const dt_cfg_opt *o);
/* Range check of a numeric value; choice check (and canonical spelling into
 * buf) of a string. 0 or -1 with a message naming `who`. */
int dt_cfg_check_range(const dt_cfg_opt *o, const char *who, const dt_cfg_val *v, char *err,
                       size_t n);
int dt_cfg_check_string(const dt_cfg_opt *o, const char *who, const char **s, char *buf,
                        size_t bufn, char *err, size_t n);

/* "FILE: key", the name of a JSON setting in messages. */
void dt_cfg_json_who(char *who, size_t n, const char *path, const char *key);
/* A value as text: numbers as %g where that reads back the same. */
void dt_cfg_format_value(const dt_cfg_opt *o, dt_cfg_val v, char *buf, size_t n);

/* ---- one --config file ----------------------------------------------------- */

/* The keys of one --config file that have set options so far (key[i],
 * option i's; "" for none), so that two keys setting one option to
 * different values are refused, naming both, rather than the one read
 * last silently winning (DeepSpeed's keys are read before dtrain's own). */
typedef struct dt_cfg_file {
    const char *path;
    char key[DT_CONFIG_MAX_OPTIONS][160];
} dt_cfg_file;

/* Option idx set from `key` of the file, as dt_cfg_set_json and
 * dt_cfg_store do, and the key noted; -1 naming both keys and values where
 * another key of the file set the option to another value (`why`, when
 * not NULL, says why the two must agree). */
int dt_cfg_file_set_json(dt_cfg_file *f, dt_train_config *c, int idx, const char *key,
                         const struct cJSON *j, const char *why, char *err, size_t n);
int dt_cfg_file_store(dt_cfg_file *f, dt_train_config *c, int idx, const char *key,
                      dt_cfg_val v, char *err, size_t n);

/* ---- DeepSpeed ----------------------------------------------------------- */

/* Applies a top-level item of the --config file f when it is one of
 * DeepSpeed's sections or keys (config/deepspeed.c) in this pass (0: the
 * optimizer section, 1: the others). 1 when the key is none of DeepSpeed's
 * sections, else 0 or -1. */
int dt_cfg_deepspeed_item(dt_cfg_file *f, dt_train_config *c, const struct cJSON *it, int pass,
                          char *err, size_t n);

/* The i-th DeepSpeed key dtrain knows (dotted: "scheduler.params.warmup_min_lr"),
 * each of which either sets something or is refused unless its value
 * changes nothing; NULL past the last. For the audit in the tests. */
const char *dt_cfg_deepspeed_key(int i, char *buf, size_t n);

#endif
