/*
 * The job secret on real daemons (the proof and the ring handshake alone
 * are in test-job-auth.c): the secret file's checks, and on a real etcd:
 * a node with the wrong secret never joins and the job goes on without
 * it; etcd writes of a process that has etcd access but not the
 * secret (a registration, a suspect report, a reshape request, a drain
 * key, a view) change nothing.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "include/ringd.h"
#include "job/job_auth.h"
#include "job/job_ring-int.h"
#include "membership/mb.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/task.h"

#define AUTH_JOB "authjob"
#define AUTH_STEPS 3000
#define AUTH_STEPS_S "3000"

static const char secret_a[] = "0123456789abcdef-the-job-secret";
static const char secret_b[] = "0123456789abcdef-another-secret";

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    ASSERT_MSG(f != NULL, "%s: %s", path, strerror(errno));
    ASSERT(fputs(text, f) >= 0);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_EQ(chmod(path, mode), 0);
}

/* A world-readable secret file is refused, by the loader and by ringd's
 * configuration check (exit 2 with the reason). */
TEST_IMPL(dmn_auth_secret_file)
{
    char *dir = th_mkdtemp("ringd-auth-");
    ASSERT(dir != NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/secret", dir);
    job_auth_t *a = NULL;
    write_file(path, "0123456789abcdef\n", 0644);
    ASSERT_EQ(job_auth_load(path, &a), ST_ECONFIG);
    write_file(path, "0123456789abcdef\n", 0640);
    ASSERT_OK(job_auth_load(path, &a));
    job_auth_destroy(a);

    write_file(path, "0123456789abcdef\n", 0604);
    td_daemon_t t;
    td_init(&t, "dmn-auth-cfg");
    char bin[512];
    snprintf(bin, sizeof(bin), "%s/ringd", th_bindir());
    char *const argv[] = {bin, "--etcd", "http://127.0.0.1:1", "--job", "j",
                          "--socket", t.sock, "--metrics", "off",
                          "--job-secret-file", path, NULL};
    pid_t pid = th_spawn(argv, t.log);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(td_exit_code(pid, 15000), 2);
    ASSERT(td_file_has(t.log, "readable by every user"));
    th_rmtree(dir);
    free(dir);
    return 0;
}

typedef struct {
    fx_etcd_t etcd;
    td_daemon_t d[3];
    pid_t trainer[3];
    char secret_dir[256];
} auth_job_t;

static void auth_env(auth_job_t *j)
{
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    char *dir = th_mkdtemp("ringd-auth-");
    ASSERT(dir != NULL);
    snprintf(j->secret_dir, sizeof(j->secret_dir), "%s", dir);
    free(dir);
    char p[300];
    snprintf(p, sizeof(p), "%s/a", j->secret_dir);
    write_file(p, secret_a, 0600);
    snprintf(p, sizeof(p), "%s/b", j->secret_dir);
    write_file(p, secret_b, 0600);
    fx_etcd_start(&j->etcd, 0);
}

/* Node i of AUTH_JOB with secret file which ("a" or "b"), and its
 * trainer. */
/* --step-delay-ms for the trainers auth_node starts next; NULL: none. */
static const char *auth_trainer_extra;

static void auth_node(auth_job_t *j, int i, const char *which,
                      const char *min_nodes)
{
    static char ids[3][8], secrets[3][300];
    char name[32];
    snprintf(ids[i], sizeof(ids[i]), "n%d", i);
    snprintf(secrets[i], sizeof(secrets[i]), "%s/%s", j->secret_dir, which);
    snprintf(name, sizeof(name), "dmn-auth-n%d", i);
    td_daemon_t *d = &j->d[i];
    td_init(d, name);
    d->networked = 1;
    const char *flags[] = {"--etcd", j->etcd.url, "--job", AUTH_JOB,
                           "--node-id", ids[i], "--trainers", "1",
                           "--lease-ttl", "2", "--min-nodes", min_nodes,
                           "--job-secret-file", secrets[i], NULL};
    ASSERT_MSG(td_start(d, flags) == 0, "daemon n%d did not start", i);
    const char *args[] = {"--steps", AUTH_STEPS_S, "--hash-log",
                          td_path(d, "h"), "--log-every", "100",
                          auth_trainer_extra ? "--step-delay-ms" : NULL,
                          auth_trainer_extra, NULL};
    j->trainer[i] = td_trainer(d, args, td_path(d, "t.log"));
}

static void expect_exit0(auth_job_t *j, int i)
{
    int rc = td_exit_code(j->trainer[i], 180000);
    if (rc != 0) {
        td_dump(td_path(&j->d[i], "t.log"));
        td_dump(j->d[i].log);
    }
    ASSERT_MSG(rc == 0, "trainer of n%d exited %d", i, rc);
}

/* The two members trained the whole job together, unfenced, and the
 * last steps ran on a view of the two of them. */
static void expect_job_of_two(auth_job_t *j)
{
    expect_exit0(j, 0);
    expect_exit0(j, 1);
    static td_hashes_t h0, h1;
    td_read_hashes(td_path(&j->d[0], "h"), &h0);
    td_read_hashes(td_path(&j->d[1], "h"), &h1);
    ASSERT_EQ(h0.hash[AUTH_STEPS - 1], h1.hash[AUTH_STEPS - 1]);
    ASSERT_EQ(h0.world[AUTH_STEPS - 1], 2);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(!td_file_has(j->d[i].log, "fenced"),
                   "member n%d was fenced", i);
}

/* The value of the job's key (kind, node), read as a foreign etcd client
 * would, into buf (trailing newlines dropped): its length. */
static size_t read_key(auth_job_t *j, mb_key_t kind, const char *node,
                       char *buf, size_t cap)
{
    char key[MB_KEY_MAX], cmd[1024];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, kind, node, 0, 0));
    snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s get "
             "%s --print-value-only", j->etcd.url, key);
    FILE *p = popen(cmd, "r");
    ASSERT(p != NULL);
    size_t n = fread(buf, 1, cap - 1, p);
    pclose(p);
    while (n > 0 && buf[n - 1] == '\n')
        n--;
    buf[n] = '\0';
    return n;
}

