/*
 * job_auth.c - the job secret and HMAC-SHA256 proofs (see job_auth.h).
 */
#include "job/job_auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/log.h"
#include "common/status.h"
#include "transport/tp.h"

/* Domain separation: a proof can never be mistaken for another HMAC made
 * with the same secret (the etcd signatures). */
#define AUTH_LABEL "ringd ring hello v1"
#define TAG_LABEL "ringd ring-tag v1"

struct job_auth {
    size_t len;
    uint8_t key[JOB_AUTH_SECRET_MAX];
};

int job_auth_create(const void *secret, size_t len, job_auth_t **auth_p)
{
    if (len < JOB_AUTH_SECRET_MIN || len > JOB_AUTH_SECRET_MAX) {
        RD_ERROR("job auth: a secret of %zu bytes (want %d..%d)", len,
                 JOB_AUTH_SECRET_MIN, JOB_AUTH_SECRET_MAX);
        return ST_ECONFIG;
    }
    job_auth_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return ST_ENOMEM;
    memcpy(a->key, secret, len);
    a->len = len;
    *auth_p = a;
    return 0;
}

void job_auth_destroy(job_auth_t *a)
{
    if (a == NULL)
        return;
    OPENSSL_cleanse(a, sizeof(*a));
    free(a);
}

static const char *secret_file_problem(FILE *f, uint8_t *buf, size_t *n_p)
{
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        return "not a regular file";
    /* Anyone who can read it can join the job. */
    if (st.st_mode & S_IROTH)
        return "readable by every user (chmod 0600 or 0640)";
    *n_p = fread(buf, 1, JOB_AUTH_SECRET_MAX + 1, f);
    if (ferror(f))
        return "read error";
    if (*n_p > JOB_AUTH_SECRET_MAX)
        return "longer than 4096 bytes";
    while (*n_p > 0 && (buf[*n_p - 1] == '\n' || buf[*n_p - 1] == '\r'))
        (*n_p)--;
    if (*n_p < JOB_AUTH_SECRET_MIN)
        return "shorter than 16 bytes";
    return NULL;
}

int job_auth_load(const char *path, job_auth_t **auth_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        RD_ERROR("job auth: cannot read job secret file %s: %s", path,
                 strerror(errno));
        return ST_ECONFIG;
    }
    uint8_t buf[JOB_AUTH_SECRET_MAX + 1];
    size_t n = 0;
    const char *bad = secret_file_problem(f, buf, &n);
    fclose(f);
    int rc = ST_ECONFIG;
    if (bad != NULL)
        RD_ERROR("job auth: job secret file %s: %s", path, bad);
    else
        rc = job_auth_create(buf, n, auth_p);
    OPENSSL_cleanse(buf, sizeof(buf));
    return rc;
}

void job_auth_secret(const job_auth_t *a, const void **secret_p,
                     size_t *len_p)
{
    *secret_p = a != NULL ? a->key : NULL;
    *len_p = a != NULL ? a->len : 0;
}

int job_auth_nonce(uint8_t nonce[JOB_AUTH_NONCE_BYTES])
{
    if (RAND_bytes(nonce, JOB_AUTH_NONCE_BYTES) != 1) {
        RD_ERROR("job auth: RAND_bytes failed");
        return ST_ENOMEM; /* OpenSSL fails on allocation */
    }
    return 0;
}

/* Strings with their length first, so no two inputs give one message. */
static uint8_t *put_str(uint8_t *p, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    memcpy(p, &n, sizeof(n));
    memcpy(p + sizeof(n), s, n);
    return p + sizeof(n) + n;
}

