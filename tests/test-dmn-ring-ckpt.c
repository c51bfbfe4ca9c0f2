/*
 * Checkpoints through a ring job of real daemons: a whole job killed and
 * restarted resumes from its newest complete checkpoint (shared or
 * per-node directories, a lost primary repaired from its replica, an
 * older checkpoint when a shard has no copy), and the manifest in etcd.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"


/*
 * A 2-node job checkpointing into a shared directory is killed whole after
 * two checkpoints, and the primary shard of member 1 of the newest one is
 * deleted. Started again, both nodes restore alone from the shared
 * directory: the newest complete step (the one etcd or the store names
 * last, never an older one), that shard from its replica; the restarted
 * job replays the steps after it with the first run's hashes, and the
 * nodes end identical.
 */
TEST_IMPL(dmn_ring_ckpt_restart)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    char *dir = th_mkdtemp("dmn-ring-ck");
    ASSERT(dir != NULL);
    rc_ckpt_dir = dir;
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    ASSERT_MSG(td_poll(two_ckpts_complete, &c, 60000) == 0,
               "no two checkpoints completed");
    kill_job(&c);
    char before[600], root[600], path[700];
    snprintf(before, sizeof(before), "%s", td_path(&c.d[0], "h0"));
    int64_t want = newest_stored(dir, 0, UINT64_MAX);
    int64_t in_etcd = newest_in_etcd(&c, td_path(&c.d[0], "etcd.out"));
    ASSERT_GE(in_etcd, 100);
    ASSERT_GE(want, in_etcd); /* the store never lags etcd */
    store_root(root, sizeof(root), dir, -1);
    ckpt_manifest_t *m = NULL;
    ASSERT_OK(ckpt_store_load_manifest(root, (uint64_t)want, &m));
    ASSERT_MSG(m->nshards == 2, "checkpoint %lld has %u shards",
               (long long)want, m->nshards);
    ckpt_manifest_free(m);
    ASSERT_OK(ckpt_store_step_dir(root, (uint64_t)want, path,
                                  sizeof(path) - 20));
    strcat(path, "/shard-00001.rckp");
    ASSERT_OK(unlink(path));

    restart_job(&c, "2", "3000");
    char line[96];
    snprintf(line, sizeof(line), "restored from the checkpoint of step %"
             PRId64 " (1 shard from replicas)", want);
    for (int i = 0; i < 2; i++) {
        int64_t got = logged_step(c.d[i].log, "restored from the "
                                              "checkpoint of step ");
        if (got != want)
            td_dump(c.d[i].log);
        ASSERT_EQ(got, want);
        ASSERT(td_file_has(c.d[i].log, line));
        ASSERT(td_file_has(td_path(&c.d[i], "t0.log"),
                           "parameters restored"));
    }
    expect_replay(before, td_path(&c.d[0], "h0"), want);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p0")),
              0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    th_rmtree(dir);
    free(dir);
    rc_ckpt_dir = NULL;
    return fx_done();
}

/*
 * Every node has its own checkpoint directory, so no node ever sees the
 * whole set of files: the manifest can only come from etcd. One trainer
 * asks for a checkpoint after step 7 (ringd_checkpoint); the request
 * rides as a flag on the messages of step 8's collectives, the step-9
 * start agrees it on both nodes, so both write step 10 (the checkpoint
 * after step 9), and the manifest key appears once both shards have
 * their two copies; the directories hold no MANIFEST.json.
 */
