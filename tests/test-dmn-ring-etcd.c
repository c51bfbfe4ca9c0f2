/*
 * A ring job of real daemons through an outage of its one real etcd:
 * while every member is healthy the job keeps its view and trains on.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"


/* A floor on each step's time: the outage must outlast the lease TTL
 * with 100 steps still to run, and a fast machine ran all 4000 steps of
 * a bare job in under 3 s. */
#define STEP_FLOOR_MS "2"

/* The highest step a hash log holds; -1 when it holds none. */
static int last_logged(const char *path)
{
    static td_hashes_t h;
    td_read_hashes(path, &h);
    for (int s = TD_MAX_STEPS - 1; s >= 0; s--)
        if (h.have[s])
            return s;
    return -1;
}

/*
 * etcd is killed mid-job. Once every daemon's lease deadline has passed
 * with etcd down (the moment each used to fence itself), the job still
 * completes 100 more steps before etcd is started again on its data dir;
 * then every daemon renews its lease. Nobody fenced, the job never left
 * generation 1, every step had all three nodes, and the three replicas
 * end bitwise identical.
 */
TEST_IMPL(dmn_ring_etcd_outage)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    const int steps = 4000;
    rc_step_delay = STEP_FLOOR_MS;
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "4000");
    char h[3][300], want[32];
    for (int i = 0; i < 3; i++)
        snprintf(h[i], sizeof(h[i]), "%s", td_path(&c.d[i], "h0"));
    ASSERT_OK(td_wait_file(h[0], "step 100 ", 60000));

    fx_etcd_kill(&c.etcd);
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(td_wait_file(c.d[i].log, "etcd unreachable past the "
                                "lease deadline", 10000) == 0,
                   "n%d never rode out its lease deadline", i);
    int at = last_logged(h[0]);
    ASSERT_LT(at + 100, steps);
    snprintf(want, sizeof(want), "step %d ", at + 100);
    if (td_wait_file(h[0], want, 30000) != 0) {
        for (int i = 0; i < 3; i++)
            td_dump(c.d[i].log);
        ASSERT_MSG(0, "the job stood still with etcd down (last step %d)",
                   last_logged(h[0]));
    }

    fx_etcd_restart(&c.etcd);
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(td_wait_file(c.d[i].log, "etcd answers again", 15000)
                       == 0, "n%d never renewed its lease", i);
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);

    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(!td_file_has(c.d[i].log, "FENCED"), "n%d fenced", i);
        ASSERT_MSG(!td_file_has(c.d[i].log, "ring backend: view 2"),
                   "n%d left generation 1", i);
    }
    static td_hashes_t hx[3];
    for (int i = 0; i < 3; i++)
        td_read_hashes(h[i], &hx[i]);
    for (int s = 0; s < steps; s++) {
        ASSERT_MSG(hx[0].have[s] && hx[1].have[s] && hx[2].have[s],
                   "step %d not logged by all three", s);
        ASSERT_EQ(hx[0].gen[s], 1);
        ASSERT_EQ(hx[0].world[s], 3);
    }
    ASSERT_EQ(td_same_hashes(&hx[0], &hx[1]), steps);
    ASSERT_EQ(td_same_hashes(&hx[0], &hx[2]), steps);
    char p0[300];
    snprintf(p0, sizeof(p0), "%s", td_path(&c.d[0], "p0"));
    for (int i = 1; i < 3; i++)
        ASSERT_EQ(td_param_diff(td_path(&c.d[i], "p0"), p0), 0);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * etcd hung (SIGSTOP) past every lease TTL: the keepalives time out and
 * the job completes 100 more steps. Resumed, etcd may expire the leases
 * it could not renew meanwhile, and the daemons whose lease is gone fence
 * and register again. Whatever it did, no step is lost or applied
 * differently: every step is logged by someone, replicas that logged the
 * same step logged the same hash, and they end bitwise identical.
 */
