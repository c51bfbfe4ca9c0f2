/*
 * The Python binding and trainer.py against a real ringd: 2 trainers reach
 * bitwise identical parameters, and each exception class is raised where
 * the binding documents it (the torch ones with a job are in
 * tests/test-client-torch.c). Skipped where /usr/bin/python3 lacks numpy,
 * and in sanitizer builds (an ASAN libringd.so cannot be loaded into an
 * uninstrumented python without LD_PRELOAD tricks).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/py-util.h"
#include "tests/task.h"

static char *last_hash(const char *path)
{
    char *s = td_read(path, NULL);
    ASSERT(s != NULL);
    char *h = strstr(s, "final: test_accuracy");
    ASSERT_MSG(h != NULL, "no final line in %s", path);
    char *out = strndup(h, 48);
    free(s);
    return out;
}

TEST_IMPL(client_python_two_trainers)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "client-py");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    char lib[600], script[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "examples/trainer.py");
    setenv("RINGD_LIB", lib, 1);
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {py, script, "--socket", t.sock, "--steps",
                              "60", "--hash-log",
                              td_path(&t, i ? "h1" : "h0"), NULL};
        p[i] = th_spawn((char *const *)argv,
                        td_path(&t, i ? "t1.log" : "t0.log"));
        td_track(p[i]);
    }
    for (int i = 0; i < 2; i++) {
        int rc = td_exit_code(p[i], 120000);
        if (rc != 0)
            td_dump(td_path(&t, i ? "t1.log" : "t0.log"));
        ASSERT_EQ(rc, 0);
    }
    char *a = last_hash(td_path(&t, "t0.log"));
    char *b = last_hash(td_path(&t, "t1.log"));
    ASSERT_STR_EQ(a, b);
    free(a);
    free(b);
    /* Ranks follow connection order, which the two processes race for. */
    const char *r1 = "step 59 gen 1 rank 1 world 2";
    const char *r0 = "step 59 gen 1 rank 0 world 2";
    int h0_is_0 = td_file_has(td_path(&t, "h0"), r0);
    ASSERT(td_file_has(td_path(&t, h0_is_0 ? "h1" : "h0"), r1));
    ASSERT(td_file_has(td_path(&t, h0_is_0 ? "h0" : "h1"), r0));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * Each documented exception class of the binding, provoked for real
 * (tests/client-errors.py): ringd.Error with ENODAEMON for a socket nobody
 * listens on, ESTATE and EINVAL for calls out of order and arrays outside
 * the shared buffers, Reshape from a view change (the fake backend breaks
 * step 2), Shutdown from step_begin once the daemon drains (SIGTERM), and
 * Disconnected when the daemon dies in the middle of a step. Each check
 * wants the exact class and code.
 */
