/* What the whole-model and the sharded checkpoint writers and readers
 * share: the run directory (the hidden temporary directory, moving it into
 * place, `latest`, pruning) and the record of a save. Private to
 * src/train. */
#ifndef DT_TRAIN_CKPT_INTERNAL_H
#define DT_TRAIN_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/gpt.h"
#include "model/optimizer.h"
#include "train/ckpt/shard.h"
#include "train/ckpt/state.h"
#include "train/weights/safetensors.h"

void dt_ckpt_remove_tree(const char *dir);
/* OUT/ckpt-NNNNNNNN */
void dt_ckpt_dir_path(char *buf, size_t len, const char *out_dir, long step);
/* The temporary directory's path for step and tag. */
void dt_ckpt_tmp_path(char *buf, size_t len, const char *out_dir, long step, long tag);
/* Creates out_dir and an empty temporary directory for step named with
 * tag (the creating process's id), whose path goes to tmp. */
int dt_ckpt_make_tmp(const char *out_dir, long step, long tag, char *tmp, size_t tmplen,
                     char *err, size_t errlen);
/* Moves tmp into place as step's checkpoint and points `latest` at it;
 * on failure the run directory is as it was. */
int dt_ckpt_publish(const char *out_dir, long step, const char *tmp, char *err, size_t errlen);
/* Removes crashed saves' temporary directories, and checkpoints older than
 * current beyond the keep - 1 newest of them. */
void dt_ckpt_prune(const char *out_dir, long current, long keep);
/* Whether dir holds a shard file (shard-*-of-*.safetensors), manifest or
 * not. */
int dt_ckpt_has_shards(const char *dir);
/* 0 when a checkpoint's recorded model s is the one built, c; else -1
 * with a message at `where` naming both. */
int dt_ckpt_model_differs(const char *where, const dt_gpt_config *s, const dt_gpt_config *c,
                          char *err, size_t errlen);
/* The record of a save, checked as a resume would check it: what cannot be
 * read back is not written. */
int dt_ckpt_make_record(const char *out_dir, const dt_gpt *m, const dt_optimizer *o,
                        const dt_ckpt_state *state, dt_ckpt_record *r, char *err,
                        size_t errlen);

/* The buffers of a checkpoint, by the prefix of their tensors' names. */
enum { DT_CKPT_PARAMS, DT_CKPT_EXP_AVG, DT_CKPT_EXP_AVG_SQ, DT_CKPT_NBUF };
extern const char *const dt_ckpt_prefix[DT_CKPT_NBUF];

/* ---- saving a sharded checkpoint (shard_save.c; shard_async.c) --------- */

/* What a rank tells the others after each part of a save. */
typedef struct {
    int64_t ok;
    int64_t value[3];
    char msg[224];
} dt_ckpt_report;

typedef struct {
    dt_comm *group; /* NULL: a process alone */
    int rank, size;
    dt_ckpt_report *all; /* [size] */
} dt_ckpt_crew;

/* Every rank learns every rank's report; 0 when all succeeded, else -1
 * with the first failed rank's message (this rank's own kept as it is). */
int dt_ckpt_agree(dt_ckpt_crew *c, dt_ckpt_report *me, const char *err_in, char *err,
                  size_t errlen);
/* -1 with a message naming the tensor when a piece of the nbuf buffers
 * holds a non-finite value. */
int dt_ckpt_check_finite(const dt_gpt *layout, const dt_ckpt_piece *p, int np,
                         const float *const bufs[DT_CKPT_NBUF], int nbuf, int rank, char *err,
                         size_t errlen);
/* Writes the pieces of nbuf buffers, with the model's sizes in the
 * metadata; its size and checksum go to bytes and sum. */
int dt_ckpt_write_shard(const char *path, const dt_gpt *layout, const dt_ckpt_piece *p, int np,
                        const float *const bufs[DT_CKPT_NBUF], int nbuf, uint64_t *bytes,
                        uint64_t *sum, char *err, size_t errlen);
/* The same with each tensor's values from its own place: src[b * np + i]
 * holds piece i of buffer b. */
int dt_ckpt_write_shard_from(const char *path, const dt_gpt *layout, const dt_ckpt_piece *p,
                             int np, int nbuf, const float *const *src, uint64_t *bytes,
                             uint64_t *sum, char *err, size_t errlen);
/* The pieces of every rank (c->all[r].value[2] of them), gathered:
 * [size][max][3] as (tensor, lo, hi); malloc'd. */
int64_t *dt_ckpt_gather_pieces(dt_ckpt_crew *c, const dt_ckpt_piece *p, int np, int *max,
                               char *err, size_t errlen);
/* Rank 0: the manifest into tmp/name, from every rank's bytes, checksum
 * and piece count (c->all[r].value[0..2]) and pieces (all, as gathered). */
int dt_ckpt_write_manifest(const char *tmp, const char *name, dt_ckpt_crew *c,
                           const dt_gpt *layout, const dt_ckpt_record *rec, int stage,
                           int moments, const int64_t *all, int max, char *err, size_t errlen);

/* ---- the snapshot slots (slots.c, slots_recover.c) ---------------------- */

#define DT_CKPT_SLOTS 2
#define DT_CKPT_SLOT_PART "manifest.part"
/* DIR/slot-K, or DIR/slot-K/NAME when name is not NULL. */
void dt_ckpt_slot_path(char *buf, size_t len, const char *dir, int k, const char *name);
/* DIR/slot-K/mark-RRRRR */
void dt_ckpt_slot_mark_path(char *buf, size_t len, const char *dir, int k, int rank);
/* Rank r's mark in slot k: 0 with its step, bytes and checksum, or -1. */
int dt_ckpt_slot_read_mark(const char *dir, int k, int r, long *step, uint64_t *bytes,
                           uint64_t *sum);
/* Slot k's manifest.part parsed (cJSON_Delete it), its step and shard
 * count set; NULL (step -1, n 0) when there is none whole. */
struct cJSON *dt_ckpt_slot_part(const char *dir, int k, long *step, int *n, char *err,
                                size_t errlen);
/* Slot k's manifest.part, checked to be step's with n shards, with their
 * checksums filled in from sums: malloc'd text, or NULL with a message. */
char *dt_ckpt_slot_manifest(const char *dir, int k, long step, const uint64_t *sums, int n,
                            char *err, size_t errlen);

/* ---- loading: where a checkpoint's values are -------------------------- */

/* Elements [lo, hi) of the layout's tensor `tensor`, held for each buffer
 * by a file's tensor (elements from 0 there); NULL for a buffer not
 * wanted. */
typedef struct {
    int tensor;
    uint64_t lo, hi;
    const dt_st_file *f[DT_CKPT_NBUF];
    const dt_st_tensor *t[DT_CKPT_NBUF];
} dt_ckpt_source_piece;

typedef struct {
    dt_st_file *files; /* open */
    int nfiles;
    dt_ckpt_source_piece *p;
    int n;
} dt_ckpt_source;

/* The sources of a sharded checkpoint for the buffers wanted: the shards
 * that hold any of the pieces `need`, each checked against the manifest
 * (present, whole, its checksum, its model, its tensors). */
int dt_ckpt_open_sharded(const char *dir, dt_ckpt_manifest *man, const dt_gpt *layout,
                         const int want[DT_CKPT_NBUF], const dt_ckpt_piece *need, int nneed,
                         dt_ckpt_source *src, char *err, size_t errlen);
void dt_ckpt_source_close(dt_ckpt_source *src);

#endif
