/* Sharded checkpoints: each data-parallel rank writes the part of the
 * model and optimizer state it holds (ZeRO), and any number of ranks,
 * holding any ranges, reads them back (resharding).
 *
 *   OUT/ckpt-00000020/manifest.json                     the layout (below)
 *   OUT/ckpt-00000020/shard-00000-of-00003.safetensors  rank 0's pieces
 *   ...
 *
 * A rank's ranges of the flat layout (model/ranges.h) are cut at tensor
 * boundaries into pieces: elements [lo, hi) of one named tensor. A shard
 * file holds, for each piece, the 1-D fp32 tensors NAME@LO (parameters)
 * and exp_avg.NAME@LO, exp_avg_sq.NAME@LO (moments, when the optimizer
 * keeps them). Flat offsets are never stored: the padding that a layout
 * puts between tensors or segments differs between rank counts, so a
 * piece is named by tensor and element and padding is not saved.
 *
 * manifest.json:
 *   {"format": "dtrain-sharded", "version": 1, "stage": 3, "ranks": 3,
 *    "moments": 2, "state": {...state.json's object...},
 *    "shards": [{"file": "shard-00000-of-00003.safetensors",
 *                "bytes": "123456", "checksum": "9f0c...",
 *                "pieces": [["wte.weight", 0, 4096], ...]}, ...]}
 *
 * The pieces of all shards tile every tensor exactly; loading checks it,
 * and each shard's size, checksum, tensors and model sizes against the
 * manifest, before it fills anything. The checkpoint is saved into the
 * same hidden temporary directory and renamed into place as a whole-model
 * one (ckpt/checkpoint.h), so a rank that dies during a save leaves the last
 * checkpoint and `latest` as they were. */
#ifndef DT_TRAIN_CKPT_SHARD_H
#define DT_TRAIN_CKPT_SHARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "model/ranges.h"
#include "train/ckpt/state.h"

#define DT_CKPT_MANIFEST "manifest.json"
#define DT_CKPT_SHARD_VERSION 1
/* The largest manifest read (a piece per tensor per rank). */
#define DT_CKPT_MANIFEST_BYTES (256 << 20)

/* Elements [lo, hi) of tensor `tensor` (an index into the layout's tensor
 * table); `at`: where element lo sits in the rank's shard buffers. */
typedef struct {
    int tensor;
    uint64_t lo, hi;
    size_t at;
} dt_ckpt_piece;

typedef struct {
    char file[64];
    uint64_t bytes, checksum;
    int npieces;
    dt_ckpt_piece *pieces; /* `at` unused */
    char (*names)[64];     /* each piece's tensor name, as the manifest gives it */
} dt_ckpt_shard;

typedef struct {
    int stage, ranks;
    int moments; /* optimizer buffers saved per piece: 0, 1 (exp_avg) or 2 */
    dt_ckpt_record record;
    int nshards;
    dt_ckpt_shard *shards;
} dt_ckpt_manifest;

/* Collective over group (every rank calls it, with its own ranges): each
 * rank writes its shard in parallel, then rank 0 writes the manifest,
 * moves the checkpoint into place, updates `latest` and prunes beyond
 * keep_last. params, o->m and o->v are the rank's shard buffers (indexed
 * by the ranges' `at`). A failure on any rank fails the save on all of
 * them, naming the rank; the last checkpoint is then untouched. group may
 * be NULL for a process alone. */
int dt_ckpt_save_sharded(const char *out_dir, const dt_gpt *layout, const dt_flat_ranges *mine,
                         const float *params, const dt_optimizer *o, const dt_ckpt_state *st,
                         int stage, dt_comm *group, long keep_last, char *path_out,
                         size_t path_len, char *err, size_t errlen);

/* Snapshots for restarts (train/snapshot_writer.c): a sharded checkpoint
 * kept in two slots, DIR/slot-0 and DIR/slot-1, whose shard files are made
 * once and then written in place, so that a snapshot is a copy into memory
 * the host already gave, not a new file. Each snapshot goes to the slot
 * that does not hold the newest complete one. In a slot:
 *
 *   shard-RRRRR-of-NNNNN.safetensors   rank R's pieces, as a sharded save's
 *   manifest.part                      rank 0's: the manifest, checksums 0
 *   mark-RRRRR                         rank R's: "STEP BYTES CHECKSUM"
 *
 * On several hosts each holds its own ranks' files (and the manifest only
 * rank 0's host) until a recovery pools them.
 *
 * A slot holds step S whole when manifest.part's step is S and every
 * rank's mark says S: each rank removes its mark before it writes into
 * the slot and writes it (atomically) once its shard is whole, and a
 * snapshot begins only when every rank's previous one is whole, so at
 * any moment one of the two slots is whole on every rank.
 * dt_ckpt_slots_recover turns the newest whole slot into a checkpoint the
 * loaders read (manifest.json with the marks' checksums, `latest`).
 *
 * dt_ckpt_slots_open is collective over group, once, on the thread that
 * owns it: the pieces of mine (moments' `at`) and of mine_params (the
 * same pieces, `at` indexing params), every rank's pieces, the shard files
 * made or reused and mapped. The buffers must stay where they are; their
 * values are read by dt_ckpt_slots_write. */
