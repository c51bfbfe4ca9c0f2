/*
 * job_ring_auth.c - the neighbours' handshake of a new ring: two
 * ring_hello rounds, nonces then proofs (job_auth.h).
 *
 * Each proof is made for one neighbour over the sender's nonce and the
 * receiver's, so it is fresh for the receiver and names both ends: a
 * proof recorded elsewhere, for another generation or another pair, does
 * not verify. Nothing of a neighbour reaches a collective's buffer before
 * its proof has verified: the first collective starts after this returns.
 */
#include <inttypes.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "job/job_ring-int.h"

static uint32_t rank_left(const mb_view_t *v)
{
    size_t n = v->n_members;
    return (uint32_t)(((size_t)v->my_index + n - 1) % n);
}

static uint32_t rank_right(const mb_view_t *v)
{
    return (uint32_t)(((size_t)v->my_index + 1) % v->n_members);
}

static int auth_verify_one(job_ring_t *b, const mb_view_t *v, uint32_t peer,
                           const uint8_t *peer_nonce, const uint8_t *mine,
                           const uint8_t *proof)
{
    const char *me = v->members[v->my_index].node;
    const char *them = v->members[peer].node;
    int rc = job_auth_verify(b->auth, b->job_name, v->generation, them, me,
                             peer_nonce, mine, proof);
    if (rc == ST_EPEER_FORGED)
        RD_ERROR("ring backend: %s failed the job-secret handshake of "
                 "generation %" PRIu64 ": closing its endpoint", them,
                 v->generation);
    return rc;
}

int job__ring_auth(job_ring_t *b, ring_t *r, const mb_view_t *v,
                   uint32_t *suspect_p)
{
    if (b->auth == NULL || v->n_members < 2)
        return 0;
    uint32_t l = rank_left(v), rr = rank_right(v);
    const char *me = v->members[v->my_index].node;
    uint8_t mine[JOB_AUTH_NONCE_BYTES], nl[JOB_AUTH_NONCE_BYTES],
        nr[JOB_AUTH_NONCE_BYTES];
    uint8_t pl[JOB_AUTH_PROOF_BYTES], pr[JOB_AUTH_PROOF_BYTES];
    uint8_t got_l[JOB_AUTH_PROOF_BYTES], got_r[JOB_AUTH_PROOF_BYTES];
    int rc = job_auth_nonce(mine);
    if (rc == 0)
        rc = ring_hello(r, mine, mine, nl, nr, sizeof(mine), suspect_p);
    if (rc == 0)
        rc = job_auth_proof(b->auth, b->job_name, v->generation, me,
                            v->members[l].node, mine, nl, pl);
    if (rc == 0)
        rc = job_auth_proof(b->auth, b->job_name, v->generation, me,
                            v->members[rr].node, mine, nr, pr);
    if (rc == 0)
        rc = ring_hello(r, pl, pr, got_l, got_r, sizeof(pl), suspect_p);
    if (rc != 0)
        return rc;
    *suspect_p = l;
    if ((rc = auth_verify_one(b, v, l, nl, mine, got_l)) != 0)
        return rc;
    *suspect_p = rr;
    if ((rc = auth_verify_one(b, v, rr, nr, mine, got_r)) != 0)
        return rc;
    *suspect_p = UINT32_MAX;
    return 0;
}
