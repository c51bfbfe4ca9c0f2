/*
 * test-mb-watch.c - membership against a real etcd: the narrow watch set of
 * members and the leader, leadership moving, watches catching up.
 */
#include <errno.h>
#include <fcntl.h>
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

/* ---- narrow watches ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The watched keys of m, each "=key" or "key*" (prefix), sorted. */
static void watch_set(mb_t *mb, char *out, size_t n)
{
    const char *keys[MB_W_N];
    int prefix[MB_W_N];
    size_t k = mb__watched(mb, keys, prefix, MB_W_N);
    char items[MB_W_N][MB_KEY_MAX + 2];
    for (size_t i = 0; i < k; i++)
        snprintf(items[i], sizeof(items[i]), "%s%s", keys[i] + 12,
                 prefix[i] ? "*" : "");
    qsort(items, k, sizeof(items[0]), cmp_str);
    out[0] = '\0';
    for (size_t i = 0; i < k; i++) {
        strncat(out, items[i], n - strlen(out) - 1);
        strncat(out, " ", n - strlen(out) - 1);
    }
}

typedef struct {
    member_t *m;
    uint64_t want[4];
} events_pred_t;

/*
 * Every member's watches have read their keys and the leader key has
 * reached each mirror. The leader key comes on its own watch stream, in
 * no fixed order with the view's: a member can install view 1 before
 * its leader watch delivers that PUT, which would then be counted as an
 * event after the baseline.
 */
static int watches_settled(void *p)
{
    events_pred_t *ep = p;
    for (int i = 0; i < 4; i++) {
        mb_t *mb = ep->m[i].mb;
        if (mb__mirror_find(mb, mb->leader_key) == NULL)
            return 0;
        for (int w = 0; w < MB_W_N; w++)
            if (mb->mirrors[w].watch != NULL && !mb->mirrors[w].synced)
                return 0;
    }
    return 1;
}

static int events_reached(void *p)
{
    events_pred_t *ep = p;
    for (int i = 0; i < 4; i++)
        if (ep->m[i].mb->events < ep->want[i])
            return 0;
    return 1;
}

/*
 * Four members n1..n4 (ring order). A non-leader watches exactly its own
 * record, the view, the leader key, its drain key and its two ring
 * neighbours' records; the leader adds the records, suspects and reshape
 * prefixes, and nobody watches checkpoint records. Twenty checkpoint
 * part records, a manifest and another node's drain key then reach no
 * member: the next event each gets is the view's rewrite that follows
 * them.
 */
TEST_IMPL(mb_watch_narrow)
{
    setup();
    member_t m[4];
    const char *names[] = {"n1", "n2", "n3", "n4"};
    for (int i = 0; i < 4; i++)
        start_member(&m[i], names[i], "h", 6, 4);
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 4, "n1 n2 n3 n4 ", 1, 10000);
    int l = leader_index(m, 4);
    ASSERT_GE(l, 0);
    char got[1024], want[1024];
    for (int i = 0; i < 4; i++) {
        const char *me = names[i], *left = names[(i + 3) % 4],
                   *right = names[(i + 1) % 4];
        /* sorted: drain, leader, node records by name, view */
        const char *a = strcmp(left, right) < 0 ? left : right;
        const char *b = strcmp(left, right) < 0 ? right : left;
        const char *n[3] = {a, b, me};
        for (int x = 0; x < 3; x++)
            for (int y = x + 1; y < 3; y++)
                if (strcmp(n[x], n[y]) > 0) {
                    const char *t = n[x];
                    n[x] = n[y];
                    n[y] = t;
                }
        snprintf(want, sizeof(want), "drain/%s leader %snodes/%s nodes/%s "
                 "nodes/%s %sview ", me, i == l ? "nodes/* " : "", n[0],
                 n[1], n[2], i == l ? "reshape/* suspect/* " : "");
        watch_set(m[i].mb, got, sizeof(got));
        ASSERT_STR_EQ(got, want);
    }

    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    events_pred_t ep = {m, {0}};
    ASSERT(fx_run_until_fn(&loop, watches_settled, &ep, 10000));
    for (int i = 0; i < 4; i++)
        ep.want[i] = m[i].mb->events + 1;
    char key[MB_KEY_MAX];
    for (uint32_t r = 0; r < 20; r++) {
        ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_CKPT_PART, NULL,
                         40, r));
        put_wait(e, key, "{\"part\":1}", 0);
    }
    ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_CKPT, NULL, 40, 0));
    put_wait(e, key, "{\"manifest\":1}", 0);
    ASSERT_OK(mb_key(key, sizeof(key), "test", MB_KEY_DRAIN, "n7", 0, 0));
    put_wait(e, key, "x", 0);
    /* The marker: the view as it is, written again (no new generation). */
    mb_kv_t *v = mb__mirror_find(m[0].mb, "/ringd/test/view");
    ASSERT(v != NULL);
    char *val = strdup(v->val);
    put_wait(e, "/ringd/test/view", val, 0);
    free(val);
    ASSERT(fx_run_until_fn(&loop, events_reached, &ep, 10000));
    for (int i = 0; i < 4; i++)
        ASSERT_MSG(m[i].mb->events == ep.want[i],
                   "%s got %llu watch events besides the view's rewrite",
                   names[i],
                   (unsigned long long)(m[i].mb->events - ep.want[i] + 1));
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(m[i].n_views, 1);
    etcd_destroy(e);
    teardown(m, 4);
    return fx_done();
}

