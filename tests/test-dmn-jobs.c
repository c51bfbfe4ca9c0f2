/*
 * Jobs named by their users: a ringd with --etcd and no --job serves the
 * job its first trainer names (RINGD_JOB, opts.job), leaves it when the
 * last trainer is gone and then serves another, without a config edit or
 * a restart; one job at a time; a pinned config keeps today's behaviour;
 * job names are bounded and checked by the client and the daemon.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "proto/proto.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/py-util.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

/* Node i of c, with no --job: it serves the job its trainers name. extra:
 * more flags (NULL-ended, at most 6). */
static void node_unpinned(cluster_t *c, int i, const char *min_nodes,
                          const char *const *extra)
{
    char name[32];
    snprintf(name, sizeof(name), "dmn-jobs-n%d", i);
    td_init(&c->d[i], name);
    c->d[i].networked = 1;
    static char ids[MAXN][16];
    snprintf(ids[i], sizeof(ids[i]), "n%d", i);
    const char *flags[24] = {"--etcd", c->etcd.url, "--node-id", ids[i],
                             "--trainers", "1", "--lease-ttl", rc_lease_ttl,
                             "--min-nodes", min_nodes};
    int k = 10;
    for (int j = 0; extra != NULL && extra[j] != NULL && j < 6; j++)
        flags[k++] = extra[j];
    if (td_start(&c->d[i], flags) != 0)
        TEST_FAIL_("daemon n%d did not start", i);
}

/* etcd's keys under prefix, one a line, into out; how many. */
static int etcd_keys(cluster_t *c, const char *prefix, const char *out)
{
    char *const argv[] = {"/usr/bin/etcdctl", "--endpoints", c->etcd.url,
                          "get", "--prefix", "--keys-only", (char *)prefix,
                          NULL};
    int st = -1;
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return td_count(out, prefix);
}

/* Trainer k on both nodes of job `job` for `steps` steps; both exit 0 and
 * their replicas are identical at every step. */
static void run_job(cluster_t *c, const char *job, int k, const char *steps)
{
    setenv("RINGD_JOB", job, 1);
    for (int i = 0; i < 2; i++)
        c->trainer[i][k] = trainer(c, i, k, steps);
    unsetenv("RINGD_JOB");
    for (int i = 0; i < 2; i++)
        expect_exit0(c, i, k, c->trainer[i][k]);
    char h[2][300], p[2][300], hn[8], pn[8];
    snprintf(hn, sizeof(hn), "h%d", k);
    snprintf(pn, sizeof(pn), "p%d", k);
    for (int i = 0; i < 2; i++) {
        snprintf(h[i], sizeof(h[i]), "%s", td_path(&c->d[i], hn));
        snprintf(p[i], sizeof(p[i]), "%s", td_path(&c->d[i], pn));
    }
    static td_hashes_t hx[2];
    for (int i = 0; i < 2; i++)
        td_read_hashes(h[i], &hx[i]);
    ASSERT_EQ(td_same_hashes(&hx[0], &hx[1]), atoi(steps));
    ASSERT_EQ(td_param_diff(p[0], p[1]), 0);
}

/*
 * Two jobs, one after the other, on the same two daemons: "alpha", then
 * "beta". Each ends with identical replicas; between them both daemons
 * leave alpha (its node keys are gone from etcd) and stay up (same pid).
 */
TEST_IMPL(dmn_jobs_two_in_turn)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 2; i++)
        node_unpinned(&c, i, "2", NULL);
    pid_t pids[2] = {c.d[0].pid, c.d[1].pid};
    run_job(&c, "alpha", 0, "200");
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(td_wait_file(c.d[i].log, "ready for the next one", 30000)
                       == 0, "n%d never left job alpha", i);
    char out[300];
    snprintf(out, sizeof(out), "%s", td_path(&c.d[0], "keys"));
    ASSERT_EQ(etcd_keys(&c, "/ringd/alpha/nodes/", out), 0);
    run_job(&c, "beta", 1, "200");
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(c.d[i].pid, pids[i]);
        ASSERT_EQ(kill(c.d[i].pid, 0), 0);
        ASSERT(td_file_has(c.d[i].log, "joined job 'alpha'"));
        ASSERT(td_file_has(c.d[i].log, "joined job 'beta'"));
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/* ringd_connect() naming job (NULL: none) on t's socket: its status, and
 * the message into why. */
