/*
 * The job's ring options, per-call wire compression and buffers taken
 * from under a collective, through real ringd daemons on one real etcd
 * and the UCX ring on loopback: a node configured with other ring options
 * joins a running job and follows the job's (the first view's); trainers
 * choose bf16 or f16 on the wire for one allreduce next to f32 ones of
 * the same step; a trainer that frees or unmaps a buffer under an
 * outstanding collective gets an error and the job goes on.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "include/ringd.h"
#include "job/job_ring-int.h"
#include "membership/mb-int.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/ring-cluster.h"
#include "tests/task.h"

/* The job's view as etcd holds it, or NULL (caller frees). */
static char *etcd_view(cluster_t *c, const char *out)
{
    char *const argv[] = {"/usr/bin/etcdctl", "--endpoints", c->etcd.url,
                          "get", "--print-value-only",
                          "/ringd/ringtest/view", NULL};
    int st = -1;
    unlink(out); /* th_spawn appends */
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return td_read(out, NULL);
}

typedef struct {
    cluster_t *c;
    const char *out;
    const char *node; /* the one member, as the view names it: "n2" */
} view_wait_t;

/* For td_poll: of the nodes n0..n3, the view in etcd names w->node
 * alone. */
static int view_of_one(void *arg)
{
    view_wait_t *w = arg;
    char *v = etcd_view(w->c, w->out);
    char me[16];
    snprintf(me, sizeof(me), "\"%s\"", w->node);
    int one = v != NULL;
    for (int i = 0; one && i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "\"n%d\"", i);
        one = (strstr(v, name) != NULL) == (strcmp(name, me) == 0);
    }
    free(v);
    return one;
}

/* For td_poll: etcd holds no record of node n2. */
static int n2_gone(void *arg)
{
    cluster_t *c = arg;
    char *const argv[] = {"/usr/bin/etcdctl", "--endpoints", c->etcd.url,
                          "get", "--print-value-only",
                          "/ringd/ringtest/nodes/n2", NULL};
    const char *out = fx_path(&c->etcd, "n2.rec");
    int st = -1;
    unlink(out);
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    ASSERT_OK(th_wait(p, 15000, &st));
    size_t len = 0;
    char *rec = td_read(out, &len);
    free(rec);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && len == 0;
}

/* dmn_ring_opts_join's three replicas: no step lost, the same hashes
 * and parameters, n2 in the job to the end. */
static void opts_join_replicas(cluster_t *c, td_hashes_t *h)
{
    enum { STEPS = 2000 };
    for (int i = 0; i < 3; i++)
        td_read_hashes(td_path(&c->d[i], "h0"), &h[i]);
    ASSERT_EQ(h[0].world[STEPS - 1], 3); /* n2 took part */
    /* The join's view change may abort the step in flight on one member
     * after the other finished it: that one logs it, the other gets its
     * state in the REBUILD and never logs it (job/README.md). So: no
     * step lost, the steps both logged the same, at most that one not. */
    for (int s = 0; s < STEPS; s++)
        ASSERT_MSG(h[0].have[s] || h[1].have[s], "step %d lost", s);
    ASSERT_GE(td_same_hashes(&h[0], &h[1]), STEPS - 1);
    ASSERT_GT(td_same_hashes(&h[0], &h[2]), 0);
    for (int i = 1; i < 3; i++) {
        ASSERT_EQ(h[0].hash[STEPS - 1], h[i].hash[STEPS - 1]);
        ASSERT_EQ(td_param_diff(td_path(&c->d[i], "p0"),
                                td_path(&c->d[0], "p0")), 0);
    }
}

/* n2 warned once, naming each difference, and followed the job's
 * options; n0 ignored RINGD_RING_WIRE; nobody was evicted, and no
 * message was rejected. */
