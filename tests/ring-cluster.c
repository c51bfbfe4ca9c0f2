/*
 * ring-cluster.c - the ring tests' job of real daemons, trainers and etcd
 * (ring-cluster.h).
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


void cluster_env(void)
{
    /* Ring traffic stays on loopback; a restarted daemon may reuse a
     * port still in TIME_WAIT. */
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
}

const char *rc_ckpt_dir; /* when set, nodes checkpoint there */
const char *rc_deadline; /* when set, --ring-deadline-ms */
const char *rc_crash_at; /* when set, trainers kill themselves there */
const char *rc_stop_after; /* when set, trainers stop themselves */
const char *rc_ckpt_interval = "50";
int rc_ckpt_per_node;    /* ckpt_dir/n<i>: no directory is shared */
const char *rc_ucx_opt;  /* when set, --ucx-opt */
const char *rc_log_level; /* when set, --log-level */
const char *rc_stop_in;  /* when set, trainers stop in that step */
const char *rc_lease_ttl = "2"; /* --lease-ttl */
const char *rc_step_timeout; /* when set, --step-timeout */
const char *rc_grid; /* when set, --ring-grid-min-nodes */
const char *rc_step_delay; /* when set, trainers' --step-delay-ms */
const char *const *rc_flags; /* when set, more daemon flags */

/* Daemon i of the job (not started). */
void node_init(cluster_t *c, int i, const char *trainers,
               const char *min_nodes)
{
    char name[32];
    snprintf(name, sizeof(name), "dmn-ring-n%d", i);
    td_init(&c->d[i], name);
    c->d[i].networked = 1;
    static char ids[MAXN][16];
    snprintf(ids[i], sizeof(ids[i]), "n%d", i);
    const char *flags[] = {"--etcd", c->etcd.url, "--job", "ringtest",
                           "--node-id", ids[i], "--trainers", trainers,
                           "--lease-ttl", rc_lease_ttl, "--min-nodes", min_nodes,
                           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                           NULL, NULL};
    static char dirs[MAXN][512];
    int k = 12;
    if (rc_ckpt_dir != NULL) {
        snprintf(dirs[i], sizeof(dirs[i]), "%s%s%s", rc_ckpt_dir,
                 rc_ckpt_per_node ? "/" : "", rc_ckpt_per_node ? ids[i] : "");
        flags[k++] = "--ckpt-dir";
        flags[k++] = dirs[i];
        flags[k++] = "--ckpt-interval";
        flags[k++] = rc_ckpt_interval;
    }
    if (rc_deadline != NULL) {
        flags[k++] = "--ring-deadline-ms";
        flags[k++] = rc_deadline;
    }
    if (rc_ucx_opt != NULL) {
        flags[k++] = "--ucx-opt";
        flags[k++] = rc_ucx_opt;
    }
    if (rc_log_level != NULL) {
        flags[k++] = "--log-level";
        flags[k++] = rc_log_level;
    }
    if (rc_step_timeout != NULL) {
        flags[k++] = "--step-timeout";
        flags[k++] = rc_step_timeout;
    }
    if (rc_grid != NULL) {
        flags[k++] = "--ring-grid-min-nodes";
        flags[k++] = rc_grid;
    }
    for (int j = 0; rc_flags != NULL && rc_flags[j] != NULL && j < 10; j++)
        flags[k++] = rc_flags[j];
    if (td_start(&c->d[i], flags) != 0)
        TEST_FAIL_("daemon n%d did not start", i);
}

