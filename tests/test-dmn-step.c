/*
 * The step timeout (--step-timeout) of a real standalone ringd with a real
 * trainer: its timer is armed only while a trainer has its turn in a step,
 * so a trainer resting between steps wakes the daemon never, and one stuck
 * in a step wakes it once, at or after its deadline. And a trainer that
 * goes back to step_begin while its collective is with the backend.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/dmn-util.h"
#include "tests/task.h"

#define TIMEOUT_MS 400

/* 1 once the trainer (our child) is stopped, reaping the stop so each
 * SIGSTOP is seen once. */
static int stopped(void *pid_p)
{
    int st;
    pid_t p = *(pid_t *)pid_p;
    return waitpid(p, &st, WUNTRACED | WNOHANG) == p && WIFSTOPPED(st);
}

typedef struct {
    const td_daemon_t *t;
    double until_s;
} uptime_wait_t;

/* For td_poll: the daemon's own clock reached until_s. */
static int uptime_reached(void *arg)
{
    uptime_wait_t *w = arg;
    return td_metric(w->t, "ringd_uptime_seconds") >= w->until_s;
}

/* The idle time the daemon's step-out line names; -1 when none. */
static long logged_idle_ms(const char *log)
{
    char *s = td_read(log, NULL);
    ASSERT(s != NULL);
    const char *p = strstr(s, "sent nothing for ");
    long ms = p != NULL ? strtol(p + strlen("sent nothing for "), NULL, 10)
                        : -1;
    free(s);
    return ms;
}

/*
 * The trainer rests after step 10 (stopped between steps) while the
 * daemon's clock runs three timeouts on: no trainer has its turn, so the
 * timer never fires and nobody is timed out. Resumed, it stops itself in
 * step 30, after step_begin: the daemon times it out after one wakeup,
 * and the line naming it gives an idle time of at least the timeout. Its
 * step 30 is redone once it is resumed, it runs to the end, and every
 * wakeup of the whole run timed a trainer out.
 */
