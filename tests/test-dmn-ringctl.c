/*
 * test-dmn-ringctl.c - ringctl's etcd commands against a real etcd: two
 * members made by the real mb_ code on a loop in this process, the real
 * build/ringctl binary run beside them (the loop keeps turning while it
 * runs, so the members keep their leases), and hostile values put with
 * etcdctl under a second job.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "membership/mb.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/task.h"

typedef struct {
    mb_t *mb;
    int views;
    uint64_t gen;
    int drained;
} ctl_member_t;

static uv_loop_t loop;
static fx_etcd_t etcd_;

static void on_view(const mb_view_t *v, void *data)
{
    ctl_member_t *m = data;
    m->views++;
    m->gen = v->generation;
}

static void on_fenced(int reason, void *data)
{
    (void)reason;
    (void)data;
}

static void on_drain(void *data)
{
    ((ctl_member_t *)data)->drained++;
}

static void on_left(int status, void *data)
{
    (void)status;
    (void)data;
}

static void start_member(ctl_member_t *m, const char *node,
                         const char *host)
{
    memset(m, 0, sizeof(*m));
    mb_config_t cfg = {.job = "ctl", .node = node, .host = host,
                       .addr = "ucx", .addr_len = 3, .slots = 4,
                       .ttl_s = 5, .min_members = 2,
                       .etcd = {.endpoints = etcd_.url}};
    mb_callbacks_t cb = {on_view, on_fenced, on_drain, on_left};
    ASSERT_OK(mb_create(&loop, &cfg, &cb, m, &m->mb));
    ASSERT_OK(mb_start(m->mb));
}

typedef struct {
    pid_t pid;
    int status;
    int done;
} child_t;

static int child_done(void *p)
{
    child_t *c = p;
    if (!c->done && waitpid(c->pid, &c->status, WNOHANG) == c->pid)
        c->done = 1;
    return c->done;
}

/*
 * Run build/ringctl with args (NULL-ended) while the loop turns; output
 * in log. Asserts it exited (no signal, no hang) within 15 s; returns
 * its exit code.
 */
static int ringctl(const char *const *args, const char *log)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    const char *argv[16] = {path};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(log);
    child_t c = {th_spawn((char *const *)argv, log), 0, 0};
    ASSERT_GT(c.pid, 0);
    if (!fx_run_until_fn(&loop, child_done, &c, 15000)) {
        th_kill(c.pid);
        TEST_FAIL_("ringctl %s: no exit within 15 s", args[0]);
    }
    if (!WIFEXITED(c.status)) {
        td_dump(log);
        TEST_FAIL_("ringctl %s: killed by signal %d", args[0],
                   WTERMSIG(c.status));
    }
    return WEXITSTATUS(c.status);
}

static int both_in_view(void *p)
{
    ctl_member_t *m = p;
    return m[0].views > 0 && m[1].views > 0 && m[0].gen == m[1].gen;
}

#define RUN_OK(log, ...)                                                     \
    do {                                                                     \
        const char *a_[] = {__VA_ARGS__, NULL};                              \
        int rc_ = ringctl(a_, log);                                          \
        if (rc_ != 0)                                                        \
            td_dump(log);                                                    \
        ASSERT_EQ(rc_, 0);                                                   \
    } while (0)

#define RUN_RC(log, want, ...)                                               \
    do {                                                                     \
        const char *a_[] = {__VA_ARGS__, NULL};                              \
        int rc_ = ringctl(a_, log);                                          \
        if (rc_ != (want))                                                   \
            td_dump(log);                                                    \
        ASSERT_EQ(rc_, (want));                                              \
    } while (0)

/* members: both nodes, one leader; --json the records. */
static void check_members(const char *log, const char *url)
{
    RUN_OK(log, "--etcd", url, "--job", "ctl", "members");
    ASSERT(td_file_has(log, "NODE"));
    ASSERT(td_file_has(log, "n1 "));
    ASSERT(td_file_has(log, "n2 "));
    ASSERT(td_file_has(log, " h1 "));
    ASSERT(td_file_has(log, " h2 "));
    ASSERT(td_file_has(log, " yes"));
    char pid[32];
    snprintf(pid, sizeof(pid), " %d ", (int)getpid());
    ASSERT(td_file_has(log, pid));
    RUN_OK(log, "--etcd", url, "--job", "ctl", "--json", "members");
    ASSERT(td_file_has(log, "[{"));
    ASSERT(td_file_has(log, "\"node\":\"n1\""));
    ASSERT(td_file_has(log, "\"node\":\"n2\""));
    ASSERT(td_file_has(log, "\"slots\":4"));
    ASSERT(td_file_has(log, "\"leader\":true"));
    ASSERT(td_file_has(log, "\"leader\":false"));
}

/* view: generation >= 1 and both members in ring order; here the job and
 * endpoints come from the environment. */