static int connect_job(td_daemon_t *t, const char *job, char *why, size_t n,
                       ringd_client_t **c_p)
{
    ringd_opts_t o;
    ringd_opts_init(&o);
    o.job = job;
    o.reconnect_s = 0;
    ringd_client_t *c = NULL;
    int rc = ringd_connect(&c, t->sock, &o);
    snprintf(why, n, "%s", ringd_last_error(NULL));
    if (c_p != NULL)
        *c_p = c;
    else
        ringd_close(c);
    return rc;
}

/* Python's Client(job=...) on t's socket: the exception's text in out. */
static int py_connect(td_daemon_t *t, const char *job, const char *out)
{
    char code[512];
    snprintf(code, sizeof(code),
             "import ringd\n"
             "try:\n"
             "    ringd.Client('%s', job='%s', reconnect_s=0)\n"
             "    print('connected')\n"
             "except ringd.Error as e:\n"
             "    print('Error', e.code, e)\n", t->sock, job);
    char pp[600], lib[600];
    th_src_path(pp, sizeof(pp), "client/python");
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    setenv("PYTHONPATH", pp, 1);
    setenv("RINGD_LIB", lib, 1);
    char *const argv[] = {"/usr/bin/python3", "-c", code, NULL};
    int st = -1;
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 60000, &st));
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * While job alpha runs on an unpinned daemon, a trainer naming beta is
 * refused with RINGD_ESTATE and a message naming both, in C and in
 * Python; one naming no job may not step; --jobs refuses a name outside
 * it; naming alpha again is served.
 */
TEST_IMPL(dmn_jobs_other_refused)
{
    cluster_env();
    cluster_t c = {.n = 1};
    fx_etcd_start(&c.etcd, 0);
    const char *extra[] = {"--jobs", "alpha, beta, te*", NULL};
    node_unpinned(&c, 0, "1", extra);
    char why[256];
    ASSERT_EQ(connect_job(&c.d[0], "gamma", why, sizeof(why), NULL),
              RINGD_EINVAL);
    ASSERT_MSG(strstr(why, "gamma") && strstr(why, "--jobs"), "%s", why);

    rc_step_delay = "5";
    setenv("RINGD_JOB", "alpha", 1);
    c.trainer[0][0] = trainer(&c, 0, 0, "2000");
    unsetenv("RINGD_JOB");
    rc_step_delay = NULL;
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 20 ", 60000));

    ASSERT_EQ(connect_job(&c.d[0], "beta", why, sizeof(why), NULL),
              RINGD_ESTATE);
    ASSERT_MSG(strstr(why, "'alpha'") && strstr(why, "'beta'"), "%s", why);
    char out[300];
    snprintf(out, sizeof(out), "%s", td_path(&c.d[0], "py.out"));
    if (python_unavailable("/usr/bin/python3") == NULL) {
        ASSERT_EQ(py_connect(&c.d[0], "beta", out), 0);
        ASSERT_MSG(td_file_has(out, "Error -14 ") &&
                   td_file_has(out, "'alpha'") && td_file_has(out, "'beta'"),
                   "python said: %s", td_read(out, NULL));
    }

    ringd_client_t *cl = NULL;
    ASSERT_EQ(connect_job(&c.d[0], NULL, why, sizeof(why), &cl), 0);
    ringd_view_t v;
    ASSERT_EQ(ringd_step_begin(cl, &v), RINGD_ESTATE);
    ASSERT_MSG(strstr(ringd_last_error(cl), "RINGD_JOB"), "%s",
               ringd_last_error(cl));
    ringd_close(cl);
    ASSERT_EQ(connect_job(&c.d[0], "alpha", why, sizeof(why), NULL), 0);

    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    ASSERT_EQ(td_stop(&c.d[0], 30000), 0);
    return fx_done();
}

/* A config that pins job ringtest: naming it or none is served, naming
 * another is refused with both names, as before there were names. */