/* The decimal lease in node's record, read as a foreign etcd client. */
static long long record_lease(auth_job_t *j, const char *node)
{
    char buf[2048];
    read_key(j, MB_KEY_NODE, node, buf, sizeof(buf));
    char *l = strstr(buf, "\"lease\":\"");
    ASSERT_MSG(l != NULL, "no lease in %s's record: %s", node, buf);
    return strtoll(l + 9, NULL, 10);
}

/* etcdctl put of value at key, as a process with etcd write access and
 * no job secret. */
static void forge(auth_job_t *j, const char *key, const char *value)
{
    char args[2048];
    snprintf(args, sizeof(args), "put %s '%s'", key, value);
    ASSERT_MSG(fx_etcdctl(&j->etcd, args) == 0, "etcdctl %s failed", args);
}

static int both_logged(void *p)
{
    void **a = p;
    auth_job_t *j = a[0];
    return td_file_has(j->d[0].log, a[1]) || td_file_has(j->d[1].log, a[1]);
}

/* Waits until n0's or n1's log holds needle. */
static void expect_logged(auth_job_t *j, const char *needle)
{
    void *a[2] = {j, (void *)needle};
    int rc = td_poll(both_logged, a, 30000);
    if (rc != 0)
        td_dump(j->d[0].log);
    ASSERT_MSG(rc == 0, "no member logged '%s'", needle);
}

static int count_in(const char *path, const char *needle)
{
    char *s = td_read(path, NULL);
    int n = 0;
    for (char *p = s; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(s);
    return n;
}

static int logged_twice(void *p)
{
    void **a = p;
    auth_job_t *j = a[0];
    return count_in(j->d[0].log, a[1]) + count_in(j->d[1].log, a[1]) >= 2;
}

static void expect_logged_twice(auth_job_t *j, const char *needle)
{
    void *a[2] = {j, (void *)needle};
    ASSERT_MSG(td_poll(logged_twice, a, 30000) == 0,
               "the second '%s' never came", needle);
}

/* Every step the two members ran was a step of both (no view of one). */
static void expect_never_alone(auth_job_t *j)
{
    static td_hashes_t h0;
    td_read_hashes(td_path(&j->d[0], "h"), &h0);
    for (int s = 0; s < AUTH_STEPS; s++)
        if (h0.have[s])
            ASSERT_MSG(h0.world[s] == 2, "step %d ran on a view of %d", s,
                       h0.world[s]);
}

static void auth_job_end(auth_job_t *j)
{
    expect_job_of_two(j);
    expect_never_alone(j);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&j->d[i], 30000), 0);
    th_rmtree(j->secret_dir);
}