static void check_view(const char *log, const char *url, uint64_t want_gen)
{
    setenv("RINGD_ETCD", url, 1);
    setenv("RINGD_JOB", "ctl", 1);
    RUN_OK(log, "view");
    unsetenv("RINGD_ETCD");
    unsetenv("RINGD_JOB");
    size_t len;
    char *out = td_read(log, &len);
    ASSERT(out != NULL);
    unsigned long long gen = 0;
    ASSERT_MSG(sscanf(out, "generation %llu", &gen) == 1, "view: %s", out);
    ASSERT_GE(gen, 1);
    ASSERT_EQ(gen, want_gen);
    ASSERT(strstr(out, "n1") != NULL && strstr(out, "n2") != NULL);
    ASSERT(strstr(out, "   0  n1") != NULL);
    ASSERT(strstr(out, "   1  n2") != NULL);
    free(out);
    RUN_OK(log, "--etcd", url, "--job", "ctl", "--json", "view");
    ASSERT(td_file_has(log, "{\"generation\":"));
    ASSERT(td_file_has(log, "\"members\":[[\"n1\","));
}

/* generation and wait-member, the rolling upgrade's wait: a member of a
 * view after GEN returns at once; after the newest one it times out
 * (exit 1, naming the newest); bad arguments are usage errors. */
static void check_wait(const char *log, const char *url, uint64_t gen)
{
    char g[32], before[32];
    snprintf(g, sizeof(g), "%llu", (unsigned long long)gen);
    snprintf(before, sizeof(before), "%llu", (unsigned long long)gen - 1);
    RUN_OK(log, "--etcd", url, "--job", "ctl", "generation");
    char *out = td_read(log, NULL);
    ASSERT(out != NULL);
    ASSERT_MSG(strtoull(out, NULL, 10) == gen, "generation: %s", out);
    free(out);
    RUN_OK(log, "--etcd", url, "--job", "ctl", "wait-member", "n2", before);
    char want[160];
    snprintf(want, sizeof(want), "n2 is a member of view %s (", g);
    ASSERT(td_file_has(log, want));
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "--timeout", "1",
           "wait-member", "n2", g);
    snprintf(want, sizeof(want), "after generation %s within 1 s (the "
             "newest is %s)", g, g);
    ASSERT(td_file_has(log, want));
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "--timeout", "1",
           "wait-member", "n9", "0");
    ASSERT(td_file_has(log, "n9 is not a member of a view after "
                       "generation 0"));
    RUN_RC(log, 2, "--etcd", url, "--job", "ctl", "wait-member", "n2",
           "abc");
    ASSERT(td_file_has(log, "GEN 'abc' is not a generation"));
    RUN_RC(log, 2, "--etcd", url, "--job", "ctl", "wait-member", "n2",
           "-1");
    RUN_RC(log, 2, "--etcd", url, "--job", "ctl", "wait-member", "n2");
    RUN_RC(log, 2, "--etcd", url, "--job", "ctl", "wait-member", "a/b",
           "0");
    RUN_RC(log, 2, "--etcd", url, "--job", "ctl", "--timeout", "0",
           "wait-member", "n2", "0");
    ASSERT(td_file_has(log, "--timeout '0': want seconds, 1..86400"));
    RUN_RC(log, 2, "--etcd", url, "--job", "ctl", "--timeout", "1x",
           "wait-member", "n2", "0");
}

/* No checkpoints yet; drain: an unknown node is refused, n1 gets
 * on_drain. */
static void check_drain(const char *log, const char *url, ctl_member_t *m)
{
    RUN_OK(log, "--etcd", url, "--job", "ctl", "checkpoints");
    ASSERT(td_file_has(log, "no checkpoints"));

    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "drain", "nosuch");
    ASSERT(td_file_has(log, "'nosuch' is not a registered node"));
    ASSERT_EQ(fx_etcdctl(&etcd_, "get /ringd/ctl/drain/nosuch "
                                 "--print-value-only | grep -q ."), 1);
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "drain", "../nodes/n1");
    ASSERT_EQ(m[0].drained, 0);
    RUN_OK(log, "--etcd", url, "--job", "ctl", "drain", "n1");
    ASSERT(td_file_has(log, "drain of n1 requested"));
    ASSERT_MSG(fx_run_until(&loop, &m[0].drained, 5000),
               "n1 did not see its drain request");
    ASSERT_EQ(m[1].drained, 0);
    RUN_OK(log, "--etcd", url, "--job", "ctl", "drain", "n1");
    ASSERT(td_file_has(log, "already requested"));
}

/* checkpoints: a garbage value and a manifest, listed by step. */
static void check_checkpoints(const char *log, const char *url)
{
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/ctl/ckpt/5 'garbage{\x01'"), 0);
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/ctl/ckpt/10 "
                                 "'{\"path\":\"/ck/10\",\"bytes\":7,"
                                 "\"nodes\":[\"n1\"]}'"), 0);
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "checkpoints");
    size_t len;
    char *out = td_read(log, &len);
    ASSERT(out != NULL);
    char *s5 = strstr(out, "step 5  (not a JSON object");
    char *s10 = strstr(out, "step 10  path=/ck/10  bytes=7  nodes=[\"n1\"]");
    ASSERT_MSG(s5 != NULL && s10 != NULL && s5 < s10, "%s", out);
    free(out);
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "--json", "checkpoints");
    ASSERT(td_file_has(log, "{\"step\":5,\"key\":\"/ringd/ctl/ckpt/5\","
                            "\"valid\":false}"));
    ASSERT(td_file_has(log, "\"value\":{\"path\":\"/ck/10\""));
}