static void opts_join_logs(cluster_t *c, const td_hashes_t *h)
{
    enum { STEPS = 2000 };
    const char *warn = "this node's config differs from the job's ring "
                       "options: chunk 1024 B (job's 1048576), "
                       "bidirectional true (job's auto), wire bf16 "
                       "(job's none), "
                       "grid-min-nodes 2 (job's 16), fuse 0 B (job's "
                       "67108864); following the job's";
    ASSERT_MSG(td_count(c->d[2].log, warn) == 1, "n2 warned %d times",
               td_count(c->d[2].log, "differs from the job's"));
    ASSERT(td_file_has(c->d[2].log, "the job's ring options: chunk 1048576 "
                                   "B, wire none, bidirectional auto, grid "
                                   "from 16 nodes"));
    ASSERT(td_file_has(c->d[0].log, "RINGD_RING_WIRE is ignored"));
    /* Nobody was evicted: from n2's first step to the last, n0's steps
     * ran on a view of three. */
    int first = 0;
    while (first < STEPS && !h[2].have[first])
        first++;
    for (int s = first; s < STEPS; s++)
        ASSERT_MSG(h[0].world[s] == 3, "n0's step %d ran on a view of %d",
                   s, h[0].world[s]);
    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(!td_file_has(c->d[i].log, "rejected message"),
                   "n%d dropped messages of the wrong size", i);
        if (i < 2)
            ASSERT(!td_file_has(c->d[i].log, "differs from the job's"));
    }
}

/* Nobody of the job is left: n3 starts it alone, on its own options. */
static void opts_join_fresh(cluster_t *c)
{
    ASSERT_EQ(td_stop(&c->d[2], 30000), 0);
    ASSERT_MSG(td_poll(n2_gone, c, 30000) == 0, "n2's record stays");
    const char *small[] = {"--ring-chunk-kib", "1", NULL};
    rc_flags = small;
    node_init(c, 3, "1", "1");
    rc_flags = NULL;
    view_wait_t w = {c, fx_path(&c->etcd, "view4.json"), "n3"};
    ASSERT_MSG(td_poll(view_of_one, &w, 30000) == 0,
               "n3 never wrote a view of its own");
    char *v = etcd_view(c, fx_path(&c->etcd, "view4.json"));
    ASSERT_MSG(v != NULL && strstr(v, "\"opts\":{\"chunk\":1024,") != NULL,
               "n3's view: %s", v ? v : "(none)");
    free(v);
    ASSERT_EQ(td_stop(&c->d[3], 30000), 0);
}

/*
 * n0 and n1 train with the default ring options (1 MiB chunks, one ring,
 * no compression; n0's RINGD_RING_WIRE=bf16 is ignored, with a
 * warning); n2 joins at step 100 configured with 1 KiB chunks, two
 * rings, bf16 on the wire, the grid from 2 nodes and no fusion by arrival:
 * with its own options its messages would have other sizes and channels
 * than its neighbours expect (and it would not ask when they do) (they drop them, and the step waits for ever). It logs one
 * warning naming each difference and follows the job's: every trainer
 * finishes, the three replicas end bitwise identical, no message is
 * rejected and nobody is evicted (views 1 and 2 only). Then n0 and n1 go:
 * n2 leads and writes the next view with the job's options, not its own.
 * Then n2 goes too, and n3 starts the job anew alone, configured with
 * 1 KiB chunks: its view carries its own options.
 */
