/*
 * ringctl.h - what ringctl's command files share: the options, the
 * blocking etcd session and its owned replies, exit codes, and the
 * commands each file defines for the table in ringctl.c.
 */
#ifndef RINGD_TOOLS_RINGCTL_H
#define RINGD_TOOLS_RINGCTL_H

#include <stddef.h>
#include <stdint.h>

#include "membership/etcd.h"

enum { EXIT_OK = 0, EXIT_DOWN = 1, EXIT_USAGE = 2 };

typedef struct {
    const char *socket;
    const char *etcd;
    const char *job;
    const char *ckpt_dir;
    int json;
    const char *etcd_ca, *etcd_cert, *etcd_key; /* TLS, as ringd's keys */
    const char *etcd_user, *etcd_password_file; /* auth */
    const char *job_secret_file; /* signs a drain request */
    unsigned timeout_s;          /* wait-member's bound (--timeout) */
} ctl_opts_t;

/* What one call left behind: an owned copy of the kvs (values NUL-ended,
 * value_len kept) and, for a txn, whether it succeeded. */
typedef struct {
    int done;
    int status;
    int succeeded;
    etcd_kv_t *kvs;
    size_t n_kvs;
    size_t sub_n_kvs; /* txn: kvs of the first sub-response */
} ctl_reply_t;

typedef struct {
    const ctl_opts_t *o;
    etcd_t *etcd;
    long run_ms;
} ctl_etcd_t;

void ctl_reply_free(ctl_reply_t *r);
/* Report a failed etcd call on one line; returns the exit code. */
int ctl_etcd_fail(const ctl_etcd_t *c, int rc);
/* Run the private loop until the queued call is answered. */
int ctl_wait(ctl_etcd_t *c, int queued, ctl_reply_t *r);
/* GET key (prefix: every key under it) into r; 0 or an exit code. */
int ctl_get(ctl_etcd_t *c, const char *key, int prefix, ctl_reply_t *r);
/* Open the blocking etcd client named by o; 0 or an exit code. */
int ctl_open(const ctl_opts_t *o, ctl_etcd_t *c);
/* s made printable and bounded, in buf. */
const char *ctl_safe(const char *s, char *buf, size_t n);
/* What follows prefix in key (key itself when it does not start so). */
const char *ctl_key_tail(const char *key, const char *prefix);

/* ringctl-hops.c: the node the ring waited for in the last records of
 * the newest generation (the one waiting least on its predecessor). */
typedef struct {
    char node[64];
    uint64_t generation, steps;  /* steps: summed over the records */
    int nodes;
    double own_ms;               /* its mean wait per step */
    double others_min_ms, others_max_ms;
} ctl_slowest_t;
/* 0 with s_p filled; 1: fewer than two nodes' records; else an exit
 * code (etcd failed, said on stderr). */
int ctl_slowest(const ctl_opts_t *o, ctl_slowest_t *s_p);

/* ringctl-wait.c: the rolling upgrade's wait between nodes. */
int cmd_generation(const ctl_opts_t *o, char **argv);
int cmd_wait_member(const ctl_opts_t *o, char **argv);

/* ringctl-ckpt.c */
int cmd_checkpoints(const ctl_opts_t *o, char **argv);
int cmd_verify(const ctl_opts_t *o, char **argv);
int cmd_dump(const ctl_opts_t *o, char **argv);

#endif
