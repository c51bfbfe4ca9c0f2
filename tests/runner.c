/*
 * runner.c - runs every test in its own process group with a timeout.
 *
 *   ringd-tests              run all tests
 *   ringd-tests NAME...      run the named tests (a trailing '*' matches a
 *                            prefix: 'kern_*')
 *   ringd-tests --list       print the test names
 *
 * A test is a function declared with TEST_IMPL(name) in tests/test-*.c; the
 * build collects them into test-list.h. Exit status 0 passes, 77 skips,
 * anything else (a signal, a timeout) fails. A skip's reason
 * (TEST_SKIP_WHY) comes back through a pipe and is printed after
 * "# SKIP". The closing line is
 * "N passed, N failed, N skipped" and the runner exits non-zero on any
 * failure. RINGD_TEST_TIMEOUT (seconds, default 300) bounds each test; a test
 * that runs past it is killed with its whole process group. A test cleans
 * up at exit (atexit): RINGD_TEST_KEEP=1 keeps the daemons' directories
 * (logs, hash logs) and prints where they are.
 */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/task.h"

#define TEST_ENTRY(name) int run_test_##name(void);
#include "test-list.h"
#undef TEST_ENTRY

typedef struct {
    const char *name;
    int (*fn)(void);
} test_entry_t;

#define TEST_ENTRY(name) {#name, run_test_##name},
static const test_entry_t tests[] = {
#include "test-list.h"
};
#undef TEST_ENTRY

/* In a test's process: where test_skip_reason() writes (-1: stderr). */
static int skip_fd = -1;

void test_skip_reason(const char *fmt, ...)
{
    char buf[201];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    for (int i = 0; i < n; i++)
        if (buf[i] == '\n')
            buf[i] = ' ';
    if (skip_fd < 0 || write(skip_fd, buf, (size_t)n) != n)
        fprintf(stderr, "skip: %s\n", buf);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int selected(const char *name, int argc, char **argv)
{
    if (argc == 0)
        return 1;
    for (int i = 0; i < argc; i++)
        if (fnmatch(argv[i], name, 0) == 0)
            return 1;
    return 0;
}

/* Wait for the test's process (bounded), then kill what it left. */
static int run_wait(pid_t pid, double timeout_s, char *why, size_t why_len)
{
    double deadline = now_s() + timeout_s;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            snprintf(why, why_len, "waitpid: %s", strerror(errno));
            return 1;
        }
        if (now_s() > deadline) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            snprintf(why, why_len, "timed out after %.0f s", timeout_s);
            return 1;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* Whatever the test left in its group dies with it. */
    kill(-pid, SIGKILL);

    if (WIFSIGNALED(status)) {
        snprintf(why, why_len, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
        return 1;
    }
    int code = WEXITSTATUS(status);
    if (code == 0 || code == TEST_SKIP)
        return code;
    snprintf(why, why_len, "exit status %d", code);
    return 1;
}

/* What the test wrote to its skip pipe (never blocks: its processes are
 * gone or stuck, and the read end is non-blocking). */
static void read_skip_reason(int fd, char *why, size_t why_len)
{
    ssize_t n = read(fd, why, why_len - 1);
    why[n > 0 ? n : 0] = '\0';
}

/* Returns 0 pass, TEST_SKIP skip, 1 fail; writes a reason on failure or
 * skip. */
static int run_one(const test_entry_t *t, double timeout_s, char *why,
                   size_t why_len)
{
    int skip_pipe[2];
    if (pipe2(skip_pipe, O_CLOEXEC) != 0 ||
        fcntl(skip_pipe[0], F_SETFL, O_NONBLOCK) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork: %s", strerror(errno));
        close(skip_pipe[0]);
        close(skip_pipe[1]);
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        close(skip_pipe[0]);
        skip_fd = skip_pipe[1];
        int rc = t->fn();
        fflush(stdout);
        fflush(stderr);
        exit(rc); /* atexit handlers clean up what the test made */
    }
    setpgid(pid, pid);
    close(skip_pipe[1]);
    int rc = run_wait(pid, timeout_s, why, why_len);
    if (rc == TEST_SKIP)
        read_skip_reason(skip_pipe[0], why, why_len);
    close(skip_pipe[0]);
    return rc;
}

int main(int argc, char **argv)
{
    size_t ntests = sizeof(tests) / sizeof(tests[0]);
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < ntests; i++)
            printf("%s\n", tests[i].name);
        return 0;
    }
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 ||
                     strcmp(argv[1], "-h") == 0)) {
        printf("usage: %s [--list] [NAME|PREFIX*]...\n", argv[0]);
        return 0;
    }

    /* Clients give up on a daemon that went away at once, as they did
     * before they waited for it (30 s by default): the tests that kill a
     * daemon and expect its trainers to end need no 30 s more, and those
     * of the wait (test-dmn-restart.c) set the variable themselves. A
     * value from the caller's environment wins. */
    setenv("RINGD_RECONNECT_S", "0", 0);

    double timeout_s = 300;
    const char *env = getenv("RINGD_TEST_TIMEOUT");
    if (env != NULL && atof(env) > 0)
        timeout_s = atof(env);

    int passed = 0, failed = 0, skipped = 0, n = 0;
    for (size_t i = 0; i < ntests; i++) {
        if (!selected(tests[i].name, argc - 1, argv + 1))
            continue;
        char why[256] = "";
        double t0 = now_s();
        int rc = run_one(&tests[i], timeout_s, why, sizeof(why));
        double ms = (now_s() - t0) * 1000;
        n++;
        if (rc == 0) {
            passed++;
            printf("ok %d - %s (%.0f ms)\n", n, tests[i].name, ms);
        } else if (rc == TEST_SKIP) {
            skipped++;
            printf("ok %d - %s # SKIP%s%s (%.0f ms)\n", n, tests[i].name,
                   why[0] ? " " : "", why, ms);
        } else {
            failed++;
            printf("not ok %d - %s: %s (%.0f ms)\n", n, tests[i].name, why,
                   ms);
        }
        fflush(stdout);
    }
    if (n == 0) {
        fprintf(stderr, "no test matched\n");
        return 2;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