TEST_IMPL(dmn_jobs_pinned)
{
    cluster_env();
    cluster_t c = {.n = 1};
    fx_etcd_start(&c.etcd, 0);
    node_init(&c, 0, "1", "1");
    char why[256];
    ASSERT_EQ(connect_job(&c.d[0], "other", why, sizeof(why), NULL),
              RINGD_ESTATE);
    ASSERT_MSG(strstr(why, "'ringtest'") && strstr(why, "'other'") &&
                   strstr(why, "pinned"), "%s", why);
    ASSERT_EQ(connect_job(&c.d[0], "ringtest", why, sizeof(why), NULL), 0);
    setenv("RINGD_JOB", "ringtest", 1);
    c.trainer[0][0] = trainer(&c, 0, 0, "50");
    unsetenv("RINGD_JOB");
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    c.trainer[0][1] = trainer(&c, 0, 1, "50");
    expect_exit0(&c, 0, 1, c.trainer[0][1]);
    ASSERT_EQ(td_stop(&c.d[0], 30000), 0);
    return fx_done();
}

/* A raw PROTO_T_JOB after HELLO on a fresh connection: the reply's status
 * (an ERROR's or the JOB reply's). */
static int raw_job(const char *sock, const char *name, size_t n)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    ASSERT_GE(fd, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
    ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof(a)));
    struct {
        proto_hdr_t h;
        union { proto_hello_t hello; proto_job_t job; } b;
    } m;
    int32_t st = 1;
    for (uint32_t seq = 1; seq <= 2; seq++) {
        memset(&m, 0, sizeof(m));
        size_t len = seq == 1 ? sizeof(proto_hello_t) : sizeof(proto_job_t);
        m.h = (proto_hdr_t){PROTO_MAGIC, PROTO_VERSION,
                            seq == 1 ? PROTO_T_HELLO : PROTO_T_JOB,
                            (uint32_t)len, seq};
        if (seq == 1)
            m.b.hello = (proto_hello_t){(uint32_t)getpid(),
                                        RINGD_API_VERSION, "raw"};
        else
            memcpy(m.b.job.name, name, n);
        ASSERT_EQ(send(fd, &m, sizeof(m.h) + len, 0),
                  (ssize_t)(sizeof(m.h) + len));
        char buf[PROTO_MAX_MSG];
        ASSERT_GT(recv(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(m.h));
        memcpy(&st, buf + sizeof(m.h), sizeof(st));
    }
    close(fd);
    return st;
}

/* ringd with args: its exit status, its output in out. */
static int ringd_exit(const char *const *args, const char *out)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringd", th_bindir());
    const char *argv[16] = {path};
    for (int i = 0; args[i] != NULL && i < 14; i++)
        argv[i + 1] = args[i];
    int st = -1;
    pid_t p = th_spawn((char *const *)argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * Bad job names: the client refuses them before it connects (RINGD_EINVAL,
 * no daemon needed); the daemon refuses them on the wire (a name with no
 * NUL in its array, a '/', a leading '.'); ringd --help states the limit;
 * --jobs with a pinned job, and checkpoints without one, are config errors.
 */
TEST_IMPL(dmn_jobs_bad_names)
{
    td_daemon_t t;
    td_init(&t, "dmn-jobs-names");
    char why[256], long_name[80];
    memset(long_name, 'a', 65);
    long_name[65] = '\0';
    const char *bad[] = {"a/b", ".hidden", "sp ace", long_name, "x\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ASSERT_EQ(connect_job(&t, bad[i], why, sizeof(why), NULL),
                  RINGD_EINVAL);
        ASSERT_MSG(strstr(why, "1..64"), "%s", why);
    }
    setenv("RINGD_JOB", "../etc", 1);
    ASSERT_EQ(connect_job(&t, NULL, why, sizeof(why), NULL), RINGD_EINVAL);
    unsetenv("RINGD_JOB");
    long_name[64] = '\0'; /* 64 is the limit: allowed (no daemon here) */
    ASSERT_EQ(connect_job(&t, long_name, why, sizeof(why), NULL),
              RINGD_ENODAEMON);

    ASSERT_OK(td_start(&t, NULL));
    char noz[72];
    memset(noz, 'a', sizeof(noz));
    ASSERT_EQ(raw_job(t.sock, noz, sizeof(noz)), RINGD_EINVAL);
    ASSERT_EQ(raw_job(t.sock, "a/b", 4), RINGD_EINVAL);
    ASSERT_EQ(raw_job(t.sock, "..", 3), RINGD_EINVAL);
    ASSERT_EQ(raw_job(t.sock, "", 1), RINGD_EINVAL);
    ASSERT_EQ(raw_job(t.sock, "fine-1.x", 9), 0);
    ASSERT_EQ(td_stop(&t, 30000), 0);

    char out[300];
    snprintf(out, sizeof(out), "%s", td_path(&t, "cfg.out"));
    const char *help[] = {"--help", NULL};
    ASSERT_EQ(ringd_exit(help, out), 0);
    ASSERT(td_file_has(out, "1..64 characters"));
    const char *both[] = {"--etcd", "http://127.0.0.1:1", "--job", "a",
                          "--jobs", "a,b", NULL};
    ASSERT_EQ(ringd_exit(both, out), 2);
    ASSERT(td_file_has(out, "--jobs and --job-secret-dir"));
    return fx_done();
}

