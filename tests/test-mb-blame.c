/*
 * test-mb-blame.c - blame against a real etcd (membership/README.md,
 * "Blame"): who a member's reports convict, the leader judged by its
 * reporters, and the self-check of a reporter in a view of two.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "membership/mb-int.h"
#include "membership/mb.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/mb-members.h"
#include "tests/task.h"

typedef struct {
    mb_t *mb;
    char key[MB_KEY_MAX];
} mirror_has_t;

/* The member's suspects mirror holds a->key: as the watch delivered it,
 * the leader judged it (mb__handle_suspects runs in that callback). */
static int mirror_has(void *arg)
{
    mirror_has_t *a = arg;
    return mb__mirror_find(a->mb, a->key) != NULL;
}

/* Wait until the leader's mirror holds by's report on node. */
static void leader_saw(member_t *leader, const char *node, const char *by)
{
    mirror_has_t a = {leader->mb, {0}};
    ASSERT_OK(mb__suspect_key(leader->mb, node, by, a.key));
    ASSERT_MSG(fx_run_until_fn(&loop, mirror_has, &a, 5000),
               "the leader never saw %s", a.key);
}

/* 1 when the leader sent a revoke of lease as a verdict. */
static int revoked_by(const mb_t *leader, int64_t lease)
{
    for (int i = 0; i < MB_SUSPECTS_MAX; i++)
        if (leader->blame_revoked[i] == lease)
            return 1;
    return 0;
}

static int64_t lease_of(const member_t *m)
{
    return m->mb->lease;
}

/* Run until the members in ms installed a view of generation 2 or later
 * without name (as an old incarnation: back as a joiner is fine). */
static void wait_dropped(member_t **ms, int n, const char *name)
{
    wait_gen(ms, n, 2, 10000);
    for (int i = 0; i < n; i++) {
        int k = ms[i]->n_views - 1;
        ASSERT_MSG(strstr(ms[i]->lists[k], name) == NULL ||
                       strstr(ms[i]->joiners[k], name) != NULL,
                   "%s still lists %s: %s", ms[i]->name, name,
                   ms[i]->lists[k]);
    }
}

/*
 * A lossy-link report alone convicts nobody, however long it stands
 * (its reporter may be the lossy one); a second member's report on the
 * same node does, at once.
 */
TEST_IMPL(mb_blame_two_accusers)
{
    member_t m[3];
    int leader = start_three(m);
    int victim = (leader + 1) % 3, other = (leader + 2) % 3;
    int64_t vl = lease_of(&m[victim]);
    ASSERT_OK(mb_suspect_soft(m[other].mb, m[victim].name, MB_BLAME_LOSSY,
                              "test: one lossy report"));
    leader_saw(&m[leader], m[victim].name, m[other].name);
    ASSERT_MSG(!revoked_by(m[leader].mb, vl), "one lossy report convicted");
    /* Past the longest grace of a silence report (a rule with a time in
     * it): still nothing, and the report is still fresh. */
    int never = 0;
    ASSERT(!fx_run_until(&loop, &never, 2 * MB_BLAME_GRACE_MS + 200));
    ASSERT_MSG(!revoked_by(m[leader].mb, vl) && m[victim].n_views == 1,
               "a lone lossy report convicted after its grace");
    ASSERT_OK(mb_suspect_soft(m[leader].mb, m[victim].name, MB_BLAME_SILENT,
                              "test: the second accuser"));
    member_t *rest[] = {&m[leader], &m[other]};
    wait_dropped(rest, 2, m[victim].name);
    ASSERT(revoked_by(m[leader].mb, vl));
    teardown(m, 3);
    return fx_done();
}

/*
 * The lossy reporter: a node whose own link fails finds its healthy
 * neighbour silent, while both its neighbours find it lossy. It stands
 * accused by two, so its word does not count: it is evicted, the
 * neighbour it accused stays.
 */
TEST_IMPL(mb_blame_lossy_reporter)
{
    member_t m[3];
    int leader = start_three(m);
    int lossy = (leader + 1) % 3, other = (leader + 2) % 3;
    ASSERT_OK(mb_suspect_soft(m[lossy].mb, m[other].name, MB_BLAME_SILENT,
                              "test: the lossy node accuses"));
    leader_saw(&m[leader], m[other].name, m[lossy].name);
    ASSERT_OK(mb_suspect_soft(m[other].mb, m[lossy].name, MB_BLAME_LOSSY,
                              "test: its neighbour"));
    ASSERT_OK(mb_suspect_soft(m[leader].mb, m[lossy].name, MB_BLAME_LOSSY,
                              "test: its other neighbour"));
    member_t *rest[] = {&m[leader], &m[other]};
    wait_dropped(rest, 2, m[lossy].name);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(strstr(rest[i]->lists[rest[i]->n_views - 1],
                          m[other].name) != NULL,
                   "the accused healthy node %s was evicted",
                   m[other].name);
    ASSERT(!revoked_by(m[leader].mb, lease_of(&m[other])));
    teardown(m, 3);
    return fx_done();
}

/*
 * A link cut one way is seen from one end only: a lone silence report,
 * its reporter accused by nobody, convicts once its grace has run out,
 * not when it arrives.
 */
