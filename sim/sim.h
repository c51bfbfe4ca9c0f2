/*
 * sim.h - an analytic model of ringd at scale: allreduce time on a flat
 * ring and on the two-level grid, a data-parallel step with and without
 * communication overlapped with backward, goodput under node failures
 * and the time for a view to reach every member. sim/README.md gives the
 * equations and the assumptions behind every default.
 *
 * Pure functions of their arguments (no globals, no I/O) except the two
 * parsers, which read a file and say why they failed. Units: seconds,
 * bytes, bytes per second, unless a name says otherwise.
 */
#ifndef RINGD_SIM_H
#define RINGD_SIM_H

#include <stddef.h>

/* One link of the ring: the alpha-beta model of a hop. */
typedef struct {
    double hop_s;  /* latency of one hop (alpha) */
    double bw;     /* bytes per second one hop carries (1/beta) */
} sim_net_t;

/*
 * An allreduce's cost split into its two terms, so the model's invariants
 * (the grid's latency below the flat ring's, the same bandwidth term) can
 * be checked apart. total = lat_s + bw_s.
 */
typedef struct {
    double lat_s;  /* hop latencies on the critical path */
    double bw_s;   /* bytes on the critical path over the link bandwidth */
    double hops;   /* hop latencies counted in lat_s */
} sim_cost_t;

/*
 * The grid: b rows, `short_rows` of them with a - 1 members, the others
 * with a (a host or rack fills a row first), so n = a * b - short_rows.
 * A row splits a message evenly among its members; a column ring joins
 * the members of every row that hold the same byte range (in a short
 * row a member's range meets at most two columns' ranges, so the column
 * rings are cut at those bounds). Spreading the shortfall over rows
 * keeps every column ring's slowest member at bytes / (a - 1); one short
 * last row of r members would slow every column ring to bytes / r.
 */
typedef struct {
    int a, b, short_rows;
} sim_grid_t;

/* Flat ring of n nodes: 2(n-1) hops, 2(n-1)/n * bytes over the link. */
sim_cost_t sim_ring_flat(int n, double bytes, const sim_net_t *net);

/*
 * Two-level ring on grid g: reduce-scatter along rows, allreduce along
 * columns, allgather along rows, each phase at its slowest member's
 * pace: 2(a-1) + 2(b-1) hops. Zero for an invalid grid.
 */
sim_cost_t sim_ring_grid(const sim_grid_t *g, double bytes,
                         const sim_net_t *net);

/* 1 when g lays out exactly n nodes: a, b >= 1, 0 <= short_rows < b,
 * a >= 2 if any row is short, a * b - short_rows == n. */
int sim_grid_valid(const sim_grid_t *g, int n);

/* Below this one row (the flat ring) is the layout. */
#define SIM_GRID_MIN_NODES 4

/*
 * The layout ring/ring_grid.c builds for n nodes of one host each:
 * floor(sqrt(n)) rows of widths that differ by at most one, whatever the
 * message; {n, 1, 0} (the flat ring) below SIM_GRID_MIN_NODES. 0, or
 * ST_EINVAL for n < 1.
 */
int sim_grid_layout(int n, sim_grid_t *grid_p);

/* The schemes of the seed's table. */
typedef enum {
    SIM_FLAT = 0,      /* one flat ring, after backward */
    SIM_GRID = 1,      /* two-level ring, after backward */
    SIM_GRID_OVERLAP = 2, /* two-level ring, buckets during backward */
    SIM_NSCHEMES = 3
} sim_scheme_t;

/* A data-parallel training step of one node (one GPU). */
typedef struct {
    double grad_bytes;   /* gradient bytes allreduced per step */
    double compute_s;    /* forward + backward of one step on one node */
    double bwd_frac;     /* share of compute_s that is backward */
    double bucket_bytes; /* fusion bucket for the overlapped scheme */
    int batch;           /* samples per node per step (weak scaling) */
    double epoch_samples; /* samples in one epoch */
} sim_work_t;

/*
 * Time of one step at n nodes. Without overlap: compute, then one
 * allreduce of every gradient. With overlap: buckets are filled at an
 * even rate through backward (the last bucket holds the remainder), each
 * is allreduced as soon as it is full and the previous one is done; only
 * the part past the end of backward counts. One node does no allreduce.
 */
double sim_step_time(sim_scheme_t s, int n, const sim_work_t *w,
                     const sim_net_t *net);

/* The allreduce time a step of scheme s exposes (step - compute). */
double sim_exposed_comm(sim_scheme_t s, int n, const sim_work_t *w,
                        const sim_net_t *net);

