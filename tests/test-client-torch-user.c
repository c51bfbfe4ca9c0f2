/*
 * ringd.torch as ordinary PyTorch scripts use it (tests/py/torch_user.py):
 * the LR scheduler, scaler and state_dict extras in elastic.State,
 * on_reset on a world size change, epoch rollover and drop_last,
 * optimizer and model checked both ways, skip_synchronize(), a .grad
 * changed in flight, the reduction ops, and BatchNorm buffers equal on
 * every trainer; tests/py/user_cnn.py, a user-style script, through a
 * join and a kill. Each skips (saying why) where torch cannot be imported.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/py-util.h"
#include "tests/task.h"

/* RINGD_LIB/PYTHONPATH and torch_user.py's path; 0, or TEST_SKIP. */
static int user_env(td_daemon_t *t, const char *name, char *script,
                    size_t len)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_init(t, name);
    if (!have_numpy(py, td_path(t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (!py_imports(py, "import torch", td_path(t, "torch.log")))
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    char lib[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, len, "tests/py/torch_user.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    return 0;
}

/* One trainer: torch_user.py --mode unit passes every check. */
TEST_IMPL(client_python_torch_user_unit)
{
    char script[600];
    td_daemon_t t;
    int rc = user_env(&t, "client-pyuser", script, sizeof(script));
    if (rc != 0)
        return rc;
    ASSERT_OK(td_start(&t, NULL));
    const char *argv[] = {"/usr/bin/python3", script, "--socket", t.sock,
                          "--mode", "unit", NULL};
    const char *log = td_path(&t, "unit.log");
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    rc = td_exit_code(p, 120000);
    td_dump(log);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(log, "PASS torch_user"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* The text after `key` on the first line of path holding it. */
static void field(const char *path, const char *key, char *out, size_t len)
{
    char *s = td_read(path, NULL);
    ASSERT_MSG(s != NULL, "%s missing", path);
    char *hit = strstr(s, key);
    ASSERT_MSG(hit != NULL, "no '%s' in %s", key, path);
    hit += strlen(key);
    size_t n = strcspn(hit, " \n");
    snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), hit);
    free(s);
}

/* The text after `key` on the last line of path holding it. */
static void field_last(const char *path, const char *key, char *out,
                       size_t len)
{
    char *s = td_read(path, NULL);
    ASSERT_MSG(s != NULL, "%s missing", path);
    char *hit = NULL;
    for (char *p = s; (p = strstr(p, key)) != NULL; p++)
        hit = p;
    ASSERT_MSG(hit != NULL, "no '%s' in %s", key, path);
    hit += strlen(key);
    size_t n = strcspn(hit, " \n");
    snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), hit);
    free(s);
}

/*
 * 2 trainers: the ops on rank-dependent gradients, then a BatchNorm model
 * over 20 steps (five epochs of 64 samples in steps of 16): both end
 * with the same state digest (parameters, BatchNorm's running statistics,
 * momentum), the same learning rate, in epoch 4, the fifth (batch()
 * rolled over).
 */
TEST_IMPL(client_python_torch_user_buffers)
{
    char script[600];
    td_daemon_t t;
    int rc = user_env(&t, "client-pyuserb", script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    char log[2][300], out[2][320];
    for (int i = 0; i < 2; i++) {
        ASSERT(snprintf(log[i], sizeof(log[i]), "%s",
                        td_path(&t, i ? "b" : "a")) < (int)sizeof(log[i]));
        ASSERT(snprintf(out[i], sizeof(out[i]), "%s.out", log[i]) <
               (int)sizeof(out[i]));
        const char *argv[] = {"/usr/bin/python3", script, "--socket", t.sock,
                              "--mode", "pair", "--steps", "20", "--log",
                              log[i], NULL};
        p[i] = th_spawn((char *const *)argv, out[i]);
        td_track(p[i]);
    }
    for (int i = 0; i < 2; i++) {
        rc = td_exit_code(p[i], 120000);
        td_dump(out[i]);
        ASSERT_EQ(rc, 0);
    }
    ASSERT(td_file_has(out[0], "ops: avg sum min max and predivide"));
    char da[64], db[64], la[64], lb[64], ea[16];
    field(log[0], "final digest ", da, sizeof(da));
    field(log[1], "final digest ", db, sizeof(db));
    field(log[0], " lr ", la, sizeof(la));
    field(log[1], " lr ", lb, sizeof(lb));
    field(log[0], " epoch ", ea, sizeof(ea));
    ASSERT_STR_EQ(da, db);
    ASSERT_STR_EQ(la, lb);
    ASSERT_EQ(atoi(ea), 4); /* 20 steps of 16 of 64: epochs 0-4 */
    printf("# 2 replicas with BatchNorm: digest %s, lr %s\n", da, la);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* One user_cnn.py trainer logging to `name`; its pid. */
static pid_t cnn_py(td_daemon_t *t, const char *script, const char *name,
                    const char *stop)
{
    char log[300], out[320];
    snprintf(log, sizeof(log), "%s", td_path(t, name));
    snprintf(out, sizeof(out), "%s.out", log);
    const char *argv[] = {"/usr/bin/python3", script, "--mode", "ringd",
                          "--socket", t->sock, "--log", log, "--stop-file",
                          stop, "--pace-ms", "20", NULL};
    pid_t p = th_spawn((char *const *)argv, out);
    td_track(p);
    return p;
}

static int cnn_tool(const char *const *argv, const char *out)
{
    pid_t p = th_spawn((char *const *)argv, out);
    td_track(p);
    int rc = td_exit_code(p, 120000);
    td_dump(out);
    return rc;
}

/*
 * tests/py/user_cnn.py (a residual CNN with BatchNorm and dropout, AdamW
 * with two groups, warm-up + cosine LambdaLR, clipping, bf16 autocast, a
 * DataLoader with 2 workers): 2 trainers, a third joins, one is
 * SIGKILLed, 20 more steps. The survivors end with the same digest
 * (parameters, buffers, AdamW's state) and learning rate; every epoch
 * completed saw each sample once and every step one learning rate; the
 * final loss is within 0.1 of one process on the same global batches
 * (dropout and BatchNorm's statistics of rank 0's share differ).
 */
TEST_IMPL(client_python_torch_user_cnn)
{
    char script[600];
    td_daemon_t t;
    int rc = user_env(&t, "client-pycnn", script, sizeof(script));
    if (rc != 0)
        return rc;
    th_src_path(script, sizeof(script), "tests/py/user_cnn.py");
    if (!py_imports("/usr/bin/python3", "import sklearn.datasets",
                    td_path(&t, "sklearn.log")))
        TEST_SKIP_WHY("sklearn cannot be imported by /usr/bin/python3");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    char stop[300], tmp[320], log[3][300];
    snprintf(stop, sizeof(stop), "%s", td_path(&t, "stop"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", stop);
    for (int i = 0; i < 3; i++)
        snprintf(log[i], sizeof(log[i]), "%s",
                 td_path(&t, (const char *[]){"a", "b", "c"}[i]));
    pid_t a = cnn_py(&t, script, "a", stop);
    pid_t b = cnn_py(&t, script, "b", stop);
    ASSERT_OK(td_wait_file(log[1], "step 5 ", 60000));
    pid_t c = cnn_py(&t, script, "c", stop);
    ASSERT_OK(td_wait_file(log[2], "restored ", 60000));
    ASSERT_OK(td_wait_file(log[2], "world 3 ", 60000));
    kill(a, SIGKILL);
    ASSERT_EQ(td_exit_code(a, 10000), 128 + SIGKILL);
    ASSERT_OK(td_wait_file(log[2], "world 2 ", 60000));
    char now[32];
    field_last(log[2], "\nstep ", now, sizeof(now));
    FILE *f = fopen(tmp, "w");
    ASSERT(f != NULL);
    int last = atoi(now) + 20;
    fprintf(f, "%d\n", last);
    fclose(f);
    ASSERT_OK(rename(tmp, stop));
    ASSERT_EQ(td_exit_code(b, 120000), 0);
    ASSERT_EQ(td_exit_code(c, 120000), 0);
    char db[64], dc[64], lb[64], lc[64], ref[300], nsteps[16];
    field(log[1], "final digest ", db, sizeof(db));
    field(log[2], "final digest ", dc, sizeof(dc));
    field_last(log[1], " lr ", lb, sizeof(lb));
    field_last(log[2], " lr ", lc, sizeof(lc));
    ASSERT_STR_EQ(db, dc);
    ASSERT_STR_EQ(lb, lc);
    const char *chk[] = {"/usr/bin/python3", script, "--check", log[0],
                         log[1], log[2], NULL};
    ASSERT_EQ(cnn_tool(chk, td_path(&t, "check.out")), 0);
    snprintf(ref, sizeof(ref), "%s", td_path(&t, "ref"));
    snprintf(nsteps, sizeof(nsteps), "%d", last);
    const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                           "--steps", nsteps, "--log", ref, NULL};
    ASSERT_EQ(cnn_tool(rargv, td_path(&t, "ref.out")), 0);
    const char *cmp[] = {"/usr/bin/python3", script, "--loss", log[1], ref,
                         "0.1", NULL};
    ASSERT_EQ(cnn_tool(cmp, td_path(&t, "loss.out")), 0);
    printf("# survivors: digest %s, lr %s after %d steps\n", db, lb, last);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
