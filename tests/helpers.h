/*
 * helpers.h - shared plumbing for tests: temp dirs, free ports, child
 * processes that are always reaped, bounded waits. Everything a helper
 * starts is in the test's process group, which the runner kills when the
 * test ends, so nothing outlives a failed test.
 */
#ifndef RINGD_TEST_HELPERS_H
#define RINGD_TEST_HELPERS_H

/* 1 in the sanitizer build (make asan): some figures and timings there
 * are the instrumentation's, not the code's. */
#if defined(__SANITIZE_ADDRESS__)
#define SAN_BUILD 1
#else
#define SAN_BUILD 0
#endif

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Monotonic milliseconds. */
int64_t th_now_ms(void);

/* mkdtemp under $TMPDIR (or /tmp) with the given prefix; caller frees. */
char *th_mkdtemp(const char *prefix);
/* rm -rf path (only paths th_mkdtemp returned are ever passed). */
void th_rmtree(const char *path);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int th_free_port(void);

/*
 * Start argv[0] (a path) with argv; stdout/stderr go to log_path when not
 * NULL (appended). Returns the pid or a negative errno.
 */
pid_t th_spawn(char *const argv[], const char *log_path);

/*
 * Wait for pid for at most timeout_ms. Returns 0 and the wait status, or
 * ST_ETIMEDOUT (the child is left running).
 */
int th_wait(pid_t pid, int64_t timeout_ms, int *status_p);

/* SIGKILL and reap; accepts pid <= 0 as "nothing to do". */
void th_kill(pid_t pid);

/* Directory of the running test binary (for finding sibling binaries). */
const char *th_bindir(void);

/* UCX on loopback only, over tls ("tcp", "tcp,sm"...), quiet logs unless
 * RINGD_LOG_LEVEL says otherwise, and, in the sanitizer build, without
 * UCX's malloc/mmap hooks (they fight ASan's interceptors). */
void th_ucx_loopback(const char *tls);

/* rel (a path from the source tree's top) as seen from the test binary,
 * which lives in build/ or in build/asan/ below it. */
void th_src_path(char *out, size_t len, const char *rel);

#endif /* RINGD_TEST_HELPERS_H */