TEST_IMPL(client_python_errors)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t fake, victim;
    td_init(&fake, "client-py-err");
    td_init(&victim, "client-py-kill");
    if (!have_numpy(py, td_path(&fake, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    char lib[600], script[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "tests/client-errors.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    const char *flags[] = {"--backend", "fake:reshape=2", NULL};
    ASSERT_OK(td_start(&fake, flags));
    ASSERT_OK(td_start(&victim, NULL));
    char fpid[16], vpid[16];
    snprintf(fpid, sizeof(fpid), "%d", (int)fake.pid);
    snprintf(vpid, sizeof(vpid), "%d", (int)victim.pid);
    const char *argv[] = {py, script, fake.sock, fpid, victim.sock, vpid,
                          NULL};
    const char *out = td_path(&fake, "py.log");
    pid_t p = th_spawn((char *const *)argv, out);
    td_track(p);
    int rc = td_exit_code(p, 120000);
    if (rc != 0)
        td_dump(out);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(out, "ok reshape at step 2"));
    ASSERT(td_file_has(out, "ok shutdown"));
    ASSERT(td_file_has(out, "ok daemon killed mid-step"));
    ASSERT(td_file_has(out, "all checks passed"));
    ASSERT_EQ(td_exit_code(fake.pid, 30000), 0); /* drained */
    fake.pid = 0;
    ASSERT_EQ(td_exit_code(victim.pid, 30000), 128 + 9);
    victim.pid = 0;
    return 0;
}

/* 1 once process *pid_p is stopped, reaping the stop. */
static int py_stopped(void *pid_p)
{
    int st;
    pid_t pid = *(pid_t *)pid_p;
    return waitpid(pid, &st, WUNTRACED | WNOHANG) == pid && WIFSTOPPED(st);
}

/*
 * ringd.Fenced for real (tests/client-fenced.py): two ring nodes with a
 * 2 s lease. b's trainer stops itself in step 5 before its allreduce, so
 * a's trainer waits in its step-5 allreduce; then a's daemon is stopped
 * and b's trainer resumed. b evicts a when a's lease expires and goes on
 * alone; on SIGCONT a fences itself and its trainer's allreduce raises
 * exactly ringd.Fenced (code EFENCED). a rejoins as a new member and
 * both trainers stop together at a step from 40 on.
 */
TEST_IMPL(client_python_fenced)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t etcd = {0};
    fx_etcd_start(&etcd, 0);
    td_daemon_t d[2];
    const char *ids[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        td_init(&d[i], i ? "client-pyf-b" : "client-pyf-a");
        d[i].networked = 1;
    }
    if (!have_numpy(py, td_path(&d[0], "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    char lib[600], script[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "tests/client-fenced.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    for (int i = 0; i < 2; i++) {
        const char *flags[] = {"--etcd", etcd.url, "--job", "pyfence",
                               "--node-id", ids[i], "--trainers", "1",
                               "--lease-ttl", "2", "--min-nodes", "2",
                               "--log-level", i ? "info" : "debug", NULL};
        ASSERT_OK(td_start(&d[i], flags));
    }
    pid_t p[2];
    const char *roles[2] = {"fenced", "stop"};
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {py, script, d[i].sock, roles[i], NULL};
        p[i] = th_spawn((char *const *)argv, td_path(&d[i], "py.log"));
        td_track(p[i]);
    }
    ASSERT_MSG(td_poll(py_stopped, &p[1], 60000) == 0,
               "b's trainer never stopped in step 5");
    ASSERT_OK(td_wait_file(d[0].log, "step 5: running -> reducing", 30000));
    ASSERT_OK(kill(d[0].pid, SIGSTOP));
    ASSERT_MSG(td_poll(td_all_stopped, &d[0].pid, 10000) == 0,
               "a's daemon did not stop");
    ASSERT_OK(kill(p[1], SIGCONT));
    ASSERT_OK(td_wait_file(d[1].log, "view 2: 1 member,", 30000));
    ASSERT_OK(kill(d[0].pid, SIGCONT));
    for (int i = 0; i < 2; i++) {
        int rc = td_exit_code(p[i], 60000);
        if (rc != 0) {
            td_dump(td_path(&d[i], "py.log"));
            td_dump(d[i].log);
        }
        ASSERT_EQ(rc, 0);
    }
    ASSERT(td_file_has(td_path(&d[0], "py.log"), "ok fenced"));
    ASSERT(td_file_has(d[0].log, "ring backend: fenced"));
    ASSERT(td_file_has(d[1].log, " 1 joiner"));
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&d[i], 30000), 0);
    return fx_done();
}

/* Run argv to completion (logging to log); its exit status. */
static int run(const char *const *argv, const char *log)
{
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    int rc = td_exit_code(pid, 120000);
    if (rc != 0)
        td_dump(log);
    return rc;
}

/* The package installs with the ordinary tools, offline, and finds
 * libringd.so beside itself or where make install put it, never in the
 * source tree; a wrong RINGD_LIB is a clear error naming it. */
/* make install into a prefix under t's dir: the package found there
 * loads the library from $(PREFIX)/lib. */
static void check_installed(td_daemon_t *t, const char *py, const char *root,
                            const char *log)
{
    char prefix[700], pyset[700], bset[700], pdir[800];
    snprintf(prefix, sizeof(prefix), "PREFIX=%s/prefix", t->dir);
    snprintf(bset, sizeof(bset), "BUILD=%s", th_bindir());
    snprintf(pdir, sizeof(pdir), "%s/prefix/lib/python3/dist-packages",
             t->dir);
    const char *make[] = {"/usr/bin/make", "-s", "-C", root, bset, prefix,
                          "install", NULL};
    ASSERT_EQ(run(make, log), 0);
    snprintf(pyset, sizeof(pyset), "%s/prefix/lib/libringd.so", t->dir);
    setenv("PYTHONPATH", pdir, 1);
    const char *installed[] = {py, "-c",
        "import sys, ringd\n"
        "assert ringd.__file__.startswith(sys.argv[2]), ringd.__file__\n"
        "assert ringd.lib_path == sys.argv[1], ringd.lib_path\n"
        "print('installed ok')", pyset, pdir, NULL};
    ASSERT_EQ(run(installed, log), 0);

}

TEST_IMPL(client_python_package)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "client-pypkg");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    char src[600], root[600], lib[600], venv[600], vpy[700], pip[700];
    th_src_path(src, sizeof(src), "client/python");
    th_src_path(root, sizeof(root), "Makefile");
    *strrchr(root, '/') = '\0';
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    snprintf(venv, sizeof(venv), "%s/venv", t.dir);
    snprintf(vpy, sizeof(vpy), "%s/bin/python", venv);
    snprintf(pip, sizeof(pip), "%s/bin/pip", venv);
    const char *log = td_path(&t, "pkg.log");
    /* A copy: pip builds in the tree it is given. */
    const char *cp[] = {"/bin/cp", "-r", src, td_path(&t, "src"), NULL};
    ASSERT_EQ(run(cp, log), 0);
    const char *mk[] = {py, "-m", "venv", "--system-site-packages", venv,
                        NULL};
    ASSERT_EQ(run(mk, log), 0);
    const char *inst[] = {pip, "install", "--no-index",
                          "--no-build-isolation", "--quiet",
                          td_path(&t, "src"), NULL};
    ASSERT_EQ(run(inst, log), 0);

    /* Beside itself: no RINGD_LIB, no source tree on the path (-I). */
    unsetenv("RINGD_LIB");
    const char *ship[] = {vpy, "-I", "-c",
        "import importlib.util as u, shutil, os, sys\n"
        "shutil.copy(sys.argv[1], os.path.dirname("
        "u.find_spec('ringd').origin))", lib, NULL};
    ASSERT_EQ(run(ship, log), 0);
    const char *beside[] = {vpy, "-I", "-c",
        "import sys, os, ringd\n"
        "assert 'torch' not in sys.modules, 'import ringd pulled in torch'\n"
        "assert ringd.__file__.startswith(sys.argv[1]), ringd.__file__\n"
        "want = os.path.join(os.path.dirname(ringd.__file__), "
        "'libringd.so')\n"
        "assert ringd.lib_path == want, ringd.lib_path\n"
        "print('beside ok')", venv, NULL};
    ASSERT_EQ(run(beside, log), 0);

    check_installed(&t, py, root, log);

    /* A RINGD_LIB that is wrong is the only place looked at. */
    setenv("RINGD_LIB", td_path(&t, "nowhere/libringd.so"), 1);
    const char *wrong[] = {py, "-c",
        "import sys\n"
        "try:\n"
        "    import ringd\n"
        "except OSError as e:\n"
        "    assert sys.argv[1] in str(e), e\n"
        "    print('clear:', e)\n"
        "else:\n"
        "    sys.exit('loaded ' + ringd.lib_path)",
        td_path(&t, "nowhere/libringd.so"), NULL};
    ASSERT_EQ(run(wrong, log), 0);
    ASSERT(td_file_has(log, "beside ok"));
    ASSERT(td_file_has(log, "installed ok"));
    return 0;
}