/*
 * A foreign writer copies n1's lease from its record into suspect/n1, as
 * n0, once without a signature and once with a made-up one: the leader
 * ignores both (and deletes them), n1 is never evicted.
 */
TEST_IMPL(dmn_auth_forged_suspect)
{
    static auth_job_t j;
    auth_env(&j);
    auth_node(&j, 0, "a", "2");
    auth_node(&j, 1, "a", "2");
    ASSERT_OK(td_wait_file(td_path(&j.d[0], "h"), "step 60 ", 60000));
    long long lease = record_lease(&j, "n1");
    long long by = record_lease(&j, "n0");
    char key[MB_KEY_MAX], v[512];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_SUSPECT, "n1", 0,
                     0));
    snprintf(v, sizeof(v), "{\"by\":\"n0\",\"why\":\"forged\","
             "\"lease\":\"%lld\"}", lease);
    forge(&j, key, v);
    char needle[600];
    snprintf(needle, sizeof(needle), "ignoring the suspect report %s", key);
    expect_logged(&j, needle);
    snprintf(v, sizeof(v), "{\"by\":\"n0\",\"why\":\"forged\","
             "\"lease\":\"%lld\",\"by_lease\":\"%lld\",\"sig\":\"%064d\"}",
             lease, by, 0);
    forge(&j, key, v);
    expect_logged_twice(&j, needle);
    auth_job_end(&j);
    return fx_done();
}

/* The generation of the view stored in etcd. */
static long long stored_generation(auth_job_t *j)
{
    char buf[4096];
    read_key(j, MB_KEY_VIEW, NULL, buf, sizeof(buf));
    char *g = strstr(buf, "\"generation\":");
    ASSERT_MSG(g != NULL, "no view in etcd: %s", buf);
    return strtoll(g + 13, NULL, 10);
}

/* The value of the view key, read as a foreign etcd client, into buf. */
static size_t stored_view(auth_job_t *j, char *buf, size_t cap)
{
    return read_key(j, MB_KEY_VIEW, NULL, buf, cap);
}

/* 1 when a line of the log at path holds needle at level warn. */
static int warned(const char *path, const char *needle)
{
    char *s = td_read(path, NULL);
    int found = 0;
    for (char *p = s; !found && p != NULL && (p = strstr(p, needle)); p++) {
        char *bol = p;
        while (bol > s && bol[-1] != '\n')
            bol--;
        char *lvl = strstr(bol, " warn ");
        found = lvl != NULL && lvl < p;
    }
    free(s);
    return found;
}

/* For td_poll: the view key holds a view signed with the job secret. */
static int view_signed(void *p)
{
    auth_job_t *j = p;
    static char buf[65536];
    char key[MB_KEY_MAX];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_VIEW, NULL, 0, 0));
    size_t n = stored_view(j, buf, sizeof(buf));
    return mb_value_signed(secret_a, strlen(secret_a), "view", key, buf, n);
}

/*
 * A foreign writer puts a well-formed view of a later generation that
 * leaves n1 out: both members refuse it as unsigned, and the leader
 * writes the valid view back at once (saying so with a warning), so the
 * key holds a signed view again within a bounded wait, not at the next
 * real change. Nobody is fenced or trains alone, and the job finishes on
 * the leader's views.
 */
