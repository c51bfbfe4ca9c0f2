/*
 * User-style PyTorch scripts (tests/py/user_cnn.py, tests/py/user_lm.py)
 * run as a user runs them: under ringrun --nproc 2 on ring daemons (etcd,
 * real UCX over loopback), through the three events a job meets:
 *
 *   1. a trainer replacement: node b's trainer 1 is SIGKILLed, ringrun
 *      starts a new one, which joins the node's other trainer at a step
 *      boundary with the job's state ("restored");
 *   2. a join: node c (a daemon and its ringrun) starts mid-job and its
 *      trainers get the state;
 *   3. a kill: node c is SIGKILLed whole (daemon, ringrun, trainers), and
 *      the job goes on at world 4 in a later generation.
 *
 * Then the job stops 20 steps on (at step 100 at the earliest). Asserted: the four survivors' state
 * digests (parameters, buffers, optimizer state) bitwise equal and their
 * learning rates equal; every step from 0 logged with one global batch
 * and one learning rate, every completed epoch saw each sample exactly
 * once (user_job.check, over every log, the killed trainers' included);
 * the final loss within a stated tolerance of one process on the same
 * global batches (dropout's draws differ). The global batch is 60, which
 * every world the job passes through (3 to 6) divides.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/py-util.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

#define PY "/usr/bin/python3"

typedef struct {
    td_daemon_t d[3];
    fx_etcd_t etcd;
    char script[600];
    char dir[3][300];  /* each node's trainer logs */
    char out[3][300];  /* each node's ringrun output */
    char stop[300];
    pid_t rr[3];
} un_job_t;

/* The text after `key` on the last line of path holding it, or "". */
static void last_field(const char *path, const char *key, char *out,
                       size_t len)
{
    out[0] = '\0';
    char *s = td_read(path, NULL);
    char *hit = NULL;
    for (char *p = s; p != NULL && (p = strstr(p, key)) != NULL; p++)
        hit = p;
    if (hit != NULL) {
        hit += strlen(key);
        size_t n = strcspn(hit, " \n");
        snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), hit);
    }
    free(s);
}

static const char *tlog(const un_job_t *j, int node, int rank)
{
    static char p[4][400];
    static int slot;
    char *out = p[slot++ % 4];
    snprintf(out, 400, "%s/t%d.log", j->dir[node], rank);
    return out;
}

/* The generation and world of the last step line of path (0 when none). */
static void last_step(const char *path, long *gen, long *world)
{
    char g[32], w[32];
    last_field(path, " gen ", g, sizeof(g));
    last_field(path, " world ", w, sizeof(w));
    *gen = atol(g);
    *world = atol(w);
}

typedef struct {
    const char *path;
    long after_gen, world;
} un_wait_t;

/* For td_poll: the last step of path ran in a generation after
 * after_gen on a world of `world`. */
static int stepped_in(void *arg)
{
    un_wait_t *w = arg;
    long gen, world;
    last_step(w->path, &gen, &world);
    return gen > w->after_gen && world == w->world;
}

static void wait_world(const char *path, long after_gen, long world)
{
    un_wait_t w = {path, after_gen, world};
    int rc = td_poll(stepped_in, &w, 120000);
    if (rc != 0)
        td_dump(path);
    ASSERT_MSG(rc == 0, "%s: no step in a generation after %ld on world "
               "%ld", path, after_gen, world);
}

/* Daemon i (node a, b, c) on the shared etcd, and ringrun --nproc 2 on
 * it running the script. */
static void start_node(un_job_t *j, int i)
{
    const char *id = (const char *[]){"a", "b", "c"}[i];
    j->d[i].networked = 1;
    const char *flags[] = {"--etcd", j->etcd.url, "--job", "userjob",
                           "--node-id", id, "--min-nodes", "2",
                           "--trainers", "2", NULL};
    ASSERT_OK(td_start(&j->d[i], flags));
    snprintf(j->dir[i], sizeof(j->dir[i]), "%s", td_path(&j->d[i], "logs"));
    ASSERT(mkdir(j->dir[i], 0755) == 0);
    snprintf(j->out[i], sizeof(j->out[i]), "%s", td_path(&j->d[i], "rr"));
    static char exe[600];
    th_src_path(exe, sizeof(exe), "client/python/ringrun");
    const char *argv[] = {PY, exe, "--nproc", "2", "--backoff", "0.05",
                          "--socket", j->d[i].sock, "--", PY, j->script,
                          "--log-dir", j->dir[i], "--stop-file", j->stop,
                          "--pace-ms", "10", "--global", "60", NULL};
    j->rr[i] = th_spawn((char *const *)argv, j->out[i]);
    td_track(j->rr[i]);
}

