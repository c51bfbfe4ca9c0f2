#include "tests/helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"

int64_t th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *th_mkdtemp(const char *prefix)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0')
        base = "/tmp";
    char *path = NULL;
    if (asprintf(&path, "%s/%s.XXXXXX", base, prefix) < 0)
        return NULL;
    if (mkdtemp(path) == NULL) {
        free(path);
        return NULL;
    }
    return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag,
                  struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

void th_rmtree(const char *path)
{
    if (path != NULL && path[0] != '\0' && strcmp(path, "/") != 0)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The first port of the kernel's ephemeral range (connect()s and bind()s
 * to port 0 take theirs from it); 32768 when it cannot be read. */
static int ephemeral_low(void)
{
    int low = 32768, high;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%d %d", &low, &high) != 2)
            low = 32768;
        fclose(f);
    }
    return low;
}

static int try_bind(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int got = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        got = ntohs(a.sin_port);
    close(fd);
    return got;
}

/*
 * One probe: a port the kernel calls free right now, below the ephemeral
 * range when there is room. A port from the ephemeral range (what bind to
 * port 0 gives) can be handed to any outgoing connection or UCX listener
 * between this probe and the daemon's own bind: CI saw a daemon refuse to
 * start with "cannot listen on 127.0.0.1:52395: address already in use".
 * Below the range only an explicit bind can take it.
 */
static int probe_port(void)
{
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    int low = ephemeral_low();
    if (low > 12000)
        for (int tries = 0; tries < 32; tries++) {
            int port = 10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000));
            if (try_bind(port) == port)
                return port;
        }
    return try_bind(0);
}

/*
 * The kernel may hand the same ephemeral port to two probes in a row, and
 * a test that asks for two ports (etcd's client and peer ports) needs them
 * distinct: never return one of the last ports returned.
 */
int th_free_port(void)
{
    static int recent[32];
    static unsigned next;
    for (int tries = 0; tries < 64; tries++) {
        int port = probe_port();
        if (port <= 0)
            return port;
        int seen = 0;
        for (unsigned i = 0; i < 32; i++)
            seen |= recent[i] == port;
        if (seen)
            continue;
        recent[next++ % 32] = port;
        return port;
    }
    return -1;
}

pid_t th_spawn(char *const argv[], const char *log_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        if (log_path != NULL) {
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

int th_wait(pid_t pid, int64_t timeout_ms, int *status_p)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            if (status_p)
                *status_p = status;
            return 0;
        }
        if (r < 0 && errno != EINTR)
            return -errno;
        if (th_now_ms() >= deadline)
            return ST_ETIMEDOUT;
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void th_kill(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void th_ucx_loopback(const char *tls)
{
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", tls, 1);
    setenv("RINGD_LOG_LEVEL", "error", 0);
#if defined(__SANITIZE_ADDRESS__)
    setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
    setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
#endif
}

void th_src_path(char *out, size_t len, const char *rel)
{
    snprintf(out, len, "%s/../%s", th_bindir(), rel);
    if (access(out, R_OK) != 0)
        snprintf(out, len, "%s/../../%s", th_bindir(), rel);
}

const char *th_bindir(void)
{
    static char dir[PATH_MAX];
    /* A binary outside the build root (build/bench/e2e) names it. */
    const char *env = getenv("RINGD_BINDIR");
    if (env != NULL && *env != '\0')
        return env;
    ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
    if (n <= 0)
        return ".";
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    return dir;
}
