/*
 * dmn-util.h - plumbing for the daemon and client tests: a real ringd in
 * --standalone mode on a temp socket, its sd_notify socket, trainers, and
 * bounded waits on real events (a notify datagram, a log line, an exit).
 * Everything started is killed and every temp dir removed at exit, even
 * when an assertion fails (atexit), and the runner kills the process group.
 */
#ifndef RINGD_TEST_DMN_UTIL_H
#define RINGD_TEST_DMN_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "include/ringd.h"

typedef struct {
    char *dir;            /* temp dir: socket, logs, files */
    char sock[256];
    char log[256];
    char notify[256];     /* NOTIFY_SOCKET path */
    int notify_fd;
    int metrics_port;
    int keep_notify;      /* keep reading notify after READY (else close:
                           * an unread socket would block the daemon) */
    int networked;        /* extra flags name etcd: no --standalone */
    pid_t pid;
} td_daemon_t;

/* A trainer's ringd_step_begin() on a thread of its own: it returns only
 * once every trainer of the step has asked, so a test driving several
 * clients (or acting meanwhile) cannot call it inline. */
typedef struct {
    ringd_client_t *c;
    ringd_view_t v;
    int rc;
    pthread_t th;
} td_begin_t;

void td_begin_start(td_begin_t *b, ringd_client_t *c);
/* The same for ringd_step_end(), which in a job of several nodes returns
 * only once every node ended the step (the commit round); b->rc holds
 * its outcome after td_begin_join. */
void td_end_start(td_begin_t *b, ringd_client_t *c);
/* Joins it within timeout_ms: 0 (b->rc and b->v hold its outcome), or
 * -1 if it has not returned by then (the thread is left running). */
int td_begin_join(td_begin_t *b, int timeout_ms);
/* A node's two trainers c[0] and c[1] in this one process: both
 * ringd_step_begin() calls, which return once both asked (c[1]'s on a
 * thread), asserted to succeed within 60 s; v[0], v[1] their views. */
void td_begin_both(ringd_client_t *c[2], ringd_view_t v[2]);

/* Make the temp dir and the notify socket (no daemon yet). */
void td_init(td_daemon_t *t, const char *name);
/* Start ringd --standalone on t's socket with extra flags (NULL-ended);
 * waits for READY=1. Returns 0 or -1 (daemon log on stderr). */
int td_start(td_daemon_t *t, const char *const *extra);
/* Wait for a notify datagram containing needle; 0 or -1 on timeout. */
int td_notify_wait(td_daemon_t *t, const char *needle, int timeout_ms);
/* SIGTERM and wait; returns the exit status, -1 (not running, or no
 * exit in time) or -2 (it exited 0 but its log shows a state move its
 * tables refused: a bug even where the test passed). */
int td_stop(td_daemon_t *t, int timeout_ms);

/* t->dir/name, in a static rotating buffer (8 slots). */
const char *td_path(const td_daemon_t *t, const char *name);
/* Spawn build/examples/trainer with args (NULL-ended) + --socket. */
pid_t td_trainer(td_daemon_t *t, const char *const *args, const char *log);
/* Exit status of pid within timeout, or -1. */
int td_exit_code(pid_t pid, int timeout_ms);
/* Wait until the file at path contains needle; 0 or -1 on timeout. */
int td_wait_file(const char *path, const char *needle, int timeout_ms);
/* Poll pred(arg) every 10 ms until it returns non-zero (0) or timeout_ms
 * passes (-1): for conditions no file or descriptor announces. */
int td_poll(int (*pred)(void *), void *arg, int timeout_ms);
/* For td_poll: 1 once every thread of process *(pid_t *)pid_p is stopped
 * (kill(SIGSTOP) returns before the target has stopped). */
int td_all_stopped(void *pid_p);
int td_file_has(const char *path, const char *needle);
/* Read a whole file (caller frees); NULL if absent. */
char *td_read(const char *path, size_t *len_p);
/* Print a file to stderr (for failure diagnosis). */
void td_dump(const char *path);
/* Remember a pid to kill at exit. */
void td_track(pid_t pid);
/* fork() for a trainer of the test's own: 0 in the child, which runs it
 * and _exits; in the parent the child's pid, tracked (a failed fork
 * fails the test). */
pid_t td_fork(void);
/* A trainer's --hash-log, parsed: the last line of each step wins;
 * have counts its lines (a step logged twice was redone after it was
 * taken as done). */
#define TD_MAX_STEPS 4096
typedef struct {
    unsigned long long hash[TD_MAX_STEPS];
    int have[TD_MAX_STEPS];
    unsigned world[TD_MAX_STEPS];
    unsigned long long gen[TD_MAX_STEPS];
    long long t_ms[TD_MAX_STEPS]; /* wall clock of the step's end; 0: none */
    int nsteps;
} td_hashes_t;

void td_read_hashes(const char *path, td_hashes_t *h);
/* Every step both logged has the same hash (asserted); returns how many
 * steps were compared. */
int td_same_hashes(const td_hashes_t *a, const td_hashes_t *b);
/* Max |a - b| / (1 + |b|) over two raw f32 parameter files. */
double td_param_diff(const char *pa, const char *pb);

/* HTTP GET on 127.0.0.1:port; the whole response (caller frees). */
char *td_http_get(int port, const char *path);
/* A sample's value from the daemon's /metrics (name with its labels,
 * e.g. ringd_x{kind="y"}); -1 if absent. */
double td_metric(const td_daemon_t *t, const char *name);

#endif
