/*
 * The job secret's pure core: the handshake proof, the ring's keyed tag
 * generations, and the ring handshake between two ring threads in this
 * process (no daemon, no etcd).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "job/job_auth.h"
#include "job/job_ring-int.h"
#include "membership/mb.h"
#include "tests/task.h"

#define AUTH_JOB "authjob"

static const char secret_a[] = "0123456789abcdef-the-job-secret";
static const char secret_b[] = "0123456789abcdef-another-secret";

TEST_IMPL(job_auth_proof)
{
    job_auth_t *a = NULL, *b = NULL;
    ASSERT_OK(job_auth_create(secret_a, strlen(secret_a), &a));
    ASSERT_OK(job_auth_create(secret_b, strlen(secret_b), &b));
    uint8_t n1[JOB_AUTH_NONCE_BYTES], n2[JOB_AUTH_NONCE_BYTES];
    ASSERT_OK(job_auth_nonce(n1));
    ASSERT_OK(job_auth_nonce(n2));
    ASSERT(memcmp(n1, n2, sizeof(n1)) != 0);
    uint8_t p[JOB_AUTH_PROOF_BYTES];
    ASSERT_OK(job_auth_proof(a, "job", 7, "n0", "n1", n1, n2, p));
    ASSERT_OK(job_auth_verify(a, "job", 7, "n0", "n1", n1, n2, p));
    /* Every input is bound: change any one and it fails. */
    ASSERT_EQ(job_auth_verify(b, "job", 7, "n0", "n1", n1, n2, p),
              ST_EPEER_FORGED);
    ASSERT_EQ(job_auth_verify(a, "jo", 7, "n0", "n1", n1, n2, p),
              ST_EPEER_FORGED);
    ASSERT_EQ(job_auth_verify(a, "job", 8, "n0", "n1", n1, n2, p),
              ST_EPEER_FORGED);
    ASSERT_EQ(job_auth_verify(a, "job", 7, "n1", "n0", n1, n2, p),
              ST_EPEER_FORGED);
    ASSERT_EQ(job_auth_verify(a, "job", 7, "n0", "n2", n1, n2, p),
              ST_EPEER_FORGED);
    ASSERT_EQ(job_auth_verify(a, "job", 7, "n0", "n1", n2, n1, p),
              ST_EPEER_FORGED);
    /* Field boundaries count: "n0"+"n1" is not "n"+"0n1". */
    ASSERT_EQ(job_auth_verify(a, "job", 7, "n", "0n1", n1, n2, p),
              ST_EPEER_FORGED);
    p[31] ^= 1;
    ASSERT_EQ(job_auth_verify(a, "job", 7, "n0", "n1", n1, n2, p),
              ST_EPEER_FORGED);
    job_auth_destroy(a);
    job_auth_destroy(b);
    /* Too short a secret is refused. */
    ASSERT_EQ(job_auth_create("short", 5, &a), ST_ECONFIG);
    return 0;
}

/*
 * The ring's keyed tag generations: a function of secret, job and
 * generation only, within the tag's field, and never the same for two
 * consecutive generations, also where the truncated HMACs collide.
 */
TEST_IMPL(job_auth_tag_gen)
{
    job_auth_t *a = NULL, *b = NULL;
    ASSERT_OK(job_auth_create(secret_a, strlen(secret_a), &a));
    ASSERT_OK(job_auth_create(secret_b, strlen(secret_b), &b));
    uint32_t x, y, prev = 0;
    ASSERT_OK(job_auth_tag_gen(a, "job", 7, &x));
    ASSERT_OK(job_auth_tag_gen(a, "job", 7, &y));
    ASSERT_EQ(x, y);
    ASSERT_OK(job_auth_tag_gen(b, "job", 7, &y));
    ASSERT_NE(x, y);
    ASSERT_OK(job_auth_tag_gen(a, "jo", 7, &y));
    ASSERT_NE(x, y);
    for (uint64_t g = 1; g <= 5000; g++) {
        ASSERT_OK(job_auth_tag_gen(a, "job", g, &y));
        ASSERT_EQ(y & ~(uint32_t)TP_TAG_GEN_MASK, 0);
        if (g > 1)
            ASSERT_MSG(y != prev, "generations %llu and %llu share %06x",
                       (unsigned long long)g - 1, (unsigned long long)g, y);
        prev = y;
    }
    /* Collisions: an even generation keeps its value, an odd one moves
     * off both neighbours'. */
    ASSERT_EQ(job_auth_tag_pick(8, 5, 5, 5), 5);
    ASSERT_EQ(job_auth_tag_pick(9, 1, 2, 3), 2);
    ASSERT_EQ(job_auth_tag_pick(9, 5, 5, 9), 5 ^ 1);
    ASSERT_EQ(job_auth_tag_pick(9, 9, 5, 5), 5 ^ 1);
    ASSERT_EQ(job_auth_tag_pick(9, 5, 5, 5 ^ 1), 5 ^ 2);
    ASSERT_EQ(job_auth_tag_pick(9, 5 ^ 1, 5, 5), 5 ^ 2);
    ASSERT_EQ(job_auth_tag_pick(9, 5 ^ 2, 5, 5 ^ 1), 5);
    uint32_t top = (uint32_t)TP_TAG_GEN_MASK;
    ASSERT_EQ(job_auth_tag_pick(9, top, top, top ^ 1), top ^ 2);
    job_auth_destroy(a);
    job_auth_destroy(b);
    return 0;
}

