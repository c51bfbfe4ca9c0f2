#include "tests/dmn-util.h"

#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"
#include "tests/task.h"

/* What to clean at exit: this test process only (each test is forked). */
static pid_t tracked[32];
static int ntracked;
static char *dirs[32];
static int ndirs;

static void cleanup(void)
{
    for (int i = 0; i < ntracked; i++)
        th_kill(tracked[i]);
    for (int i = 0; i < ndirs; i++) {
        if (getenv("RINGD_TEST_KEEP") != NULL)
            fprintf(stderr, "kept %s\n", dirs[i]);
        else
            th_rmtree(dirs[i]);
    }
}

void td_track(pid_t pid)
{
    if (ntracked == 0 && ndirs == 0)
        atexit(cleanup);
    if (pid > 0 && ntracked < 32)
        tracked[ntracked++] = pid;
}

pid_t td_fork(void)
{
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid > 0)
        td_track(pid);
    return pid;
}

void td_init(td_daemon_t *t, const char *name)
{
    memset(t, 0, sizeof(*t));
    td_track(0);
    t->dir = th_mkdtemp(name);
    ASSERT(t->dir != NULL);
    if (ndirs < 32)
        dirs[ndirs++] = t->dir;
    snprintf(t->sock, sizeof(t->sock), "%s/ringd.sock", t->dir);
    snprintf(t->log, sizeof(t->log), "%s/ringd.log", t->dir);
    snprintf(t->notify, sizeof(t->notify), "%s/notify.sock", t->dir);
    t->notify_fd = -1;
    t->metrics_port = th_free_port();
}

static void notify_open(td_daemon_t *t)
{
    unlink(t->notify);
    t->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT(t->notify_fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    ASSERT(strlen(t->notify) < sizeof(a.sun_path));
    memcpy(a.sun_path, t->notify, strlen(t->notify) + 1);
    ASSERT_OK(bind(t->notify_fd, (struct sockaddr *)&a, sizeof(a)));
}

const char *td_path(const td_daemon_t *t, const char *name)
{
    static char bufs[8][300];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, 300, "%s/%s", t->dir, name);
    return b;
}