/*
 * Seven members, TTL 60 s; three that do not lead crash at once (their
 * leases stay: only the suspicions can remove them) and each is
 * reported by the next live member in ring order, as its ring neighbour
 * would. The leader writes one view for all the suspects it holds: every
 * survivor's next view, or the one after (a report that came while the
 * first view's txn was out), lists exactly the survivors, long before
 * the leases could expire.
 */
TEST_IMPL(mb_multi_kill)
{
    enum { N = 7, DEAD = 3 };
    setup();
    member_t m[N];
    const char *names[N] = {"n1", "n2", "n3", "n4", "n5", "n6", "n7"};
    for (int i = 0; i < N; i++)
        start_member(&m[i], names[i], "h", 60, N);
    member_t *all[N];
    for (int i = 0; i < N; i++)
        all[i] = &m[i];
    wait_view(all, N, "n1 n2 n3 n4 n5 n6 n7 ", 1, 15000);
    int l = leader_index(m, N);
    ASSERT_GE(l, 0);
    int dead[N] = {0}, k = 0;
    for (int i = 0; i < N && k < DEAD; i++)
        if (i != l) {
            dead[i] = 1;
            k++;
        }
    uint64_t g = last_gen(&m[l]);
    member_t *alive[N];
    int n_alive = 0;
    char list[128] = "";
    for (int i = 0; i < N; i++) {
        if (dead[i])
            continue;
        alive[n_alive++] = &m[i];
        strcat(list, names[i]);
        strcat(list, " ");
    }
    for (int i = 0; i < N; i++)
        if (dead[i])
            stop_member(&m[i]);
    for (int i = 0; i < N; i++) {
        if (!dead[i])
            continue;
        int r = (i + 1) % N;
        while (dead[r])
            r = (r + 1) % N;
        ASSERT_OK(mb_suspect(m[r].mb, names[i], "ring endpoint failed"));
    }
    /* Bounded far below the TTL: only the suspicions can do this. */
    wait_view(alive, n_alive, list, g + 1, 10000);
    for (int i = 0; i < n_alive; i++) {
        const member_t *s = alive[i];
        ASSERT_LE(last_gen(s), g + 2);
        ASSERT_LE(s->n_views, 3);
        ASSERT_EQ(s->fenced, 0);
    }
    teardown(m, N);
    return fx_done();
}

typedef struct {
    member_t *m;
    int leader;
} switch_pred_t;

/* Member sp->leader watches the leader's prefixes (synced) and no other
 * member watches any prefix. */
