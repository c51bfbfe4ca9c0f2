/*
 * Hostile local input: config files that are not what they seem, a
 * --socket path that is somebody's file, and more clients than the daemon
 * has descriptors for. None may destroy anything, and none may make the
 * daemon spin or stop serving the trainers it has.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/status.h"
#include "daemon/dmn.h"
#include "daemon/dmn-parse.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* Load a config file in-process; the error text goes to err (caller
 * frees). */
static int load_conf(const char *path, dmn_config_t *cfg, char **err_p)
{
    size_t len;
    FILE *err = open_memstream(err_p, &len);
    ASSERT(err != NULL);
    char *argv[] = {"ringd", "-c", (char *)path, NULL};
    dmn_config_init(cfg);
    int rc = dmn_config_load(cfg, 3, argv, err);
    fclose(err);
    return rc;
}

/* A config file of `body` loaded in-process: its rc, err as load_conf. */
static int load_text(td_daemon_t *t, const char *body, size_t n,
                     dmn_config_t *cfg, char **err_p)
{
    const char *conf = td_path(t, "t.conf");
    FILE *f = fopen(conf, "w");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(body, 1, n, f), n);
    fclose(f);
    return load_conf(conf, cfg, err_p);
}

/* n copies of ch, then tail, in a buffer the caller frees. */
static char *repeat(int ch, size_t n, const char *tail)
{
    char *s = malloc(n + strlen(tail) + 1);
    ASSERT(s != NULL);
    memset(s, ch, n);
    strcpy(s + n, tail);
    return s;
}

/*
 * A line is at most 4096 bytes (DMN_CONFIG_LINE_MAX): one of 4096 loads,
 * one byte more is an error naming its line, and nothing after it, nor
 * the long line's tail, sets anything. A 100 KB value is an error too,
 * not a number read in pieces.
 */