TEST_IMPL(mb_blame_silent_grace)
{
    member_t m[3];
    int leader = start_three(m);
    int victim = (leader + 1) % 3, other = (leader + 2) % 3;
    int64_t vl = lease_of(&m[victim]);
    ASSERT_OK(mb_suspect_soft(m[other].mb, m[victim].name, MB_BLAME_SILENT,
                              "test: a one-way cut"));
    leader_saw(&m[leader], m[victim].name, m[other].name);
    ASSERT_MSG(!revoked_by(m[leader].mb, vl),
               "a lone silence report convicted before its grace");
    member_t *rest[] = {&m[leader], &m[other]};
    wait_dropped(rest, 2, m[victim].name);
    ASSERT(revoked_by(m[leader].mb, vl));
    teardown(m, 3);
    return fx_done();
}

typedef struct {
    mb_t *mb;
    const char *node;
} checked_t;

/* The reporter's soft suspicion of node has read the reports once. */
static int leader_checked(void *arg)
{
    checked_t *a = arg;
    for (int i = 0; i < MB_SUSPECTS_MAX; i++) {
        const mb__sus_t *p = &a->mb->sus[i];
        if (p->lease != 0 && strcmp(p->node, a->node) == 0 &&
            p->leader_check && p->put_ok && !p->checking && p->check_at)
            return 1;
    }
    return 0;
}

/*
 * The leader's reporters read the reports (it may be unable to act). One
 * lossy report on it revokes nothing; a second member's report does, and
 * the others go on in a view without that incarnation.
 */
TEST_IMPL(mb_blame_leader)
{
    member_t m[3];
    int leader = start_three(m);
    int r1 = (leader + 1) % 3, r2 = (leader + 2) % 3;
    ASSERT_OK(mb_suspect_soft(m[r1].mb, m[leader].name, MB_BLAME_LOSSY,
                              "test: lossy leader"));
    checked_t c = {m[r1].mb, m[leader].name};
    ASSERT_MSG(fx_run_until_fn(&loop, mirror_leader_is,
                               &(leader_is_t){m[r1].mb, m[leader].name},
                               5000), "no leader key");
    ASSERT_MSG(fx_run_until_fn(&loop, leader_checked, &c, 5000),
               "the reporter never read the reports on the leader");
    ASSERT_EQ(m[leader].fenced, 0);
    ASSERT_EQ(last_gen(&m[r1]), 1);
    ASSERT_OK(mb_suspect_soft(m[r2].mb, m[leader].name, MB_BLAME_SILENT,
                              "test: the second accuser"));
    member_t *rest[] = {&m[r1], &m[r2]};
    wait_dropped(rest, 2, m[leader].name);
    /* Its incarnation is gone (it may lead again as a new one). */
    ASSERT_MSG(fx_run_until(&loop, &m[leader].fenced, 5000),
               "the convicted leader never learnt it was evicted");
    teardown(m, 3);
    return fx_done();
}

typedef struct {
    mb_t *mb;
    const char *node;
} slot_of_t;

/* mb has no suspicion of node left (sent, or withheld). */
static int no_slot(void *arg)
{
    slot_of_t *a = arg;
    for (int i = 0; i < MB_SUSPECTS_MAX; i++)
        if (a->mb->sus[i].lease != 0 &&
            strcmp(a->mb->sus[i].node, a->node) == 0)
            return 0;
    return 1;
}

/*
 * In a view of two nobody else can report, so a soft report checks its
 * reporter's own path first. n2, whose path to etcd is held up (its
 * relay SIGSTOPped for 300 ms: a lossy network looks so), withholds its
 * report on n1, and n1 stays; n1's report on n2, over a sound path,
 * convicts n2 at once.
 */
TEST_IMPL(mb_blame_self_check)
{
    setup();
    member_t m[2];
    int port = th_free_port();
    pid_t relay = fx_proxy_start(&etcd_, port);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    start_member(&m[0], "n1", "h", 30, 2);
    start_member_at(&m[1], "n2", "h", 30, 2, url);
    member_t *all[] = {&m[0], &m[1]};
    wait_view(all, 2, "n1 n2 ", 1, 10000);

    kill(relay, SIGSTOP);
    ASSERT_OK(mb_suspect_soft(m[1].mb, "n1", MB_BLAME_LOSSY,
                              "test: from a slow path"));
    int never = 0;
    ASSERT(!fx_run_until(&loop, &never, 300)); /* the path stays slow */
    kill(relay, SIGCONT);
    slot_of_t s = {m[1].mb, "n1"};
    ASSERT_MSG(fx_run_until_fn(&loop, no_slot, &s, 10000),
               "n2's probe never ended");
    ASSERT_MSG(m[0].n_views == 1 && m[1].n_views == 1 && !m[0].fenced,
               "n2's report went out from a slow path");
    char key[MB_KEY_MAX], cmd[MB_KEY_MAX + 64];
    ASSERT_OK(mb__suspect_key(m[1].mb, "n1", "n2", key));
    snprintf(cmd, sizeof(cmd), "get %s --keys-only | grep -q .", key);
    ASSERT_MSG(fx_etcdctl(&etcd_, cmd) != 0, "the withheld report is "
               "stored");

    ASSERT_OK(mb_suspect_soft(m[0].mb, "n2", MB_BLAME_LOSSY,
                              "test: from a sound path"));
    member_t *rest[] = {&m[0]};
    wait_dropped(rest, 1, "n2");
    fx_proxy_stop(relay);
    teardown(m, 2);
    return fx_done();
}
