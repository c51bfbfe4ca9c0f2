/*
 * mb-sign.c - HMAC-SHA256 signatures of the etcd writes that change a
 * view, with the job secret (OpenSSL's libcrypto). A writer with etcd
 * access but without the secret cannot make one, so the leader can tell
 * a member's request from a foreign one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/log.h"
#include "common/status.h"
#include "membership/mb-int.h"

#define SIGN_LABEL "ringd etcd write v1"

/* NUL-separated fields after the label: no two field lists give one
 * message, as no field holds a NUL. */
static int sign_raw(const mb_t *mb, const char *const *f, size_t n,
                    char hex[MB_SIG_HEX])
{
    size_t cap = sizeof(SIGN_LABEL);
    for (size_t i = 0; i < n; i++)
        cap += strlen(f[i]) + 1;
    char *msg = malloc(cap), *p = msg;
    if (msg == NULL)
        return ST_ENOMEM;
    memcpy(p, SIGN_LABEL, sizeof(SIGN_LABEL));
    p += sizeof(SIGN_LABEL);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(f[i]) + 1;
        memcpy(p, f[i], l);
        p += l;
    }
    uint8_t mac[32];
    unsigned len = 0;
    int ok = HMAC(EVP_sha256(), mb->secret, (int)mb->secret_len,
                  (const uint8_t *)msg, cap, mac, &len) != NULL &&
             len == sizeof(mac);
    free(msg);
    if (!ok) {
        RD_ERROR("mb %s: HMAC-SHA256 failed", mb->me.node);
        return ST_ENOMEM;
    }
    for (unsigned i = 0; i < len; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    return 0;
}

int mb__sign(const mb_t *mb, const char *const *fields, size_t n,
             char hex[MB_SIG_HEX])
{
    hex[0] = '\0';
    return mb->secret_len ? sign_raw(mb, fields, n, hex) : 0;
}

int mb__sig_ok(const mb_t *mb, const char *const *fields, size_t n,
               const char *sig)
{
    char want[MB_SIG_HEX];
    if (mb->secret_len == 0)
        return 1;
    if (sig == NULL || strlen(sig) != MB_SIG_HEX - 1 ||
        sign_raw(mb, fields, n, want) != 0)
        return 0;
    return CRYPTO_memcmp(want, sig, MB_SIG_HEX - 1) == 0;
}

#define VIEW_SIG_OPEN ",\"sig\":\""
#define VIEW_SIG_LEN (sizeof(VIEW_SIG_OPEN) - 1 + MB_SIG_HEX - 1 + 2)

char *mb__text_sign(const mb_t *mb, const char *what, const char *key,
                    char *json)
{
    char sig[MB_SIG_HEX];
    size_t n = json != NULL ? strlen(json) : 0;
    if (mb->secret_len == 0 || n < 2 || json[n - 1] != '}')
        return json;
    const char *f[] = {what, key, json};
    char *out = malloc(n + VIEW_SIG_LEN);
    if (out == NULL || mb__sign(mb, f, 3, sig) != 0) {
        free(out);
        free(json);
        return NULL;
    }
    memcpy(out, json, n - 1);
    snprintf(out + n - 1, VIEW_SIG_LEN + 1, VIEW_SIG_OPEN "%s\"}", sig);
    free(json);
    return out;
}

int mb__text_sig_ok(const mb_t *mb, const char *what, const char *key,
                    const char *val, size_t len)
{
    if (mb->secret_len == 0)
        return 1;
    if (len < VIEW_SIG_LEN + 2 || val[len - 1] != '}' ||
        memcmp(val + len - VIEW_SIG_LEN, VIEW_SIG_OPEN,
               sizeof(VIEW_SIG_OPEN) - 1) != 0)
        return 0;
    size_t body = len - VIEW_SIG_LEN;
    char *unsigned_json = malloc(body + 2);
    char sig[MB_SIG_HEX];
    if (unsigned_json == NULL)
        return 0;
    memcpy(unsigned_json, val, body);
    memcpy(unsigned_json + body, "}", 2);
    memcpy(sig, val + body + sizeof(VIEW_SIG_OPEN) - 1, MB_SIG_HEX - 1);
    sig[MB_SIG_HEX - 1] = '\0';
    const char *f[] = {what, key, unsigned_json};
    int ok = mb__sig_ok(mb, f, 3, sig);
    free(unsigned_json);
    return ok;
}

/* The signed value: the node's lease, so a drain outlives no incarnation
 * of it (a replayed value names a lease that is gone). */
int mb_drain_value(const void *secret, size_t len, const char *key,
                   int64_t lease, char **value_p)
{
    mb_t *mb = calloc(1, sizeof(*mb));
    char *json = NULL;
    if (mb == NULL)
        return ST_ENOMEM;
    mb->secret = (uint8_t *)secret;
    mb->secret_len = len;
    if (asprintf(&json, "{\"by\":\"ringctl\",\"lease\":\"%lld\"}",
                 (long long)lease) < 0)
        json = NULL;
    json = mb__text_sign(mb, "drain", key, json);
    free(mb);
    if (json == NULL)
        return ST_ENOMEM;
    *value_p = json;
    return 0;
}

int mb_value_signed(const void *secret, size_t len, const char *what,
                    const char *key, const char *val, size_t vlen)
{
    mb_t *mb = calloc(1, sizeof(*mb));
    if (mb == NULL)
        return 0;
    mb->secret = (uint8_t *)secret;
    mb->secret_len = len;
    int ok = len > 0 && mb__text_sig_ok(mb, what, key, val, vlen);
    free(mb);
    return ok;
}
