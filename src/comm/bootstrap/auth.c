/*
 * Mutual challenge-response over a fresh connection.
 *
 *   server -> client   magic[4] nonce_s[32]
 *   client -> server   magic[4] nonce_c[32] mac_c[32]
 *   server -> client   status[1] (1 = accepted, 0 = refused), then if accepted mac_s[32]
 *
 *   mac_c = HMAC-SHA256(secret, context NUL "C" nonce_s nonce_c)
 *   mac_s = HMAC-SHA256(secret, context NUL "S" nonce_c nonce_s)
 *
 * Fresh nonces from both sides mean a recorded exchange cannot be replayed;
 * the role letter stops a server's answer from being reflected back as a
 * client's, and the context stops a store handshake from being reused on a
 * data connection. The secret itself never crosses the wire. Only the
 * handshake is protected: the traffic after it is neither encrypted nor
 * signed.
 */
#include "comm/bootstrap/auth.h"

#include <errno.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "comm/transport/net.h"
#include "dtrain/comm.h"

#define AUTH_MAGIC "DTA1"
#define MAGIC_LEN 4
#define NONCE_LEN 32
#define MAC_LEN 32
#define MAX_CONTEXT 64
#define STATUS_ACCEPTED 1
#define STATUS_REFUSED 0


static int random_nonce(unsigned char *buf, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = getrandom(buf + off, n - off, 0);
        if (r < 0 && errno != EINTR) return DT_ERR_SYSTEM;
        if (r > 0) off += (size_t)r; /* after EINTR or a short read: ask again */
    }
    return 0;
}

static int compute_mac(const char *secret, const char *context, char role,
                       const unsigned char *first, const unsigned char *second,
                       unsigned char mac[MAC_LEN])
{
    unsigned char msg[MAX_CONTEXT + 2 + 2 * NONCE_LEN];
    size_t clen = strlen(context);
    memcpy(msg, context, clen);
    msg[clen] = 0; /* ends the context, so "ab"+"C" never equals "abC"+... */
    msg[clen + 1] = (unsigned char)role;
    memcpy(msg + clen + 2, first, NONCE_LEN);
    memcpy(msg + clen + 2 + NONCE_LEN, second, NONCE_LEN);
    unsigned int maclen = MAC_LEN;
    if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, clen + 2 + 2 * NONCE_LEN, mac,
              &maclen) ||
        maclen != MAC_LEN)
        return DT_ERR_SYSTEM;
    return 0;
}

static int check_args(const char *secret, const char *context, char *err, size_t errlen)
{
    if (!secret) {
        snprintf(err, errlen, "no job secret given for the authentication handshake");
        return DT_ERR_INVALID;
    }
    if (!context || strlen(context) > MAX_CONTEXT) {
        snprintf(err, errlen, "authentication context is missing or longer than %d bytes",
                 MAX_CONTEXT);
        return DT_ERR_INVALID;
    }
    return 0;
}

/* A failed read or write during the handshake, worded for the side we are. */
static int io_failure(int rc, const char *who, char *err, size_t errlen)
{
    if (rc == DT_ERR_TIMEOUT)
        snprintf(err, errlen, "%s did not complete the authentication handshake in time", who);
    else if (rc == DT_ERR_PEER)
        snprintf(err, errlen, "%s closed the connection during the authentication handshake",
                 who);
    else
        snprintf(err, errlen, "socket error during the authentication handshake with %s", who);
    return rc;
}

