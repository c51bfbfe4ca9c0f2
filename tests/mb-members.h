/*
 * mb-members.h - the membership tests' members (tests/mb-members.c): a
 * member_t is one mb_t on the shared test loop recording every view it
 * installed; the waits run the loop until the members' views agree.
 */
#ifndef RINGD_TEST_MB_MEMBERS_H
#define RINGD_TEST_MB_MEMBERS_H

#include <stdint.h>

#include <uv.h>

#include "membership/etcd.h"
#include "membership/mb.h"
#include "tests/mb-fixture.h"

#define MAX_VIEWS 64

typedef struct {
    char name[16];
    mb_t *mb;
    int n_views;
    uint64_t gens[MAX_VIEWS];
    char lists[MAX_VIEWS][128];
    char joiners[MAX_VIEWS][128];
    int joiner[MAX_VIEWS];
    int source[MAX_VIEWS];
    uint64_t steps[MAX_VIEWS];
    int fenced, drained, left;
    int leave_on_drain;
    int all_peers;           /* its peers callback names every member */
} member_t;

/* The loop and etcd of the running test (setup starts both). */
extern uv_loop_t loop;
extern fx_etcd_t etcd_;
extern int start_all_peers; /* start_member's next member: all_peers */
extern int ride_outage_;    /* the next start_member's mb_config_t */

/* The callbacks start_member gives each member. */
void on_view(const mb_view_t *v, void *data);
void on_fenced(int reason, void *data);
void on_left(int status, void *data);
void on_drain(void *data);

void start_member(member_t *m, const char *name, const char *host,
                  int ttl, int min_members);
/* The same, reaching etcd at endpoints (a relay in front of it). */
void start_member_at(member_t *m, const char *name, const char *host,
                     int ttl, int min_members, const char *endpoints);
void stop_member(member_t *m);
/* Run until every member in ms installed a view listing exactly list. */
void wait_view(member_t **ms, int n, const char *list, uint64_t min_gen,
               int64_t timeout_ms);
/* Run until every member in ms installed generation min_gen or later. */
void wait_gen(member_t **ms, int n, uint64_t min_gen, int64_t timeout_ms);
uint64_t last_gen(const member_t *m);
/* The loop and a fresh etcd; teardown destroys n members and the loop. */
void setup(void);
void teardown(member_t *ms, int n);
/* The one member leading (asserts there is at most one), -1: none. */
int leader_index(member_t *ms, int n);

typedef struct {
    int done, status;
    int64_t lease, mod;
} put_reply_t;

void on_put_reply(int status, const etcd_result_t *res, void *data);
/* A put through e on the test loop; returns the reply's revision. */
int64_t put_wait(etcd_t *e, const char *key, const char *val,
                 int64_t lease);
/* A predicate on member_t m[2]: m[0] or m[1] leads. */
int n1_or_n2_leads(void *p);
/* setup() and members n1..n3 (TTL 30 s: longer than any wait here, so
 * only a revoke evicts one) in their first view; returns the leader's
 * index. */
int start_three(member_t m[3]);

typedef struct {
    mb_t *mb;
    const char *val;
} leader_is_t;
/* A predicate: the member's mirror holds the leader key with value
 * a->val. */
int mirror_leader_is(void *arg);

#endif