TEST_IMPL(dmn_ring_etcd_hang)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    const int steps = 4000;
    rc_step_delay = STEP_FLOOR_MS;
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "4000");
    char h[3][300];
    for (int i = 0; i < 3; i++)
        snprintf(h[i], sizeof(h[i]), "%s", td_path(&c.d[i], "h0"));
    ASSERT_OK(td_wait_file(h[0], "step 100 ", 60000));
    fx_etcd_signal(&c.etcd, SIGSTOP);
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(td_wait_file(c.d[i].log, "etcd unreachable past the "
                                "lease deadline", 10000) == 0,
                   "n%d never rode out its lease deadline", i);
    int at = last_logged(h[0]);
    char want[32];
    snprintf(want, sizeof(want), "step %d ", at + 100);
    ASSERT_MSG(td_wait_file(h[0], want, 30000) == 0,
               "the job stood still with etcd hung (last step %d)",
               last_logged(h[0]));
    fx_etcd_signal(&c.etcd, SIGCONT);
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    int fenced = 0;
    for (int i = 0; i < 3; i++)
        fenced += td_file_has(c.d[i].log, "-> FENCED");
    fprintf(stderr, "%d of 3 daemons fenced after etcd resumed\n", fenced);
    static td_hashes_t hx[3];
    for (int i = 0; i < 3; i++)
        td_read_hashes(h[i], &hx[i]);
    /* A daemon that registered again after the others formed a view
     * joins later and skips the steps between (it gets the job's state). */
    for (int s = 0; s < steps; s++)
        ASSERT_MSG(hx[0].have[s] || hx[1].have[s] || hx[2].have[s],
                   "step %d logged by nobody", s);
    ASSERT_GT(td_same_hashes(&hx[0], &hx[1]), at + 100);
    ASSERT_GT(td_same_hashes(&hx[0], &hx[2]), at + 100);
    ASSERT_GT(td_same_hashes(&hx[1], &hx[2]), at + 100);
    char p0[300];
    snprintf(p0, sizeof(p0), "%s", td_path(&c.d[0], "p0"));
    for (int i = 1; i < 3; i++)
        ASSERT_EQ(td_param_diff(td_path(&c.d[i], "p0"), p0), 0);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* The largest member count of the "mb NODE: view G, N members" lines in
 * text; 0 when there is none. */
static size_t views_max_members(const char *text, const char *node)
{
    char needle[64];
    snprintf(needle, sizeof(needle), "mb %s: view ", node);
    size_t most = 0;
    for (const char *p = strstr(text, needle); p != NULL;
         p = strstr(p + 1, needle)) {
        unsigned long long g;
        size_t n;
        if (sscanf(p + strlen(needle), "%llu, %zu members", &g, &n) == 2 &&
            n > most)
            most = n;
    }
    return most;
}

/* A step of a generation above 1 in the hash log at path. */
static int stepped_after_gen1(void *path)
{
    static td_hashes_t h;
    td_read_hashes(path, &h);
    for (int s = 0; s < TD_MAX_STEPS; s++)
        if (h.have[s] && h.gen[s] > 1)
            return 1;
    return 0;
}

/*
 * A daemon SIGKILLed together with etcd; etcd comes back on its data dir
 * once both survivors fenced (their ring lost the dead node, so no
 * collective completed for a lease TTL). The restarted etcd renews the
 * dead node's lease for a full TTL; the survivors' suspicions of it,
 * made while etcd was down, must still reach etcd, so no view written
 * after etcd's return counts the dead node, and the survivors complete
 * steps in a later generation as a job of two.
 */
TEST_IMPL(dmn_ring_etcd_dead_member)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    char h[2][300];
    for (int i = 0; i < 2; i++)
        snprintf(h[i], sizeof(h[i]), "%s", td_path(&c.d[i], "h0"));
    ASSERT_OK(td_wait_file(h[0], "step 100 ", 60000));

    fx_etcd_kill(&c.etcd);
    th_kill(c.d[2].pid);
    c.d[2].pid = 0;
    th_kill(c.trainer[2][0]);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(td_wait_file(c.d[i].log, "-> FENCED", 15000) == 0,
                   "n%d did not fence with its neighbour and etcd gone", i);
    size_t off[2];
    for (int i = 0; i < 2; i++) {
        free(td_read(c.d[i].log, &off[i]));
    }
    fx_etcd_restart(&c.etcd);
    for (int i = 0; i < 2; i++) {
        int rc = td_poll(stepped_after_gen1, h[i], 30000);
        if (rc != 0)
            td_dump(c.d[i].log);
        ASSERT_MSG(rc == 0, "n%d completed no step in a later view", i);
    }
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *text = td_read(c.d[i].log, &len), node[8];
        ASSERT(text != NULL && len >= off[i]);
        snprintf(node, sizeof(node), "n%d", i);
        size_t most = views_max_members(text + off[i], node);
        if (most != 2)
            td_dump(c.d[i].log);
        ASSERT_MSG(most == 2, "n%d: a view after etcd's return has %zu "
                   "members (the dead n2 counted)", i, most);
        free(text);
    }
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    static td_hashes_t hx;
    td_read_hashes(h[0], &hx);
    for (int s = 0; s < TD_MAX_STEPS; s++)
        if (hx.have[s] && hx.gen[s] > 1)
            ASSERT_EQ(hx.world[s], 2);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}