TEST_IMPL(dmn_auth_forged_view)
{
    static auth_job_t j;
    auth_env(&j);
    auth_node(&j, 0, "a", "2");
    auth_node(&j, 1, "a", "2");
    ASSERT_OK(td_wait_file(td_path(&j.d[0], "h"), "step 60 ", 60000));
    ASSERT_MSG(view_signed(&j), "the view in etcd is not signed");
    long long gen = stored_generation(&j);
    char key[MB_KEY_MAX], v[512];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_VIEW, NULL, 0, 0));
    snprintf(v, sizeof(v), "{\"generation\":999999,\"step\":0,\"hosts\":"
             "[\"h\"],\"members\":[[\"n0\",0,\"%llx\",1]],\"joiners\":[]}",
             (unsigned long long)record_lease(&j, "n0"));
    forge(&j, key, v);
    for (int i = 0; i < 2; i++) {
        int rc = td_wait_file(j.d[i].log, "refusing the view at revision",
                              30000);
        if (rc != 0)
            td_dump(j.d[i].log);
        ASSERT_MSG(rc == 0, "n%d did not refuse the forged view", i);
    }
    int rc = td_poll(view_signed, &j, 10000);
    if (rc != 0)
        td_dump(j.d[0].log);
    ASSERT_MSG(rc == 0, "the forged view stayed in etcd for 10 s");
    ASSERT(stored_generation(&j) >= gen);
    ASSERT(stored_generation(&j) < 999999);
    ASSERT_MSG(warned(j.d[0].log, "the view key holds a view no leader "
                      "wrote: writing view") ||
               warned(j.d[1].log, "the view key holds a view no leader "
                      "wrote: writing view"),
               "no leader warned that it wrote the view back");
    auth_job_end(&j);
    return fx_done();
}

static int generation_above(void *p)
{
    void **a = p;
    return stored_generation(a[0]) > *(long long *)a[1];
}

/*
 * A foreign writer keeps a signed view (n0 and n1) and puts it back after
 * n2 has joined: the signature verifies, but its generation is older than
 * the one every member holds. Members refuse it as a replay, the leader
 * writes the current view back at once, and the three finish the job
 * together, bitwise identical.
 */
TEST_IMPL(dmn_auth_replayed_view)
{
    static auth_job_t j;
    auth_env(&j);
    auth_node(&j, 0, "a", "2");
    auth_node(&j, 1, "a", "2");
    ASSERT_OK(td_wait_file(td_path(&j.d[0], "h"), "step 60 ", 60000));
    static char old[65536];
    char key[MB_KEY_MAX];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_VIEW, NULL, 0, 0));
    size_t n = stored_view(&j, old, sizeof(old));
    ASSERT(mb_value_signed(secret_a, strlen(secret_a), "view", key, old, n));
    long long g1 = stored_generation(&j);
    auth_node(&j, 2, "a", "2");
    void *a[2] = {&j, &g1};
    ASSERT_OK(td_poll(generation_above, a, 30000));
    for (int i = 0; i < 3; i++)
        ASSERT_OK(td_wait_file(j.d[i].log, "3 members", 30000));
    long long g2 = stored_generation(&j);
    static char cmd[70000];
    snprintf(cmd, sizeof(cmd), "put %s '%s'", key, old);
    ASSERT_MSG(fx_etcdctl(&j.etcd, cmd) == 0, "the replay failed");
    for (int i = 0; i < 3; i++) {
        int rc = td_wait_file(j.d[i].log, "(a replay)", 30000);
        if (rc != 0)
            td_dump(j.d[i].log);
        ASSERT_MSG(rc == 0, "n%d did not refuse the replayed view", i);
    }
    a[1] = &g2;
    g2--;
    int rc = td_poll(generation_above, a, 10000);
    if (rc != 0)
        td_dump(j.d[0].log);
    ASSERT_MSG(rc == 0, "the replayed view (generation %lld) stayed in "
               "etcd for 10 s", g1);
    ASSERT(view_signed(&j));
    static td_hashes_t h[3];
    for (int i = 0; i < 3; i++) {
        expect_exit0(&j, i);
        td_read_hashes(td_path(&j.d[i], "h"), &h[i]);
        ASSERT_EQ(h[i].world[AUTH_STEPS - 1], 3);
        ASSERT_EQ(h[i].hash[AUTH_STEPS - 1], h[0].hash[AUTH_STEPS - 1]);
        ASSERT_MSG(!td_file_has(j.d[i].log, "fenced"), "n%d was fenced", i);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&j.d[i], 30000), 0);
    th_rmtree(j.secret_dir);
    return fx_done();
}