TEST_IMPL(dmn_ring_opts_join)
{
    enum { STEPS = 2000 };
    cluster_env();
    static cluster_t c = {.n = 4};
    fx_etcd_start(&c.etcd, 0);
    /* The ring library's variable does not reach ringd's options. */
    setenv("RINGD_RING_WIRE", "bf16", 1);
    node_init(&c, 0, "1", "2");
    unsetenv("RINGD_RING_WIRE");
    node_init(&c, 1, "1", "2");
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "2000");
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 100 ", 60000));
    const char *other[] = {"--ring-chunk-kib", "1", "--ring-wire", "bf16",
                           "--ring-bidirectional", "--ring-grid-min-nodes",
                           "2", "--ring-fuse-kib", "0", NULL};
    rc_flags = other;
    node_init(&c, 2, "1", "1");
    rc_flags = NULL;
    /* n2's trainer stops itself after the last step, so that n2 stays in
     * the job when n0's and n1's trainers end and their nodes step out. */
    rc_stop_after = "1999";
    c.trainer[2][0] = trainer(&c, 2, 0, "2000");
    rc_stop_after = NULL;
    ASSERT_OK(td_wait_file(td_path(&c.d[2], "h0"), "step ", 60000));
    char *v = etcd_view(&c, fx_path(&c.etcd, "view2.json"));
    ASSERT_MSG(v != NULL && strstr(v, "\"opts\":{\"chunk\":1048576,"
                                      "\"bidir\":2,\"wire\":\"none\","
                                      "\"grid_min\":16,") != NULL,
               "view 2: %s", v ? v : "(none)");
    free(v);
    for (int i = 0; i < 2; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);
    int st;
    ASSERT_EQ(waitpid(c.trainer[2][0], &st, WUNTRACED), c.trainer[2][0]);
    ASSERT(WIFSTOPPED(st));

    /* n2 alone leads and copies the options into the next view. */
    for (int i = 0; i < 2; i++) {
        th_kill(c.d[i].pid);
        c.d[i].pid = 0;
    }
    view_wait_t w = {&c, fx_path(&c.etcd, "view3.json"), "n2"};
    ASSERT_MSG(td_poll(view_of_one, &w, 30000) == 0,
               "n2 never wrote a view of its own");
    v = etcd_view(&c, fx_path(&c.etcd, "view3.json"));
    ASSERT_MSG(v != NULL && strstr(v, "\"opts\":{\"chunk\":1048576,"
                                      "\"bidir\":2,\"wire\":\"none\","
                                      "\"grid_min\":16,") != NULL,
               "n2's view: %s", v ? v : "(none)");
    free(v);
    ASSERT(td_file_has(c.d[2].log, "mb n2: leader writes view"));
    ASSERT_EQ(kill(c.trainer[2][0], SIGCONT), 0);
    expect_exit0(&c, 2, 0, c.trainer[2][0]);

    static td_hashes_t h[3];
    opts_join_replicas(&c, h);
    opts_join_logs(&c, h);
    opts_join_fresh(&c);
    return fx_done();
}

/*
 * The view's "opts" object: carried through JSON as the compact text it
 * was given, handed out by mb_view_parse and mb_view_dup, covered by the
 * view's signature, and refused when it is no object or over
 * MB_OPTS_MAX bytes.
 */
