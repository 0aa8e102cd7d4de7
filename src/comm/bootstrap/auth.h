/* Mutual challenge-response on a new connection: each side proves it holds
 * the job's secret (HMAC-SHA256 over fresh nonces) without sending it, so a
 * stray or hostile connection cannot join the job. */
#ifndef DT_COMM_AUTH_H
#define DT_COMM_AUTH_H

#include <stddef.h>
#include <stdint.h>

/* Both return 0, DT_ERR_AUTH when the other side does not know the secret,
 * or DT_ERR_TIMEOUT / DT_ERR_PEER / DT_ERR_PROTOCOL. `context` is a short
 * label mixed into the MAC (for example "store" or "tcp") so that a
 * response cannot be replayed on a different kind of connection. */
int dt_auth_client(int fd, const char *secret, const char *context, uint64_t deadline_ns,
                   char *err, size_t errlen);
int dt_auth_server(int fd, const char *secret, const char *context, uint64_t deadline_ns,
                   char *err, size_t errlen);

#endif
