/*
 * Checkpoints through the daemon: a job killed whole (daemon and trainer
 * SIGKILLed) and started again resumes from its newest complete
 * checkpoint with exactly the parameters an uninterrupted run has, even
 * when the newest checkpoint's primary shard is damaged (it comes from the
 * replica).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* A metric's value in a /metrics body (name with its labels); -1 if
 * absent. */
static double metric_of(const char *m, const char *key)
{
    char want[160];
    snprintf(want, sizeof(want), "\n%s ", key);
    const char *p = m != NULL ? strstr(m, want) : NULL;
    return p != NULL ? strtod(p + strlen(want), NULL) : -1;
}

static pid_t run_trainer(td_daemon_t *t, const char *save, const char *log)
{
    const char *args[] = {"--steps", "150", "--save", save, "--log-every",
                          "50", NULL};
    return td_trainer(t, args, log);
}

/*
 * A job SIGKILLed whole resumes from its newest checkpoint (primary
 * damaged: from the replica) and ends bitwise where an uninterrupted run
 * ends; the restore ran off the main loop.
 */
TEST_IMPL(dmn_ckpt_whole_job_restart)
{
    /* The reference: the same job, never interrupted. */
    td_daemon_t ref;
    td_init(&ref, "dmn-ckpt-ref");
    ASSERT_OK(td_start(&ref, NULL));
    ASSERT_EQ(td_exit_code(run_trainer(&ref, td_path(&ref, "p.ref"),
                                       td_path(&ref, "t.log")), 60000), 0);
    ASSERT_EQ(td_stop(&ref, 30000), 0);

    td_daemon_t t;
    td_init(&t, "dmn-ckpt");
    const char *ck = td_path(&t, "ck");
    char ckdir[512];
    snprintf(ckdir, sizeof(ckdir), "%s", ck);
    const char *flags[] = {"--ckpt-dir", ckdir, "--ckpt-interval", "50",
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t tr = run_trainer(&t, td_path(&t, "p.cut"), td_path(&t, "t1.log"));
    /* Kill the whole job once a checkpoint is complete (the first one
     * cannot be skipped: nothing is in flight before it). */
    if (td_wait_file(t.log, "checkpoint of step 50 complete", 60000) != 0) {
        td_dump(t.log);
        TEST_FAIL_("no checkpoint of step 50");
    }
    th_kill(tr);
    th_kill(t.pid);

    /* Damage the newest checkpoint's primary shard: its replica must do. */
    char root[600], path[700];
    snprintf(root, sizeof(root), "%s/standalone", ckdir);
    uint64_t *steps;
    size_t n;
    ASSERT_OK(ckpt_store_list(root, &steps, &n));
    ASSERT_GE(n, 1);
    uint64_t newest = steps[0];
    free(steps);
    ASSERT_GE(newest, 50);
    char dir[600];
    ASSERT_OK(ckpt_store_step_dir(root, newest, dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/shard-00000.rckp", dir);
    int fd = open(path, O_RDWR);
    ASSERT(fd >= 0);
    unsigned char c;
    ASSERT_EQ(pread(fd, &c, 1, 200), 1);
    c ^= 0xff;
    ASSERT_EQ(pwrite(fd, &c, 1, 200), 1);
    close(fd);

    /* Start the job again: it resumes there and ends where the reference
     * did, bit for bit. */
    ASSERT_OK(td_start(&t, flags));
    pid_t tr2 = run_trainer(&t, td_path(&t, "p.cut"), td_path(&t, "t2.log"));
    int rc = td_exit_code(tr2, 60000);
    if (rc != 0) {
        td_dump(td_path(&t, "t2.log"));
        td_dump(t.log);
    }
    ASSERT_EQ(rc, 0);
    char want[64];
    snprintf(want, sizeof(want), "joined at step %llu",
             (unsigned long long)newest);
    ASSERT(td_file_has(td_path(&t, "t2.log"), want));
    ASSERT(td_file_has(t.log, "1 shard from replicas"));
    /* td_param_diff is relative (below 1): ASSERT_EQ's integer cast
     * would pass any difference. */
    double diff = td_param_diff(td_path(&t, "p.cut"),
                                td_path(&ref, "p.ref"));
    ASSERT_MSG(diff == 0, "restarted run differs by %g", diff);
    /* The restore decoded and copied the state on the pool, and so
     * were the per-step snapshots made: none on the loop's thread. */
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL);
    ASSERT_EQ(metric_of(m, "ringd_state_restores_total"), 1);
    ASSERT_EQ(metric_of(m, "ringd_loop_copy_bytes_total"), 0);
    free(m);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * ringd_checkpoint(): a request after step 4 is carried into the view of
 * step 5, whose end (boundary 6) takes the checkpoint, though the
 * interval is far away; it restores like any other. With checkpoints off
 * the request is refused with RINGD_ENOTSUP and training goes on.
 */
TEST_IMPL(dmn_ckpt_on_request)
{
    td_daemon_t t;
    td_init(&t, "dmn-ckpt-req");
    const char *ck = td_path(&t, "ck");
    char ckdir[512];
    snprintf(ckdir, sizeof(ckdir), "%s", ck);
    const char *flags[] = {"--ckpt-dir", ckdir, "--ckpt-interval", "100000",
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *args[] = {"--steps", "12", "--ckpt-at", "4", NULL};
    char lg[512];
    snprintf(lg, sizeof(lg), "%s", td_path(&t, "t.log"));
    int rc = td_exit_code(td_trainer(&t, args, lg), 60000);
    if (rc != 0)
        td_dump(lg);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(lg, "checkpoint requested after step 4: success"));
    if (td_wait_file(t.log, "checkpoint of step 6 complete", 10000) != 0) {
        td_dump(t.log);
        TEST_FAIL_("no checkpoint of step 6");
    }
    ASSERT_EQ(td_stop(&t, 30000), 0);
    char root[600];
    snprintf(root, sizeof(root), "%s/standalone", ckdir);
    uint64_t *steps;
    size_t n;
    ASSERT_OK(ckpt_store_list(root, &steps, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(steps[0], 6);
    free(steps);
    unsigned bad = 1;
    ASSERT_OK(ckpt_store_verify(root, 6, &bad));
    ASSERT_EQ(bad, 0);

    /* Checkpoints off: refused, training unaffected. */
    td_daemon_t off;
    td_init(&off, "dmn-ckpt-off");
    ASSERT_OK(td_start(&off, NULL));
    snprintf(lg, sizeof(lg), "%s", td_path(&off, "t.log"));
    ASSERT_EQ(td_exit_code(td_trainer(&off, args, lg), 60000), 0);
    ASSERT(td_file_has(lg, "checkpoint requested after step 4: not "));
    ASSERT_EQ(td_stop(&off, 30000), 0);
    return 0;
}

/*
 * The snapshot copy overlaps the next step: the demo trainer writes its
 * parameters (the state region) right after each step's allreduce, while
 * the writers may still be copying the boundary's state. Every checkpoint
 * the store keeps (at least one; how many depends on how many boundaries
 * found the writers idle) must hold exactly the parameters after its
 * step, which the trainer dumps itself (--dump), bit for bit. The copies
 * were made off the main loop (its thread copied no state byte) and the
 * writers' counters account for them.
 */
TEST_IMPL(dmn_ckpt_overlap_exact)
{
    td_daemon_t t;
    td_init(&t, "dmn-ckpt-overlap");
    char ckdir[512], dump[512], lg[512];
    snprintf(ckdir, sizeof(ckdir), "%s", td_path(&t, "ck"));
    snprintf(dump, sizeof(dump), "%s", td_path(&t, "p"));
    snprintf(lg, sizeof(lg), "%s", td_path(&t, "t.log"));
    const char *flags[] = {"--ckpt-dir", ckdir, "--ckpt-interval", "20",
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    /* A little compute per step, so that most boundaries find the
     * writers idle (a busy one skips the checkpoint). */
    const char *args[] = {"--steps", "300", "--step-delay-ms", "2",
                          "--dump", dump, "--dump-every", "20", NULL};
    int rc = td_exit_code(td_trainer(&t, args, lg), 60000);
    if (rc != 0)
        td_dump(lg);
    ASSERT_EQ(rc, 0);
    if (td_wait_file(t.log, "complete (", 30000) != 0) {
        td_dump(t.log);
        TEST_FAIL_("no checkpoint completed");
    }
    ASSERT_OK(td_wait_file(t.log, " written: copies ", 30000));
    char *mt = td_http_get(t.metrics_port, "/metrics");
    ASSERT(mt != NULL);
    ASSERT_EQ(metric_of(mt, "ringd_loop_copy_bytes_total"), 0);
    ASSERT_GE(metric_of(mt, "ringd_checkpoint_shards_written_total"
                            "{shard=\"primary\"}"), 1);
    double copy_s = metric_of(mt, "ringd_checkpoint_shard_copy_seconds_"
                                  "total{shard=\"primary\"}");
    double enc_s = metric_of(mt, "ringd_checkpoint_encode_cpu_seconds_"
                                 "total{shard=\"primary\"}");
    ASSERT_MSG(copy_s > 0 && enc_s > 0, "copy %g s, encode %g s", copy_s,
               enc_s);
    free(mt);
    ASSERT_EQ(td_stop(&t, 30000), 0); /* the writers finish first */

    char root[600];
    snprintf(root, sizeof(root), "%s/standalone", ckdir);
    uint64_t *steps;
    size_t n;
    ASSERT_OK(ckpt_store_list(root, &steps, &n));
    ASSERT_GE(n, 1);
    printf("%zu checkpoints kept, each equal to its step's dump\n", n);
    for (size_t k = 0; k < n; k++) {
        ckpt_manifest_t *m;
        ASSERT_OK(ckpt_store_load_manifest(root, steps[k], &m));
        char want_path[600];
        snprintf(want_path, sizeof(want_path), "%s.%llu", dump,
                 (unsigned long long)steps[k]);
        size_t len;
        char *want = td_read(want_path, &len);
        ASSERT(want != NULL);
        ASSERT_EQ(m->total_size, len);
        ASSERT_EQ(m->nshards, 1);
        char *got = malloc(len);
        ASSERT(got != NULL);
        ASSERT_OK(ckpt_store_read_shard(root, m, 0, got, NULL));
        ASSERT_MSG(memcmp(got, want, len) == 0,
                   "checkpoint of step %llu differs from the parameters "
                   "after that step", (unsigned long long)steps[k]);
        free(got);
        free(want);
        ckpt_manifest_free(m);
    }
    free(steps);
    return 0;
}

typedef struct {
    int port;
} writers_t;

/* For td_poll: no copy queued and no shard being written. */
static int writers_idle(void *arg)
{
    char *m = td_http_get(((writers_t *)arg)->port, "/metrics");
    int idle = m != NULL && metric_of(m, "ringd_checkpoint_writing") == 0;
    free(m);
    return idle;
}

/*
 * A checkpoint every step, of steps without a collective: nothing holds
 * the next step for the copy, so boundaries follow each other while the
 * last one's copy is still queued on the pool. Each boundary takes its
 * checkpoint or skips it, never half of one (a second copy racing the
 * first for the writers failed both), and the loop copies nothing.
 */
TEST_IMPL(dmn_ckpt_empty_steps)
{
    td_daemon_t t;
    td_init(&t, "dmn-ckpt-empty");
    char ckdir[512];
    snprintf(ckdir, sizeof(ckdir), "%s", td_path(&t, "ck"));
    const char *flags[] = {"--ckpt-dir", ckdir, "--ckpt-interval", "1",
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    size_t bytes = 16u << 20;
    unsigned char *st = ringd_buffer(c, bytes);
    ASSERT(st != NULL);
    for (size_t i = 0; i < bytes; i++)
        st[i] = (unsigned char)(i * 2654435761u >> 13);
    ASSERT_OK(ringd_state(c, st, bytes));
    /* Until a few boundaries took one (the first ones skip while the
     * writers' stages are faulted in), with a bound. */
    int steps = 0;
    for (int copied = 0; copied < 3 && steps < 200000; steps++) {
        ringd_view_t v;
        ASSERT_OK(ringd_step_begin(c, &v));
        ASSERT_OK(ringd_step_end(c));
        if (steps % 20 == 19) {
            char *mm = td_http_get(t.metrics_port, "/metrics");
            copied = (int)metric_of(mm, "ringd_checkpoint_copies_total");
            free(mm);
        }
    }
    ringd_close(c);
    writers_t w = {t.metrics_port};
    ASSERT_OK(td_poll(writers_idle, &w, 60000));
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL);
    double copies = metric_of(m, "ringd_checkpoint_copies_total");
    double skipped = metric_of(m, "ringd_checkpoints_skipped_total");
    ASSERT_EQ(metric_of(m, "ringd_checkpoint_failures_total"), 0);
    ASSERT_GE(copies, 3);
    /* Boundaries 1..steps, each copied or skipped. */
    ASSERT_EQ(copies + skipped, steps);
    ASSERT_EQ(metric_of(m, "ringd_loop_copy_bytes_total"), 0);
    free(m);
    ASSERT(!td_file_has(t.log, "not taken"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

static pid_t run_trainer_i(td_daemon_t *t, int i, const char *steps,
                           int round)
{
    char save[32], lg[32];
    snprintf(save, sizeof(save), "p%d", i);
    snprintf(lg, sizeof(lg), "t%d.%d.log", i, round);
    const char *args[] = {"--steps", steps, "--save", td_path(t, save),
                          "--log-every", "10", NULL};
    return td_trainer(t, args, td_path(t, lg));
}

/*
 * Two trainers on a node restart from a checkpoint: the restore decodes
 * into the first one's state on the pool and copies it into the
 * second's there too, so both resume from the same parameters and end
 * bitwise equal, with nothing copied on the loop's thread.
 */
TEST_IMPL(dmn_ckpt_restart_two_trainers)
{
    td_daemon_t t;
    td_init(&t, "dmn-ckpt-two");
    char ckdir[512];
    snprintf(ckdir, sizeof(ckdir), "%s", td_path(&t, "ck"));
    const char *flags[] = {"--trainers", "2", "--ckpt-dir", ckdir,
                           "--ckpt-interval", "20", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++)
        p[i] = run_trainer_i(&t, i, "45", 1);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_exit_code(p[i], 60000), 0);
    writers_t w = {t.metrics_port};
    ASSERT_OK(td_poll(writers_idle, &w, 60000));
    ASSERT_OK(td_wait_file(t.log, "complete (", 30000));
    th_kill(t.pid);
    char root[600];
    snprintf(root, sizeof(root), "%s/standalone", ckdir);
    uint64_t *steps;
    size_t n;
    ASSERT_OK(ckpt_store_list(root, &steps, &n));
    ASSERT_GE(n, 1);
    uint64_t newest = steps[0]; /* 20 or 40: a busy writer skips one */
    free(steps);
    ASSERT(newest == 20 || newest == 40);
    char want[64];
    snprintf(want, sizeof(want), "joined at step %llu",
             (unsigned long long)newest);

    ASSERT_OK(td_start(&t, flags));
    for (int i = 0; i < 2; i++)
        p[i] = run_trainer_i(&t, i, "60", 2);
    for (int i = 0; i < 2; i++) {
        char lg[32];
        snprintf(lg, sizeof(lg), "t%d.2.log", i);
        int rc = td_exit_code(p[i], 60000);
        if (rc != 0)
            td_dump(td_path(&t, lg));
        ASSERT_EQ(rc, 0);
        ASSERT(td_file_has(td_path(&t, lg), want));
    }
    ASSERT(td_file_has(t.log, "job state restored from the checkpoint"));
    double diff = td_param_diff(td_path(&t, "p0"), td_path(&t, "p1"));
    ASSERT_MSG(diff == 0, "the trainers' parameters differ by %g", diff);
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL);
    ASSERT_EQ(metric_of(m, "ringd_loop_copy_bytes_total"), 0);
    free(m);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