TEST_IMPL(mb_view_opts)
{
    mb_member_t m = {"n0", "h0", (const uint8_t *)"", 0, 1, 0x1f, 0};
    mb__view_t v = {.generation = 4, .step = 9, .members = &m,
                    .n_members = 1, .source_index = -1}, back;
    const char *opts = "{\"chunk\":1024,\"wire\":\"bf16\"}";
    ASSERT_OK(mb__view_set_opts(&v, opts));
    char *json = mb__view_json(&v);
    ASSERT(strstr(json, ",\"opts\":{\"chunk\":1024,\"wire\":\"bf16\"}") !=
           NULL);
    ASSERT_OK(mb__view_parse(json, strlen(json), &back));
    ASSERT_STR_EQ(back.opts, opts);
    mb__view_free(&back);
    mb_view_t *pub, *dup;
    const char *why = NULL;
    ASSERT_OK(mb_view_parse(json, strlen(json), &pub, &why));
    ASSERT_STR_EQ(pub->opts, opts);
    ASSERT_OK(mb_view_dup(pub, &dup));
    ASSERT(dup->opts != pub->opts);
    ASSERT_STR_EQ(dup->opts, opts);
    mb_view_free(pub);
    mb_view_free(dup);

    /* Signed with a secret: changing the options breaks the signature. */
    mb_t *mb = calloc(1, sizeof(*mb));
    ASSERT(mb != NULL);
    mb->secret = (uint8_t *)"0123456789abcdef0123";
    mb->secret_len = 20;
    char *sig = mb__text_sign(mb, "view", "/ringd/j/view", json);
    ASSERT(sig != NULL);
    ASSERT_EQ(mb__text_sig_ok(mb, "view", "/k", sig, strlen(sig)), 0);
    ASSERT_EQ(mb__text_sig_ok(mb, "view", "/ringd/j/view", sig,
                              strlen(sig)), 1);
    char *p = strstr(sig, "1024");
    ASSERT(p != NULL);
    p[0] = '2';
    ASSERT_EQ(mb__text_sig_ok(mb, "view", "/ringd/j/view", sig,
                              strlen(sig)), 0);
    free(sig);
    free(mb);

    /* A view without opts has none; bad ones are refused. */
    ASSERT_OK(mb__view_set_opts(&v, NULL));
    json = mb__view_json(&v);
    ASSERT(strstr(json, "opts") == NULL);
    ASSERT_OK(mb__view_parse(json, strlen(json), &back));
    ASSERT(back.opts == NULL);
    mb__view_free(&back);
    free(json);
    const char *head = "{\"generation\":1,\"step\":0,\"hosts\":[],"
                       "\"members\":[],\"joiners\":[],\"opts\":";
    static char big[2 * MB_OPTS_MAX];
    snprintf(big, sizeof(big), "%s{\"x\":\"%0*d\"}}", head, MB_OPTS_MAX, 0);
    char b1[256], b2[256];
    snprintf(b1, sizeof(b1), "%s[1]}", head);
    snprintf(b2, sizeof(b2), "%s\"chunk\"}", head);
    const char *bad[] = {b1, b2, big};
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(mb__view_parse(bad[i], strlen(bad[i]), &back) ==
                       ST_EPROTO, "bad opts %d taken", i);
    return 0;
}

/* ---- per-call wire compression ------------------------------------- */

/* Every client's step_begin (end 0) or step_end (end 1) at once, each on
 * a thread: a step_begin returns once all have asked, a step_end once all
 * nodes ended the step (the commit round). */
static void all_at_once(ringd_client_t **c, int n, int end)
{
    td_begin_t b[MAXN];
    for (int k = 0; k < n; k++)
        (end ? td_end_start : td_begin_start)(&b[k], c[k]);
    for (int k = 0; k < n; k++) {
        ASSERT_OK(td_begin_join(&b[k], 60000));
        ASSERT_EQ(b[k].rc, 0);
        if (!end)
            ASSERT_EQ(b[k].v.world, (uint32_t)n);
    }
}

static void begin_all(ringd_client_t **c, int n)
{
    all_at_once(c, n, 0);
}

static void end_all(ringd_client_t **c, int n)
{
    all_at_once(c, n, 1);
}

/* Trainer k's element i: 1..145, spread over the exponents. */
static float wire_input(int k, int i)
{
    return 1.0f + (float)((i * 37 + k * 101) % 1000) / 7.0f + 1e-4f * i;
}

enum { WN = 3, WL = 3000 };

/* Tensor t of each replica: bitwise equal across them, within tol *
 * sum|x| of the exact sum; returns how many elements differ from ref
 * (NULL: none compared). */
static int check_tensor(float *const *res, int t, double tol,
                        const float *ref, const char *what)
{
    int differ = 0;
    for (int i = 0; i < WL; i++) {
        double exact = 0, mag = 0;
        for (int k = 0; k < WN; k++) {
            exact += wire_input(k, i);
            mag += fabs(wire_input(k, i));
        }
        float got = res[0][t * WL + i];
        for (int k = 1; k < WN; k++)
            ASSERT_MSG(memcmp(&res[k][t * WL + i], &got, 4) == 0,
                       "%s [%d]: replica %d has %.9g, replica 0 %.9g", what,
                       i, k, (double)res[k][t * WL + i], (double)got);
        ASSERT_MSG(fabs(got - exact) <= tol * mag, "%s [%d] = %.9g, exact "
                   "%.9g: off by %.3g, bound %.3g", what, i, (double)got,
                   exact, fabs(got - exact), tol * mag);
        differ += ref != NULL && got != ref[i];
    }
    return differ;
}