/* The pid the trainer logged last ("start pid=P"). */
static pid_t trainer_pid(const char *path)
{
    char p[32];
    last_field(path, "start pid=", p, sizeof(p));
    ASSERT_MSG(p[0] != '\0', "%s: no start line", path);
    return (pid_t)atol(p);
}

static int run_tool(const char *const *argv, const char *out)
{
    pid_t p = th_spawn((char *const *)argv, out);
    td_track(p);
    int rc = td_exit_code(p, 180000);
    td_dump(out);
    return rc;
}

/* Every log of the job, the killed trainers' included (NULL-ended). */
static void all_logs(const un_job_t *j, const char **v)
{
    static char p[6][400];
    int n = 0;
    for (int i = 0; i < 3; i++)
        for (int r = 0; r < 2; r++) {
            snprintf(p[n], sizeof(p[n]), "%s", tlog(j, i, r));
            v[n] = p[n];
            n++;
        }
    v[n] = NULL;
}

/* 1. node b's trainer 1 killed; its replacement gets the state. */
static void replace_trainer(un_job_t *j)
{
    const char *t = tlog(j, 1, 1);
    ASSERT_OK(td_wait_file(t, "world 4 ", 180000));
    long gen, world;
    last_step(tlog(j, 0, 0), &gen, &world);
    pid_t victim = trainer_pid(t);
    ASSERT_OK(kill(victim, SIGKILL));
    ASSERT_OK(td_wait_file(t, "restored ", 120000));
    ASSERT_EQ(td_count(t, "start pid="), 2);
    wait_world(tlog(j, 0, 0), gen, 4);
    ASSERT_OK(td_wait_file(j->out[1], "trainer 1 ", 10000));
    ASSERT(td_file_has(j->out[1], "; restart 1 of "));
}

/* 2. node c joins; its trainers get the state. */
static void join_node(un_job_t *j)
{
    long gen, world;
    last_step(tlog(j, 0, 0), &gen, &world);
    start_node(j, 2);
    for (int r = 0; r < 2; r++)
        ASSERT_OK(td_wait_file(tlog(j, 2, r), "restored ", 120000));
    wait_world(tlog(j, 0, 0), gen, 6);
}

/* 3. node c killed whole; the job goes on at world 4. */
static void kill_node(un_job_t *j)
{
    long gen, world;
    last_step(tlog(j, 0, 0), &gen, &world);
    pid_t t[2] = {trainer_pid(tlog(j, 2, 0)), trainer_pid(tlog(j, 2, 1))};
    kill(j->d[2].pid, SIGKILL);
    kill(j->rr[2], SIGKILL);
    for (int r = 0; r < 2; r++)
        kill(t[r], SIGKILL);
    ASSERT_EQ(td_exit_code(j->d[2].pid, 10000), 128 + SIGKILL);
    j->d[2].pid = 0;
    ASSERT_EQ(td_exit_code(j->rr[2], 10000), 128 + SIGKILL);
    wait_world(tlog(j, 0, 0), gen, 4);
}

/* Stop 20 steps after the newest, or at step 100 (a loss that has
 * moved well off its start), and every survivor ends with 0. */
static int stop_job(un_job_t *j)
{
    char now[32], tmp[320];
    last_field(tlog(j, 0, 0), "\nstep ", now, sizeof(now));
    int last = atoi(now) + 20 < 100 ? 100 : atoi(now) + 20;
    snprintf(tmp, sizeof(tmp), "%s.tmp", j->stop);
    FILE *f = fopen(tmp, "w");
    ASSERT(f != NULL);
    fprintf(f, "%d\n", last);
    fclose(f);
    ASSERT_OK(rename(tmp, j->stop));
    for (int i = 0; i < 2; i++) {
        int rc = td_exit_code(j->rr[i], 180000);
        if (rc != 0)
            td_dump(j->out[i]);
        ASSERT_MSG(rc == 0, "ringrun on node %d exited %d", i, rc);
    }
    return last;
}

