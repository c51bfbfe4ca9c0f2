/*
 * ringrun (client/python/ringrun, ringd/launcher.py) against a real standalone
 * ringd, with tests/py/ringrun_trainer.py as its trainers: their
 * environment, the rank prefix on their output, restarts of a killed
 * trainer up to --max-restarts and giving up beyond, a stop on SIGTERM
 * that ends each trainer after its step with BYE while another trainer's
 * job goes on, the kill after --grace, and every bad flag refused with
 * exit 2. All trainers of a test share one daemon: a killed trainer's
 * replacement joins the node's other trainer at a step boundary and gets
 * the state. Skipped where /usr/bin/python3 lacks numpy, and in sanitizer
 * builds (see tests/py-util.h).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/py-util.h"
#include "tests/task.h"

#define PY "/usr/bin/python3"

/* RINGD_LIB, PYTHONPATH and the trainer script; 0, or TEST_SKIP. */
static int rr_env(td_daemon_t *t, const char *name, char *script, size_t len)
{
    if (python_unavailable(PY) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(PY));
    td_init(t, name);
    if (!have_numpy(PY, td_path(t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by " PY);
    char lib[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, len, "tests/py/ringrun_trainer.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("RINGD_SOCKET");
    return 0;
}

/* client/python/ringrun ARGS (NULL-ended), what make install puts in
 * BINDIR, its output to log. */
static pid_t ringrun(const char *const *args, const char *log)
{
    static char exe[600];
    th_src_path(exe, sizeof(exe), "client/python/ringrun");
    const char *argv[48] = {PY, exe};
    int n = 2;
    for (int i = 0; args[i] != NULL && n < 47; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    return p;
}

/* t->dir/sub, made; in a static buffer of its own. */
static const char *rr_dir(const td_daemon_t *t, const char *sub)
{
    static char d[4][300];
    static int slot;
    char *out = d[slot++ % 4];
    snprintf(out, 300, "%s", td_path(t, sub));
    ASSERT(mkdir(out, 0755) == 0);
    return out;
}

static void touch(const char *dir, const char *name)
{
    char p[400];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ASSERT_MSG(f != NULL, "cannot create %s", p);
    fclose(f);
}

static const char *tlog(const char *dir, int rank)
{
    static char p[4][400];
    static int slot;
    char *out = p[slot++ % 4];
    snprintf(out, 400, "%s/t%d.log", dir, rank);
    return out;
}

/* The number after `key` on the last line of path holding it. */
static long last_num(const char *path, const char *key)
{
    ASSERT(key[0] != '\0');     /* strstr would find "" forever */
    char *s = td_read(path, NULL);
    ASSERT_MSG(s != NULL, "%s missing", path);
    char *hit = NULL;
    for (char *p = s; (p = strstr(p, key)) != NULL; p++)
        hit = p;
    ASSERT_MSG(hit != NULL, "no '%s' in %s", key, path);
    long v = strtol(hit + strlen(key), NULL, 10);
    free(s);
    return v;
}

/* The hash of the "final step S hash H" line of path (caller frees). */
static char *final_line(const char *path)
{
    char *s = td_read(path, NULL);
    ASSERT_MSG(s != NULL, "%s missing", path);
    char *h = strstr(s, "final step ");
    ASSERT_MSG(h != NULL, "no final line in %s", path);
    char *out = strndup(h, strcspn(h, "\n"));
    free(s);
    return out;
}

/* How often needle is in the file at path. */
static int count_in(const char *path, const char *needle)
{
    if (needle[0] == '\0')
        return 0;               /* strstr would find "" forever */
    char *s = td_read(path, NULL);
    int n = 0;
    for (char *p = s; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(s);
    return n;
}

/* For td_poll: the daemon log (a td_daemon_t) says 2 trainers left. */
static int two_left(void *t)
{
    return count_in(((td_daemon_t *)t)->log, ") left\n") >= 2;
}

/* ringrun's exit status within 2 min, its output dumped when not want. */
static void rr_exit(pid_t p, const char *out, int want)
{
    int rc = td_exit_code(p, 120000);
    if (rc != want)
        td_dump(out);
    ASSERT_EQ(rc, want);
}

/*
 * Two trainers under ringrun get LOCAL_RANK, LOCAL_WORLD_SIZE,
 * RINGD_SOCKET, RINGD_JOB, RINGD_LAUNCHER, RINGRUN_RESTART_COUNT and, from
 * --gpus 3,5, CUDA_VISIBLE_DEVICES 3 and 5; their stdout and stderr lines
 * come out prefixed with their rank; the job ends with identical
 * replicas and exit 0. Then --gpus auto with CUDA_VISIBLE_DEVICES=7,9 set
 * and the socket from $RINGD_SOCKET: the trainers get 7 and 9 and no
 * RINGD_JOB.
 */
TEST_IMPL(ringrun_env)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-env", script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *d = rr_dir(&t, "a");
    touch(d, "stop");           /* one step, then the end */
    const char *out = td_path(&t, "rr-a.out");
    const char *args[] = {"--nproc", "2", "--job", "my_job.1", "--gpus",
                          "3,5", "--socket", t.sock, "--", PY, script,
                          "--dir", d, NULL};
    rr_exit(ringrun(args, out), out, 0);
    ASSERT(td_file_has(out, "[0] hello from LOCAL_RANK 0\n"));
    ASSERT(td_file_has(out, "[1] hello from LOCAL_RANK 1\n"));
    ASSERT(td_file_has(out, "[0] err from LOCAL_RANK 0\n"));
    ASSERT(td_file_has(out, "[1] err from LOCAL_RANK 1\n"));
    ASSERT(td_file_has(out, "ringrun: 2 trainers finished (exit 0), "
                            "0 restarts"));
    for (int r = 0; r < 2; r++) {
        char want[600];
        snprintf(want, sizeof(want), "LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 "
                 "RINGD_SOCKET=%s RINGD_JOB=my_job.1 CUDA_VISIBLE_DEVICES=%s "
                 "RINGD_LAUNCHER=1 RINGRUN_RESTART_COUNT=0", r, t.sock,
                 r ? "5" : "3");
        ASSERT_MSG(td_file_has(tlog(d, r), want), "%s lacks %s",
                   tlog(d, r), want);
    }
    char *f0 = final_line(tlog(d, 0)), *f1 = final_line(tlog(d, 1));
    ASSERT_STR_EQ(f0, f1);
    free(f0);
    free(f1);

    const char *e = rr_dir(&t, "b");
    touch(e, "stop");
    setenv("CUDA_VISIBLE_DEVICES", "7,9", 1);
    setenv("RINGD_SOCKET", t.sock, 1);
    const char *out2 = td_path(&t, "rr-b.out");
    const char *args2[] = {"--nproc", "2", "--", PY, script, "--dir", e,
                           NULL};
    rr_exit(ringrun(args2, out2), out2, 0);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("RINGD_SOCKET");
    for (int r = 0; r < 2; r++) {
        char want[600];
        snprintf(want, sizeof(want), "LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 "
                 "RINGD_SOCKET=%s RINGD_JOB=- CUDA_VISIBLE_DEVICES=%s ", r,
                 t.sock, r ? "9" : "7");
        ASSERT_MSG(td_file_has(tlog(e, r), want), "%s lacks %s",
                   tlog(e, r), want);
    }
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * Trainer 1 of 2 killed (SIGKILL) 3 times, each time after it completed
 * a step: ringrun restarts it 3 times (--max-restarts 3), each
 * replacement joins at a step boundary with the job's state, and the job
 * ends with exit 0 and both replicas on the same final hash.
 */
TEST_IMPL(ringrun_restart)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-restart", script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *d = rr_dir(&t, "a");
    const char *out = td_path(&t, "rr.out");
    const char *args[] = {"--nproc", "2", "--max-restarts", "3",
                          "--backoff", "0.05", "--socket", t.sock, "--", PY,
                          script, "--dir", d, "--step-ms", "5", NULL};
    pid_t p = ringrun(args, out);
    const char *t1 = tlog(d, 1);
    for (int i = 0; i < 3; i++) {
        char start[64], stepped[64];
        snprintf(start, sizeof(start), "start restart=%d pid=", i);
        snprintf(stepped, sizeof(stepped), "r%d step ", i);
        ASSERT_OK(td_wait_file(t1, stepped, 60000));
        pid_t victim = (pid_t)last_num(t1, start);
        ASSERT(victim > 0);
        ASSERT_OK(kill(victim, SIGKILL));
        char said[128];
        snprintf(said, sizeof(said), "ringrun: trainer 1 killed by SIGKILL; "
                 "restart %d of 3 within 300 s", i + 1);
        ASSERT_OK(td_wait_file(out, said, 60000));
    }
    ASSERT_OK(td_wait_file(t1, "r3 step ", 60000));
    touch(d, "stop");
    rr_exit(p, out, 0);
    ASSERT(td_file_has(out, "ringrun: 2 trainers finished (exit 0), "
                            "3 restarts"));
    ASSERT(!td_file_has(tlog(d, 0), "start restart=1"));
    char *f0 = final_line(tlog(d, 0)), *f1 = final_line(t1);
    ASSERT_STR_EQ(f0, f1);
    printf("# 3 restarts, replicas identical: %s\n", f0);
    free(f0);
    free(f1);
    ASSERT(td_file_has(t.log, "state restored"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* 2 ring daemons (etcd), a ringrun --nproc n on each (and --trainers n);
 * node b's trainer n-1 is killed 3 times, each replacement joins the job
 * (its node's other trainer stays, or its node comes back into the job)
 * with the job's state, and every trainer ends on the same final hash. */
static int nodes_restart(int n)
{
    td_daemon_t d[2];
    char script[600], nstr[8];
    snprintf(nstr, sizeof(nstr), "%d", n);
    int rc = rr_env(&d[0], "ringrun-na", script, sizeof(script));
    if (rc != 0)
        return rc;
    td_init(&d[1], "ringrun-nb");
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t etcd = {0};
    fx_etcd_start(&etcd, 0);
    for (int i = 0; i < 2; i++) {
        d[i].networked = 1;
        const char *flags[] = {"--etcd", etcd.url, "--job", "rrnodes",
                               "--node-id", i ? "b" : "a", "--min-nodes",
                               "2", "--trainers", nstr, NULL};
        ASSERT_OK(td_start(&d[i], flags));
    }
    const char *dir[2], *out[2];
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        dir[i] = rr_dir(&d[i], "a");
        out[i] = td_path(&d[i], "rr.out");
        const char *args[] = {"--nproc", nstr, "--backoff", "0.05",
                              "--socket", d[i].sock, "--", PY, script,
                              "--dir", dir[i], "--step-ms", "5", NULL};
        p[i] = ringrun(args, out[i]);
    }
    const char *tb = tlog(dir[1], n - 1);
    for (int i = 0; i < 3; i++) {
        char start[64], stepped[64];
        snprintf(start, sizeof(start), "start restart=%d pid=", i);
        snprintf(stepped, sizeof(stepped), "r%d step ", i);
        ASSERT_OK(td_wait_file(tb, stepped, 60000));
        ASSERT_OK(kill((pid_t)last_num(tb, start), SIGKILL));
    }
    ASSERT_OK(td_wait_file(tb, "r3 step ", 60000));
    touch(dir[0], "stop");
    for (int i = 0; i < 2; i++)
        rr_exit(p[i], out[i], 0);
    ASSERT(td_file_has(out[1], "(exit 0), 3 restarts"));
    char *fa = final_line(tlog(dir[0], 0));
    for (int i = 0; i < 2 * n; i++) {
        char *f = final_line(tlog(dir[i / n], i % n));
        ASSERT_STR_EQ(f, fa);
        free(f);
    }
    printf("# 2 nodes x %d, b's trainer %d restarted 3 times: %s\n", n,
           n - 1, fa);
    free(fa);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&d[i], 30000), 0);
    return fx_done();
}

/* One trainer a node: the killed trainer's node leaves and rejoins. */
TEST_IMPL(ringrun_nodes_restart)
{
    return nodes_restart(1);
}

/* Two trainers a node: the replacement joins a node whose other
 * trainer stayed in the job. */
TEST_IMPL(ringrun_nodes2_restart)
{
    return nodes_restart(2);
}

/*
 * Trainer 1 exits with status 3 after every first step: restarted twice
 * (--max-restarts 2), its third exit gives up: ringrun stops trainer 0
 * (which leaves with BYE) and exits 1 naming trainer 1, its status and
 * the count. Trainer 1 exits leaving its client open (--no-close): the
 * ringd package closes it at exit, between two steps, so it too leaves
 * with BYE.
 */
TEST_IMPL(ringrun_give_up)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-giveup", script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *d = rr_dir(&t, "a");
    const char *out = td_path(&t, "rr.out");
    const char *args[] = {"--nproc", "2", "--max-restarts", "2",
                          "--backoff", "0", "--socket", t.sock, "--", PY,
                          script, "--dir", d, "--step-ms", "5",
                          "--fail-rank", "1", "--no-close", NULL};
    rr_exit(ringrun(args, out), out, 1);
    ASSERT(td_file_has(out, "ringrun: trainer 1 exited with status 3; "
                            "restarted 2 times within 300 s "
                            "(--max-restarts 2): giving up\n"));
    ASSERT(td_file_has(tlog(d, 1), "start restart=2 "));
    ASSERT(!td_file_has(tlog(d, 1), "start restart=3 "));
    ASSERT(td_file_has(tlog(d, 0), "stopped: step_begin: the launcher "
                                   "asked this trainer to stop (SIGTERM)"));
    ASSERT(td_file_has(tlog(d, 0), "closed\n"));
    ASSERT(!td_file_has(tlog(d, 1), "closed\n"));
    ASSERT_EQ(count_in(tlog(d, 1), "failing with status 3"), 3);
    ASSERT_EQ(td_stop(&t, 30000), 0); /* its log is complete */
    if (count_in(t.log, ") left\n") != 4)
        td_dump(t.log);
    ASSERT_EQ(count_in(t.log, ") left\n"), 4);
    ASSERT(!td_file_has(t.log, " lost at step "));
    return 0;
}

/*
 * SIGTERM to ringrun while its 2 trainers and another trainer (not under
 * ringrun) train on one daemon: ringrun's trainers end after their step
 * and leave with BYE (the daemon logs "left" for their pids, never
 * "lost"), ringrun exits 143 within --grace saying every trainer left,
 * and the other trainer's job goes on alone (world 1) to its end.
 */
TEST_IMPL(ringrun_sigterm)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-term", script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "3", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *d = rr_dir(&t, "a"), *o = rr_dir(&t, "other");
    setenv("RINGD_SOCKET", t.sock, 1);
    const char *oargv[] = {PY, script, "--dir", o, "--step-ms", "5", NULL};
    pid_t other = th_spawn((char *const *)oargv, td_path(&t, "other.out"));
    td_track(other);
    unsetenv("RINGD_SOCKET");
    const char *out = td_path(&t, "rr.out");
    const char *args[] = {"--nproc", "2", "--grace", "60", "--socket",
                          t.sock, "--", PY, script, "--dir", d, "--step-ms",
                          "5", NULL};
    pid_t p = ringrun(args, out);
    ASSERT_OK(td_wait_file(tlog(o, -1), "world 3 hash", 60000));
    ASSERT_OK(kill(p, SIGTERM));
    rr_exit(p, out, 128 + SIGTERM);
    ASSERT(td_file_has(out, "ringrun: stopped by SIGTERM: every trainer "
                            "left (exit 0)\n"));
    for (int r = 0; r < 2; r++) {
        ASSERT(td_file_has(tlog(d, r), "stopped: step_begin: the launcher "
                                       "asked this trainer to stop "
                                       "(SIGTERM)"));
        ASSERT(td_file_has(tlog(d, r), "closed\n"));
        char left[64];
        long pid = last_num(tlog(d, r), "start restart=0 pid=");
        snprintf(left, sizeof(left), "(pid %ld) left", pid);
        ASSERT_OK(td_wait_file(t.log, left, 30000));
    }
    ASSERT_OK(td_wait_file(tlog(o, -1), "world 1 hash", 60000));
    touch(o, "stop");
    ASSERT_EQ(td_exit_code(other, 60000), 0);
    ASSERT(td_file_has(tlog(o, -1), "final step "));
    if (td_file_has(t.log, " lost at step "))
        td_dump(t.log);
    ASSERT(!td_file_has(t.log, " lost at step "));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * ringd.torch under ringrun (tests/py/elastic_train.py, 2 trainers, each
 * with its LOCAL_RANK in its file names through sh -c exec): SIGTERM to
 * ringrun makes elastic.run return at the next step boundary (ringd.Stopped
 * is a Shutdown), the script writes its final digest and closes, both
 * trainers leave with BYE, ringrun exits 143. Skips without torch.
 */
TEST_IMPL(ringrun_torch_sigterm)
{
    td_daemon_t t;
    char script[600], el[600];
    int rc = rr_env(&t, "ringrun-torch", script, sizeof(script));
    if (rc != 0)
        return rc;
    if (!py_imports(PY, "import torch", td_path(&t, "torch.log")))
        TEST_SKIP_WHY("torch cannot be imported by %s", PY);
    th_src_path(el, sizeof(el), "tests/py/elastic_train.py");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *d = rr_dir(&t, "a");
    char sh[2000];
    snprintf(sh, sizeof(sh), "exec %s %s --mode ringd --log %s/t$LOCAL_RANK"
             ".log --out %s/t$LOCAL_RANK.pt --stop-file %s/never "
             "--pace-ms 20", PY, el, d, d, d);
    const char *out = td_path(&t, "rr.out");
    const char *args[] = {"--nproc", "2", "--socket", t.sock, "--",
                          "/bin/sh", "-c", sh, NULL};
    pid_t p = ringrun(args, out);
    for (int r = 0; r < 2; r++)
        ASSERT_OK(td_wait_file(tlog(d, r), "step 3 gen", 120000));
    ASSERT_OK(kill(p, SIGTERM));
    rr_exit(p, out, 128 + SIGTERM);
    ASSERT(td_file_has(out, "ringrun: stopped by SIGTERM: every trainer "
                            "left (exit 0)\n"));
    for (int r = 0; r < 2; r++) {
        ASSERT_MSG(td_file_has(tlog(d, r), "final digest "),
                   "%s: no final digest", tlog(d, r));
        char pid[32];
        snprintf(pid, sizeof(pid), "[%d] final digest ", r);
        ASSERT(td_file_has(out, pid));
    }
    ASSERT_OK(td_poll(two_left, &t, 30000));
    ASSERT(!td_file_has(t.log, " lost at step "));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * A trainer that ignores SIGTERM is killed once --grace (0.5 s) is over:
 * ringrun exits 143 and says so.
 */
TEST_IMPL(ringrun_grace)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-grace", script, sizeof(script));
    if (rc != 0)
        return rc;
    ASSERT_OK(td_start(&t, NULL));
    const char *out = td_path(&t, "rr.out");
    const char *args[] = {"--nproc", "1", "--grace", "0.5", "--socket",
                          t.sock, "--", PY, "-c",
                          "import signal\n"
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "print('ready', flush=True)\n"
                          "while True: signal.pause()\n", NULL};
    pid_t p = ringrun(args, out);
    ASSERT_OK(td_wait_file(out, "[0] ready\n", 60000));
    ASSERT_OK(kill(p, SIGTERM));
    rr_exit(p, out, 128 + SIGTERM);
    ASSERT(td_file_has(out, "ringrun: stopped by SIGTERM: trainer 0 killed "
                            "after the 0.5 s grace\n"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * What a trainer writes, hostile or odd: a 200000-byte line without a
 * newline comes out in 65536-byte pieces, each prefixed, the last one at
 * the end of the file; a trainer whose child keeps its pipes open after
 * it exited does not hold ringrun up (ringrun exits 0 while the child
 * sleeps on).
 */
TEST_IMPL(ringrun_output)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-out", script, sizeof(script));
    if (rc != 0)
        return rc;
    ASSERT_OK(td_start(&t, NULL));
    const char *out = td_path(&t, "rr.out");
    const char *args[] = {"--nproc", "1", "--socket", t.sock, "--", PY,
                          "-c", "import sys; sys.stdout.write('x' * 200000)",
                          NULL};
    rr_exit(ringrun(args, out), out, 0);
    ASSERT_EQ(count_in(out, "[0] x"), 4);
    char *s = td_read(out, NULL);
    ASSERT(s != NULL);
    char *last = strstr(s, "[0] x");
    for (int i = 0; i < 3; i++) {
        size_t n = strspn(last + 4, "x");
        ASSERT_EQ(n, 65536);
        ASSERT_EQ(last[4 + n], '\n');
        last = strstr(last + 4, "[0] x");
    }
    ASSERT_EQ(strspn(last + 4, "x"), 200000 - 3 * 65536);
    free(s);

    const char *out2 = td_path(&t, "rr2.out");
    char sh[600];
    snprintf(sh, sizeof(sh), "sleep 600 & echo $! > %s; echo bye",
             td_path(&t, "sleeper"));
    const char *args2[] = {"--nproc", "1", "--socket", t.sock, "--",
                           "/bin/sh", "-c", sh, NULL};
    pid_t p = ringrun(args2, out2);
    rr_exit(p, out2, 0);
    char *sp = td_read(td_path(&t, "sleeper"), NULL);
    ASSERT(sp != NULL);
    long sleeper = strtol(sp, NULL, 10);
    free(sp);
    ASSERT(sleeper > 0);
    td_track((pid_t)sleeper);
    ASSERT_EQ(kill((pid_t)sleeper, 0), 0);     /* it still holds the pipe */
    ASSERT(td_file_has(out2, "[0] bye\n"));
    ASSERT(td_file_has(out2, "ringrun: 1 trainer finished (exit 0)"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* Each bad flag or value: exit 2 and this message. "@S" is the
 * daemon's socket, "@C" a trainer command ("--", /bin/true). */
static const char *const bad_flags[][8] = {
    {"argument --nproc: 0 is not in 1..1024", "--nproc", "0", "@C"},
    {"argument --nproc: 1025 is not in 1..1024", "--nproc", "1025", "@C"},
    {"argument --nproc: 'x' is not a number", "--nproc", "x", "@C"},
    {"the following arguments are required: --nproc", "@S", "@C"},
    {"argument --job: 'a/b' is not 1..64 characters of [A-Za-z0-9_.-]",
     "--nproc", "1", "--job", "a/b", "@C"},
    {"argument --job: '' is not", "--nproc", "1", "--job", "", "@C"},
    {"argument --max-restarts: 1001 is not in 0..1000", "--nproc", "1",
     "--max-restarts", "1001", "@C"},
    {"argument --max-restarts: -1 is not in 0..1000", "--nproc", "1",
     "--max-restarts=-1", "@C"},
    {"argument --grace: 3601 is not in 0..3600", "--nproc", "1", "--grace",
     "3601", "@C"},
    {"argument --restart-window: 0 is not in 1..86400", "--nproc", "1",
     "--restart-window", "0", "@C"},
    {"argument --backoff: nan is not in 0..60", "--nproc", "1", "--backoff",
     "nan", "@C"},
    {"argument --gpus: --gpus: a GPU is named twice", "--nproc", "1",
     "--gpus", "1,1", "@C"},
    {"'x' is not a GPU index (0..9999) or a GPU-/MIG- UUID", "--nproc", "1",
     "--gpus", "0,x", "@C"},
    {"ringrun: --nproc 2 but --gpus gives 1 GPU (0); --gpus none runs",
     "--nproc", "2", "--gpus", "0", "@S", "@C"},
    {"ringrun: --socket /nonexistent/s: No such file or directory (is ringd "
     "running?)", "--nproc", "1", "--socket", "/nonexistent/s", "@C"},
    {"ringrun: --socket /: not a socket", "--nproc", "1", "--socket", "/",
     "@C"},
    {"ringrun: --socket: 108 bytes, a Unix socket path holds at most 107",
     "--nproc", "1", "--socket", "@L", "@C"},
    {"no trainer command: put it after --", "--nproc", "1", "@S"},
    {"ringrun: cannot run '/nonexistent/x': not an executable file\n",
     "--nproc", "1", "@S", "--", "/nonexistent/x"},
    {"ringrun: cannot run 'no-such-trainer-cmd': not an executable file on "
     "PATH", "--nproc", "1", "@S", "--", "no-such-trainer-cmd"},
    {"unrecognized arguments: --bogus", "--nproc", "1", "--bogus", "@C"},
};

/* bad_flags[i]'s arguments, the placeholders filled in. */
static void bad_args(int i, const char *sock, const char *longp,
                     const char **args)
{
    int n = 0;
    for (int j = 1; j < 8 && bad_flags[i][j] != NULL; j++) {
        const char *a = bad_flags[i][j];
        if (strcmp(a, "@S") == 0) {
            args[n++] = "--socket";
            args[n++] = sock;
        } else if (strcmp(a, "@C") == 0) {
            args[n++] = "--";
            args[n++] = "/bin/true";
        } else {
            args[n++] = strcmp(a, "@L") == 0 ? longp : a;
        }
    }
    args[n] = NULL;
}

/*
 * Every limit ringrun --help states is enforced: each bad flag or value
 * exits 2 with a message naming it, before any trainer starts; --help
 * states the limits and exits 0.
 */
TEST_IMPL(ringrun_usage)
{
    td_daemon_t t;
    char script[600];
    int rc = rr_env(&t, "ringrun-usage", script, sizeof(script));
    if (rc != 0)
        return rc;
    ASSERT_OK(td_start(&t, NULL));
    char longp[109];
    memset(longp, 'a', 108);
    longp[0] = '/';
    longp[108] = '\0';
    int n = (int)(sizeof(bad_flags) / sizeof(bad_flags[0]));
    for (int i = 0; i < n; i++) {
        const char *args[20];
        bad_args(i, t.sock, longp, args);
        char name[32];
        snprintf(name, sizeof(name), "bad%d.out", i);
        const char *out = td_path(&t, name);
        rr_exit(ringrun(args, out), out, 2);
        ASSERT_MSG(td_file_has(out, bad_flags[i][0]), "case %d: no '%s'",
                   i, bad_flags[i][0]);
        ASSERT(!td_file_has(t.log, "connected"));
    }
    const char *help[] = {"--help", NULL};
    const char *out = td_path(&t, "help.out");
    rr_exit(ringrun(help, out), out, 0);
    static const char *limits[] = {
        "--nproc 1..1024", "--max-restarts 0..1000",
        "--restart-window 1..86400 s", "--grace 0..3600 s",
        "--backoff 0..60 s", "1..107 bytes", "1..64 characters of",
        "exit status: 0 every trainer exited 0"};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++)
        ASSERT_MSG(td_file_has(out, limits[i]), "--help lacks '%s'",
                   limits[i]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