/* The steps of the checkpoints stored under dir/job, ascending. */
static size_t stored(const char *dir, const char *job, uint64_t **steps_p)
{
    char root[600];
    snprintf(root, sizeof(root), "%s/%s", dir, job);
    size_t n = 0;
    *steps_p = NULL;
    ASSERT_OK(ckpt_store_list(root, steps_p, &n));
    return n;
}

/* Both nodes of c have left n jobs. */
static int left_n;
static int both_left(void *arg)
{
    cluster_t *c = arg;
    for (int i = 0; i < 2; i++)
        if (td_count(c->d[i].log, "ready for the next one") < left_n)
            return 0;
    return 1;
}

static void left_jobs(cluster_t *c, int n)
{
    left_n = n;
    ASSERT_MSG(td_poll(both_left, c, 30000) == 0, "the nodes never left "
               "job %d", n);
}

/*
 * A named job whose checkpoint store cannot be made (--ckpt-dir under a
 * regular file) is refused at the join, with nothing of it left started:
 * the next name, alpha again or beta, is refused for the same reason and
 * never lands in another job's store; the daemon serves on.
 */
TEST_IMPL(dmn_jobs_ckpt_store_refused)
{
    cluster_env();
    cluster_t c = {.n = 1};
    fx_etcd_start(&c.etcd, 0);
    td_daemon_t *t = &c.d[0];
    char file[300], bad[320];
    snprintf(file, sizeof(file), "%s/not-a-dir", fx_path(&c.etcd, ""));
    FILE *f = fopen(file, "w");
    ASSERT(f != NULL);
    fclose(f);
    snprintf(bad, sizeof(bad), "%s/ckpt", file);
    const char *extra[] = {"--ckpt-interval", "10", "--ckpt-dir", bad, NULL};
    node_unpinned(&c, 0, "1", extra);
    char why[256];
    const char *names[] = {"alpha", "beta", "alpha"};
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(connect_job(t, names[i], why, sizeof(why), NULL),
                  RINGD_EABORTED);
        ASSERT_MSG(strstr(why, "could not join") && strstr(why, names[i]),
                   "%s", why);
    }
    ASSERT_EQ(td_count(t->log, "checkpoints under"), 3);
    ASSERT(!td_file_has(t->log, "joined job"));
    ASSERT_EQ(kill(t->pid, 0), 0);
    ASSERT_EQ(td_stop(t, 30000), 0);
    return fx_done();
}

/*
 * Checkpoints of jobs named by their users: each job's go to its own
 * directory, --ckpt-dir/NAME. Alpha then beta on the same two daemons
 * (--ckpt-interval 50, 300 steps each): each job's directory holds its own checkpoints
 * and beta writes nothing into alpha's. Alpha named again later resumes
 * from its newest checkpoint, on both nodes, with identical replicas.
 */