/* tests/py/binding.py --part part against ringd --trainers 2. */
static int run_binding(const char *part)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "client-pybind");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (strcmp(part, "numpy") != 0 &&
        !py_imports(py, "import torch", td_path(&t, "torch.log"))) {
        td_dump(td_path(&t, "torch.log"));
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    }
    char lib[600], script[600], pypath[600], pid[32];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "tests/py/binding.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    snprintf(pid, sizeof(pid), "%d", (int)t.pid);
    const char *argv[] = {py, script, "--socket", t.sock, "--daemon-pid",
                          pid, "--part", part, NULL};
    const char *log = td_path(&t, "binding.log");
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    int rc = td_exit_code(p, 240000);
    td_dump(log);
    ASSERT_EQ(rc, 0);
    char want[32];
    snprintf(want, sizeof(want), "PASS %s", part);
    ASSERT(td_file_has(log, want));
    /* Bad input was refused in Python: the daemon saw no bad message. */
    ASSERT(!td_file_has(t.log, "rejected message"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* Every ringd dtype from numpy (bf16 as uint16 bits), clear errors for
 * bad arrays, 500 buffers in one step, freed in the daemon when the
 * arrays are dropped. */
TEST_IMPL(client_python_dtypes_and_freeing)
{
    return run_binding("numpy");
}

/* ringd.torch: tensors in ringd memory reduced in place for every dtype,
 * NotContiguous / NotRingdMemory / UnsupportedDtype with the daemon
 * unharmed, a ValueError naming the one parameter that differs across
 * trainers, bf16 compression of a float32 bucket in place (the daemon's
 * wire) and of a float64 one through a cast, a DistributedOptimizer of
 * 200 buckets (past the cap on outstanding handles), buckets split at a
 * module boundary, the same model's optimizer staged (staging=True: .grad
 * outside ringd memory, copied in and back) bitwise equal to the one in
 * ringd memory with 2 passes a step and 3 buckets, bf16 through staging
 * within 1e-2, UnsupportedDevice naming a meta parameter, 500 tensors in
 * one step freed after, and allreduce_async_ returning before the peer
 * issued. Skips (and says so) only when torch cannot be imported. */
TEST_IMPL(client_python_torch_tensors)
{
    return run_binding("torch");
}

/* The CUDA staging logic without a GPU: staging.Device on CPU tensors
 * with torch.cuda faked (tests/py/fake_cuda.py). 2 trainers'
 * DistributedOptimizer through it equals the in-region path bitwise;
 * every transfer is asynchronous, on the side stream, between equal
 * dtypes (the bf16 cast on the device), a copy in only after the side
 * stream waited for the gradient's stream, an allreduce only after its
 * copies were waited for, the caller's stream waits for the copies back;
 * buckets page-locked once and unlocked when collected; elastic.State's
 * staged tensors through the region page-locked once, on the side stream
 * at commit and restore. */
TEST_IMPL(client_python_torch_fake_cuda)
{
    return run_binding("fakecuda");
}