/* n2's steps, if it ran any, ran on its own and only after the members'
 * last step (their trainers end quickly under a fast build: a node left
 * alone leads a job of its own then). */
static void expect_alone_after(auth_job_t *j)
{
    static td_hashes_t h0, h2;
    td_read_hashes(td_path(&j->d[0], "h"), &h0);
    const char *p2 = td_path(&j->d[2], "h");
    if (!td_file_has(p2, "step "))
        return;
    td_read_hashes(p2, &h2);
    long long last = h0.t_ms[AUTH_STEPS - 1];
    ASSERT(last > 0);
    for (int s = 0; s < h2.nsteps; s++) {
        if (!h2.have[s])
            continue;
        ASSERT_MSG(h2.world[s] == 1, "n2's step %d ran on a view of %u", s,
                   h2.world[s]);
        ASSERT_MSG(h2.t_ms[s] >= last, "n2's step %d ended %lld ms before "
                   "the members' last", s, last - h2.t_ms[s]);
    }
}

/*
 * n0 and n1 share the job secret; n2 comes with another one. Its node
 * record carries a signature the leader cannot verify: the leader ignores
 * the registration (and says so), n2 never gets into a view, and n0 and
 * n1 finish the job together, never fenced, never alone.
 */
TEST_IMPL(dmn_auth_wrong_secret_refused)
{
    static auth_job_t j;
    auth_env(&j);
    auth_node(&j, 0, "a", "2");
    auth_node(&j, 1, "a", "2");
    ASSERT_OK(td_wait_file(td_path(&j.d[0], "h"), "step 60 ", 60000));
    auth_node(&j, 2, "b", "1");
    ASSERT_OK(td_wait_file(j.d[2].log, "node record written", 30000));
    expect_logged(&j, "ignoring the registration /ringd/" AUTH_JOB
                      "/nodes/n2");
    /* While the members ran, n2 never trained (once they are gone it
     * may lead a job of its own). */
    expect_job_of_two(&j);
    expect_never_alone(&j);
    expect_alone_after(&j);
    ASSERT(!td_file_has(j.d[0].log, "3 members"));
    th_kill(j.trainer[2]);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(td_stop(&j.d[i], 30000), 0);
    th_rmtree(j.secret_dir);
    return fx_done();
}

/*
 * A foreign writer registers n9 under a lease of its own, with a record
 * copied from n1 (so a valid-looking address and a signature made for
 * another key and lease): the leader ignores it, no view takes n9 in, and
 * the job is not stalled on an endpoint nobody answers.
 */
TEST_IMPL(dmn_auth_forged_registration)
{
    static auth_job_t j;
    auth_env(&j);
    auth_node(&j, 0, "a", "2");
    auth_node(&j, 1, "a", "2");
    ASSERT_OK(td_wait_file(td_path(&j.d[0], "h"), "step 60 ", 60000));
    char key[MB_KEY_MAX], src[MB_KEY_MAX], cmd[2048];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_NODE, "n9", 0, 0));
    ASSERT_OK(mb_key(src, sizeof(src), AUTH_JOB, MB_KEY_NODE, "n1", 0, 0));
    snprintf(cmd, sizeof(cmd), "export ETCDCTL_API=3; e='etcdctl "
             "--endpoints=%s'; l=$($e lease grant 60 | awk '{print $2}'); "
             "v=$($e get %s --print-value-only); $e put --lease=$l %s \"$v\""
             " >> %s/forge.log 2>&1", j.etcd.url, src, key, j.etcd.dir);
    ASSERT_MSG(system(cmd) == 0, "the forged registration failed: %s", cmd);
    expect_logged(&j, "ignoring the registration /ringd/" AUTH_JOB
                      "/nodes/n9");
    auth_job_end(&j);
    ASSERT(!td_file_has(j.d[0].log, "3 members"));
    return fx_done();
}

/*
 * A foreign writer asks, as n1, for a new generation of the current view
 * (the right generation, n1's lease, no signature): the leader ignores
 * it, and the job ends on the very view it had.
 */