TEST_IMPL(dmn_jobs_ckpt)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    char *dir = th_mkdtemp("dmn-jobs-ck");
    ASSERT(dir != NULL);
    const char *extra[] = {"--ckpt-interval", "50", "--ckpt-dir", dir, NULL};
    for (int i = 0; i < 2; i++)
        node_unpinned(&c, i, "2", extra);
    /* A checkpoint still being written when its job ends is not complete
     * (no manifest): 10 ms a step leaves the writers time. */
    rc_step_delay = "10";
    run_job(&c, "alpha", 0, "300");
    left_jobs(&c, 1);
    uint64_t *a0 = NULL, *a1 = NULL, *b = NULL;
    size_t na = stored(dir, "alpha", &a0);
    ASSERT_MSG(na >= 1, "alpha: no checkpoint stored");
    uint64_t alpha_newest = a0[na - 1];
    ASSERT_GE(alpha_newest, 50);

    run_job(&c, "beta", 1, "300");
    left_jobs(&c, 2);
    size_t nb = stored(dir, "beta", &b);
    ASSERT_MSG(nb >= 1, "beta: no checkpoint stored");
    ASSERT_EQ(stored(dir, "alpha", &a1), na);
    ASSERT_EQ(memcmp(a0, a1, na * sizeof(*a0)), 0);

    /* Alpha again: both nodes restore its newest checkpoint. */
    setenv("RINGD_JOB", "alpha", 1);
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "400");
    unsetenv("RINGD_JOB");
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    /* The newest whose files are whole: at least the newest with the
     * directory's manifest (the job's own record, in etcd, may name a
     * later one whose manifest file the leave cut short), at most the
     * boundary after alpha's last step (300), and the same on both
     * nodes. */
    int64_t got[2];
    for (int i = 0; i < 2; i++) {
        got[i] = logged_step(c.d[i].log, "restored from the checkpoint of "
                                         "step ");
        if (got[i] < (int64_t)alpha_newest)
            td_dump(c.d[i].log);
        ASSERT_GE(got[i], (int64_t)alpha_newest);
        ASSERT(got[i] <= 300 && got[i] % 50 == 0);
    }
    ASSERT_EQ(got[0], got[1]);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p0")),
              0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    rc_step_delay = NULL;
    free(a0);
    free(a1);
    free(b);
    th_rmtree(dir);
    free(dir);
    return fx_done();
}

/*
 * --job-secret-dir: job NAME's secret is DIR/NAME.secret. A job whose
 * file is there (0600) is served and its ring runs with that secret; a
 * job without one, or with one every user can read, is refused.
 */
TEST_IMPL(dmn_jobs_secret_dir)
{
    cluster_env();
    cluster_t c = {.n = 1};
    fx_etcd_start(&c.etcd, 0);
    td_daemon_t tmp;
    td_init(&tmp, "dmn-jobs-secrets");
    char path[400];
    const char *names[] = {"alpha", "open"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s.secret", tmp.dir, names[i]);
        FILE *f = fopen(path, "w");
        ASSERT(f != NULL);
        fputs("0123456789abcdef0123456789abcdef\n", f);
        fclose(f);
        ASSERT_OK(chmod(path, i == 0 ? 0600 : 0644));
    }
    const char *extra[] = {"--job-secret-dir", tmp.dir, NULL};
    node_unpinned(&c, 0, "1", extra);
    char why[256];
    ASSERT_EQ(connect_job(&c.d[0], "beta", why, sizeof(why), NULL),
              RINGD_EINVAL);
    ASSERT_MSG(strstr(why, "'beta'") && strstr(why, "secret"), "%s", why);
    ASSERT_EQ(connect_job(&c.d[0], "open", why, sizeof(why), NULL),
              RINGD_EINVAL);
    ASSERT_MSG(strstr(why, "'open'") && strstr(why, "secret"), "%s", why);
    ASSERT(td_file_has(c.d[0].log, "readable by every user"));
    setenv("RINGD_JOB", "alpha", 1);
    c.trainer[0][0] = trainer(&c, 0, 0, "50");
    unsetenv("RINGD_JOB");
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    ASSERT(td_file_has(c.d[0].log, "joined job 'alpha'"));
    ASSERT_EQ(td_stop(&c.d[0], 30000), 0);
    return fx_done();
}

/*
 * --job-grace: n1's only trainer dies in step 20 (no BYE). n1 keeps job
 * alpha, stepped out (n0 goes on alone), refuses another job meanwhile
 * with a message naming the grace, and the replacement started on its
 * socket rejoins with the job's state: both replicas end identical, and
 * n1 never left the job (joined once; "ready for the next one" only
 * after the replacement's clean end).
 */
