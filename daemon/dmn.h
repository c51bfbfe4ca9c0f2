/*
 * dmn.h - the ringd daemon module: configuration and the daemon object.
 *
 * daemon/main.c owns the one global (the daemon object and signal flags),
 * parses the configuration with dmn_config_*() and runs the daemon with
 * dmn_create()/dmn_run(). Everything runs on one libuv loop.
 */
#ifndef RINGD_DMN_H
#define RINGD_DMN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <uv.h>

#define DMN_VERSION "0.1.0"
#define DMN_DEFAULT_CONFIG "/etc/ringd/ringd.conf"
#define DMN_MAX_UCX_OPTS 32

typedef struct dmn_config {
    char *config_path;      /* NULL: DMN_DEFAULT_CONFIG if it exists */
    char *etcd;             /* comma-separated endpoints */
    char *etcd_ca;          /* etcd TLS: CA bundle (NULL: the system's) */
    char *etcd_cert;        /* etcd TLS client certificate and key */
    char *etcd_key;
    char *etcd_user;        /* etcd auth user, with its password file */
    char *etcd_password_file;
    char *job_secret_file;  /* ring neighbours prove they hold it */
    char *job;              /* NULL: the job its first trainer names */
    char *jobs;             /* without job: names allowed (a,b,pre*) */
    char *job_secret_dir;   /* without job: DIR/NAME.secret */
    uint32_t job_grace_ms;  /* without job: a lost last trainer's
                               replacement may come this long */
    char *node_id;          /* default: hostname */
    char *host;             /* ring grouping; default: hostname */
    uint32_t min_nodes;     /* the first view waits for this many */
    uint32_t ring_deadline_ms; /* a ring collective with no progress */
    uint32_t liveness_ms;      /* a neighbour silent this long is dead */
    uint32_t ring_grid_min_nodes; /* two-level allreduce from N nodes; 0 */
    uint32_t ring_grid_max_kib;   /* ... for messages up to this; 0: any */
    uint32_t ring_grid_cols;      /* ... its row width; 0: by host */
    int step_commit;              /* commit each step (a job option) */
    uint32_t ring_fuse_kib;       /* fuse queued allreduces up to this
                                     (a job option); 0: off */
    uint32_t ring_chunk_kib;      /* the ring's pipeline chunk */
    int ring_bidirectional;       /* two rings: 0, 1 or 2 (auto, default) */
    char *ring_wire;              /* "none", "bf16" or "f16": default
                                     compression of f32 allreduces */
    uint32_t step_timeout_ms; /* a trainer silent this long in a step
                                 steps the node out; 0: off */
    char *socket_path;
    char *socket_group;     /* group name or number; NULL: ringd's own */
    char *socket_mode;      /* octal permission bits, default "0660" */
    uint32_t socket_mode_bits; /* parsed by dmn_config_load */
    uint32_t socket_gid;    /* resolved by dmn_config_load */
    char *ckpt_dir;
    uint32_t ckpt_interval; /* steps; 0 = never */
    uint32_t lease_ttl;     /* seconds */
    char *metrics_addr;     /* "addr:port"; "off" disables */
    char *log_level;
    uint32_t trainers;      /* 0: every trainer that shows up */
    uint32_t max_clients;   /* local connections served at once */
    uint32_t max_client_buffers; /* buffers one client may map at once */
    uint32_t max_client_mib;     /* bytes one client may map, in MiB */
    int standalone;
    char *backend;          /* hidden: "solo", "fake:reshape=..." */
    char *ucx_opts[DMN_MAX_UCX_OPTS]; /* "KEY=VAL" */
    int nucx_opts;
    int want_help;
    int want_version;
} dmn_config_t;

/* Defaults for every field. */
void dmn_config_init(dmn_config_t *cfg);
/*
 * Flags first (they name the config file), then the file, then the flags
 * again so they win. On error prints one clear line to err and returns
 * ST_ECONFIG (file errors name file:line).
 */
int dmn_config_load(dmn_config_t *cfg, int argc, char **argv, FILE *err);
/* Free every string. Accepts NULL. */
void dmn_config_free(dmn_config_t *cfg);
/* The --help text. */
void dmn_config_usage(FILE *out);

typedef struct dmn dmn_t;

/* Hooks for main.c (sd_notify): called on the loop thread. */
typedef struct {
    void (*on_status)(void *arg, const char *status);
    void *arg;
} dmn_hooks_t;

/*
 * Create the daemon on loop: backend, local socket (refusing to steal one
 * a live daemon listens on), metrics server. Returns 0 or a negative code
 * (logged).
 */
int dmn_create(uv_loop_t *loop, const dmn_config_t *cfg,
               const dmn_hooks_t *hooks, dmn_t **d_p);
/*
 * Start draining: finish the current step, answer every trainer's next
 * step_begin with RINGD_ESHUTDOWN, leave the job, then stop the loop.
 */
void dmn_drain(dmn_t *d);
/*
 * A drain for a restart (SIGUSR2, `systemctl reload ringd`): the step in
 * progress finishes and the node leaves the job as for dmn_drain(), but
 * the trainers are told nothing: their step_begin stays unanswered until
 * ringd exits (with DMN_EXIT_RESTART) and the connections close, and the
 * clients wait for the next ringd on the same socket (client-wait.c).
 * Returns 1, or 0 when a stop was under way already (ringctl drain):
 * that stays a stop.
 */
int dmn_restart(dmn_t *d);
/* Non-zero when the drain under way is dmn_restart()'s. */
int dmn_restarting(const dmn_t *d);
/* ringd's exit status after a restart drain (EX_TEMPFAIL): the unit's
 * RestartForceExitStatus starts it again. */
#define DMN_EXIT_RESTART 75
/* Non-zero once drained and every trainer was told (or timed out). */
int dmn_done(const dmn_t *d);
/* Non-zero when the drain was the end of a job its trainers named (the
 * config pins none) and the last trainer left: the caller destroys d and
 * creates a fresh one for the next job (main.c). */
int dmn_job_ended(const dmn_t *d);
/* Close everything; run the loop afterwards to finish the closes.
 * Accepts NULL. */
void dmn_destroy(dmn_t *d);

#endif /* RINGD_DMN_H */