int td_poll(int (*pred)(void *), void *arg, int timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    for (;;) {
        if (pred(arg))
            return 0;
        if (th_now_ms() >= deadline)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* 1 if t's daemon has exited (it is not reaped: td_exit_code does that). */
static int daemon_exited(const td_daemon_t *t)
{
    siginfo_t si = {0};
    return t->pid > 0 &&
           waitid(P_PID, (id_t)t->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == t->pid;
}

int td_notify_wait(td_daemon_t *t, const char *needle, int timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    char buf[1024];
    for (;;) {
        int64_t left = deadline - th_now_ms();
        if (left <= 0)
            return -1;
        /* Checked before the poll, so that a message sent just before the
         * exit is still read: a daemon that exited (failed to start, say)
         * is no reason to wait out the whole timeout. */
        int exited = daemon_exited(t);
        struct pollfd p = {t->notify_fd, POLLIN, 0};
        if (poll(&p, 1, exited ? 0 : left < 100 ? (int)left : 100) <= 0) {
            if (exited)
                return -1;
            continue;
        }
        ssize_t n = recv(t->notify_fd, buf, sizeof(buf) - 1, 0);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        if (strstr(buf, needle) != NULL)
            return 0;
    }
}

static int start_once(td_daemon_t *t, const char *const *extra);

static off_t log_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* 1 if the daemon that just failed to start exited because its metrics
 * port was in use (its log, from offset `from`, says so); reaps it. */
static int port_taken(td_daemon_t *t, off_t from)
{
    if (t->pid <= 0 || td_exit_code(t->pid, 2000) < 0)
        return 0;
    t->pid = 0;
    char *s = td_read(t->log, NULL);
    int taken = s != NULL && (off_t)strlen(s) >= from &&
                strstr(s + from, "metrics: cannot listen") != NULL &&
                strstr(s + from, "address already in use") != NULL;
    free(s);
    return taken;
}

/*
 * Start the daemon and wait for READY=1. A metrics port taken between
 * th_free_port() and the daemon's bind is the test's bad luck, not the
 * daemon's failure: start again on another port (at most twice).
 */
int td_start(td_daemon_t *t, const char *const *extra)
{
    for (int tries = 0;; tries++) {
        off_t before = log_size(t->log);
        int rc = start_once(t, extra);
        if (rc == 0 || tries == 2 || !port_taken(t, before))
            return rc;
        fprintf(stderr, "# metrics port %d was taken: starting again\n",
                t->metrics_port);
        t->metrics_port = th_free_port();
    }
}

static int start_once(td_daemon_t *t, const char *const *extra)
{
    char port[32];
    snprintf(port, sizeof(port), "127.0.0.1:%d", t->metrics_port);
    char path[512];
    snprintf(path, sizeof(path), "%s/ringd", th_bindir());
    const char *argv[40] = {path, "--socket", t->sock, "--metrics", port};
    int n = 5;
    if (!t->networked)
        argv[n++] = "--standalone";
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 38; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    if (t->notify_fd < 0)
        notify_open(t);
    setenv("NOTIFY_SOCKET", t->notify, 1);
    t->pid = th_spawn((char *const *)argv, t->log);
    unsetenv("NOTIFY_SOCKET");
    if (t->pid <= 0)
        return -1;
    td_track(t->pid);
    if (td_notify_wait(t, "READY=1", 15000) != 0) {
        td_dump(t->log);
        return -1;
    }
    if (!t->keep_notify) {
        close(t->notify_fd);
        t->notify_fd = -1;
    }
    return 0;
}

static void *begin_main(void *p)
{
    td_begin_t *b = p;
    b->rc = ringd_step_begin(b->c, &b->v);
    return NULL;
}

void td_begin_start(td_begin_t *b, ringd_client_t *c)
{
    *b = (td_begin_t){.c = c, .rc = -999};
    ASSERT_OK(pthread_create(&b->th, NULL, begin_main, b));
}

static void *end_main(void *p)
{
    td_begin_t *b = p;
    b->rc = ringd_step_end(b->c);
    return NULL;
}

void td_end_start(td_begin_t *b, ringd_client_t *c)
{
    *b = (td_begin_t){.c = c, .rc = -999};
    ASSERT_OK(pthread_create(&b->th, NULL, end_main, b));
}

void td_begin_both(ringd_client_t *c[2], ringd_view_t v[2])
{
    td_begin_t b;
    td_begin_start(&b, c[1]);
    int rc = ringd_step_begin(c[0], &v[0]);
    ASSERT_OK(td_begin_join(&b, 60000));
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(b.rc, 0);
    v[1] = b.v;
}

int td_begin_join(td_begin_t *b, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return pthread_timedjoin_np(b->th, NULL, &until) == 0 ? 0 : -1;
}

int td_exit_code(pid_t pid, int timeout_ms)
{
    int status;
    if (th_wait(pid, timeout_ms, &status) != 0)
        return -1;
    for (int i = 0; i < ntracked; i++)
        if (tracked[i] == pid)
            tracked[i] = 0;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

/* A move the daemon's step or connection machine refused ("... a -> b
 * refused", step.c): a path that tried a transition its table has not.
 * Prints the line; 1 if there is one. */
static int refused_move(const char *log)
{
    char *s = td_read(log, NULL);
    int found = 0;
    for (char *l = s; l != NULL && *l != '\0' && !found;) {
        char *nl = strchr(l, '\n');
        if (nl != NULL)
            *nl = '\0';
        /* "a -> b refused": the state's name, then the word. */
        char *arrow = strstr(l, " -> ");
        char *to = arrow != NULL ? arrow + 4 : NULL;
        size_t n = to != NULL ? strcspn(to, " ") : 0;
        if (to != NULL && strncmp(to + n, " refused", 8) == 0) {
            fprintf(stderr, "%s: %s\n", log, l);
            found = 1;
        }
        l = nl != NULL ? nl + 1 : NULL;
    }
    free(s);
    return found;
}

/* The last lines of the file at path on stderr (a failed stop says why
 * without the test's temp dir, which is gone by the time CI reports). */
static void dump_tail(const char *path, int lines)
{
    char *s = td_read(path, NULL);
    if (s == NULL)
        return;
    char *from = s + strlen(s);
    while (from > s && lines >= 0)
        if (*--from == '\n')
            lines--;
    fprintf(stderr, "---- last lines of %s ----\n%s\n----\n", path,
            from == s ? s : from + 1);
    free(s);
}

int td_stop(td_daemon_t *t, int timeout_ms)
{
    if (t->pid <= 0)
        return -1;
    kill(t->pid, SIGTERM);
    int rc = td_exit_code(t->pid, timeout_ms);
    t->pid = 0;
    if (rc == 0 && refused_move(t->log))
        return -2;
    if (rc != 0)
        dump_tail(t->log, 40);
    return rc;
}

pid_t td_trainer(td_daemon_t *t, const char *const *args, const char *log)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/examples/trainer", th_bindir());
    const char *argv[48] = {path, "--socket", t->sock, "--cpu"};
    int n = 4;
    for (int i = 0; args[i] != NULL && n < 46; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    return pid;
}

char *td_read(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    fclose(f);
    if (buf != NULL)
        buf[len] = '\0';
    if (len_p)
        *len_p = len;
    return buf;
}

int td_file_has(const char *path, const char *needle)
{
    char *s = td_read(path, NULL);
    int has = s != NULL && strstr(s, needle) != NULL;
    free(s);
    return has;
}

int td_wait_file(const char *path, const char *needle, int timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    while (!td_file_has(path, needle)) {
        if (th_now_ms() > deadline)
            return -1;
        /* Polling a file for a line: the event we wait on is the write. */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

void td_dump(const char *path)
{
    char *s = td_read(path, NULL);
    fprintf(stderr, "---- %s ----\n%s\n----\n", path, s ? s : "(missing)");
    free(s);
}

char *td_http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
    size_t cap = 65536, len = 0;
    char *buf = NULL;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        write(fd, req, (size_t)n) != n || (buf = malloc(cap)) == NULL)
        goto out;
    ssize_t got;
    while (len < cap - 1 && (got = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)got;
    buf[len] = '\0';
out:
    close(fd);
    return buf;
}

/* Parse a --hash-log: the last line of each step wins. */
void td_read_hashes(const char *path, td_hashes_t *h)
{
    memset(h, 0, sizeof(*h));
    char *s = td_read(path, NULL);
    ASSERT_MSG(s != NULL, "no hash log %s", path);
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        long step;
        unsigned long long gen, hash;
        unsigned rank, world;
        if (sscanf(line, "step %ld gen %llu rank %u world %u hash %llx",
                   &step, &gen, &rank, &world, &hash) != 5 || step < 0 ||
            step >= TD_MAX_STEPS)
            continue;
        h->hash[step] = hash;
        h->gen[step] = gen;
        h->world[step] = world;
        h->have[step]++;
        const char *tm = strstr(line, " t_ms ");
        h->t_ms[step] = tm != NULL ? atoll(tm + 6) : 0;
        if (step + 1 > h->nsteps)
            h->nsteps = (int)step + 1;
    }
    free(s);
}

/* Every step both logged has the same hash; returns steps compared. */
int td_same_hashes(const td_hashes_t *a, const td_hashes_t *b)
{
    int n = 0;
    for (int i = 0; i < TD_MAX_STEPS; i++) {
        if (!a->have[i] || !b->have[i])
            continue;
        ASSERT_MSG(a->hash[i] == b->hash[i],
                   "step %d: replicas differ (%016llx vs %016llx)", i,
                   a->hash[i], b->hash[i]);
        n++;
    }
    return n;
}

/* Max |a - b| / (1 + |b|) over two raw f32 parameter files. */
double td_param_diff(const char *pa, const char *pb)
{
    size_t la, lb;
    char *a = td_read(pa, &la), *b = td_read(pb, &lb);
    ASSERT(a != NULL && b != NULL);
    ASSERT_EQ(la, lb);
    ASSERT(la > 0 && la % 4 == 0);
    double worst = 0;
    for (size_t i = 0; i < la / 4; i++) {
        float x, y;
        memcpy(&x, a + 4 * i, 4);
        memcpy(&y, b + 4 * i, 4);
        double d = fabs((double)x - y) / (1 + fabs((double)y));
        if (d > worst)
            worst = d;
    }
    free(a);
    free(b);
    return worst;
}

/* 1 once every thread of process pid is stopped: kill(SIGSTOP) returns
 * before the target has stopped, and a thread still running could finish
 * a collective the test means to catch it in. */
int td_all_stopped(void *pid_p)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)*(pid_t *)pid_p);
    DIR *d = opendir(path);
    if (d == NULL)
        return 0;
    int stopped = 1, n = 0;
    struct dirent *e;
    while (stopped && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sp[400];
        snprintf(sp, sizeof(sp), "%s/%s/stat", path, e->d_name);
        FILE *f = fopen(sp, "r");
        char *rp = f != NULL && fgets(buf, sizeof(buf), f) != NULL
                       ? strrchr(buf, ')') : NULL;
        stopped = rp != NULL && (rp[2] == 'T' || rp[2] == 't');
        n++;
        if (f != NULL)
            fclose(f);
    }
    closedir(d);
    return stopped && n > 0;
}

double td_metric(const td_daemon_t *t, const char *name)
{
    char *m = td_http_get(t->metrics_port, "/metrics");
    ASSERT(m != NULL);
    char key[256];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(m, key);
    double v = p != NULL ? strtod(p + strlen(key), NULL) : -1;
    free(m);
    return v;
}