/*
 * Per call: in one step of a 3-node job, each trainer issues an f32
 * allreduce, a bf16 one and an f16 one of the same tensor, then a fusion
 * group of a bf16 allreduce and an f32 one. Every result is bitwise the
 * same on the three replicas; the f32 ones are within f32 rounding of the
 * exact sum, the compressed ones within the bound include/ringd.h states
 * (n * 2^-8 * sum|x| bf16, n * 2^-11 f16) and differ from the f32 result
 * (they were compressed). A format for a dtype other than f32, or out of
 * range, is RINGD_EINVAL, and the job goes on.
 */
TEST_IMPL(dmn_ring_wire_per_call)
{
    cluster_env();
    static cluster_t c = {.n = WN};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < WN; i++)
        node_init(&c, i, "1", "3");
    ringd_client_t *cl[WN];
    float *b[WN];
    for (int k = 0; k < WN; k++) {
        ASSERT_OK(ringd_connect(&cl[k], c.d[k].sock, NULL));
        b[k] = ringd_buffer(cl[k], 5 * WL * sizeof(float));
        ASSERT(b[k] != NULL);
        for (int t = 0; t < 5; t++)
            for (int i = 0; i < WL; i++)
                b[k][t * WL + i] = wire_input(k, i);
    }
    begin_all(cl, WN);
    static const ringd_wire_t fmt[4] = {RINGD_WIRE_DEFAULT, RINGD_WIRE_BF16,
                                        RINGD_WIRE_F16, RINGD_WIRE_NONE};
    ringd_handle_t h[WN][6];
    for (int k = 0; k < WN; k++) {
        for (int t = 0; t < 3; t++)
            ASSERT_OK(ringd_allreduce_wire_async(cl[k], b[k] + t * WL, WL,
                                                 RINGD_F32, RINGD_SUM,
                                                 fmt[t], &h[k][t]));
        /* Tensor 3 compressed and tensor 4 not, in one group: two
         * runs, since a run has one format. */
        ASSERT_OK(ringd_group_start(cl[k]));
        ASSERT_OK(ringd_allreduce_wire_async(cl[k], b[k] + 3 * WL, WL,
                                             RINGD_F32, RINGD_SUM,
                                             RINGD_WIRE_BF16, &h[k][3]));
        ASSERT_OK(ringd_allreduce_wire_async(cl[k], b[k] + 4 * WL, WL,
                                             RINGD_F32, RINGD_SUM,
                                             RINGD_WIRE_NONE, &h[k][4]));
        ASSERT_OK(ringd_group_end(cl[k]));
    }
    for (int k = 0; k < WN; k++)
        for (int t = 0; t < 5; t++)
            ASSERT_EQ(ringd_wait(cl[k], h[k][t]), 0);
    static float f32[WL];
    memcpy(f32, b[0], sizeof(f32));
    const double f32_tol = 1e-6, bf16_tol = WN / 256.0 + 1e-6,
                 f16_tol = WN / 2048.0 + 1e-6;
    check_tensor(b, 0, f32_tol, NULL, "f32");
    ASSERT_GT(check_tensor(b, 1, bf16_tol, f32, "bf16"), 0);
    ASSERT_GT(check_tensor(b, 2, f16_tol, f32, "f16"), 0);
    ASSERT_GT(check_tensor(b, 3, bf16_tol, f32, "bf16 in a group"), 0);
    ASSERT_EQ(check_tensor(b, 4, f32_tol, f32, "f32 in a group"), 0);

    for (int k = 0; k < WN; k++) {
        ASSERT_EQ(ringd_allreduce_wire(cl[k], b[k], WL, RINGD_I32,
                                       RINGD_SUM, RINGD_WIRE_BF16),
                  RINGD_EINVAL);
        ASSERT(strstr(ringd_last_error(cl[k]), "f32") != NULL);
        ASSERT_EQ(ringd_allreduce_wire(cl[k], b[k], WL, RINGD_F32,
                                       RINGD_SUM, (ringd_wire_t)7),
                  RINGD_EINVAL);
    }
    end_all(cl, WN);
    /* The next step runs as usual. */
    begin_all(cl, WN);
    for (int k = 0; k < WN; k++)
        for (int i = 0; i < WL; i++)
            b[k][i] = wire_input(k, i);
    for (int k = 0; k < WN; k++)
        ASSERT_OK(ringd_allreduce_wire_async(cl[k], b[k], WL, RINGD_F32,
                                             RINGD_SUM, RINGD_WIRE_F16,
                                             &h[k][0]));
    for (int k = 0; k < WN; k++)
        ASSERT_EQ(ringd_wait(cl[k], h[k][0]), 0);
    end_all(cl, WN);
    ASSERT_GT(check_tensor(b, 0, f16_tol, f32, "f16, next step"), 0);
    for (int k = 0; k < WN; k++) {
        ringd_close(cl[k]);
        ASSERT(!td_file_has(c.d[k].log, "rejected message"));
        ASSERT_EQ(td_stop(&c.d[k], 30000), 0);
    }
    return fx_done();
}