static int user_nodes(const char *script, const char *need,
                      const char *tol)
{
    static un_job_t j;
    memset(&j, 0, sizeof(j));
    if (python_unavailable(PY) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(PY));
    td_init(&j.d[0], "torch-nodes-a");
    if (!have_numpy(PY, td_path(&j.d[0], "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by " PY);
    if (!py_imports(PY, need, td_path(&j.d[0], "imports.log")))
        TEST_SKIP_WHY("'%s' fails in " PY, need);
    td_init(&j.d[1], "torch-nodes-b");
    td_init(&j.d[2], "torch-nodes-c");
    char lib[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(pypath, sizeof(pypath), "client/python");
    th_src_path(j.script, sizeof(j.script), script);
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    /* Six trainers and their loaders' workers share 2 cores here. */
    setenv("OMP_NUM_THREADS", "1", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("RINGD_SOCKET");
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    snprintf(j.stop, sizeof(j.stop), "%s", td_path(&j.d[0], "stop"));
    fx_etcd_start(&j.etcd, 0);
    for (int i = 0; i < 2; i++)
        start_node(&j, i);

    replace_trainer(&j);
    join_node(&j);
    kill_node(&j);
    int last = stop_job(&j);

    char d0[64], d[64], lr0[64], lr[64];
    last_field(tlog(&j, 0, 0), "final digest ", d0, sizeof(d0));
    last_field(tlog(&j, 0, 0), " lr ", lr0, sizeof(lr0));
    ASSERT_MSG(d0[0] != '\0', "no final digest from node a's trainer 0");
    for (int i = 0; i < 4; i++) {
        const char *t = tlog(&j, i / 2, i % 2);
        last_field(t, "final digest ", d, sizeof(d));
        last_field(t, " lr ", lr, sizeof(lr));
        ASSERT_MSG(strcmp(d, d0) == 0, "%s: digest %s, node a's %s", t, d,
                   d0);
        ASSERT_MSG(strcmp(lr, lr0) == 0, "%s: lr %s, node a's %s", t, lr,
                   lr0);
    }
    const char *chk[8] = {PY, j.script, "--check"};
    all_logs(&j, chk + 3);
    ASSERT_EQ(run_tool(chk, td_path(&j.d[0], "check.out")), 0);
    char ref[300], nsteps[16];
    snprintf(ref, sizeof(ref), "%s", td_path(&j.d[0], "ref"));
    snprintf(nsteps, sizeof(nsteps), "%d", last);
    const char *rargv[] = {PY, j.script, "--mode", "ref", "--global", "60",
                           "--steps", nsteps, "--log", ref, NULL};
    ASSERT_EQ(run_tool(rargv, td_path(&j.d[0], "ref.out")), 0);
    const char *cmp[] = {PY, j.script, "--loss", tlog(&j, 0, 0), ref, tol,
                         NULL};
    ASSERT_EQ(run_tool(cmp, td_path(&j.d[0], "loss.out")), 0);
    printf("# %s: 4 survivors, digest %s, lr %s after %d steps\n", script,
           d0, lr0, last);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&j.d[i], 30000), 0);
    return fx_done();
}

/* The residual BatchNorm CNN (AdamW, two groups, LambdaLR, clipping, bf16
 * autocast, DataLoader with 2 workers). Tolerance 0.1: dropout and the
 * BatchNorm statistics of rank 0's share differ from one process's. */
TEST_IMPL(client_python_torch_user_cnn_nodes)
{
    return user_nodes("tests/py/user_cnn.py", "import torch, sklearn",
                      "0.1");
}

/* The small transformer LM (tied head, causal mask, two AdamW groups,
 * warm-up + cosine, clipping, bf16 autocast, 2 loader workers).
 * Tolerance 0.15 nats: dropout's draws differ from one process's. */
TEST_IMPL(client_python_torch_user_lm_nodes)
{
    return user_nodes("tests/py/user_lm.py", "import torch", "0.15");
}

/* The BatchNorm CNN in DistributedDataParallel on the ringd backend
 * (rdist.run re-makes DDP after each view change). */
TEST_IMPL(client_python_torch_user_ddp_nodes)
{
    return user_nodes("tests/py/user_ddp.py", "import torch, sklearn",
                      "0.1");
}
