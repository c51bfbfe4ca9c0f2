/*
 * The Python binding and trainer.py against a real ringd: 2 trainers reach
 * bitwise identical parameters, and each exception class is raised where
 * the binding documents it. Skipped where /usr/bin/python3 lacks numpy,
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
#include "tests/task.h"

#if defined(__SANITIZE_ADDRESS__)
#define SAN_BUILD 1
#else
#define SAN_BUILD 0
#endif

/* Why the Python tests cannot run here, or NULL. */
static const char *python_unavailable(const char *py)
{
    if (SAN_BUILD)
        return "sanitizer build: /usr/bin/python3 cannot load an "
               "ASan-instrumented libringd.so without preloading the "
               "sanitizer runtime (the plain build runs these tests)";
    if (access(py, X_OK) != 0)
        return "/usr/bin/python3 is not installed";
    return NULL;
}

static int have_numpy(const char *py, const char *log)
{
    const char *argv[] = {py, "-c", "import numpy", NULL};
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    return td_exit_code(pid, 60000) == 0;
}

/* The source tree: build/ or build/asan/ below it. */
static void src_path(char *out, size_t len, const char *rel)
{
    snprintf(out, len, "%s/../%s", th_bindir(), rel);
    if (access(out, R_OK) != 0)
        snprintf(out, len, "%s/../../%s", th_bindir(), rel);
}

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
    src_path(script, sizeof(script), "examples/trainer.py");
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
    src_path(script, sizeof(script), "tests/client-errors.py");
    src_path(pypath, sizeof(pypath), "client/python");
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
    src_path(script, sizeof(script), "tests/client-fenced.py");
    src_path(pypath, sizeof(pypath), "client/python");
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
    src_path(src, sizeof(src), "client/python");
    src_path(root, sizeof(root), "Makefile");
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

