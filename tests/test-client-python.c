/*
 * The Python binding and trainer.py against a real ringd: 2 trainers reach
 * bitwise identical parameters. Skipped where /usr/bin/python3 lacks numpy,
 * and in sanitizer builds (an ASAN libringd.so cannot be loaded into an
 * uninstrumented python without LD_PRELOAD tricks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

#if defined(__SANITIZE_ADDRESS__)
#define SAN_BUILD 1
#else
#define SAN_BUILD 0
#endif

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
    if (SAN_BUILD || access(py, X_OK) != 0)
        return TEST_SKIP;
    td_daemon_t t;
    td_init(&t, "client-py");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        return TEST_SKIP;
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