TEST_IMPL(dmn_jobs_grace_replacement)
{
    cluster_env();
    cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    const char *extra[] = {"--job-grace", "600000", NULL};
    for (int i = 0; i < 2; i++)
        node_unpinned(&c, i, "2", extra);
    const char *steps = "3000";
    setenv("RINGD_JOB", "alpha", 1);
    rc_step_delay = "5"; /* n0 alone must not finish before n1 is back */
    c.trainer[0][0] = trainer(&c, 0, 0, steps);
    rc_crash_at = "20";
    c.trainer[1][0] = trainer(&c, 1, 0, steps);
    rc_crash_at = NULL;
    ASSERT_NE(td_exit_code(c.trainer[1][0], 60000), 0);
    ASSERT_OK(td_wait_file(c.d[1].log, "keeps the job for 600000 ms",
                           30000));
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "world 1", 60000));
    char why[256];
    ASSERT_EQ(connect_job(&c.d[1], "beta", why, sizeof(why), NULL),
              RINGD_ESTATE);
    ASSERT_MSG(strstr(why, "lost trainer") && strstr(why, "'alpha'") &&
                   strstr(why, "--job-grace"), "%s", why);
    const char *args[] = {"--steps", steps, "--hash-log",
                          td_path(&c.d[1], "h2"), "--save",
                          td_path(&c.d[1], "p2"), "--log-every", "20",
                          "--step-delay-ms", "5", NULL};
    pid_t repl = td_trainer(&c.d[1], args, td_path(&c.d[1], "t2.log"));
    unsetenv("RINGD_JOB");
    rc_step_delay = NULL;
    ASSERT_OK(td_wait_file(c.d[1].log, "a trainer is back", 30000));
    ASSERT_OK(td_wait_file(td_path(&c.d[1], "h2"), "world 2", 60000));
    expect_exit0(&c, 0, 0, c.trainer[0][0]);
    int rc = td_exit_code(repl, 180000);
    if (rc != 0) {
        td_dump(td_path(&c.d[1], "t2.log"));
        td_dump(c.d[1].log);
    }
    ASSERT_MSG(rc == 0, "the replacement exited %d", rc);
    ASSERT(td_file_has(td_path(&c.d[1], "t2.log"), "restored"));

    static td_hashes_t h0, h2;
    td_read_hashes(td_path(&c.d[0], "h0"), &h0);
    td_read_hashes(td_path(&c.d[1], "h2"), &h2);
    ASSERT_EQ(h0.world[2999], 2);
    ASSERT_EQ(h0.hash[2999], h2.hash[2999]);
    ASSERT_EQ(td_param_diff(td_path(&c.d[0], "p0"), td_path(&c.d[1], "p2")),
              0);
    ASSERT_EQ(td_count(c.d[1].log, "joined job 'alpha'"), 1);
    /* Once: when the replacement finished, not during the grace. */
    ASSERT_OK(td_wait_file(c.d[1].log, "ready for the next one", 30000));
    ASSERT_EQ(td_count(c.d[1].log, "ready for the next one"), 1);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&c.d[i], 30000), 0);
    return fx_done();
}

/*
 * --job-grace that runs out: the only trainer dies and none comes back
 * within 300 ms, so the node leaves job alpha ("no trainer came back"),
 * and the same daemon then serves job beta.
 */
TEST_IMPL(dmn_jobs_grace_expires)
{
    cluster_env();
    cluster_t c = {.n = 1};
    fx_etcd_start(&c.etcd, 0);
    const char *extra[] = {"--job-grace", "300", NULL};
    node_unpinned(&c, 0, "1", extra);
    pid_t pid = c.d[0].pid;
    setenv("RINGD_JOB", "alpha", 1);
    rc_crash_at = "10";
    c.trainer[0][0] = trainer(&c, 0, 0, "1000");
    rc_crash_at = NULL;
    unsetenv("RINGD_JOB");
    ASSERT_NE(td_exit_code(c.trainer[0][0], 60000), 0);
    ASSERT_OK(td_wait_file(c.d[0].log, "no trainer came back within 300 ms",
                           30000));
    ASSERT_OK(td_wait_file(c.d[0].log, "ready for the next one", 30000));
    setenv("RINGD_JOB", "beta", 1);
    c.trainer[0][1] = trainer(&c, 0, 1, "50");
    unsetenv("RINGD_JOB");
    expect_exit0(&c, 0, 1, c.trainer[0][1]);
    ASSERT(td_file_has(c.d[0].log, "joined job 'beta'"));
    ASSERT_EQ(c.d[0].pid, pid);
    ASSERT_EQ(td_stop(&c.d[0], 30000), 0);
    return fx_done();
}