/* ---- the ring handshake itself, two ring threads in this process ---- */

typedef struct hs_side hs_side_t;
struct hs_side {
    const char *secret;
    int rank;
    tp_t *tp;
    const void *addr;
    size_t addr_len;
    int rc;
    uint32_t suspect;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *ready;
    hs_side_t *other;
};

static void *hs_run(void *arg)
{
    hs_side_t *s = arg;
    hs_side_t *o = s->other;
    s->rc = tp_create(NULL, &s->tp);
    if (s->rc != 0)
        return NULL;
    tp_address(s->tp, &s->addr, &s->addr_len);
    pthread_mutex_lock(s->mu);
    (*s->ready)++;
    pthread_cond_broadcast(s->cv);
    while (*s->ready < 2)
        pthread_cond_wait(s->cv, s->mu);
    pthread_mutex_unlock(s->mu);
    static const char *nodes[2] = {"n0", "n1"};
    mb_member_t m[2] = {{.node = nodes[0]}, {.node = nodes[1]}};
    const void *addrs[2];
    size_t lens[2];
    addrs[s->rank] = s->addr;
    lens[s->rank] = s->addr_len;
    addrs[1 - s->rank] = o->addr;
    lens[1 - s->rank] = o->addr_len;
    ring_view_t rv = {.generation = 5, .nranks = 2,
                      .rank = (uint32_t)s->rank, .addrs = addrs,
                      .addr_lens = lens};
    ring_opts_t opts;
    ring_opts_default(&opts);
    opts.deadline_ms = 10000;
    ring_t *r = NULL;
    s->rc = ring_create(s->tp, &rv, &opts, &r, NULL);
    job_ring_t *b = calloc(1, sizeof(*b));
    mb_view_t v = {.generation = 5, .members = m, .n_members = 2,
                   .my_index = s->rank, .source_index = -1};
    if (s->rc == 0 && b != NULL) {
        b->job_name = AUTH_JOB;
        s->rc = job_auth_create(s->secret, strlen(s->secret), &b->auth);
    }
    if (s->rc == 0)
        s->rc = job__ring_auth(b, r, &v, &s->suspect);
    /* An accepted neighbour's ring carries a collective. */
    int32_t x = s->rank + 1;
    ring_allreduce_t a = {.buf = &x, .count = 1, .dt = KERN_I32,
                          .op = KERN_SUM};
    if (s->rc == 0)
        s->rc = ring_allreduce(r, &a) == 0 && x == 3 ? 0 : ST_EPROTO;
    if (b != NULL)
        job_auth_destroy(b->auth);
    free(b);
    ring_abort(r);
    ring_destroy(r);
    return NULL;
}

/* Both ends' results of one handshake with these secrets. */
static void handshake(const char *sa, const char *sb, hs_side_t out[2])
{
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int ready = 0;
    static hs_side_t sides[2];
    memset(sides, 0, sizeof(sides));
    const char *sec[2] = {sa, sb};
    for (int i = 0; i < 2; i++)
        sides[i] = (hs_side_t){.secret = sec[i], .rank = i, .mu = &mu,
                                 .cv = &cv, .ready = &ready,
                                 .other = &sides[1 - i],
                                 .suspect = UINT32_MAX};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, hs_run, &sides[i]), 0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        out[i] = sides[i];
        tp_destroy(sides[i].tp);
    }
}

/* Neighbours with the same secret pass and run a collective; with
 * different secrets each refuses the other's proof (ST_EPEER_FORGED,
 * naming it), before any collective. */
TEST_IMPL(job_auth_ring_handshake)
{
    hs_side_t r[2];
    handshake(secret_a, secret_a, r);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(r[i].rc == 0, "rank %d: %s", i, st_strerror(r[i].rc));
    handshake(secret_a, secret_b, r);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(r[i].rc, ST_EPEER_FORGED);
        ASSERT_EQ(r[i].suspect, (uint32_t)(1 - i));
    }
    return 0;
}
