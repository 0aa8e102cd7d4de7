/*
 * The store's wire format, shared by its server, its clients and the
 * monitor (see store.h for what the store does).
 *
 * Every message is a 24-byte little-endian header followed by key_len
 * bytes of key and val_len bytes of value:
 *
 *   off size field
 *    0   1   type     (DT_WIRE_*)
 *    1   1   flag     FAIL: 1 when the failure is a timeout
 *    2   2   magic    0x5344 ("DS"), catches a stream that is out of step
 *    4   4   id       request id, echoed by the REPLY (CANCEL: the GET's id)
 *    8   4   a        HELLO, LEFT: rank; FAIL, ABORT: code; REPLY: status (0 or DT_ERR_*)
 *   12   4   b        HELLO: heartbeat interval in ms; FAIL: suspect rank
 *   16   4   key_len  1..DT_STORE_MAX_KEY for SET, GET, ADD; 0 otherwise
 *   20   4   val_len  SET, REPLY: <= DT_STORE_MAX_VALUE; ADD: 8 (int64 delta);
 *                     FAIL, ABORT: <= DT_STORE_MAX_MSG (text); 0 otherwise
 *
 * Request connections send SET, GET, ADD (each answered by one REPLY with
 * the same id; a GET's REPLY waits until the key exists; an ADD's REPLY
 * carries the new int64) and CANCEL (a GET the client stopped waiting for;
 * no answer). A REPLY with a non-zero status carries an error text.
 * A connection whose first message is HELLO is a control connection: it then
 * sends HEARTBEAT, FAIL and BYE, and receives one REPLY to its HELLO, a LEFT
 * (a: the rank) for each other rank that says BYE while the job runs, and
 * at most one ABORT. Counters made by ADD are stored as decimal text, so a GET
 * of a counter reads "3".
 */
#ifndef DT_COMM_BOOTSTRAP_STORE_WIRE_H
#define DT_COMM_BOOTSTRAP_STORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define DT_WIRE_HDR_SIZE 24
#define DT_WIRE_AUTH_CONTEXT "store" /* mixed into the handshake's MAC */

enum {
    DT_WIRE_SET = 1,
    DT_WIRE_GET = 2,
    DT_WIRE_ADD = 3,
    DT_WIRE_CANCEL = 4,
    DT_WIRE_HELLO = 16,
    DT_WIRE_HEARTBEAT = 17,
    DT_WIRE_FAIL = 18,
    DT_WIRE_BYE = 19,
    DT_WIRE_REPLY = 32,
    DT_WIRE_ABORT = 33,
    DT_WIRE_LEFT = 34
};

typedef struct {
    uint8_t type;
    uint8_t flag;
    uint32_t id;
    int32_t a;
    int32_t b;
    uint32_t key_len;
    uint32_t val_len;
} dt_wire_hdr;

void dt_wire_put_i64(unsigned char *p, int64_t v);
int64_t dt_wire_get_i64(const unsigned char *p);
void dt_wire_encode(const dt_wire_hdr *h, unsigned char *p);
void dt_wire_decode(const unsigned char *p, dt_wire_hdr *h);
/* Validate a header before any of its lengths is used: 0, or -1 with the
 * reason in why. */
int dt_wire_check(const unsigned char *raw, const dt_wire_hdr *h, char *why, size_t len);

/* Blocking-style send and read of one message (clients and the monitor).
 * dt_wire_read's *body gets key and value in one malloc'd block with a NUL
 * after them. */
int dt_wire_send(int fd, const dt_wire_hdr *h, const void *key, const void *val,
                 uint64_t deadline_ns);
int dt_wire_read(int fd, dt_wire_hdr *h, unsigned char **body, uint64_t deadline_ns, char *why,
                 size_t whylen);
/* Connect to the store at host:port and pass its handshake: the socket in
 * *out_fd, or a code with the reason in err. */
int dt_wire_dial(const char *host, int port, const char *secret, uint64_t deadline_ns,
                 int *out_fd, char *err, size_t errlen);

#endif
