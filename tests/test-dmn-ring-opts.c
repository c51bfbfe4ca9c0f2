/*
 * The job's ring options and per-call wire compression, through real
 * ringd daemons on one real etcd and the UCX ring on loopback: a node
 * configured with other ring options joins a running job and follows the
 * job's (the first view's), and trainers choose bf16 or f16 on the wire
 * for one allreduce next to f32 ones of the same step.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/status.h"
#include "include/ringd.h"
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
} view_wait_t;

/* For td_poll: the view in etcd has one member (n2, alone). */
static int view_of_one(void *arg)
{
    view_wait_t *w = arg;
    char *v = etcd_view(w->c, w->out);
    int one = v != NULL && strstr(v, "[\"n2\",") != NULL &&
              strstr(v, "[\"n0\",") == NULL && strstr(v, "[\"n1\",") == NULL;
    free(v);
    return one;
}

/*
 * n0 and n1 train with the default ring options (1 MiB chunks, one ring,
 * no compression); n2 joins at step 100 configured with 1 KiB chunks, two
 * rings, bf16 on the wire and the grid from 2 nodes: with its own options
 * its messages would have other sizes and channels than its neighbours
 * expect (they drop them, and the step waits for ever). It logs one
 * warning naming each difference and follows the job's: every trainer
 * finishes, the three replicas end bitwise identical, no message is
 * rejected and nobody is evicted (views 1 and 2 only). Then n0 and n1 go:
 * n2 leads and writes the next view with the job's options, not its own.
 */
TEST_IMPL(dmn_ring_opts_join)
{
    enum { STEPS = 2000 };
    cluster_env();
    static cluster_t c = {.n = 3};
    fx_etcd_start(&c.etcd, 0);
    for (int i = 0; i < 2; i++)
        node_init(&c, i, "1", "2");
    for (int i = 0; i < 2; i++)
        c.trainer[i][0] = trainer(&c, i, 0, "2000");
    ASSERT_OK(td_wait_file(td_path(&c.d[0], "h0"), "step 100 ", 60000));
    const char *other[] = {"--ring-chunk-kib", "1", "--ring-wire", "bf16",
                           "--ring-bidirectional", "--ring-grid-min-nodes",
                           "2", NULL};
    rc_flags = other;
    node_init(&c, 2, "1", "1");
    rc_flags = NULL;
    c.trainer[2][0] = trainer(&c, 2, 0, "2000");
    for (int i = 0; i < 3; i++)
        expect_exit0(&c, i, 0, c.trainer[i][0]);

    static td_hashes_t h[3];
    for (int i = 0; i < 3; i++)
        td_read_hashes(td_path(&c.d[i], "h0"), &h[i]);
    ASSERT_EQ(h[0].world[STEPS - 1], 3); /* n2 took part */
    ASSERT_EQ(td_same_hashes(&h[0], &h[1]), STEPS);
    ASSERT_GT(td_same_hashes(&h[0], &h[2]), 0);
    for (int i = 1; i < 3; i++) {
        ASSERT_EQ(h[0].hash[STEPS - 1], h[i].hash[STEPS - 1]);
        ASSERT_EQ(td_param_diff(td_path(&c.d[i], "p0"),
                                td_path(&c.d[0], "p0")), 0);
    }
    const char *warn = "this node's config differs from the job's ring "
                       "options: chunk 1024 B (job's 1048576), "
                       "bidirectional 1 (job's 0), wire bf16 (job's none), "
                       "grid-min-nodes 2 (job's 16); following the job's";
    ASSERT_MSG(td_count(c.d[2].log, warn) == 1, "n2 warned %d times",
               td_count(c.d[2].log, "differs from the job's"));
    ASSERT(td_file_has(c.d[2].log, "the job's ring options: chunk 1048576 "
                                   "B, wire none, bidirectional 0, grid "
                                   "from 16 nodes"));
    for (int i = 0; i < 3; i++) {
        ASSERT_MSG(!td_file_has(c.d[i].log, "rejected message"),
                   "n%d dropped messages of the wrong size", i);
        ASSERT_MSG(!td_file_has(c.d[i].log, "ring backend: view 3"),
                   "n%d saw a third view: someone was evicted", i);
        if (i < 2)
            ASSERT(!td_file_has(c.d[i].log, "differs from the job's"));
    }
    char *v = etcd_view(&c, fx_path(&c.etcd, "view2.json"));
    ASSERT_MSG(v != NULL && strstr(v, "\"opts\":{\"chunk\":1048576,"
                                      "\"bidir\":0,\"wire\":\"none\","
                                      "\"grid_min\":16,") != NULL,
               "view 2: %s", v ? v : "(none)");
    free(v);

    /* n2 alone leads and copies the options into view 3. */
    for (int i = 0; i < 2; i++) {
        th_kill(c.d[i].pid);
        c.d[i].pid = 0;
    }
    view_wait_t w = {&c, fx_path(&c.etcd, "view3.json")};
    ASSERT_MSG(td_poll(view_of_one, &w, 30000) == 0,
               "n2 never wrote a view of its own");
    v = etcd_view(&c, fx_path(&c.etcd, "view3.json"));
    ASSERT_MSG(v != NULL && strstr(v, "\"opts\":{\"chunk\":1048576,"
                                      "\"bidir\":0,\"wire\":\"none\","
                                      "\"grid_min\":16,") != NULL,
               "view 3: %s", v ? v : "(none)");
    free(v);
    ASSERT(td_file_has(c.d[2].log, "mb n2: leader writes view"));
    ASSERT_EQ(td_stop(&c.d[2], 30000), 0);
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