/* Weak-scaling efficiency: one node's step time over n nodes'. */
double sim_efficiency(sim_scheme_t s, int n, const sim_work_t *w,
                      const sim_net_t *net);

/* Seconds per epoch: epoch_samples / (n * batch) steps. */
double sim_epoch_time(sim_scheme_t s, int n, const sim_work_t *w,
                      const sim_net_t *net);

/* Failures and what each one costs. */
typedef struct {
    double fail_per_node_h; /* interruptions per node-hour */
    double recover_s;       /* in place: detection to the first new step */
    double step_s;          /* the step redone after an in-place recovery */
    double replace_s;       /* until a spare joins: n-1 nodes meanwhile */
    double restart_s;       /* from a checkpoint: relaunch, restore */
    double ckpt_s;          /* training time a checkpoint stalls */
    double ckpt_every_s;    /* interval; 0: Young's optimum for restarts */
} sim_fail_t;

/* Interruptions per node-hour from a fleet's count over its GPU-days. */
double sim_fail_rate(double interruptions, double days, double gpus,
                     double gpus_per_node);

/* Young's checkpoint interval sqrt(2 * ckpt_s * MTBF) for n nodes. */
double sim_ckpt_interval(int n, const sim_fail_t *f);

/*
 * Fraction of wall time spent on training steps that are kept, at n
 * nodes. in_place = 1: ringd re-forms without the dead node (recovery,
 * one redone step, a node short until the spare joins) and pays only its
 * periodic checkpoints; in_place = 0: every failure restarts the job
 * from the last checkpoint (half an interval of work lost on average).
 */
double sim_goodput(int n, const sim_fail_t *f, int in_place);

/* etcd: the view change, and the members' steady load. */
typedef struct {
    double base_s;        /* suspicion to the view written, small job */
    double fanout_s;      /* one view write to every watcher, measured */
    int fanout_members;   /* the members behind fanout_s */
    double keepalive_cpu_s; /* etcd CPU per lease keepalive, measured */
    double ttl_s;         /* lease TTL: a keepalive every ttl_s / 3 */
    double view_bytes_per_member; /* compact view size per member */
    double etcd_bw;       /* bytes per second etcd sends to watchers */
    /* etcd's CPU per view write and watcher (bench/etcd-load's fit):
     * whatever the size, and per byte of the view; 0: fanout_s above. */
    double watcher_cpu_s, watcher_byte_cpu_s;
    double etcd_cores;    /* the cores the fan-out runs on */
} sim_etcd_t;

/*
 * Seconds from a suspicion until the view reaches all n members: the
 * small job's base; the fan-out, n watchers' events at watcher_cpu_s +
 * watcher_byte_cpu_s per byte of an n-member view each, on etcd_cores
 * (or, without that fit, the measured fanout_s scaled by
 * n / fanout_members); and n copies of the view over etcd's bandwidth.
 */
double sim_view_change(int n, const sim_etcd_t *e);

/* etcd's steady CPU for n members' keepalives, in cores. */
double sim_etcd_cpu(int n, const sim_etcd_t *e);

/* One row of bench/ringbench's table. */
typedef struct {
    int n;
    double bytes, usec;
} sim_row_t;

/*
 * Reads ringbench's TSV (tls n bytes usec ...) from path: rows of the
 * given tls ("tcp") and n, at most max, into rows; their count in
 * *count_p. 0, -errno when the file cannot be read, ST_EINVAL when no
 * row matches.
 */
int sim_ringbench_read(const char *path, const char *tls, int n,
                       sim_row_t *rows, int max, int *count_p);

/*
 * Least-squares alpha and beta of a flat ring of rows[0].n nodes through
 * the rows (relative errors: a 4 KiB row weighs as much as a 64 MiB
 * one). ST_EINVAL unless two rows of different sizes give a positive
 * alpha and bandwidth.
 */
int sim_fit(const sim_row_t *rows, int count, sim_net_t *net_p);

/*
 * Finds "etcd_load: members=<m> etcd_cpu_pct=<x> view_fanout_ms=<x>
 * per_key_us=<x>" (bench/etcd-load; per_key_us is etcd CPU per
 * keepalive) in path, the last such line, and sets e's fanout_s,
 * fanout_members and keepalive_cpu_s; from the last "etcd_fanout: ...
 * cpu_per_watcher_us=<x> cpu_per_watcher_kb_us=<x>" line, if any (its
 * fit; kB = 1000 bytes), watcher_cpu_s and watcher_byte_cpu_s.
 * 0, -errno, or ST_EINVAL.
 */
int sim_etcd_load_read(const char *path, sim_etcd_t *e);

#endif