pid_t trainer(cluster_t *c, int i, int k, const char *steps)
{
    char hl[32], sv[32], lg[32];
    snprintf(hl, sizeof(hl), "h%d", k);
    snprintf(sv, sizeof(sv), "p%d", k);
    snprintf(lg, sizeof(lg), "t%d.log", k);
    const char *args[] = {"--steps", steps, "--hash-log",
                          td_path(&c->d[i], hl), "--save",
                          td_path(&c->d[i], sv), "--log-every", "20",
                          rc_crash_at ? "--crash-at-step" : NULL, rc_crash_at,
                          NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    int at = rc_crash_at ? 10 : 8;
    if (rc_stop_after != NULL) {
        args[at++] = "--stop-after-step";
        args[at++] = rc_stop_after;
    }
    if (rc_stop_in != NULL) {
        args[at++] = "--stop-in-step";
        args[at++] = rc_stop_in;
    }
    if (rc_step_delay != NULL) {
        args[at++] = "--step-delay-ms";
        args[at++] = rc_step_delay;
    }
    return td_trainer(&c->d[i], args, td_path(&c->d[i], lg));
}

/* How many times needle occurs in the file at path. */
int td_count(const char *path, const char *needle)
{
    char *s = td_read(path, NULL);
    int n = 0;
    for (char *p = s; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(s);
    return n;
}

void expect_exit0(cluster_t *c, int i, int k, pid_t p)
{
    char lg[32];
    snprintf(lg, sizeof(lg), "t%d.log", k);
    int rc = td_exit_code(p, 180000);
    if (rc != 0) {
        td_dump(td_path(&c->d[i], lg));
        td_dump(c->d[i].log);
    }
    ASSERT_MSG(rc == 0, "trainer %d of n%d exited %d", k, i, rc);
}

/* ---- checkpoint restarts: what the stores and etcd hold ---------------- */

/* Store of node i (per-node directories) or the shared one (i < 0). */
void store_root(char *out, size_t len, const char *dir, int i)
{
    if (i < 0)
        snprintf(out, len, "%s/ringtest", dir);
    else
        snprintf(out, len, "%s/n%d/ringtest", dir, i);
}

/* The newest step below `below` with a MANIFEST.json in any of the n
 * stores (n == 0: the shared one); -1 when none has one. */
int64_t newest_stored(const char *dir, int n, uint64_t below)
{
    int64_t best = -1;
    for (int i = n > 0 ? 0 : -1; i < (n > 0 ? n : 0); i++) {
        char root[600];
        uint64_t *steps = NULL;
        size_t k = 0;
        store_root(root, sizeof(root), dir, i);
        ASSERT_OK(ckpt_store_list(root, &steps, &k));
        for (size_t j = 0; j < k; j++)
            if (steps[j] < below && (int64_t)steps[j] > best)
                best = (int64_t)steps[j];
        free(steps);
    }
    return best;
}

/* The newest manifest key ckpt/<S> in etcd; -1 when there is none. */
int64_t newest_in_etcd(cluster_t *c, const char *out)
{
    char *const argv[] = {"/usr/bin/etcdctl", "--endpoints", c->etcd.url,
                          "get", "--prefix", "--keys-only",
                          "/ringd/ringtest/ckpt/", NULL};
    int st = -1;
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *s = td_read(out, NULL);
    ASSERT(s != NULL);
    int64_t best = -1;
    const char *pre = "/ringd/ringtest/ckpt/";
    for (char *l = strtok(s, "\n"); l != NULL; l = strtok(NULL, "\n")) {
        unsigned long long step;
        if (strncmp(l, pre, strlen(pre)) == 0 &&
            sscanf(l + strlen(pre), "%llu", &step) == 1 &&
            (int64_t)step > best)
            best = (int64_t)step;
    }
    free(s);
    return best;
}

/* The step number right after the first `needle` in the file; -1 if the
 * file has no such line. */
int64_t logged_step(const char *path, const char *needle)
{
    char *s = td_read(path, NULL);
    char *at = s != NULL ? strstr(s, needle) : NULL;
    unsigned long long step;
    int64_t r = at != NULL && sscanf(at + strlen(needle), "%llu", &step) == 1
                    ? (int64_t)step : -1;
    free(s);
    return r;
}

/* The first step a hash log holds. */
int first_step(const td_hashes_t *h)
{
    for (int s = 0; s < TD_MAX_STEPS; s++)
        if (h->have[s])
            return s;
    return -1;
}

/* Two complete checkpoints logged by the nodes of c (so one is a delta;
 * a busy machine may skip some steps' checkpoints under back pressure). */
int two_ckpts_complete(void *arg)
{
    cluster_t *c = arg;
    int found = 0;
    for (int i = 0; i < c->n; i++)
        found += td_count(c->d[i].log, "complete (every shard has 2");
    return found >= 2;
}

/* SIGKILL every daemon and trainer of c at once, then reap them: killing
 * and reaping one node at a time let the last one, alone in a new view,
 * take a 1-shard checkpoint before its turn came. */
void kill_job(cluster_t *c)
{
    for (int i = 0; i < c->n; i++) {
        kill(c->trainer[i][0], SIGKILL);
        kill(c->d[i].pid, SIGKILL);
    }
    for (int i = 0; i < c->n; i++) {
        th_kill(c->trainer[i][0]);
        th_kill(c->d[i].pid);
    }
}

/* Every daemon of c logged a view with all c->n members. */
int all_in_view(void *arg)
{
    cluster_t *c = arg;
    char want[32];
    snprintf(want, sizeof(want), ": %d members, me #", c->n);
    for (int i = 0; i < c->n; i++)
        if (!td_file_has(c->d[i].log, want))
            return 0;
    return 1;
}

/* Start c's daemons again (fresh directories, same node ids, the same
 * checkpoint stores) and their trainers once every daemon is in one view:
 * a restore needs every member's store. */
void restart_job(cluster_t *c, const char *min_nodes,
                 const char *steps)
{
    for (int i = 0; i < c->n; i++)
        node_init(c, i, "1", min_nodes);
    ASSERT_MSG(td_poll(all_in_view, c, 30000) == 0,
               "the restarted daemons never shared a view");
    for (int i = 0; i < c->n; i++)
        c->trainer[i][0] = trainer(c, i, 0, steps);
    for (int i = 0; i < c->n; i++)
        expect_exit0(c, i, 0, c->trainer[i][0]);
}

/* The restarted job replayed the first run: it began at `step` and every
 * step both runs logged has the same hash. */
void expect_replay(const char *before_log, const char *after_log,
                   int64_t step)
{
    static td_hashes_t before, after;
    td_read_hashes(before_log, &before);
    td_read_hashes(after_log, &after);
    ASSERT_EQ(first_step(&after), step);
    ASSERT_MSG(before.have[step], "the first run never logged step %d",
               (int)step);
    ASSERT_GT(td_same_hashes(&before, &after), 0);
}
