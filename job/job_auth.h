/*
 * job_auth.h - the job secret and the proofs made with it (HMAC-SHA256,
 * OpenSSL's libcrypto): ring neighbours prove to each other that they
 * hold the secret before any collective traffic.
 *
 * The core is pure: a proof is a function of (secret, job, generation,
 * from, to, both nonces) and nothing else, so it is bound to the job, the
 * view and the direction, and a fresh nonce of the verifier's makes a
 * recorded proof useless later.
 */
#ifndef RINGD_JOB_AUTH_H
#define RINGD_JOB_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define JOB_AUTH_NONCE_BYTES 32
#define JOB_AUTH_PROOF_BYTES 32 /* SHA-256 */
#define JOB_AUTH_SECRET_MIN 16
#define JOB_AUTH_SECRET_MAX 4096

typedef struct job_auth job_auth_t;

/*
 * Reads the secret from path: a regular file that is not readable by
 * every user (ST_ECONFIG, logged, otherwise), its bytes up to a trailing
 * newline, at least JOB_AUTH_SECRET_MIN of them.
 */
int job_auth_load(const char *path, job_auth_t **auth_p);
/* From bytes (tests). */
int job_auth_create(const void *secret, size_t len, job_auth_t **auth_p);
/* Wipes the secret. Accepts NULL. */
void job_auth_destroy(job_auth_t *auth);

/* The secret's bytes (NULL and 0 for a NULL auth), owned by auth: for
 * membership's signatures of etcd writes. */
void job_auth_secret(const job_auth_t *auth, const void **secret_p,
                     size_t *len_p);

/* A fresh random nonce (RAND_bytes). */
int job_auth_nonce(uint8_t nonce[JOB_AUTH_NONCE_BYTES]);

/* The proof that node `from` holds the secret, for node `to`. */
int job_auth_proof(const job_auth_t *auth, const char *job,
                   uint64_t generation, const char *from, const char *to,
                   const uint8_t from_nonce[JOB_AUTH_NONCE_BYTES],
                   const uint8_t to_nonce[JOB_AUTH_NONCE_BYTES],
                   uint8_t proof[JOB_AUTH_PROOF_BYTES]);
/* 0 when proof is the one job_auth_proof makes, ST_EPEER_FORGED otherwise
 * (not logged: the caller names the peer). Constant time. */
int job_auth_verify(const job_auth_t *auth, const char *job,
                    uint64_t generation, const char *from, const char *to,
                    const uint8_t from_nonce[JOB_AUTH_NONCE_BYTES],
                    const uint8_t to_nonce[JOB_AUTH_NONCE_BYTES],
                    const uint8_t proof[JOB_AUTH_PROOF_BYTES]);

/*
 * The generation field of the ring's tags for generation gen
 * (transport/tp.h): HMAC-SHA256 of (job, gen) under the secret, truncated
 * to TP_TAG_GEN_BITS, so that a process without the secret cannot make a
 * tag that any of the ring's receives matches. Two consecutive
 * generations never get the same value (job_auth_tag_pick), so a late
 * message of the previous ring can never match the new ring's receives.
 */
int job_auth_tag_gen(const job_auth_t *auth, const char *job, uint64_t gen,
                     uint32_t *tag_gen_p);
/*
 * The pure rule behind it, from the truncated HMACs of gen - 1, gen and
 * gen + 1: an even generation keeps its own, an odd one keeps its own
 * unless it equals a neighbour's, then takes the first of cur ^ 1,
 * cur ^ 2, cur ^ 3 that equals neither. Even generations are never
 * changed, so every node derives the same value and neighbours differ.
 */
uint32_t job_auth_tag_pick(uint64_t gen, uint32_t prev, uint32_t cur,
                           uint32_t next);

#endif /* RINGD_JOB_AUTH_H */