static int watches_follow(void *p)
{
    switch_pred_t *sp = p;
    for (int i = 0; i < 4; i++) {
        char got[1024];
        watch_set(sp->m[i].mb, got, sizeof(got));
        int has = strstr(got, "nodes/* ") != NULL &&
                  strstr(got, "suspect/* ") != NULL &&
                  strstr(got, "reshape/* ") != NULL;
        if (i == sp->leader ? !has || !mb__leader_synced(sp->m[i].mb)
                            : strchr(got, '*') != NULL)
            return 0;
    }
    return 1;
}

/*
 * The leader key moves to another member (put over it, under that
 * member's lease, as a new election would leave it): the old leader
 * stops its leader watches, the new one starts them, and it does the
 * leader's work: a member that leaves is out of the next view.
 */
TEST_IMPL(mb_watch_leader_switch)
{
    setup();
    member_t m[4];
    const char *names[] = {"n1", "n2", "n3", "n4"};
    for (int i = 0; i < 4; i++)
        start_member(&m[i], names[i], "h", 6, 4);
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 4, "n1 n2 n3 n4 ", 1, 10000);
    int l = leader_index(m, 4);
    ASSERT_GE(l, 0);
    switch_pred_t sp = {m, l};
    ASSERT(fx_run_until_fn(&loop, watches_follow, &sp, 10000));
    int nl = (l + 1) % 4, gone = (l + 2) % 4;
    etcd_config_t ecfg = {.endpoints = etcd_.url};
    etcd_t *e;
    ASSERT_OK(etcd_create(&loop, &ecfg, &e));
    put_wait(e, "/ringd/test/leader", names[nl], mb_lease(m[nl].mb));
    sp.leader = nl;
    ASSERT(fx_run_until_fn(&loop, watches_follow, &sp, 10000));
    ASSERT(!mb_is_leader(m[l].mb));
    ASSERT(mb_is_leader(m[nl].mb));
    ASSERT_OK(mb_leave(m[gone].mb));
    char list[64] = "";
    member_t *rest[3];
    int k = 0;
    for (int i = 0; i < 4; i++) {
        if (i == gone)
            continue;
        rest[k++] = &m[i];
        strcat(list, names[i]);
        strcat(list, " ");
    }
    wait_view(rest, 3, list, 2, 10000);
    etcd_destroy(e);
    teardown(m, 4);
    return fx_done();
}


/* One member loses etcd (its relay is cut) while the others write two
 * views; when it is back within its TTL, its resumed watch delivers both
 * writes and it installs the newest, without fencing. View 2 is not
 * installed: it names n4 as a neighbour, whose record is gone (it left),
 * so it cannot be built, and view 3 has replaced it anyway. */
TEST_IMPL(mb_watch_catch_up)
{
    setup();
    int port = th_free_port();
    pid_t relay = fx_proxy_start(&etcd_, port);
    member_t m[4];
    start_member(&m[0], "n1", "h", 6, 3);
    start_member(&m[1], "n2", "h", 6, 3);
    ASSERT(fx_run_until_fn(&loop, n1_or_n2_leads, m, 10000));
    /* n3 reaches etcd through the relay. */
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    start_member_at(&m[2], "n3", "h", 6, 3, url);
    member_t *all[] = {&m[0], &m[1], &m[2], &m[3]};
    wait_view(all, 3, "n1 n2 n3 ", 1, 10000);
    fx_proxy_stop(relay);
    start_member(&m[3], "n4", "h", 6, 1);
    member_t *two[] = {&m[0], &m[1], &m[3]};
    wait_view(two, 3, "n1 n2 n3 n4 ", 2, 5000);
    ASSERT_OK(mb_leave(m[3].mb));
    wait_view(two, 2, "n1 n2 n3 ", 3, 5000);
    ASSERT_EQ(m[2].n_views, 1);
    relay = fx_proxy_start(&etcd_, port);
    wait_view(all, 3, "n1 n2 n3 ", 3, 5000);
    ASSERT_EQ(m[2].n_views, 2);
    ASSERT_EQ(m[2].gens[1], 3);
    ASSERT_STR_EQ(m[2].lists[1], "n1 n2 n3 ");
    ASSERT_EQ(m[2].fenced, 0);
    fx_proxy_stop(relay);
    teardown(m, 4);
    return fx_done();
}
