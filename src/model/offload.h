/* The optimizer's state on NVMe (ZeRO-Infinity's offload_optimizer with
 * device nvme): a rank's moments live in one file under --nvme-path, and
 * each optimizer step streams them through a few aligned buffers: read
 * chunk k+1 (and further ahead, buffer_count - 2 chunks), update chunk k,
 * write chunk k-1, all at once, on io_uring with O_DIRECT (core/aio.h).
 *
 * The file holds each state buffer (exp_avg, exp_avg_sq, then with
 * offload_param the parameters' pieces) as a region of n floats rounded
 * up to whole chunks, chunk c of state s at byte
 * (s * padded + c * chunk) * 4; it is created with the job, sized up front
 * (a disk too small fails at start, naming the bytes needed and free). The
 * file has no name (O_TMPFILE, or unlinked as soon as it is made), so it
 * goes with the last descriptor: when the store is destroyed, or when the
 * process dies in any way, SIGKILL included; nothing is left in the
 * directory and no name can collide with a later run's. Before each step
 * the store checks that the file still has its size. Checkpoints read and
 * write the state through a mapping of the file (dt_opt_store_map). The
 * update is the in-memory one, element-wise on the same values, so the
 * numbers are the same bits. */
#ifndef DT_MODEL_OFFLOAD_H
#define DT_MODEL_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "model/gbuf.h"
#include "model/gpt.h"

typedef struct {
    const char *dir;     /* where the file goes (--nvme-path) */
    size_t chunk_floats; /* per state buffer and chunk; a multiple of 1024 */
    int buffers;         /* chunk buffers (offload_optimizer.buffer_count), >= 3 */
    size_t block_bytes;  /* aio.block_size: one request's bytes, a multiple of 4096 */
    unsigned depth;      /* aio.queue_depth: requests in flight */
} dt_offload_opts;

/* DeepSpeed's defaults: chunks of 16 MiB per state, 4 buffers, 1 MiB
 * requests, 8 in flight. */
dt_offload_opts dt_offload_defaults(const char *dir);

/* The chunk buffers' bytes for nstates buffers of n floats (chunks no
 * longer than the state): what offload keeps in memory. */
size_t dt_offload_buffer_bytes(const dt_offload_opts *o, int nstates, size_t n);

typedef struct dt_opt_store dt_opt_store;

/* A file for `nstates` state buffers of n floats each, and with_params:
 * one more for the parameters themselves (ZeRO-3's offload_param), sized
 * up front; `tag` (a job and rank) names it for the moment it has a name
 * where the file system has no O_TMPFILE. 0, or -1 with err naming the
 * directory and, for a disk that is too small, the bytes needed and free. */
int dt_opt_store_create(dt_opt_store **s, const dt_offload_opts *o, const char *tag,
                        int nstates, int with_params, size_t n, char *err, size_t errlen);
/* Closes the file, which frees its blocks. */
void dt_opt_store_destroy(dt_opt_store *s);
/* What messages call the file: "an unnamed file in DIR". */
const char *dt_opt_store_path(const dt_opt_store *s);
uint64_t dt_opt_store_file_bytes(const dt_opt_store *s);
/* The bytes of the chunk buffers in memory. */
size_t dt_opt_store_buffer_bytes(const dt_opt_store *s);

/* One range of a step: the layout's floats [lo, hi), whose parameters
 * and gradients start at params and grads, and whose state starts at
 * float `at` of each state buffer. */
typedef struct {
    float *params;
    dt_gbuf grads;
    size_t at, lo, hi;
} dt_opt_span;

/* With the parameters in the file: a span's params pointer is not read,
 * the update gets them streamed as its last state, and these move pieces
 * of them (floats [at, at + n), multiples of 1024, through a 4096-byte
 * aligned buffer) on the store's engine: a read queued for later (its
 * ticket, waited for with dt_opt_store_wait), or a write done now. -1
 * with err on failure. */
int dt_opt_store_has_params(const dt_opt_store *s);
int dt_opt_store_read_params(dt_opt_store *s, size_t at, size_t n, float *buf, char *err,
                             size_t errlen);
int dt_opt_store_write_params(dt_opt_store *s, size_t at, size_t n, const float *buf,
                              char *err, size_t errlen);
int dt_opt_store_wait(dt_opt_store *s, int ticket, char *err, size_t errlen);
/* Since the store opened: the parameters' bytes read, and the
 * nanoseconds its engine has spent blocked in waits (the stream's too). */
void dt_opt_store_totals(const dt_opt_store *s, uint64_t *param_bytes_read, uint64_t *wait_ns);

/* Updates a step's spans (ascending in `at`, not overlapping) through
 * the file; `update` is called for each piece with the piece's state in
 * the buffers (states[s] at the piece's first float). 0, or -1 with err. */
typedef void (*dt_opt_piece_fn)(void *ctx, const dt_opt_span *piece, float *const *states);
int dt_opt_store_step(dt_opt_store *s, const dt_opt_span *spans, int n, dt_opt_piece_fn update,
                      void *ctx, char *err, size_t errlen);
/* The same stream in parts, so that compute can run between them: begin
 * copies the spans and starts the first reads (ctx and the spans' buffers
 * must stay valid until the end); advance updates every chunk that starts
 * below state float `upto`, keeping the next reads in flight and the
 * writes behind; end does the rest and waits for the disk. Any other call
 * that reads or maps the state ends an open stream first. step = begin,
 * end. 0, or -1 with err (the stream closed). */
int dt_opt_store_begin(dt_opt_store *s, const dt_opt_span *spans, int n, dt_opt_piece_fn update,
                       void *ctx, char *err, size_t errlen);
int dt_opt_store_advance(dt_opt_store *s, size_t upto, char *err, size_t errlen);
int dt_opt_store_end(dt_opt_store *s, char *err, size_t errlen);
int dt_opt_store_pending(const dt_opt_store *s);
/* The last stream that ended: bytes read and written, and its wall ms
 * from begin to end (the I/O it did not hide is in dt_opt_store_totals'
 * waits). */
void dt_opt_store_last_step(const dt_opt_store *s, uint64_t *bytes, double *wall_ms);

/* The state buffers as memory (states[s], n floats each), for a
 * checkpoint to read or fill; dt_opt_store_unmap after (written: the
 * values changed, flush them to the file). 0, or -1 with err. */
int dt_opt_store_map(dt_opt_store *s, float **states, char *err, size_t errlen);
int dt_opt_store_unmap(dt_opt_store *s, int written, char *err, size_t errlen);

/* The disk under dir: sequential write and read bandwidth (bytes/s) of
 * an unnamed temporary file, with O_DIRECT where the file system has it
 * (direct says). Its bytes are at most `most` and at most half of what
 * the file system has free (free: before the probe); under 16 MiB
 * nothing is measured (bytes 0), so the probe never fills a disk that
 * holds the state. 0, or -1 with err. */
typedef struct {
    size_t bytes;
    uint64_t free;
    double write_bps, read_bps;
    int direct;
} dt_disk_probe;
int dt_disk_bandwidth(const char *dir, size_t most, dt_disk_probe *p, char *err, size_t errlen);

#endif