/* ---- a buffer freed or unmapped under a collective ----------------- */

enum { FL = 4 << 20 }; /* 16 MiB of f32 */

static void fill(float *b, int k)
{
    for (int i = 0; i < FL; i++)
        b[i] = (float)((k + 1) * (i % 1000));
}

static void expect_sum(const float *b, const char *what)
{
    for (int i = 0; i < FL; i++)
        ASSERT_MSG(b[i] == (float)(3 * (i % 1000)), "%s [%d] = %g, want %d",
                   what, i, (double)b[i], 3 * (i % 1000));
}

/*
 * Two nodes, one trainer each (the ring runs in the trainers' buffers).
 * Trainer 0 issues an allreduce and, before trainer 1 has issued it (so
 * it is surely outstanding), frees its buffer: RINGD_ESTATE, the buffer
 * stays valid and the allreduce completes on both. Next step it issues
 * again and munmaps the buffer itself: its wait gets RINGD_EINVAL naming
 * the unmapping, while trainer 1 gets the full sum (the daemon reads and
 * writes its own mapping of the buffer). The daemons do not crash: the
 * step after runs on a new buffer, /healthz answers, and both daemons
 * exit cleanly.
 */
TEST_IMPL(dmn_ring_free_outstanding)
{
    cluster_env();
    static cluster_t c = {.n = 2};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    ringd_client_t *cl[2];
    float *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&cl[k], c.d[k].sock, NULL));
        b[k] = ringd_buffer(cl[k], FL * sizeof(float));
        ASSERT(b[k] != NULL);
    }
    ringd_handle_t h[2];

    /* Freed while outstanding: refused. */
    begin_all(cl, 2);
    for (int k = 0; k < 2; k++)
        fill(b[k], k);
    ASSERT_OK(ringd_allreduce_async(cl[0], b[0], FL, RINGD_F32, RINGD_SUM,
                                    &h[0]));
    ASSERT_EQ(ringd_buffer_free(cl[0], b[0]), RINGD_ESTATE);
    ASSERT(strstr(ringd_last_error(cl[0]), "outstanding") != NULL);
    ASSERT_OK(ringd_allreduce_async(cl[1], b[1], FL, RINGD_F32, RINGD_SUM,
                                    &h[1]));
    for (int k = 0; k < 2; k++) {
        ASSERT_EQ(ringd_wait(cl[k], h[k]), 0);
        expect_sum(b[k], k ? "trainer 1, step 0" : "trainer 0, step 0");
    }
    end_all(cl, 2);

    /* Unmapped while outstanding: an error for trainer 0 only. */
    begin_all(cl, 2);
    for (int k = 0; k < 2; k++)
        fill(b[k], k);
    ASSERT_OK(ringd_allreduce_async(cl[0], b[0], FL, RINGD_F32, RINGD_SUM,
                                    &h[0]));
    ASSERT_OK(munmap(b[0], FL * sizeof(float)));
    ASSERT_OK(ringd_allreduce_async(cl[1], b[1], FL, RINGD_F32, RINGD_SUM,
                                    &h[1]));
    ASSERT_EQ(ringd_wait(cl[1], h[1]), 0);
    expect_sum(b[1], "trainer 1, step 1");
    ASSERT_EQ(ringd_wait(cl[0], h[0]), RINGD_EINVAL);
    ASSERT_MSG(strstr(ringd_last_error(cl[0]), "was unmapped") != NULL,
               "error: %s", ringd_last_error(cl[0]));
    end_all(cl, 2);
    ASSERT_OK(ringd_buffer_free(cl[0], b[0]));

    /* The job goes on. */
    b[0] = ringd_buffer(cl[0], FL * sizeof(float));
    ASSERT(b[0] != NULL);
    begin_all(cl, 2);
    for (int k = 0; k < 2; k++) {
        fill(b[k], k);
        ASSERT_OK(ringd_allreduce_async(cl[k], b[k], FL, RINGD_F32,
                                        RINGD_SUM, &h[k]));
    }
    for (int k = 0; k < 2; k++) {
        ASSERT_EQ(ringd_wait(cl[k], h[k]), 0);
        expect_sum(b[k], k ? "trainer 1, step 2" : "trainer 0, step 2");
    }
    end_all(cl, 2);
    for (int k = 0; k < 2; k++)
        ringd_close(cl[k]);
    /* Both still in the first view: nobody was evicted. (A node that
     * stops leaves the view, so stop them only after looking.) */
    for (int k = 0; k < 2; k++) {
        char *hz = td_http_get(c.d[k].metrics_port, "/healthz");
        ASSERT_MSG(hz != NULL, "n%d does not answer /healthz", k);
        free(hz);
        ASSERT(td_file_has(c.d[k].log, "ring backend: view 1"));
        ASSERT(!td_file_has(c.d[k].log, "ring backend: view 2"));
    }
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(td_stop(&c.d[k], 30000), 0);
    return fx_done();
}