TEST_IMPL(dmn_auth_forged_reshape)
{
    static auth_job_t j;
    auth_env(&j);
    auth_node(&j, 0, "a", "2");
    auth_node(&j, 1, "a", "2");
    ASSERT_OK(td_wait_file(td_path(&j.d[0], "h"), "step 60 ", 60000));
    long long gen = stored_generation(&j);
    char key[MB_KEY_MAX], v[256];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_RESHAPE, "n1", 0,
                     0));
    snprintf(v, sizeof(v), "{\"gen\":\"%lld\",\"why\":\"forged\","
             "\"lease\":\"%lld\"}", gen, record_lease(&j, "n1"));
    forge(&j, key, v);
    expect_logged(&j, "ignoring the reshape request");
    expect_job_of_two(&j);
    ASSERT_EQ(stored_generation(&j), gen);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&j.d[i], 30000), 0);
    th_rmtree(j.secret_dir);
    return fx_done();
}

/* ---- injection into a running collective ---- */

enum { INJ_STEPS = 200, INJ_COUNT = 256, INJ_SEQS = 1024, INJ_IDXS = 2 };

/* A trainer of the job in a child process: INJ_STEPS allreduces whose sum
 * is known; 0 when every result was exactly it, 13 at the first one that
 * was not. Paced, so that the job runs while the attack goes on. */
static int inj_trainer(const char *sock)
{
    ringd_client_t *c = NULL;
    if (ringd_connect(&c, sock, NULL) != 0)
        return 10;
    float *f = ringd_buffer(c, INJ_COUNT * sizeof(float));
    if (f == NULL)
        return 11;
    for (;;) {
        ringd_view_t v;
        if (ringd_step_begin(c, &v) != 0)
            return 12;
        if (v.step >= INJ_STEPS)
            break;
        for (int i = 0; i < INJ_COUNT; i++)
            f[i] = (float)(v.rank + 1 + i);
        int rc = ringd_allreduce(c, f, INJ_COUNT, RINGD_F32, RINGD_SUM);
        if (rc == RINGD_ERESHAPE)
            continue;
        for (int i = 0; rc == 0 && i < INJ_COUNT; i++)
            if (f[i] != (float)(v.world * (v.world + 1) / 2 +
                                v.world * i)) {
                fprintf(stderr, "step %llu: [%d] = %g\n",
                        (unsigned long long)v.step, i, f[i]);
                return 13;
            }
        if (rc != 0 || ringd_step_end(c) != 0)
            return 15;
        usleep(5000);
    }
    ringd_close(c);
    return 0;
}

/* node's UCX worker address, from its record in etcd, into addr. */
static size_t record_addr(auth_job_t *j, const char *node, uint8_t *addr,
                          size_t cap)
{
    static char buf[8192];
    read_key(j, MB_KEY_NODE, node, buf, sizeof(buf));
    char *a = strstr(buf, "\"addr\":\"");
    ASSERT_MSG(a != NULL, "no addr in %s's record: %s", node, buf);
    a += 8;
    char *end = strchr(a, '"');
    ASSERT(end != NULL && (size_t)(end - a) / 4 * 3 <= cap);
    long len = etcd_b64_decode(a, (size_t)(end - a), addr);
    ASSERT_GT(len, 0);
    return (size_t)len;
}

static void inj_sent(tp_req_t *req)
{
    (*(int *)req->data)++;
}

/*
 * What a process that reaches peer's worker and knows the tag layout but
 * not the secret sends: for generation gen, the first INJ_SEQS
 * collectives, their first INJ_IDXS messages on channel 0, each exactly
 * the size of a message of the trainers' allreduce (half the vector), all
 * 1e6. Returns once UCX has sent them all.
 */
