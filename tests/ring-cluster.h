/*
 * ring-cluster.h - a job of real ringd daemons on one real etcd, joined by
 * the UCX ring on loopback, with real trainers, for the ring tests
 * (test-dmn-ring*.c). The rc_ knobs shape the next node_init()/trainer()
 * (each is the flag it adds when set); tests set them, run, and reset
 * them. Everything started is killed at exit (dmn-util).
 */
#ifndef RINGD_TEST_RING_CLUSTER_H
#define RINGD_TEST_RING_CLUSTER_H

#include <stdint.h>
#include <sys/types.h>

#include "checkpoint/ckpt.h"
#include "tests/dmn-util.h"
#include "tests/mb-fixture.h"

#define MAXN 6

typedef struct {
    fx_etcd_t etcd;
    td_daemon_t d[MAXN];
    pid_t trainer[MAXN][2];
    int n;
} cluster_t;

extern const char *rc_ckpt_dir; /* when set, nodes checkpoint there */
extern const char *rc_deadline; /* when set, --ring-deadline-ms */
extern const char *rc_crash_at; /* when set, trainers kill themselves there */
extern const char *rc_stop_after; /* when set, trainers stop themselves */
extern const char *rc_ckpt_interval;
extern int rc_ckpt_per_node;    /* ckpt_dir/n<i>: no directory is shared */
extern const char *rc_ucx_opt;  /* when set, --ucx-opt */
extern const char *rc_log_level; /* when set, --log-level */
extern const char *rc_stop_in;  /* when set, trainers stop in that step */
extern const char *rc_lease_ttl; /* --lease-ttl */
extern const char *rc_step_timeout; /* when set, --step-timeout */
extern const char *rc_grid; /* when set, --ring-grid-min-nodes */
extern const char *rc_step_delay; /* when set, trainers' --step-delay-ms */
extern const char *const *rc_flags; /* when set, more daemon flags
                                       (NULL-ended, at most 10) */

void cluster_env(void);
void node_init(cluster_t *c, int i, const char *trainers,
               const char *min_nodes);
pid_t trainer(cluster_t *c, int i, int k, const char *steps);
int td_count(const char *path, const char *needle);
void expect_exit0(cluster_t *c, int i, int k, pid_t p);
void store_root(char *out, size_t len, const char *dir, int i);
int64_t newest_stored(const char *dir, int n, uint64_t below);
int64_t newest_in_etcd(cluster_t *c, const char *out);
int64_t logged_step(const char *path, const char *needle);
int first_step(const td_hashes_t *h);
int two_ckpts_complete(void *arg);
void kill_job(cluster_t *c);
int all_in_view(void *arg);
void restart_job(cluster_t *c, const char *min_nodes,
                 const char *steps);
void expect_replay(const char *before_log, const char *after_log,
                   int64_t step);

#endif