TEST_IMPL(dmn_ring_ckpt_etcd_manifest)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    char *dir = th_mkdtemp("dmn-ring-ckm");
    ASSERT(dir != NULL);
    rc_ckpt_dir = dir;
    rc_ckpt_interval = "100000";
    rc_ckpt_per_node = 1;
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    char hl[600], sv[600], lg[600];
    snprintf(hl, sizeof(hl), "%s", td_path(&c.d[0], "h0"));
    snprintf(sv, sizeof(sv), "%s", td_path(&c.d[0], "p0"));
    snprintf(lg, sizeof(lg), "%s", td_path(&c.d[0], "t0.log"));
    /* The same collectives as trainer() (--log-every 20), plus the
     * request. */
    const char *args[] = {"--steps", "30", "--hash-log", hl, "--save", sv,
                          "--log-every", "20", "--ckpt-at", "7", NULL};
    c.trainer[0][0] = td_trainer(&c.d[0], args, lg);
    c.trainer[1][0] = trainer(&c, 1, 0, "30");
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    ASSERT(td_file_has(lg, "checkpoint requested after step 7: success"));
    int done = td_wait_file(c.d[0].log, "checkpoint of step 10 complete",
                            10000) == 0 ||
               td_wait_file(c.d[1].log, "checkpoint of step 10 complete",
                            1000) == 0;
    if (!done) {
        td_dump(c.d[0].log);
        td_dump(c.d[1].log);
    }
    ASSERT(done);
    /* Exactly one checkpoint: the interval never came. */
    for (int i = 0; i < 2; i++)
        ASSERT(!td_file_has(c.d[i].log, "checkpoint of step 9 ") &&
               !td_file_has(c.d[i].log, "checkpoint of step 11 "));
    /* A node's MANIFEST.json, if there yet, is a copy of etcd's (node
     * ids), never one built from its own files (it has 2 of 4). */
    for (int i = 0; i < 2; i++) {
        char m[700];
        snprintf(m, sizeof(m), "%s/n%d/ringtest/step-%020d/MANIFEST.json",
                 dir, i, 10);
        ASSERT(!td_file_has(m, "member0"));
    }
    char out[600];
    snprintf(out, sizeof(out), "%s", td_path(&c.d[0], "ctl.out"));
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    char *const argv[] = {path, "--etcd", c.etcd.url, "--job", "ringtest",
                          "--json", "checkpoints", NULL};
    int st = -1;
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    if (!td_file_has(out, "{\"step\":10,") ||
        td_file_has(out, "ckpt-parts"))
        td_dump(out);
    ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT(td_file_has(out, "{\"step\":10,"));
    ASSERT(!td_file_has(out, "\"step\":9,") &&
           !td_file_has(out, "\"step\":11"));
    ASSERT(td_file_has(out, "\"member\":\"n0\""));
    ASSERT(td_file_has(out, "\"member\":\"n1\""));
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    th_rmtree(dir);
    free(dir);
    rc_ckpt_dir = NULL;
    rc_ckpt_per_node = 0;
    rc_ckpt_interval = "50";
    return fx_done();
}

/* Delete one copy (primary: shard-<k>, else replica-<k>) of shard k of
 * `step` from node i's store. */
static void delete_copy(const char *dir, int i, uint64_t step, uint32_t k,
                        int replica)
{
    char root[600], path[800];
    store_root(root, sizeof(root), dir, i);
    ASSERT_OK(ckpt_store_step_dir(root, step, path, 700));
    snprintf(path + strlen(path), 100, "/%s-%05u.rckp",
             replica ? "replica" : "shard", k);
    ASSERT_MSG(unlink(path) == 0, "cannot delete %s", path);
}

/* The manifest of `step` from the first of n stores that has it. */
static ckpt_manifest_t *stored_manifest(const char *dir, int n,
                                        uint64_t step)
{
    for (int i = 0; i < n; i++) {
        char root[600];
        ckpt_manifest_t *m = NULL;
        store_root(root, sizeof(root), dir, i);
        if (ckpt_store_load_manifest(root, step, &m) == 0)
            return m;
    }
    TEST_FAIL_("no store has the manifest of step %llu",
               (unsigned long long)step);
}

/* The index of node id `node` among m's members. */
static uint32_t member_index(const ckpt_manifest_t *m, const char *node)
{
    for (uint32_t i = 0; i < m->nshards; i++)
        if (strcmp(m->members[i], node) == 0)
            return i;
    TEST_FAIL_("%s is no member of checkpoint %llu", node,
               (unsigned long long)m->step);
}