/* Hostile values under another job: never a crash, exit 1. */
static void check_hostile(const char *log, const char *url)
{
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/evil/nodes/x '[1,2'"), 0);
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/evil/nodes/y "
                                 "'{\"host\":7,\"slots\":\"a\"}'"), 0);
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/evil/nodes/z "
                                 "'{\"host\":\"hz\",\"slots\":1,"
                                 "\"lease\":\"12\",\"pid\":-1}'"), 0);
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/evil/nodes/ok "
                                 "'{\"host\":\"hok\",\"slots\":2,"
                                 "\"lease\":\"255\"}'"), 0);
    RUN_RC(log, 1, "--etcd", url, "--job", "evil", "members");
    ASSERT(td_file_has(log, "bad node record for 'x'"));
    ASSERT(td_file_has(log, "bad node record for 'y'"));
    ASSERT(td_file_has(log, "bad node record for 'z'"));
    ASSERT(td_file_has(log, "ok "));
    ASSERT(td_file_has(log, " ff "));
    RUN_RC(log, 1, "--etcd", url, "--job", "evil", "view");
    ASSERT(td_file_has(log, "job evil has no view"));
    const char *views[] = {
        "'not json'", "'[]'", "'{\"generation\":0,\"step\":0,"
        "\"members\":[]}'", "'{\"generation\":\"1\",\"step\":0,"
        "\"members\":[]}'", "'{\"generation\":1,\"step\":0,"
        "\"members\":{}}'", "'{\"generation\":1,\"step\":0,"
        "\"members\":[7]}'", "'{\"generation\":1,\"step\":0,"
        "\"members\":[],\"source\":3}'"};
    for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "put /ringd/evil/view %s", views[i]);
        ASSERT_EQ(fx_etcdctl(&etcd_, cmd), 0);
        RUN_RC(log, 1, "--etcd", url, "--job", "evil", "view");
        ASSERT_MSG(td_file_has(log, "bad view of job evil"), "%s",
                   views[i]);
        RUN_RC(log, 1, "--etcd", url, "--job", "evil", "--json", "view");
    }
    RUN_OK(log, "--etcd", url, "--job", "evil", "drain", "x");
    ASSERT(td_file_has(log, "drain of x requested")); /* x is a key */
    ASSERT_EQ(fx_etcdctl(&etcd_, "put /ringd/evil/ckpt/abc ''"), 0);
    RUN_RC(log, 1, "--etcd", url, "--job", "evil", "checkpoints");
    ASSERT(td_file_has(log, "step abc  (not a JSON object: 0 bytes)"));
}

/* Usage errors, then etcd gone: a clear line, exit 1, within the
 * client's timeouts. */
static void check_usage_and_down(const char *log, const char *url)
{
    /* Usage: no job, no etcd, an unknown option. */
    RUN_RC(log, 2, "--etcd", url, "members");
    ASSERT(td_file_has(log, "needs --etcd URLS and --job NAME"));
    ASSERT(td_file_has(log, "Usage: ringctl"));
    RUN_RC(log, 2, "--job", "ctl", "view");
    RUN_RC(log, 2, "--etcd", url, "--job", "a/b", "view");
    RUN_RC(log, 2, "--etcd", "", "--job", "ctl", "checkpoints");

    /* etcd gone: a clear line, exit 1, within the client's timeouts. */
    fx_etcd_kill(&etcd_);
    int64_t t0 = th_now_ms();
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "members");
    ASSERT(td_file_has(log, "cannot reach etcd at http://127.0.0.1:"));
    RUN_RC(log, 1, "--etcd", url, "--job", "ctl", "drain", "n2");
    ASSERT(td_file_has(log, "cannot reach etcd at"));
    ASSERT_LT(th_now_ms() - t0, 10000);
}

TEST_IMPL(dmn_ringctl_etcd)
{
    td_daemon_t t;
    td_init(&t, "dmn-ctl-etcd");
    const char *log = td_path(&t, "ctl.log");
    ASSERT_OK(uv_loop_init(&loop));
    fx_etcd_start(&etcd_, 0);
    const char *url = etcd_.url;
    ctl_member_t m[2];
    start_member(&m[0], "n1", "h1");
    start_member(&m[1], "n2", "h2");
    ASSERT_MSG(fx_run_until_fn(&loop, both_in_view, m, 15000),
               "no view with both members");
    check_members(log, url);
    check_view(log, url, m[0].gen);
    check_wait(log, url, m[0].gen);
    check_drain(log, url, m);
    check_checkpoints(log, url);
    check_hostile(log, url);
    check_usage_and_down(log, url);
    mb_destroy(m[0].mb);
    mb_destroy(m[1].mb);
    fx_loop_drain(&loop);
    ASSERT_OK(uv_loop_close(&loop));
    return fx_done();
}
