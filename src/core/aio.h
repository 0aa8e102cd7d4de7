/* Asynchronous file I/O on io_uring (Debian's liburing): reads and writes
 * queued against a file descriptor and waited for by ticket, so a caller
 * can keep several in flight while it computes (the optimizer's offload
 * stream reads the next chunk and writes the last one around the update
 * of the current one).
 *
 * A transfer is split into blocks of at most block_bytes, each its own
 * request; at most `depth` requests are in the kernel at once, and more
 * wait in a queue of this engine until some complete. Buffers, offsets and
 * lengths must suit the descriptor (O_DIRECT: 4096-byte aligned). A short
 * transfer is an error that names the file, the offset and the bytes (a
 * file truncated under a running job), never silently zero-filled. One
 * thread calls an engine; the engine's own I/O thread reaps completions
 * and submits the queue's next blocks, so transfers progress while the
 * caller computes, between its calls. */
#ifndef DT_CORE_AIO_H
#define DT_CORE_AIO_H

#include <stddef.h>
#include <stdint.h>

typedef struct dt_aio dt_aio;

/* An engine with up to `depth` requests in the kernel, blocks of
 * block_bytes. 0, or -1 with err. */
int dt_aio_open(dt_aio **a, unsigned depth, size_t block_bytes, char *err, size_t errlen);
void dt_aio_close(dt_aio *a);

/* Queues a read (into buf) or write (from buf) of len bytes at offset off
 * of fd, whose name `what` errors quote (kept by pointer until the ticket
 * is waited for). Returns a ticket >= 0, or -1 with the engine's error. */
int dt_aio_read(dt_aio *a, int fd, const char *what, void *buf, size_t len, uint64_t off);
int dt_aio_write(dt_aio *a, int fd, const char *what, const void *buf, size_t len,
                 uint64_t off);

/* Waits until ticket t is done. 0, or -1 with the message in dt_aio_error
 * (a failed or short transfer). */
int dt_aio_wait(dt_aio *a, int t);
/* Waits for every ticket; the first failure's -1. */
int dt_aio_drain(dt_aio *a);
const char *dt_aio_error(const dt_aio *a);
/* Nanoseconds spent blocked in waits since the engine opened. */
uint64_t dt_aio_wait_ns(const dt_aio *a);

#endif