/*
 * A 3-node job with one checkpoint directory per node runs until two
 * checkpoints completed and is SIGKILLed whole. No node can restore alone
 * (it holds 2 of the 3 shards' files), so the restarted nodes restore
 * together through the ring. `lose_both` 0: n1's primary copy of its own
 * shard of the newest checkpoint is deleted, so that shard must come from
 * its replica on the next node, and the job resumes at the newest step;
 * 1: that shard's replica goes too, no member holds it, and the job falls
 * back to the checkpoint before. Either way the restarted job replays the
 * first run's steps bit for bit and the nodes end identical.
 */
static int per_node_restart(int lose_both)
{
    cluster_env();
    cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    char *dir = th_mkdtemp("dmn-ring-ckp");
    ASSERT(dir != NULL);
    rc_ckpt_dir = dir;
    rc_ckpt_per_node = 1;
    for (int i = 0; i < 3; i++)
        node_init(&c, i, "1", "3");
    for (int i = 0; i < 3; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "3000");
    ASSERT_MSG(td_poll(two_ckpts_complete, &c, 60000) == 0,
               "no two checkpoints completed");
    kill_job(&c);
    char before[600];
    snprintf(before, sizeof(before), "%s", td_path(&c.d[0], "h0"));
    int64_t newest = newest_stored(dir, 3, UINT64_MAX);
    int64_t in_etcd = newest_in_etcd(&c, td_path(&c.d[0], "etcd.out"));
    ASSERT_GE(in_etcd, 100);
    ASSERT_GE(newest, in_etcd); /* the stores never lag etcd */
    int64_t want = newest;
    if (lose_both) {
        want = newest_stored(dir, 3, (uint64_t)newest);
        ASSERT_GE(want, 50);
    }
    ckpt_manifest_t *m = stored_manifest(dir, 3, (uint64_t)newest);
    ASSERT_MSG(m->nshards == 3, "checkpoint %lld has %u shards",
               (long long)newest, m->nshards);
    uint32_t k = member_index(m, "n1");
    ASSERT_EQ(m->shards[k].owner, k);
    uint32_t rep = m->shards[k].replica;
    int rep_node = m->members[rep][1] - '0';
    ASSERT_NE(rep_node, 1);
    delete_copy(dir, 1, (uint64_t)newest, k, 0);
    if (lose_both)
        delete_copy(dir, rep_node, (uint64_t)newest, k, 1);
    ckpt_manifest_free(m);

    restart_job(&c, "3", "3000");
    char line[128];
    for (int i = 0; i < 3; i++) {
        int64_t got = logged_step(c.d[i].log, "restore: the state of step ");
        if (got != want)
            td_dump(c.d[i].log);
        ASSERT_EQ(got, want);
        ASSERT(td_file_has(td_path(&c.d[i], "t0.log"),
                           "parameters restored"));
        /* Its primary copy was deleted: only the replica may serve. */
        snprintf(line, sizeof(line), "restore: shard %u of step %" PRId64
                 " sent from this node's primary", k, newest);
        ASSERT(!td_file_has(c.d[i].log, line));
        snprintf(line, sizeof(line), "restore: step %" PRId64 " has 1 of "
                 "3 shards on no member", newest);
        ASSERT_EQ(td_file_has(c.d[i].log, line), lose_both);
    }
    if (!lose_both) {
        snprintf(line, sizeof(line), "restore: shard %u of step %" PRId64
                 " sent from this node's replica copy", k, want);
        ASSERT(td_file_has(c.d[rep_node].log, line));
    }
    expect_replay(before, td_path(&c.d[0], "h0"), want);
    static td_hashes_t after, other;
    td_read_hashes(td_path(&c.d[0], "h0"), &after);
    for (int i = 1; i < 3; i++) {
        td_read_hashes(td_path(&c.d[i], "h0"), &other);
        ASSERT_GT(td_same_hashes(&after, &other), 0);
        ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"),
                                td_path(&c.d[i], "p0")), 0);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    th_rmtree(dir);
    free(dir);
    rc_ckpt_dir = NULL;
    rc_ckpt_per_node = 0;
    return fx_done(); /* while c, which the fixture points to, lives */
}

TEST_IMPL(dmn_ring_ckpt_per_node_restart)
{
    return per_node_restart(0);
}

TEST_IMPL(dmn_ring_ckpt_per_node_fallback)
{
    return per_node_restart(1);
}