TEST_IMPL(dmn_step_timeout_one_wakeup)
{
    td_daemon_t t;
    td_init(&t, "dmn-step-timeout");
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", TIMEOUT_MS);
    const char *flags[] = {"--trainers", "1", "--step-timeout", ms, NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *args[] = {"--steps", "100", "--stop-after-step", "10",
                          "--stop-in-step", "30", "--hash-log",
                          td_path(&t, "h0"), NULL};
    const char *tlog = td_path(&t, "t0.log");
    pid_t p = td_trainer(&t, args, tlog);

    ASSERT_MSG(td_poll(stopped, &p, 60000) == 0,
               "the trainer never stopped after step 10");
    uptime_wait_t w = {&t, td_metric(&t, "ringd_uptime_seconds") +
                               3 * TIMEOUT_MS / 1000.0};
    ASSERT_OK(td_poll(uptime_reached, &w, 30000));
    ASSERT_EQ(td_metric(&t, "ringd_step_timeout_wakeups_total"), 0);
    ASSERT_EQ(td_metric(&t, "ringd_trainers_stalled_total"), 0);
    ASSERT_OK(kill(p, SIGCONT));

    ASSERT_MSG(td_poll(stopped, &p, 60000) == 0,
               "the trainer never stopped in step 30");
    int rc = td_wait_file(t.log, "sent nothing for ", 30000);
    if (rc != 0)
        td_dump(t.log);
    ASSERT_MSG(rc == 0, "the daemon never timed the trainer out");
    ASSERT_GE(logged_idle_ms(t.log), TIMEOUT_MS);
    ASSERT_EQ(td_metric(&t, "ringd_trainers_stalled_total"), 1);
    ASSERT_EQ(td_metric(&t, "ringd_step_timeout_wakeups_total"), 1);
    ASSERT_OK(kill(p, SIGCONT));

    rc = td_exit_code(p, 120000);
    if (rc != 0) {
        td_dump(tlog);
        td_dump(t.log);
    }
    ASSERT_EQ(rc, 0);
    static td_hashes_t h;
    td_read_hashes(td_path(&t, "h0"), &h);
    for (int s = 0; s < 100; s++)
        ASSERT_MSG(h.have[s], "step %d not logged", s);
    /* A step slower than the timeout on a loaded machine is a stall too:
     * what must hold is one wakeup per stall, whatever their number. */
    ASSERT_EQ(td_metric(&t, "ringd_step_timeout_wakeups_total"),
              td_metric(&t, "ringd_trainers_stalled_total"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * No step of a superseded view completes: the fake backend finishes the
 * first collective of step 5 with its result while a newer generation has
 * come (what the ring backend sees when a view arrives just after the
 * ring finished, too late for the abort). The daemon drops that result,
 * so the trainer redoes step 5, in the new generation, and applies it
 * once: it ends bitwise where one process without a daemon ends.
 */
TEST_IMPL(dmn_step_fenced_by_generation)
{
    td_daemon_t t;
    td_init(&t, "dmn-step-fence");
    const char *flags[] = {"--trainers", "1", "--backend",
                           "fake:late_view=5", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *args[] = {"--steps", "12", "--hash-log", td_path(&t, "h0"),
                          "--save", td_path(&t, "p0"), NULL};
    const char *tlog = td_path(&t, "t0.log");
    pid_t p = td_trainer(&t, args, tlog);
    int rc = td_exit_code(p, 60000);
    if (rc != 0) {
        td_dump(tlog);
        td_dump(t.log);
    }
    ASSERT_EQ(rc, 0);
    ASSERT_MSG(td_file_has(t.log, "finished on view 1 after view 2 came"),
               "the daemon did not drop the superseded result");
    static td_hashes_t h;
    td_read_hashes(td_path(&t, "h0"), &h);
    ASSERT_EQ(h.nsteps, 12);
    ASSERT_EQ(h.gen[4], 1);
    ASSERT_MSG(h.gen[5] == 2, "step 5 completed in generation %llu, the "
               "superseded view", h.gen[5]);
    const char *ref[] = {"--no-daemon", "--steps", "12", "--save",
                         td_path(&t, "pref"), NULL};
    pid_t r = td_trainer(&t, ref, td_path(&t, "ref.log"));
    ASSERT_EQ(td_exit_code(r, 60000), 0);
    ASSERT_MSG(td_param_diff(td_path(&t, "p0"), td_path(&t, "pref")) == 0,
               "the trainer's parameters differ from one process's");
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * A trainer that goes back to step_begin while its collective is still
 * with the backend: the step is broken, the step_begin is answered once
 * the collective comes back, and the redone step works. The fake backend
 * holds step 1's collective until the test has seen the daemon take the
 * second step_begin (its "restarted step" line), so the order is the one
 * that once left the step BROKEN with nobody to close it.
 */
TEST_IMPL(dmn_step_begin_while_in_flight)
{
    td_daemon_t t;
    td_init(&t, "dmn-step-inflight");
    char spec[600];
    const char *release = td_path(&t, "release");
    snprintf(spec, sizeof(spec), "fake:hold=1@%s", release);
    const char *flags[] = {"--trainers", "1", "--backend", spec, NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    float *buf = ringd_buffer(c, 4 * sizeof(float));
    ASSERT(buf != NULL);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.step, 0);
    buf[0] = 1.0f;
    ASSERT_OK(ringd_allreduce(c, buf, 1, RINGD_F32, RINGD_SUM));
    ASSERT_OK(ringd_step_end(c));

    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.step, 1);
    ringd_handle_t h;
    buf[0] = 2.0f;
    ASSERT_OK(ringd_allreduce_async(c, buf, 1, RINGD_F32, RINGD_SUM, &h));
    ASSERT_OK(td_wait_file(t.log, "holding the collective of step 1",
                           20000));
    td_begin_t b;
    td_begin_start(&b, c);
    ASSERT_OK(td_wait_file(t.log, "restarted step 1 without ending it",
                           20000));
    FILE *f = fopen(release, "w");
    ASSERT(f != NULL);
    fclose(f);
    ASSERT_MSG(td_begin_join(&b, 30000) == 0,
               "step_begin after the held collective was not answered "
               "within 30 s");
    ASSERT_EQ(b.rc, 0);
    ASSERT_EQ(b.v.step, 1);
    ASSERT_EQ(ringd_wait(c, h), RINGD_EINVAL); /* void with its step */

    buf[0] = 3.0f;
    ASSERT_OK(ringd_allreduce(c, buf, 1, RINGD_F32, RINGD_SUM));
    ASSERT(buf[0] == 3.0f);
    ASSERT_OK(ringd_step_end(c));
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.step, 2);
    ASSERT_OK(ringd_step_end(c));
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