int job_auth_proof(const job_auth_t *a, const char *job, uint64_t gen,
                   const char *from, const char *to,
                   const uint8_t from_nonce[JOB_AUTH_NONCE_BYTES],
                   const uint8_t to_nonce[JOB_AUTH_NONCE_BYTES],
                   uint8_t proof[JOB_AUTH_PROOF_BYTES])
{
    size_t cap = 4 * sizeof(uint32_t) + sizeof(AUTH_LABEL) + strlen(job) +
                 strlen(from) + strlen(to) + sizeof(gen) +
                 2 * JOB_AUTH_NONCE_BYTES;
    uint8_t *msg = malloc(cap);
    if (msg == NULL)
        return ST_ENOMEM;
    uint8_t *p = put_str(msg, AUTH_LABEL);
    p = put_str(p, job);
    memcpy(p, &gen, sizeof(gen));
    p = put_str(put_str(p + sizeof(gen), from), to);
    memcpy(p, from_nonce, JOB_AUTH_NONCE_BYTES);
    memcpy(p + JOB_AUTH_NONCE_BYTES, to_nonce, JOB_AUTH_NONCE_BYTES);
    p += 2 * JOB_AUTH_NONCE_BYTES;
    unsigned len = 0;
    int ok = HMAC(EVP_sha256(), a->key, (int)a->len, msg,
                  (size_t)(p - msg), proof, &len) != NULL &&
             len == JOB_AUTH_PROOF_BYTES;
    free(msg);
    if (!ok) {
        RD_ERROR("job auth: HMAC-SHA256 failed");
        return ST_ENOMEM; /* OpenSSL fails on allocation */
    }
    return 0;
}

int job_auth_verify(const job_auth_t *a, const char *job, uint64_t gen,
                    const char *from, const char *to,
                    const uint8_t from_nonce[JOB_AUTH_NONCE_BYTES],
                    const uint8_t to_nonce[JOB_AUTH_NONCE_BYTES],
                    const uint8_t proof[JOB_AUTH_PROOF_BYTES])
{
    uint8_t want[JOB_AUTH_PROOF_BYTES];
    int rc = job_auth_proof(a, job, gen, from, to, from_nonce, to_nonce,
                            want);
    if (rc != 0)
        return rc;
    return CRYPTO_memcmp(want, proof, sizeof(want)) == 0 ? 0
                                                         : ST_EPEER_FORGED;
}

/* The truncated HMAC of one generation: the first 24 bits of the MAC. */
static int tag_raw(const job_auth_t *a, const char *job, uint64_t gen,
                   uint32_t *raw_p)
{
    size_t cap = 2 * sizeof(uint32_t) + sizeof(TAG_LABEL) + strlen(job) +
                 sizeof(gen);
    uint8_t *msg = malloc(cap), mac[EVP_MAX_MD_SIZE];
    if (msg == NULL)
        return ST_ENOMEM;
    uint8_t *p = put_str(put_str(msg, TAG_LABEL), job);
    memcpy(p, &gen, sizeof(gen));
    p += sizeof(gen);
    unsigned len = 0;
    int ok = HMAC(EVP_sha256(), a->key, (int)a->len, msg,
                  (size_t)(p - msg), mac, &len) != NULL && len >= 3;
    free(msg);
    if (!ok) {
        RD_ERROR("job auth: HMAC-SHA256 failed");
        return ST_ENOMEM;
    }
    *raw_p = ((uint32_t)mac[0] << 16 | (uint32_t)mac[1] << 8 | mac[2]) &
             (uint32_t)TP_TAG_GEN_MASK;
    return 0;
}

uint32_t job_auth_tag_pick(uint64_t gen, uint32_t prev, uint32_t cur,
                           uint32_t next)
{
    if (gen % 2 == 0)
        return cur;
    uint32_t v = cur;
    for (uint32_t d = 1; d <= 3 && (v == prev || v == next); d++)
        v = cur ^ d;
    return v;
}

int job_auth_tag_gen(const job_auth_t *a, const char *job, uint64_t gen,
                     uint32_t *tag_gen_p)
{
    uint32_t raw[3];
    for (int i = 0; i < 3; i++) {
        int rc = tag_raw(a, job, gen - 1 + (uint64_t)i, &raw[i]);
        if (rc != 0)
            return rc;
    }
    *tag_gen_p = job_auth_tag_pick(gen, raw[0], raw[1], raw[2]);
    return 0;
}