static void inject(tp_t *tp, tp_peer_t *peer, uint64_t gen)
{
    static tp_req_t req[INJ_SEQS * INJ_IDXS];
    static float junk[INJ_COUNT / 2];
    for (int i = 0; i < INJ_COUNT / 2; i++)
        junk[i] = 1e6f;
    int done = 0, posted = 0;
    for (uint32_t s = 0; s < INJ_SEQS; s++)
        for (uint32_t m = 0; m < INJ_IDXS; m++) {
            tp_req_t *q = &req[posted];
            q->cb = inj_sent;
            q->data = &done;
            ASSERT_OK(tp_send(peer, junk, sizeof(junk),
                              tp_tag_make(gen, 0, s, m), NULL, q));
            posted++;
        }
    int64_t end = th_now_ms() + 30000;
    while (done < posted && th_now_ms() < end)
        if (tp_progress(tp) == 0)
            tp_wait(tp, 10);
    ASSERT_MSG(done == posted, "only %d of %d injected messages sent", done,
               posted);
}

/* The messages n's ring dropped as stale, from its log. */
static long stale_dropped(const char *log)
{
    char *s = td_read(log, NULL);
    long n = 0;
    for (char *p = s; p != NULL && (p = strstr(p, "dropped ")) != NULL;
         p++) {
        char *e;
        long k = strtol(p + 8, &e, 10);
        if (e != p + 8 && strncmp(e, " stale message", 14) == 0)
            n += k;
    }
    free(s);
    return n;
}

/*
 * While two members with the job secret run allreduces, a foreign process
 * reads n1's UCX worker address from etcd, connects to it and keeps
 * sending well-sized messages with the tags the plain layout gives the
 * current generation's collectives. None reaches a buffer: every result
 * of both trainers is exactly the expected sum, and n1's ring drops the
 * injected messages as stale.
 */
TEST_IMPL(dmn_auth_ring_injection)
{
    static auth_job_t j;
    auth_env(&j);
    static char ids[2][8], secret[300];
    snprintf(secret, sizeof(secret), "%s/a", j.secret_dir);
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        snprintf(name, sizeof(name), "dmn-auth-inj-n%d", i);
        td_init(&j.d[i], name);
        j.d[i].networked = 1;
        const char *flags[] = {"--etcd", j.etcd.url, "--job", AUTH_JOB,
                               "--node-id", ids[i], "--trainers", "1",
                               "--lease-ttl", "2", "--min-nodes", "2",
                               "--job-secret-file", secret, NULL};
        ASSERT_MSG(td_start(&j.d[i], flags) == 0, "n%d did not start", i);
    }
    for (int i = 0; i < 2; i++)
        if ((p[i] = td_fork()) == 0)
            _exit(inj_trainer(j.d[i].sock));
    ASSERT_OK(td_wait_file(j.d[1].log, "2 members", 60000));
    static uint8_t addr[4096];
    size_t alen = record_addr(&j, "n1", addr, sizeof(addr));
    tp_t *tp = NULL;
    tp_peer_t *peer = NULL;
    ASSERT_OK(tp_create(NULL, &tp));
    ASSERT_OK(tp_peer_connect(tp, addr, alen, NULL, NULL, &peer));
    int rc[2] = {-1, -1}, left = 2, sprays = 0;
    int64_t end = th_now_ms() + 180000, next = 0;
    while (left > 0 && th_now_ms() < end) {
        for (int i = 0; i < 2; i++) {
            int st;
            if (rc[i] < 0 && waitpid(p[i], &st, WNOHANG) == p[i]) {
                rc[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
                left--;
            }
        }
        if (left > 0 && th_now_ms() >= next) {
            inject(tp, peer, (uint64_t)stored_generation(&j));
            sprays++;
            next = th_now_ms() + 300;
        }
        if (tp_progress(tp) == 0)
            tp_wait(tp, 20);
    }
    tp_peer_close(peer, 1);
    tp_destroy(tp);
    for (int i = 0; i < 2; i++) {
        if (rc[i] != 0)
            td_dump(j.d[i].log);
        ASSERT_MSG(rc[i] == 0, "trainer of n%d exited %d", i, rc[i]);
    }
    /* The attack ran while the job did, and its messages reached n1. */
    ASSERT_MSG(sprays >= 2, "only %d sprays during the job", sprays);
    long dropped = stale_dropped(j.d[1].log);
    ASSERT_MSG(dropped >= INJ_SEQS * INJ_IDXS, "n1 dropped %ld stale "
               "messages, fewer than one spray", dropped);
    for (int i = 0; i < 2; i++) {
        ASSERT(!td_file_has(j.d[i].log, "fenced"));
        ASSERT_EQ(td_stop(&j.d[i], 30000), 0);
    }
    th_rmtree(j.secret_dir);
    return fx_done();
}