TEST_IMPL(dmn_config_long_lines)
{
    td_daemon_t t;
    td_init(&t, "dmn-longconf");
    dmn_config_t cfg;
    char *err = NULL;
    /* "# " + 4094 x = a 4096-byte comment line, then a setting. */
    char *ok = repeat('x', 4094, "\ntrainers = 3\nstandalone = true\n");
    char *body = malloc(strlen(ok) + 3);
    ASSERT(body != NULL);
    sprintf(body, "# %s", ok);
    int rc = load_text(&t, body, strlen(body), &cfg, &err);
    ASSERT_MSG(rc == 0, "rc %d, err '%s'", rc, err);
    ASSERT_EQ(cfg.trainers, 3);
    dmn_config_free(&cfg);
    free(err);
    free(body);
    free(ok);

    /* One byte more: line 2 is over, and its tail " trainers = 7" is not
     * read as a setting, nor is line 3's. */
    char *lng = repeat('x', 4095, " trainers = 7\ntrainers = 3\n");
    body = malloc(strlen(lng) + 40);
    ASSERT(body != NULL);
    sprintf(body, "standalone = true\n# %s", lng);
    err = NULL;
    rc = load_text(&t, body, strlen(body), &cfg, &err);
    ASSERT_MSG(rc == ST_ECONFIG, "rc %d, err '%s'", rc, err);
    ASSERT_MSG(strstr(err, "t.conf:2: line over 4096 bytes") != NULL,
               "err '%s'", err);
    ASSERT_EQ(cfg.trainers, 0);
    dmn_config_free(&cfg);
    free(err);
    free(body);
    free(lng);

    char *big = repeat('9', 100000, "\n");
    body = malloc(strlen(big) + 40);
    ASSERT(body != NULL);
    sprintf(body, "trainers = 3\nlease-ttl = %s", big);
    err = NULL;
    rc = load_text(&t, body, strlen(body), &cfg, &err);
    ASSERT_MSG(rc == ST_ECONFIG, "rc %d, err '%s'", rc, err);
    ASSERT_MSG(strstr(err, "t.conf:2: line over") != NULL, "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);
    free(body);
    free(big);

    /* A flag's string value has the same bound. */
    char *job = repeat('j', DMN_CONFIG_VALUE_MAX + 1, "");
    char *argv[] = {"ringd", "--config", "/dev/null", "--job", job, NULL};
    size_t elen;
    err = NULL;
    FILE *ef = open_memstream(&err, &elen);
    ASSERT(ef != NULL);
    dmn_config_init(&cfg);
    rc = dmn_config_load(&cfg, 5, argv, ef);
    fclose(ef);
    ASSERT_MSG(rc == ST_ECONFIG, "rc %d, err '%s'", rc, err);
    ASSERT_MSG(strstr(err, "at most 4095") != NULL, "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);
    free(job);
    return 0;
}

/*
 * A directory is not an empty config file, nor is a file with a NUL; a
 * FIFO (which would block the open, then never end) and a device are no
 * config source at all, said at once; /dev/null is an empty one. A
 * stream that never ends a line is read only to the line limit.
 */
TEST_IMPL(dmn_config_not_a_file)
{
    td_daemon_t t;
    td_init(&t, "dmn-dirconf");
    dmn_config_t cfg;
    char *err = NULL;
    ASSERT_EQ(load_conf(t.dir, &cfg, &err), ST_ECONFIG);
    ASSERT_MSG(strstr(err, "is a directory") != NULL, "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);

    err = NULL;
    ASSERT_EQ(load_text(&t, "standalone = true\ntrainers = 2\0 # hidden\n",
                        40, &cfg, &err), ST_ECONFIG);
    ASSERT_MSG(strstr(err, "t.conf:2: NUL byte") != NULL, "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);

    const char *fifo = td_path(&t, "fifo.conf");
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    err = NULL;
    ASSERT_EQ(load_conf(fifo, &cfg, &err), ST_ECONFIG);
    ASSERT_MSG(strstr(err, "not a regular file (a FIFO)") != NULL,
               "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);

    err = NULL;
    ASSERT_EQ(load_conf("/dev/zero", &cfg, &err), ST_ECONFIG);
    ASSERT_MSG(strstr(err, "character device") != NULL, "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);

    /* Empty: what fails is the missing job, not the source. */
    err = NULL;
    load_conf("/dev/null", &cfg, &err);
    ASSERT_MSG(strstr(err, "cannot read") == NULL, "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);

    /* The reader itself, on a stream of NULs that never ends. */
    FILE *z = fopen("/dev/zero", "r");
    ASSERT(z != NULL);
    size_t elen;
    err = NULL;
    FILE *ef = open_memstream(&err, &elen);
    ASSERT(ef != NULL);
    dmn_config_init(&cfg);
    ASSERT_EQ(dmn__config_read(&cfg, z, "zero", ef), ST_ECONFIG);
    fclose(ef);
    fclose(z);
    ASSERT_MSG(strstr(err, "zero:1: line over 4096 bytes") != NULL,
               "err '%s'", err);
    dmn_config_free(&cfg);
    free(err);
    return 0;
}

/* ringd --standalone on t's socket, expected to exit: its exit code. */
static int ringd_exit_code(td_daemon_t *t)
{
    char bin[512];
    snprintf(bin, sizeof(bin), "%s/ringd", th_bindir());
    char *argv[] = {bin, "--standalone", "--config", "/dev/null",
                    "--metrics", "off", "--socket", t->sock, NULL};
    pid_t pid = th_spawn(argv, t->log);
    td_track(pid);
    return td_exit_code(pid, 30000);
}

/*
 * --socket naming a user's regular file: ringd refuses to start and the
 * file is untouched. A stale socket (nobody accepts on it) is replaced.
 */
TEST_IMPL(dmn_socket_path_not_ours)
{
    td_daemon_t t;
    td_init(&t, "dmn-sockpath");
    FILE *f = fopen(t.sock, "w");
    ASSERT(f != NULL);
    fputs("precious\n", f);
    fclose(f);
    ASSERT_EQ(ringd_exit_code(&t), 1);
    ASSERT(td_file_has(t.log, "exists and is not a socket"));
    ASSERT(td_file_has(t.sock, "precious"));

    /* A directory at the path: refused too, and still there. */
    ASSERT_EQ(unlink(t.sock), 0);
    ASSERT_EQ(mkdir(t.sock, 0700), 0);
    ASSERT_EQ(ringd_exit_code(&t), 1);
    struct stat st;
    ASSERT(stat(t.sock, &st) == 0 && S_ISDIR(st.st_mode));
    ASSERT_EQ(rmdir(t.sock), 0);

    /* A socket left by a crash: bound, never listening. */
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    ASSERT(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    ASSERT(strlen(t.sock) < sizeof(a.sun_path));
    memcpy(a.sun_path, t.sock, strlen(t.sock) + 1);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    close(fd);
    ASSERT_EQ(td_start(&t, NULL), 0);
    ASSERT(td_file_has(t.log, "removing the stale socket"));
    ASSERT_EQ(td_stop(&t, 10000), 0);
    return 0;
}

/* A TCP listener on 127.0.0.1:port (the caller closes it). */
static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    return fd;
}

/*
 * A --metrics port somebody else holds: ringd refuses to start with a line
 * that names the address, and exits non-zero (it must not run without the
 * metrics it was asked for). The test harness's td_start() takes that line
 * as a taken port and starts again on another one, which must work.
 */
TEST_IMPL(dmn_metrics_port_taken)
{
    td_daemon_t t;
    td_init(&t, "dmn-metricsport");
    int port = t.metrics_port;
    int fd = listen_on(port);
    char bin[512], addr[32];
    snprintf(bin, sizeof(bin), "%s/ringd", th_bindir());
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    char *argv[] = {bin, "--standalone", "--config", "/dev/null",
                    "--metrics", addr, "--socket", t.sock, NULL};
    pid_t pid = th_spawn(argv, t.log);
    td_track(pid);
    ASSERT_EQ(td_exit_code(pid, 30000), 1);
    char want[96];
    snprintf(want, sizeof(want), "cannot listen on %s: address already in use",
             addr);
    ASSERT_MSG(td_file_has(t.log, want), "no '%s' in the log", want);

    ASSERT_EQ(td_start(&t, NULL), 0);
    ASSERT(t.metrics_port != port);
    char *body = td_http_get(t.metrics_port, "/metrics");
    ASSERT(body != NULL && strstr(body, "ringd_") != NULL);
    free(body);
    ASSERT_EQ(td_stop(&t, 10000), 0);
    close(fd);
    return 0;
}

/* A raw connection to the daemon's socket (no HELLO). */
static int raw_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ASSERT(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    ASSERT(strlen(path) < sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* A descriptor limit that leaves the process `room` free descriptor
 * numbers (new descriptors take the lowest free numbers below it). */
static rlim_t limit_leaving(pid_t pid, int room)
{
    char path[64];
    unsigned char open_fd[4096] = {0};
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    ASSERT(dir != NULL);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int n = atoi(e->d_name);
        if (e->d_name[0] != '.' && n >= 0 && n < 4096)
            open_fd[n] = 1;
    }
    closedir(dir);
    int lim = 0;
    for (int free_below = 0; lim < 4096; lim++)
        if (!open_fd[lim] && free_below++ == room)
            break;
    return (rlim_t)lim;
}

static int count_lines_with(const char *path, const char *needle)
{
    size_t len;
    char *s = td_read(path, &len);
    int n = 0;
    for (char *p = s; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(s);
    return n;
}

/*
 * The daemon runs out of descriptors while clients keep connecting. It
 * must stop polling its listening socket instead of spinning on EMFILE
 * (one warning, not one per try), keep serving, and accept again once
 * descriptors are free: a trainer that connected during the flood trains.
 */
#define FLOOD 32
TEST_IMPL(dmn_fd_exhaustion)
{
    td_daemon_t t;
    td_init(&t, "dmn-fds");
    ASSERT_EQ(td_start(&t, NULL), 0);
    /* Room for 2 more descriptors: the flood runs it out at once. */
    struct rlimit old, rl;
    ASSERT_EQ(prlimit(t.pid, RLIMIT_NOFILE, NULL, &old), 0);
    rl = old;
    rl.rlim_cur = limit_leaving(t.pid, 2);
    ASSERT_EQ(prlimit(t.pid, RLIMIT_NOFILE, &rl, NULL), 0);
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        fds[i] = raw_connect(t.sock);
    ASSERT_EQ(td_wait_file(t.log, "Too many open files", 10000), 0);
    /* The trainer's connection waits in the backlog behind the flood.
     * A daemon that polls on through EMFILE logs every try: hundreds of
     * lines in the milliseconds until the flood ends below. */
    const char *args[] = {"--steps", "20", NULL};
    pid_t tr = td_trainer(&t, args, td_path(&t, "t.log"));
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    ASSERT_EQ(prlimit(t.pid, RLIMIT_NOFILE, &old, NULL), 0);
    ASSERT_EQ(td_exit_code(tr, 60000), 0);
    int warned = count_lines_with(t.log, "accept: ");
    ASSERT_MSG(warned >= 1 && warned <= 2, "%d accept warnings", warned);
    ASSERT_EQ(td_stop(&t, 10000), 0);
    return 0;
}

/* Did the daemon close this raw connection (EOF within timeout_ms)? */
static int closed_by_daemon(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return 0;
    char b;
    return recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

/* At --max-clients the next connection is closed at once; the trainer
 * already served trains on. */
TEST_IMPL(dmn_max_clients)
{
    td_daemon_t t;
    td_init(&t, "dmn-maxcl");
    const char *extra[] = {"--max-clients", "3", NULL};
    ASSERT_EQ(td_start(&t, extra), 0);
    const char *args[] = {"--steps", "1000000000", "--log-every",
                          "1000000000", NULL};
    pid_t tr = td_trainer(&t, args, td_path(&t, "t.log"));
    ASSERT_EQ(td_wait_file(t.log, "client 1 connected", 10000), 0);
    /* Accepted in connection order: a and b fill the cap, so the four
     * after them are the ones closed. */
    int a = raw_connect(t.sock), b = raw_connect(t.sock);
    int over[4];
    for (int i = 0; i < 4; i++)
        over[i] = raw_connect(t.sock);
    for (int i = 0; i < 4; i++)
        ASSERT_MSG(closed_by_daemon(over[i], 10000), "conn %d kept", i);
    ASSERT(!closed_by_daemon(a, 0) && !closed_by_daemon(b, 0));
    ASSERT_EQ(count_lines_with(t.log, "refusing a client"), 1);
    ASSERT_EQ(td_exit_code(tr, 0), -1); /* still training */
    for (int i = 0; i < 4; i++)
        close(over[i]);
    close(a);
    close(b);
    ASSERT_EQ(td_stop(&t, 10000), 0);
    return 0;
}

/*
 * Started under a low descriptor limit, the daemon caps its clients below
 * it (64 descriptors stay for etcd, UCX and checkpoint files, and each
 * client takes two: its socket and the pidfd of its process), so a flood
 * of connections is refused at the cap and never runs the daemon out of
 * descriptors: no EMFILE anywhere, the trainer it serves trains on, and a
 * new trainer is served once the flood is gone.
 */
#define FD_LIMIT 160
#define FD_FLOOD 150
TEST_IMPL(dmn_fd_reserve)
{
    td_daemon_t t;
    td_init(&t, "dmn-fdres");
    /* The daemon inherits the limit; this test is a process of its own. */
    struct rlimit old, rl;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    rl = old;
    rl.rlim_cur = FD_LIMIT;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    int rc = td_start(&t, NULL);
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(t.log, "serving at most 48 local clients"));
    const char *args[] = {"--steps", "1000000000", "--log-every",
                          "1000000000", NULL};
    pid_t tr = td_trainer(&t, args, td_path(&t, "t.log"));
    ASSERT_EQ(td_wait_file(t.log, "client 1 connected", 10000), 0);
    int fds[FD_FLOOD];
    for (int i = 0; i < FD_FLOOD; i++)
        fds[i] = raw_connect(t.sock);
    /* The last one is past the cap: closed once the daemon got to it. */
    ASSERT(closed_by_daemon(fds[FD_FLOOD - 1], 10000));
    ASSERT_MSG(!td_file_has(t.log, "Too many open files"),
               "the flood ran the daemon out of descriptors");
    ASSERT_EQ(count_lines_with(t.log, "refusing a client"), 1);
    ASSERT_EQ(td_exit_code(tr, 0), -1); /* still training */
    for (int i = 0; i < FD_FLOOD; i++)
        close(fds[i]);
    ASSERT_EQ(kill(tr, SIGKILL), 0);
    td_exit_code(tr, 10000);
    const char *args2[] = {"--steps", "20", NULL};
    pid_t tr2 = td_trainer(&t, args2, td_path(&t, "t2.log"));
    ASSERT_EQ(td_exit_code(tr2, 60000), 0);
    ASSERT_EQ(td_stop(&t, 10000), 0);
    return 0;
}