/*
 * The lone-chunk split is a job option too: a view that names it is
 * followed, a view from a ringd before the rule (no "split") means whole
 * chunks on every node of that job, whatever this node would do, and a
 * value out of range keeps the options in use.
 */
TEST_IMPL(job_opts_split_from_view)
{
    job_ring_t *b = calloc(1, sizeof(*b));
    ASSERT(b != NULL);
    ring_opts_default(&b->my_opts);
    ASSERT_EQ(b->my_opts.split_lone, 1);
    b->ring_opts = b->my_opts;
    struct {
        const char *opts;
        int split, bidir;
    } cases[] = {
        {"{\"chunk\":1048576,\"bidir\":2,\"wire\":\"none\",\"split\":1}", 1,
         2},
        {"{\"chunk\":1048576,\"bidir\":0,\"wire\":\"none\"}", 0, 0},
        {"{\"chunk\":1048576,\"bidir\":1,\"wire\":\"none\",\"split\":2}", 0,
         0},
        {"{\"chunk\":1048576,\"bidir\":3,\"wire\":\"none\",\"split\":1}", 0,
         0},
        {"{\"chunk\":1048576,\"bidir\":2,\"split\":1}", 1, 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mb_view_t v = {.generation = i + 1, .opts = cases[i].opts};
        job__opts_install(b, &v);
        ASSERT_MSG(b->ring_opts.split_lone == cases[i].split &&
                       b->ring_opts.bidirectional == cases[i].bidir,
                   "case %zu: split %d bidir %d", i, b->ring_opts.split_lone,
                   b->ring_opts.bidirectional);
    }
    job_xopts_t x = {.commit = 1};
    char *json = job__opts_json(&b->my_opts, &x);
    ASSERT(json != NULL && strstr(json, "\"split\":1}") != NULL);
    free(json);
    free(b->opts_seen);
    free(b);
    return 0;
}