/* ringctl drain NODE of AUTH_JOB, with the job secret file or without
 * (secret NULL); returns its exit code. */
static int ringctl_drain(auth_job_t *j, const char *node, const char *secret,
                         const char *out)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    const char *argv[] = {path, "--etcd", j->etcd.url, "--job", AUTH_JOB,
                          "drain", node, NULL, NULL, NULL};
    if (secret != NULL) {
        argv[5] = "--job-secret-file";
        argv[6] = secret;
        argv[7] = "drain";
        argv[8] = node;
    }
    int st = -1;
    pid_t p = th_spawn((char *const *)argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The last step n1's hash log names so far (-1 when none). */
static int last_step(auth_job_t *j, int i)
{
    static td_hashes_t h;
    td_read_hashes(td_path(&j->d[i], "h"), &h);
    return h.nsteps - 1;
}

/*
 * A drain key written without the job secret (ringctl without
 * --job-secret-file, as any etcd writer could) is ignored by n1, which
 * says so and trains on in the job of two; the same request signed
 * (ringctl --job-secret-file) drains it at its next step boundary while
 * the job runs (a node whose trainer has ended has left the job, so
 * there is nothing to drain then), and n0 (--min-nodes 1) finishes alone.
 * Each step takes 2 ms so that the job outlasts the two requests.
 */
TEST_IMPL(dmn_auth_forged_drain)
{
    static auth_job_t j;
    auth_env(&j);
    auth_trainer_extra = "2";
    auth_node(&j, 0, "a", "1");
    auth_node(&j, 1, "a", "2");
    auth_trainer_extra = NULL;
    ASSERT_OK(td_wait_file(td_path(&j.d[1], "h"), "step 60 ", 60000));
    const char *out = td_path(&j.d[0], "drain.out");
    ASSERT_EQ(ringctl_drain(&j, "n1", NULL, out), 0);
    ASSERT_OK(td_wait_file(j.d[1].log, "ignoring the drain request", 30000));
    char later[32];
    int ignored_at = last_step(&j, 1);
    snprintf(later, sizeof(later), "step %d ", ignored_at + 50);
    ASSERT_OK(td_wait_file(td_path(&j.d[1], "h"), later, 60000));
    static td_hashes_t h1;
    td_read_hashes(td_path(&j.d[1], "h"), &h1);
    for (int s = 60; s <= ignored_at + 50; s++)
        ASSERT_MSG(h1.have[s] && h1.world[s] == 2,
                   "n1's step %d ran on a view of %d", s, h1.world[s]);
    ASSERT(!td_file_has(j.d[1].log, "drained at step"));
    /* Signed, the request is obeyed. */
    char key[MB_KEY_MAX], secret[300];
    ASSERT_OK(mb_key(key, sizeof(key), AUTH_JOB, MB_KEY_DRAIN, "n1", 0, 0));
    char del[600];
    snprintf(del, sizeof(del), "del %s", key);
    ASSERT_EQ(fx_etcdctl(&j.etcd, del), 0);
    snprintf(secret, sizeof(secret), "%s/a", j.secret_dir);
    ASSERT_EQ(ringctl_drain(&j, "n1", secret, out), 0);
    ASSERT_OK(td_wait_file(j.d[1].log, "drained at step", 30000));
    ASSERT_EQ(td_exit_code(j.d[1].pid, 30000), 0);
    j.d[1].pid = 0;
    ASSERT_MSG(last_step(&j, 1) < AUTH_STEPS - 1,
               "n1 trained to the end: the drain came too late to tell");
    expect_exit0(&j, 1);
    expect_exit0(&j, 0);
    static td_hashes_t h0;
    td_read_hashes(td_path(&j.d[0], "h"), &h0);
    ASSERT_EQ(h0.world[AUTH_STEPS - 1], 1);
    ASSERT_EQ(td_stop(&j.d[0], 30000), 0);
    th_rmtree(j.secret_dir);
    return fx_done();
}