typedef struct dt_ckpt_slots dt_ckpt_slots;
int dt_ckpt_slots_open(dt_ckpt_slots **s, const char *dir, const dt_gpt *layout,
                       const dt_flat_ranges *mine, const dt_flat_ranges *mine_params,
                       const float *params, const dt_optimizer *o, int stage, dt_comm *group,
                       char *err, size_t errlen);
/* Collective over the group: the ranks agree that every rank's previous
 * snapshot is whole (prev_err: this rank's previous write's failure, or
 * NULL; any rank's fails the begin on all), then each removes its mark
 * from the slot to write and rank 0 writes the slot's manifest.part for
 * st's step. */
int dt_ckpt_slots_begin(dt_ckpt_slots *s, const dt_optimizer *o, const dt_ckpt_state *st,
                        const char *save_dir, const char *prev_err, char *err, size_t errlen);
/* Any thread, no communicator: this rank's pieces into the slot begun, its
 * checksum taken as it copies, then its mark. */
int dt_ckpt_slots_write(dt_ckpt_slots *s, char *err, size_t errlen);
/* A begin given save_dir (a run directory: --save-every) also saves the
 * snapshot there as a checkpoint, rank 0 making its temporary directory.
 * Then, after dt_ckpt_slots_write, with no communicator: each rank writes
 * its shard file from the slot into it and a marker beside it, and rank 0
 * waits for every marker (the ranks share the host), writes the manifest,
 * moves the checkpoint into place (its path to path) and prunes beyond
 * keep, or, failing or abandoned, removes it: a checkpoint is whole or
 * absent. The slot must not be begun again until this returns. */
int dt_ckpt_slots_save(dt_ckpt_slots *s, long keep, const atomic_int *abandon, char *path,
                       size_t pathlen, char *err, size_t errlen);
/* Whether the snapshot begun goes to disk too. */
int dt_ckpt_slots_saving(const dt_ckpt_slots *s);
/* Bytes of shared memory this rank's two shard files hold. */
uint64_t dt_ckpt_slots_bytes(const dt_ckpt_slots *s);
/* Closes the mappings; a save's temporary directory left (a run given up
 * during it) is removed by rank 0. */
void dt_ckpt_slots_close(dt_ckpt_slots *s);
/* After a restart (the writers are gone), collective over world (NULL: a
 * process alone): the newest slot whole across the hosts' DIRs, fetched
 * where a host lacks a file of it, made a checkpoint on every host (see
 * slots_recover.c), its step to *step and the files and bytes copied
 * between hosts for it (over the job) to moved. 0; 1 when no slot is
 * whole; -1 with a message. */
int dt_ckpt_slots_recover(const char *dir, dt_comm *world, long *step, uint64_t moved[2],
                          char *err, size_t errlen);

/* Fills this rank's ranges of params, o->m, o->v (and o->t, *st) from a
 * whole-model or a sharded checkpoint of any rank count and stage; the
 * shard buffers' floats outside the tensors (padding) are set to zero.
 * params, o and st may be NULL (not wanted). Nothing non-finite, and no
 * negative second moment, is loaded. */
int dt_ckpt_load_ranges(const char *dir, const dt_gpt *layout, const dt_flat_ranges *mine,
                        float *params, dt_optimizer *o, dt_ckpt_state *st, char *err,
                        size_t errlen);

/* Whether dir holds a sharded checkpoint (a manifest). */
int dt_ckpt_is_sharded(const char *dir);

/* The record (state.json's contents) of a checkpoint of either kind. */
int dt_ckpt_read_record(const char *dir, dt_ckpt_record *r, char *err, size_t errlen);

/* The experts' bias a checkpoint of either kind records (dt_ckpt_state's
 * moe_bias) into bias[n]: 0 when it holds n values, 1 when it holds none
 * (bias untouched), else -1 with a message naming the file and both
 * counts. */
int dt_ckpt_read_moe_bias(const char *dir, float *bias, size_t n, char *err, size_t errlen);

/* ---- the pieces and the manifest (ckpt/shard_pieces.c, ckpt/shard_manifest.c) */

/* The pieces of mine in layout's tensors, in flat order (malloc'd, *n of
 * them); checks that the ranges are ascending, disjoint, inside the
 * layout and the shard buffers. */
int dt_ckpt_pieces(const dt_gpt *layout, const dt_flat_ranges *mine, dt_ckpt_piece **out,
                   int *n, char *err, size_t errlen);

/* A shard's name inside the checkpoint, and a piece's tensor name in it. */
void dt_ckpt_shard_name(char *buf, size_t len, int rank, int ranks);
void dt_ckpt_piece_name(char *buf, size_t len, const char *prefix, const char *tensor,
                        uint64_t lo);


/* The manifest's text (malloc'd), or NULL when memory runs out. */
char *dt_ckpt_manifest_format(const dt_ckpt_manifest *m, const dt_gpt *layout);
/* Reads DIR/manifest.json, checking its fields (not yet the shards). */
int dt_ckpt_manifest_read(const char *dir, dt_ckpt_manifest *m, char *err, size_t errlen);
/* Checks that the manifest describes layout's model and that its pieces
 * tile every tensor exactly once; sets each piece's tensor index. */
int dt_ckpt_manifest_check(const char *dir, dt_ckpt_manifest *m, const dt_gpt *layout,
                           char *err, size_t errlen);
void dt_ckpt_manifest_free(dt_ckpt_manifest *m);

#endif