static int py_imports(const char *py, const char *module, const char *log)
{
    const char *argv[] = {py, "-c", module, NULL};
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    return td_exit_code(pid, 60000) == 0;
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
    if (strcmp(part, "torch") == 0 &&
        !py_imports(py, "import torch", td_path(&t, "torch.log"))) {
        td_dump(td_path(&t, "torch.log"));
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    }
    char lib[600], script[600], pypath[600], pid[32];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    src_path(script, sizeof(script), "tests/py/binding.py");
    src_path(pypath, sizeof(pypath), "client/python");
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
 * module boundary, 500 tensors in one step freed after, and
 * allreduce_async_ returning before the peer issued. Skips (and says so)
 * only when torch cannot be imported. */
TEST_IMPL(client_python_torch_tensors)
{
    return run_binding("torch");
}

/* ringd.torch.elastic without a job (tests/py/elastic_unit.py): the
 * ElasticSampler through simulated view changes and redone steps sees
 * every sample of each epoch exactly once; State's tensors are the state
 * region, training through it is bitwise unchanged, another replica
 * restores model, Adam's moments and step, sampler, RNG and extras from
 * its bytes, and another layout is refused. Skips only without torch. */
TEST_IMPL(client_python_elastic_unit)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "client-pyel");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (!py_imports(py, "import torch", td_path(&t, "torch.log"))) {
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    }
    char lib[600], script[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    src_path(script, sizeof(script), "tests/py/elastic_unit.py");
    src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    ASSERT_OK(td_start(&t, NULL));
    const char *argv[] = {py, script, "--socket", t.sock, NULL};
    const char *log = td_path(&t, "elastic.log");
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    int rc = td_exit_code(p, 240000);
    td_dump(log);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(log, "PASS elastic"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* Set up RINGD_LIB/PYTHONPATH and the script path; 0, or TEST_SKIP where
 * torch (or numpy) cannot be imported, saying so. */
static int torch_env(td_daemon_t *t, const char *name, char *script,
                     size_t len)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_init(t, name);
    if (!have_numpy(py, td_path(t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (!py_imports(py, "import torch", td_path(t, "torch.log"))) {
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    }
    char lib[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    src_path(script, len, "tests/py/elastic_train.py");
    src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    return 0;
}

/* elastic_train.py with argv[2..] (NULL-ended) and its log; its pid. */
static pid_t train_py(td_daemon_t *t, const char *script, const char *name,
                      const char *const *extra)
{
    char log[300], out[320], stdo[320];
    snprintf(log, sizeof(log), "%s", td_path(t, name));
    snprintf(out, sizeof(out), "%s.pt", log);
    snprintf(stdo, sizeof(stdo), "%s.out", log);
    const char *argv[32] = {"/usr/bin/python3", script, "--log", log,
                            "--out", out, "--socket", t->sock};
    int n = 8;
    for (int i = 0; extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t p = th_spawn((char *const *)argv, stdo);
    td_track(p);
    return p;
}

static int py_ok(const char *const *argv, const char *log)
{
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    int rc = td_exit_code(p, 120000);
    td_dump(log);
    return rc;
}

/* The text after `key` on the last line of path holding it. */
static void last_field(const char *path, const char *key, char *out,
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
 * 2 trainers x DistributedOptimizer (SGD with momentum, whose update
 * scales with the gradient, so a wrong average shows) reach the
 * parameters of one process on the same global batch: within 1e-5, and
 * with backward_passes_per_step=4 against a 4x batch; bf16 compression
 * within 1e-2 of that (one node: no wire, the daemon reduces in f32; the
 * bf16 wire is client_python_torch_dopt_nodes'). The two replicas are
 * bitwise identical each time.
 */
TEST_IMPL(client_python_torch_dopt)
{
    char script[600];
    td_daemon_t t[3];
    int rc = torch_env(&t[0], "client-pydopt", script, sizeof(script));
    if (rc != 0)
        return rc;
    static const char *cfg[3][4] = {{"1", "none", "1e-5", "plain"},
                                    {"4", "none", "1e-5", "k4"},
                                    {"1", "bf16", "1e-2", "bf16"}};
    const char *flags[] = {"--trainers", "2", NULL};
    for (int i = 0; i < 3; i++) {
        if (i > 0)
            td_init(&t[i], "client-pydopt");
        ASSERT_OK(td_start(&t[i], flags));
        const char *extra[] = {"--mode", "ringd", "--k", cfg[i][0],
                               "--compression", cfg[i][1], "--opt", "sgd",
                               NULL};
        pid_t a = train_py(&t[i], script, "a.log", extra);
        pid_t b = train_py(&t[i], script, "b.log", extra);
        char ref[300];
        snprintf(ref, sizeof(ref), "%s", td_path(&t[i], "ref.pt"));
        const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                               "--k", cfg[i][0], "--opt", "sgd", "--out",
                               ref, NULL};
        ASSERT_EQ(py_ok(rargv, td_path(&t[i], "ref.out")), 0);
        ASSERT_EQ(td_exit_code(a, 120000), 0);
        ASSERT_EQ(td_exit_code(b, 120000), 0);
        char da[64], db[64], pa[300], pb[300];
        last_field(td_path(&t[i], "a.log"), "final digest ", da, sizeof(da));
        last_field(td_path(&t[i], "b.log"), "final digest ", db, sizeof(db));
        ASSERT_STR_EQ(da, db);
        snprintf(pa, sizeof(pa), "%s", td_path(&t[i], "a.log.pt"));
        snprintf(pb, sizeof(pb), "%s", td_path(&t[i], "b.log.pt"));
        const char *c1[] = {"/usr/bin/python3", script, "--compare", pa, ref,
                            cfg[i][2], NULL};
        ASSERT_EQ(py_ok(c1, td_path(&t[i], "cmp1.out")), 0);
        const char *c2[] = {"/usr/bin/python3", script, "--compare", pa, pb,
                            "0", NULL};
        ASSERT_EQ(py_ok(c2, td_path(&t[i], "cmp2.out")), 0);
        printf("# %s: replicas %s, matches one process\n", cfg[i][3], da);
        ASSERT_EQ(td_stop(&t[i], 30000), 0);
    }
    return 0;
}

/*
 * 2 nodes x 2 trainers (etcd, UCX on loopback) x DistributedOptimizer
 * with three fusion buckets: the 4 replicas end bitwise identical and
 * within 1e-5 of one process on the same global batch (the 4 trainers'
 * gradients averaged), with Adam and backward_passes_per_step 1 and 4
 * (against a 4x batch), with SGD (momentum) and 4, and with SGD and bf16
 * compression within 1e-2 of the f32 process (and at least 1e-5 from it:
 * the wire was bf16). Every step of every trainer also checks the overlap
 * (elastic_train.py --check-overlap): a bucket's allreduce was issued
 * before the last gradient hook fired, and only step() waited.
 */
TEST_IMPL(client_python_torch_dopt_nodes)
{
    char script[600];
    td_daemon_t d[2];
    int rc = torch_env(&d[0], "client-pydn-a", script, sizeof(script));
    if (rc != 0)
        return rc;
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t etcd = {0};
    fx_etcd_start(&etcd, 0);
    /* SGD with momentum too: Adam's update hardly changes when every
     * gradient is scaled alike, so a sum instead of an average shows in
     * SGD only. Then the tolerance, and how far at least: the f32 runs
     * end within 2e-7 of one process, so a bf16 run as close never went
     * through bf16. */
    static const char *cfg[4][5] = {{"1", "adam", "none", "1e-5", "0"},
                                    {"4", "adam", "none", "1e-5", "0"},
                                    {"4", "sgd", "none", "1e-5", "0"},
                                    {"1", "sgd", "bf16", "1e-2", "1e-5"}};
    for (int v = 0; v < 4; v++) {
        char job[32];
        snprintf(job, sizeof(job), "pydn%d", v);
        if (v > 0)
            td_init(&d[0], "client-pydn-a");
        td_init(&d[1], "client-pydn-b");
        for (int i = 0; i < 2; i++) {
            d[i].networked = 1;
            const char *flags[] = {"--etcd", etcd.url, "--job", job,
                                   "--node-id", i ? "b" : "a",
                                   "--trainers", "2", "--min-nodes", "2",
                                   NULL};
            ASSERT_OK(td_start(&d[i], flags));
        }
        const char *extra[] = {"--mode", "ringd", "--k", cfg[v][0],
                               "--opt", cfg[v][1],
                               "--compression", cfg[v][2],
                               "--bucket-cap-mb", "0.0004",
                               "--check-overlap", NULL};
        static const char *names[4] = {"t0.log", "t1.log", "t0.log",
                                       "t1.log"};
        pid_t p[4];
        for (int j = 0; j < 4; j++)
            p[j] = train_py(&d[j / 2], script, names[j], extra);
        char ref[300];
        snprintf(ref, sizeof(ref), "%s", td_path(&d[0], "ref.pt"));
        const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                               "--world", "4", "--k", cfg[v][0], "--opt",
                               cfg[v][1], "--out", ref, NULL};
        ASSERT_EQ(py_ok(rargv, td_path(&d[0], "ref.out")), 0);
        char dg[4][64];
        for (int j = 0; j < 4; j++) {
            const char *log = td_path(&d[j / 2], names[j]);
            int code = td_exit_code(p[j], 180000);
            if (code != 0) {
                char out[320];
                snprintf(out, sizeof(out), "%s.out", log);
                td_dump(log);
                td_dump(out);
            }
            ASSERT_EQ(code, 0);
            ASSERT_MSG(td_file_has(log, "overlap checked 30 steps, "
                                   "3 buckets"), "%s: no overlap check",
                       log);
            last_field(log, "final digest ", dg[j], sizeof(dg[j]));
            ASSERT_STR_EQ(dg[j], dg[0]);
        }
        char pa[300];
        snprintf(pa, sizeof(pa), "%s.pt", td_path(&d[1], "t1.log"));
        const char *c1[] = {"/usr/bin/python3", script, "--compare", pa, ref,
                            cfg[v][3], "--differ-by", cfg[v][4], NULL};
        ASSERT_EQ(py_ok(c1, td_path(&d[0], "cmp.out")), 0);
        printf("# k=%s %s %s: 4 replicas %s, match one process\n",
               cfg[v][0], cfg[v][1], cfg[v][2], dg[0]);
        for (int i = 0; i < 2; i++)
            ASSERT_EQ(td_stop(&d[i], 30000), 0);
    }
    return fx_done();
}

/*
 * elastic.run through a trainer killed and one joining: 2 trainers start,
 * a third joins (restored: it gets the model, Adam's moments and step
 * counter, the sampler's position, exactly the state another trainer
 * logged after the step before), one of the first two is SIGKILLed
 * mid-run, the job carries on; on_reset saw the worlds 3 then 2; every
 * epoch completed saw each sample exactly once; the two survivors end
 * bitwise identical.
 */
TEST_IMPL(client_python_elastic_kill_join)
{
    char script[600];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pykill", script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    char stop[300], tmp[320];
    snprintf(stop, sizeof(stop), "%s", td_path(&t, "stop"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", stop);
    const char *extra[] = {"--mode", "ringd", "--pace-ms", "20",
                           "--stop-file", stop, NULL};
    pid_t a = train_py(&t, script, "a.log", extra);
    pid_t b = train_py(&t, script, "b.log", extra);
    ASSERT_OK(td_wait_file(td_path(&t, "b.log"), "step 5 ", 60000));
    pid_t c = train_py(&t, script, "c.log", extra);
    ASSERT_OK(td_wait_file(td_path(&t, "c.log"), "restored ", 60000));
    ASSERT_OK(td_wait_file(td_path(&t, "c.log"), "world 3 ", 60000));
    kill(a, SIGKILL);
    ASSERT_EQ(td_exit_code(a, 10000), 128 + SIGKILL);
    ASSERT_OK(td_wait_file(t.log, "lost at step", 10000));
    ASSERT_OK(td_wait_file(td_path(&t, "c.log"), "world 2 ", 60000));
    /* Stop 20 steps on, at the same step everywhere. */
    char now[32];
    last_field(td_path(&t, "c.log"), "\nstep ", now, sizeof(now));
    FILE *f = fopen(tmp, "w");
    ASSERT(f != NULL);
    fprintf(f, "%d\n", atoi(now) + 20);
    fclose(f);
    ASSERT_OK(rename(tmp, stop));
    ASSERT_EQ(td_exit_code(b, 120000), 0);
    ASSERT_EQ(td_exit_code(c, 120000), 0);

    /* The joiner got the state of the step before it. */
    char rs[32], rd[64], ra[32], want[200];
    last_field(td_path(&t, "c.log"), "restored ", rs, sizeof(rs));
    last_field(td_path(&t, "c.log"), " adam_step ", ra, sizeof(ra));
    (void)ra;
    char *cl = td_read(td_path(&t, "c.log"), NULL);
    ASSERT(cl != NULL);
    char adam[32];
    ASSERT_EQ(sscanf(strstr(cl, "restored "),
                     "restored %*d digest %63s adam_step %31s", rd, adam),
              2);
    free(cl);
    snprintf(want, sizeof(want), "step %d gen ", atoi(rs) - 1);
    char *bl = td_read(td_path(&t, "b.log"), NULL);
    ASSERT(bl != NULL);
    char *line = strstr(bl, want);
    ASSERT_MSG(line != NULL, "b.log lacks '%s'", want);
    char bd[64], ba[32];
    ASSERT_EQ(sscanf(strstr(line, "digest "), "digest %63s adam_step %31s",
                     bd, ba), 2);
    free(bl);
    ASSERT_STR_EQ(rd, bd);
    ASSERT_STR_EQ(adam, ba);
    ASSERT_EQ(atoi(adam), atoi(rs)); /* one Adam step per job step */
    printf("# joiner restored at step %s: digest %s, adam_step %s\n", rs, rd,
           adam);

    char fb[64], fc[64];
    last_field(td_path(&t, "b.log"), "final digest ", fb, sizeof(fb));
    last_field(td_path(&t, "c.log"), "final digest ", fc, sizeof(fc));
    ASSERT_STR_EQ(fb, fc);
    ASSERT(td_file_has(td_path(&t, "b.log"), "resets [3, 2]"));
    char la[300], lb[300], lc[300];
    snprintf(la, sizeof(la), "%s", td_path(&t, "a.log"));
    snprintf(lb, sizeof(lb), "%s", td_path(&t, "b.log"));
    snprintf(lc, sizeof(lc), "%s", td_path(&t, "c.log"));
    const char *chk[] = {"/usr/bin/python3", script, "--check", la, lb, lc,
                         NULL};
    ASSERT_EQ(py_ok(chk, td_path(&t, "check.out")), 0);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * A checkpoint of an elastic.State exported with `python3 -m
 * ringd.torch.export` (decoded and checked by `ringctl dump`): its bytes
 * are the live state a trainer logged after the step before the
 * checkpoint's, and a python without ringd loads it with plain torch.load
 * into a fresh model and Adam (step counter included).
 */
TEST_IMPL(client_python_torch_export)
{
    char script[600];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pyexp", script, sizeof(script));
    if (rc != 0)
        return rc;
    char ckpt[300], exp[300], man[400], live[300];
    snprintf(ckpt, sizeof(ckpt), "%s", td_path(&t, "ckpt"));
    snprintf(live, sizeof(live), "%s", td_path(&t, "a.log.pt.live"));
    snprintf(exp, sizeof(exp), "%s", td_path(&t, "export.pt"));
    /* One checkpoint only, at step 10: with an earlier one still being
     * written (a loaded machine), the daemon would skip step 10's. */
    const char *flags[] = {"--ckpt-interval", "10", "--ckpt-dir", ckpt,
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *extra[] = {"--mode", "ringd", "--steps", "12",
                           "--save-live", "9", NULL};
    pid_t a = train_py(&t, script, "a.log", extra);
    ASSERT_EQ(td_exit_code(a, 120000), 0);
    snprintf(man, sizeof(man),
             "%s/standalone/step-00000000000000000010/MANIFEST.json", ckpt);
    ASSERT_OK(td_wait_file(man, "\"step\"", 30000));
    const char *ex[] = {"/usr/bin/python3", "-m", "ringd.torch.export",
                        "--ckpt-dir", ckpt, "--out", exp, NULL};
    ASSERT_EQ(py_ok(ex, td_path(&t, "export.out")), 0);
    char step[32], digest[64], want[128];
    last_field(td_path(&t, "export.out"), "step ", step, sizeof(step));
    last_field(td_path(&t, "export.out"), "digest ", digest, sizeof(digest));
    ASSERT_STR_EQ(step, "10:");
    snprintf(want, sizeof(want), "digest %s adam_step 10 ", digest);
    ASSERT_MSG(td_file_has(td_path(&t, "a.log"), want), "'%s' not in the "
               "trainer's log", want);
    unsetenv("PYTHONPATH");
    const char *load[] = {"/usr/bin/python3", "-I", "-c",
        "import sys, torch\n"
        "d = torch.load(sys.argv[1])\n"
        "assert 'ringd' not in sys.modules\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),\n"
        "                        torch.nn.Linear(32, 3))\n"
        "m.load_state_dict(d['model'])\n"
        "o = torch.optim.Adam(m.parameters())\n"
        "o.load_state_dict(d['optimizer'])\n"
        "st = o.state[next(m.parameters())]\n"
        "assert float(st['step']) == 10, st['step']\n"
        "assert st['exp_avg'].abs().sum() > 0\n"
        "assert o.param_groups[0]['lr'] == 0.01\n"
        "assert d['step'] == 10 and d['sampler']['processed'] == 40\n"
        "live = torch.load(sys.argv[2])\n"
        "for k, v in live['model'].items():\n"
        "    assert torch.equal(d['model'][k], v), k\n"
        "for i, s in live['optimizer']['state'].items():\n"
        "    for k, v in s.items():\n"
        "        assert torch.equal(d['optimizer']['state'][i][k], v), k\n"
        "print('plain torch.load ok: equals the live state after step 9')",
        exp, live, NULL};
    ASSERT_EQ(py_ok(load, td_path(&t, "load.out")), 0);
    ASSERT(td_file_has(td_path(&t, "load.out"), "plain torch.load ok"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* examples/torch/train.py, the LeNet on digits, through ringd with two
 * trainers for 4 epochs: both finish with the same test accuracy, at least
 * 0.85 (0.92 here). */
TEST_IMPL(client_python_torch_example)
{
    char script[600], ex[600], acc[2][32];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pyex", script, sizeof(script));
    if (rc != 0)
        return rc;
    if (access("/usr/lib/python3/dist-packages/sklearn/datasets/data/"
               "digits.csv.gz", R_OK) != 0)
        TEST_SKIP_WHY("scikit-learn's digits are not installed");
    src_path(ex, sizeof(ex), "examples/torch/train.py");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {"/usr/bin/python3", ex, "--socket", t.sock,
                              "--epochs", "4", NULL};
        p[i] = th_spawn((char *const *)argv, td_path(&t, i ? "b" : "a"));
        td_track(p[i]);
    }
    for (int i = 0; i < 2; i++) {
        int st = td_exit_code(p[i], 180000);
        td_dump(td_path(&t, i ? "b" : "a"));
        ASSERT_EQ(st, 0);
        last_field(td_path(&t, i ? "b" : "a"), "final: test_accuracy ",
                   acc[i], sizeof(acc[i]));
    }
    ASSERT_STR_EQ(acc[0], acc[1]);
    ASSERT_MSG(atof(acc[0]) >= 0.85, "test accuracy %s", acc[0]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A daemon of a ring job (real etcd) with one trainer slot. */
static void ring_node(td_daemon_t *d, fx_etcd_t *et, int i,
                      const char *min_nodes)
{
    static char ids[8][16];
    char name[32];
    snprintf(name, sizeof(name), "client-pyring-n%d", i);
    snprintf(ids[i], sizeof(ids[i]), "n%d", i);
    td_init(d, name);
    d->networked = 1;
    const char *flags[] = {"--etcd", et->url, "--job", "pyring",
                           "--node-id", ids[i], "--trainers", "1",
                           "--lease-ttl", "2", "--min-nodes", min_nodes,
                           NULL};
    ASSERT_OK(td_start(d, flags));
}

/* The joiner's log says it restored a state (parameters and Adam's
 * moments by digest, Adam's step counter) that survivor a or b logged. */
static void joiner_got(const char *joiner, const char *a, const char *b)
{
    char rs[32], rd[64], adam[32], want[128];
    last_field(joiner, "restored ", rs, sizeof(rs));
    char *cl = td_read(joiner, NULL);
    ASSERT(cl != NULL);
    ASSERT_EQ(sscanf(strstr(cl, "restored "),
                     "restored %*d digest %63s adam_step %31s", rd, adam),
              2);
    free(cl);
    snprintf(want, sizeof(want), "digest %s adam_step %s ", rd, adam);
    ASSERT_MSG(td_file_has(a, want) || td_file_has(b, want),
               "no survivor logged '%s'", want);
    printf("# joiner restored at step %s: digest %s, adam_step %s\n", rs, rd,
           adam);
}

/*
 * elastic.run in a real 3-node ring job: a daemon is SIGKILLed mid-epoch
 * (its trainer fails, the other two carry on in a 2-node view), a fourth
 * node joins and its trainer receives the state (Adam's moments and step
 * counter as a survivor logged them); every epoch completed saw each
 * sample exactly once, one of them losing a trainer midway; Adam's step
 * counter is the job's step + 1 on every trainer's every step; the
 * survivors and the joiner end identical.
 */
TEST_IMPL(client_python_ring_kill_join)
{
    char script[600];
    td_daemon_t d[4];
    int rc = torch_env(&d[0], "client-pyring", script, sizeof(script));
    if (rc != 0)
        return rc;
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 0);
    /* In torch_env's dir, which outlives d[0]'s re-init by ring_node. */
    char stop[300], tmp[320];
    snprintf(stop, sizeof(stop), "%s", td_path(&d[0], "stop"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", stop);
    const char *extra[] = {"--mode", "ringd", "--pace-ms", "20",
                           "--stop-file", stop, NULL};
    pid_t p[4];
    for (int i = 0; i < 3; i++) {
        ring_node(&d[i], &et, i, "3");
        p[i] = train_py(&d[i], script, "t.log", extra);
    }
    ASSERT_OK(td_wait_file(td_path(&d[0], "t.log"), "world 3 ", 120000));
    ASSERT_OK(td_wait_file(td_path(&d[0], "t.log"), "step 10 ", 60000));
    th_kill(d[1].pid);
    d[1].pid = 0;
    ASSERT_OK(td_wait_file(td_path(&d[0], "t.log"), "world 2 ", 60000));
    ring_node(&d[3], &et, 3, "1");
    p[3] = train_py(&d[3], script, "t.log", extra);
    ASSERT_OK(td_wait_file(td_path(&d[3], "t.log"), "restored ", 120000));
    ASSERT_OK(td_wait_file(td_path(&d[3], "t.log"), "world 3 ", 60000));
    char now[32];
    last_field(td_path(&d[3], "t.log"), "\nstep ", now, sizeof(now));
    FILE *f = fopen(tmp, "w");
    ASSERT(f != NULL);
    fprintf(f, "%d\n", atoi(now) + 20);
    fclose(f);
    ASSERT_OK(rename(tmp, stop));
    int live[3] = {0, 2, 3};
    for (int k = 0; k < 3; k++) {
        int st = td_exit_code(p[live[k]], 120000);
        if (st != 0)
            td_dump(td_path(&d[live[k]], "t.log.out"));
        ASSERT_EQ(st, 0);
    }
    ASSERT_NE(td_exit_code(p[1], 30000), 0); /* lost its daemon */
    char l[4][300];
    for (int i = 0; i < 4; i++)
        snprintf(l[i], sizeof(l[i]), "%s", td_path(&d[i], "t.log"));
    const char *chk[] = {"/usr/bin/python3", script, "--shrunk", "1",
                         "--check", l[0], l[1], l[2], l[3], NULL};
    ASSERT_EQ(py_ok(chk, td_path(&d[0], "check.out")), 0);
    joiner_got(l[3], l[0], l[2]);
    char f0[64], f2[64], f3[64];
    last_field(l[0], "final digest ", f0, sizeof(f0));
    last_field(l[2], "final digest ", f2, sizeof(f2));
    last_field(l[3], "final digest ", f3, sizeof(f3));
    ASSERT_STR_EQ(f0, f2);
    ASSERT_STR_EQ(f0, f3);
    for (int k = 0; k < 3; k++)
        ASSERT_EQ(td_stop(&d[live[k]], 30000), 0);
    return fx_done();
}
