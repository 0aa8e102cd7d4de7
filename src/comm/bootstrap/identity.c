/* A job's secret and id (identity.h). */
#include "comm/bootstrap/identity.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

static void to_hex(const unsigned char *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

int dt_ident_random_secret(char *out, size_t len)
{
    unsigned char bytes[DT_SECRET_HEX / 2];
    if (len <= DT_SECRET_HEX) {
        errno = ENOBUFS;
        return -1;
    }
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t r = getrandom(bytes + got, sizeof bytes - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        got += (size_t)r;
    }
    to_hex(bytes, sizeof bytes, out);
    return 0;
}

void dt_ident_job_id(const char *secret, const char *master_addr, int master_port, char *out,
                     size_t len)
{
    char text[1024];
    int n = snprintf(text, sizeof text, "dtrain-job-id|%s|%s|%d", secret, master_addr,
                     master_port);
    if (n < 0 || (size_t)n >= sizeof text) n = (int)sizeof text - 1;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char hex[17];
    /* SHA-256 cannot fail on a buffer in memory short of a broken OpenSSL;
     * an all-zero id then still names the job's files consistently. */
    if (!EVP_Digest(text, (size_t)n, md, &mdlen, EVP_sha256(), NULL) || mdlen < 8)
        memset(md, 0, 8);
    to_hex(md, 8, hex);
    snprintf(out, len, "%s", hex);
}

int dt_ident_attempt_secret(const char *secret, long attempt, char *out, size_t len)
{
    char text[48];
    int n = snprintf(text, sizeof text, "dtrain attempt %ld", attempt);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0;
    if (len <= DT_ATTEMPT_SECRET_HEX ||
        !HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)text, (size_t)n,
              mac, &maclen) ||
        maclen != DT_ATTEMPT_SECRET_HEX / 2)
        return -1;
    to_hex(mac, maclen, out);
    return 0;
}

int dt_ident_job_id_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > DT_JOB_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i])) return 0;
    return 1;
}