int dt_auth_server(int fd, const char *secret, const char *context, uint64_t deadline_ns,
                   char *err, size_t errlen)
{
    int rc = check_args(secret, context, err, errlen);
    if (rc) return rc;
    char who[128], peer[96];
    dt_net_peer_name(fd, peer, sizeof peer);
    snprintf(who, sizeof who, "the connection from %s", peer);

    unsigned char hello[MAGIC_LEN + NONCE_LEN];
    unsigned char *nonce_s = hello + MAGIC_LEN;
    memcpy(hello, AUTH_MAGIC, MAGIC_LEN);
    if (random_nonce(nonce_s, NONCE_LEN)) {
        snprintf(err, errlen, "getrandom failed while authenticating %s", peer);
        return DT_ERR_SYSTEM;
    }
    rc = dt_net_write_all(fd, hello, sizeof hello, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);

    unsigned char answer[MAGIC_LEN + NONCE_LEN + MAC_LEN];
    rc = dt_net_read_all(fd, answer, sizeof answer, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);
    if (memcmp(answer, AUTH_MAGIC, MAGIC_LEN) != 0) {
        snprintf(err, errlen, "%s is not a dtrain peer (bad handshake greeting)", who);
        return DT_ERR_PROTOCOL;
    }
    const unsigned char *nonce_c = answer + MAGIC_LEN;
    const unsigned char *mac_c = answer + MAGIC_LEN + NONCE_LEN;

    unsigned char expect[MAC_LEN];
    if (compute_mac(secret, context, 'C', nonce_s, nonce_c, expect)) {
        snprintf(err, errlen, "HMAC-SHA256 failed while authenticating %s", peer);
        return DT_ERR_SYSTEM;
    }
    if (CRYPTO_memcmp(expect, mac_c, MAC_LEN) != 0) {
        /* Tell the client why before the caller closes, so that it reports
         * a wrong secret rather than a dropped connection. */
        unsigned char refused = STATUS_REFUSED;
        (void)dt_net_write_all(fd, &refused, 1, deadline_ns);
        snprintf(err, errlen, "connection from %s did not present the job secret (DTRAIN_SECRET)",
                 peer);
        return DT_ERR_AUTH;
    }

    unsigned char reply[1 + MAC_LEN];
    reply[0] = STATUS_ACCEPTED;
    if (compute_mac(secret, context, 'S', nonce_c, nonce_s, reply + 1)) {
        snprintf(err, errlen, "HMAC-SHA256 failed while authenticating %s", peer);
        return DT_ERR_SYSTEM;
    }
    rc = dt_net_write_all(fd, reply, sizeof reply, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);
    return 0;
}

int dt_auth_client(int fd, const char *secret, const char *context, uint64_t deadline_ns,
                   char *err, size_t errlen)
{
    int rc = check_args(secret, context, err, errlen);
    if (rc) return rc;
    char who[128], peer[96];
    dt_net_peer_name(fd, peer, sizeof peer);
    snprintf(who, sizeof who, "the server at %s", peer);

    unsigned char hello[MAGIC_LEN + NONCE_LEN];
    rc = dt_net_read_all(fd, hello, sizeof hello, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);
    if (memcmp(hello, AUTH_MAGIC, MAGIC_LEN) != 0) {
        snprintf(err, errlen, "%s is not a dtrain peer (bad handshake greeting)", who);
        return DT_ERR_PROTOCOL;
    }
    const unsigned char *nonce_s = hello + MAGIC_LEN;

    unsigned char answer[MAGIC_LEN + NONCE_LEN + MAC_LEN];
    unsigned char *nonce_c = answer + MAGIC_LEN;
    memcpy(answer, AUTH_MAGIC, MAGIC_LEN);
    if (random_nonce(nonce_c, NONCE_LEN)) {
        snprintf(err, errlen, "getrandom failed while authenticating to %s", peer);
        return DT_ERR_SYSTEM;
    }
    if (compute_mac(secret, context, 'C', nonce_s, nonce_c, answer + MAGIC_LEN + NONCE_LEN)) {
        snprintf(err, errlen, "HMAC-SHA256 failed while authenticating to %s", peer);
        return DT_ERR_SYSTEM;
    }
    rc = dt_net_write_all(fd, answer, sizeof answer, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);

    unsigned char status;
    rc = dt_net_read_all(fd, &status, 1, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);
    if (status != STATUS_ACCEPTED) {
        snprintf(err, errlen,
                 "%s refused our job secret (DTRAIN_SECRET must be the same on every rank)", who);
        return DT_ERR_AUTH;
    }
    unsigned char mac_s[MAC_LEN], expect[MAC_LEN];
    rc = dt_net_read_all(fd, mac_s, MAC_LEN, deadline_ns);
    if (rc) return io_failure(rc, who, err, errlen);
    if (compute_mac(secret, context, 'S', nonce_c, nonce_s, expect)) {
        snprintf(err, errlen, "HMAC-SHA256 failed while authenticating to %s", peer);
        return DT_ERR_SYSTEM;
    }
    if (CRYPTO_memcmp(expect, mac_s, MAC_LEN) != 0) {
        snprintf(err, errlen, "%s does not know the job secret (DTRAIN_SECRET)", who);
        return DT_ERR_AUTH;
    }
    return 0;
}
