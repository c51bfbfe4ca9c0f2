/*
 * etcd-load.c - what M members cost etcd: from one process, M lightweight
 * members (a lease each, kept alive on ringd's schedule, a node record of
 * a daemon's size under it, one watch each on what a daemon watches),
 * next to a real etcd started on loopback with a temp data dir. For each
 * M it measures, over a steady window, etcd's CPU (utime+stime from
 * /proc/<etcd>/stat: 100 = one core), the keepalive round trip, and etcd
 * CPU per keepalive; then the time for one view write to reach all M
 * watchers (put sent -> the last watcher's event). Prints a TSV table,
 * then for the largest M that completed without a failed keepalive:
 *   etcd_load: members=<m> etcd_cpu_pct=<x> view_fanout_ms=<x>
 *              per_key_us=<x>
 * per_key_us is etcd CPU per keepalive (one member's lease renewal), the
 * per-member steady cost a model multiplies by members * 3 / TTL.
 *
 * Today's layout by default: every member watches the job's whole prefix
 * (/ringd/J/), and the view holds every member's record with its UCX
 * address (373 bytes a member); --watch view watches only the view key,
 * and --view-bytes N (or --view-member-bytes B: M * B) writes a view of
 * that size instead. Figures and what they say: bench/README.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "membership/etcd.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"

#define JOB_PREFIX "/ringd/load/"
#define VIEW_KEY JOB_PREFIX "view"
#define ADDR_BYTES 215 /* a UCX worker address over tcp here */
#define MAX_INFLIGHT 64
#define MAX_SIZES 16

typedef struct {
    int idx;
    int64_t lease;
    etcd_watch_t *watch;
    int reset_seen;
    long view_gen;       /* the newest view generation this member saw */
    uv_timer_t ka;
    int64_t ka_sent_ms;
    int ka_inflight;
    int lost;            /* a keepalive failed or found the lease gone */
} member_t;

typedef struct {
    long members[MAX_SIZES];
    int n_sizes;
    long ttl_s;
    long view_bytes[MAX_SIZES]; /* {0}: today's layout for M members */
    int n_bytes;
    long watchers[MAX_SIZES]; /* ascending; {0}: every member watches */
    int n_watchers;
    long view_member_bytes; /* > 0: a view of M times this many bytes */
    int watch_view_only;
    long window_s;
    int reps;
} opts_t;

/* What one M measured. */
typedef struct {
    double setup_s, etcd_cpu_pct, ka_per_s, ka_p50_ms, ka_p99_ms;
    double per_key_us, fanout_ms, fanout_max_ms, tool_cpu_pct;
    double fanout_etcd_s, fanout_tool_s; /* CPU per view write */
    long view_len, lost;
    int ok;
} row_t;

static uv_loop_t loop;
static etcd_t *etcd;
static fx_etcd_t et;
static member_t *mem;
static long n_mem;
static long next_reg, n_reg, reg_inflight, n_reset, reg_failed;
static long next_watch, watch_failed, n_watch;
static const char *watch_what;
static long cur_gen, n_seen;
static long ttl_s;
static int64_t last_seen_ms;
static int measuring;
static double *ka_ms;
static long n_ka, cap_ka, ka_failed, n_lost;
static char addr_b64[ETCD_B64_ENC_LEN(ADDR_BYTES)];

static int64_t now_ms(void)
{
    return (int64_t)uv_now(&loop);
}

static void reg_pump(void);

static void on_ka_timer(uv_timer_t *t);

/* Registered: keepalives from now on, as a daemon does (every TTL/3). */
static void on_put(int status, const etcd_result_t *res, void *data)
{
    member_t *m = data;
    (void)res;
    reg_inflight--;
    if (status == 0) {
        uint64_t period = (uint64_t)ttl_s * 1000 / 3;
        uv_timer_start(&m->ka, on_ka_timer, period, period);
        n_reg++;
    } else {
        reg_failed++;
    }
    reg_pump();
}

/* A daemon's node record (membership/mb-view.c's fields). */
static void on_grant(int status, const etcd_result_t *res, void *data)
{
    member_t *m = data;
    if (status != 0) {
        reg_inflight--;
        reg_failed++;
        reg_pump();
        return;
    }
    m->lease = res->lease_id;
    char key[128], val[768];
    snprintf(key, sizeof(key), JOB_PREFIX "nodes/node%d", m->idx);
    int n = snprintf(val, sizeof(val), "{\"host\":\"host%d\",\"addr\":\"%s\","
                     "\"lease\":\"%lld\",\"slots\":1,\"pid\":%d,"
                     "\"version\":1}", m->idx, addr_b64,
                     (long long)m->lease, 100000 + m->idx);
    if (etcd_put(etcd, key, val, (size_t)n, m->lease, on_put, m) != 0) {
        reg_inflight--;
        reg_failed++;
    }
}

/* Register members MAX_INFLIGHT at a time, as daemons starting together
 * would, without one process's burst swamping the loop. */
static void reg_pump(void)
{
    while (reg_inflight < MAX_INFLIGHT && next_reg < n_mem) {
        member_t *m = &mem[next_reg++];
        if (etcd_lease_grant(etcd, ttl_s, on_grant, m) != 0) {
            reg_failed++;
            continue;
        }
        reg_inflight++;
    }
}

static void on_keepalive(int status, const etcd_result_t *res, void *data)
{
    member_t *m = data;
    m->ka_inflight = 0;
    if (status != 0 || res->ttl <= 0) {
        ka_failed++;
        n_lost += !m->lost;
        m->lost = 1;
        return;
    }
    if (!measuring)
        return;
    if (n_ka == cap_ka) {
        long cap = cap_ka ? cap_ka * 2 : 4096;
        double *p = realloc(ka_ms, (size_t)cap * sizeof(*p));
        if (p == NULL)
            return;
        ka_ms = p;
        cap_ka = cap;
    }
    ka_ms[n_ka++] = (double)(now_ms() - m->ka_sent_ms);
}

static void on_ka_timer(uv_timer_t *t)
{
    member_t *m = t->data;
    if (m->ka_inflight)
        return;
    m->ka_sent_ms = now_ms();
    if (etcd_lease_keepalive(etcd, m->lease, on_keepalive, m) == 0)
        m->ka_inflight = 1;
}

/* The generation of a view value ("{\"generation\":G,..."), else -1. */
static long view_gen(const etcd_kv_t *kv)
{
    long g;
    if (strcmp(kv->key, VIEW_KEY) != 0 ||
        sscanf(kv->value, "{\"generation\":%ld", &g) != 1)
        return -1;
    return g;
}

static void saw(member_t *m, long g)
{
    if (g <= m->view_gen)
        return;
    m->view_gen = g;
    if (g == cur_gen) {
        n_seen++;
        last_seen_ms = now_ms();
    }
}

static void watch_pump(void);

static void on_watch(const etcd_watch_update_t *up, void *data)
{
    member_t *m = data;
    if (up->reset && !m->reset_seen) {
        m->reset_seen = 1;
        n_reset++;
        watch_pump();
    }
    for (size_t i = 0; i < up->n_kvs; i++)
        saw(m, view_gen(&up->kvs[i]));
    for (size_t i = 0; i < up->n_events; i++)
        if (!up->events[i].is_delete)
            saw(m, view_gen(&up->events[i].kv));
}

/*
 * Start watches MAX_INFLIGHT at a time: each begins with a read of what
 * it watches (the whole prefix today), and hundreds at once under
 * ringd's request timeout (TTL/3) time out and retry together without
 * end on this machine (bench/README.md).
 */
static void watch_pump(void)
{
    while (next_watch < n_watch && next_watch - n_reset < MAX_INFLIGHT) {
        member_t *m = &mem[next_watch++];
        if (etcd_watch_start(etcd, watch_what, on_watch, m, &m->watch) != 0)
            watch_failed++;
    }
}

/* etcd's utime + stime in seconds. */
static double etcd_cpu_s(void)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)et.pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
                                   "%*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int reached(void *p)
{
    long *want = p;
    return want[0] <= *(long *)want[1];
}

/* Run the loop until *counter >= want or timeout_ms. */
static int run_to(long *counter, long want, int64_t timeout_ms)
{
    long arg[2] = {want, (long)counter};
    return fx_run_until_fn(&loop, reached, arg, timeout_ms);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, long n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    long i = (long)(q * (double)(n - 1) + 0.5);
    return v[i];
}

/* A view of generation g: today's layout (every member's record) when
 * want is 0, else filler to want bytes. malloc'd; NULL when out of
 * memory. */
static char *view_value(long g, long m, long want, long *len_p)
{
    size_t cap = want > 0 ? (size_t)want + 64 : (size_t)m * 420 + 256;
    char *v = malloc(cap);
    if (v == NULL)
        return NULL;
    size_t n = (size_t)snprintf(v, cap, "{\"generation\":%ld,\"step\":%ld,"
                                "\"members\":[", g, g * 1000);
    for (long i = 0; want == 0 && i < m; i++)
        n += (size_t)snprintf(v + n, cap - n, "%s{\"node\":\"node%ld\","
                              "\"host\":\"host%ld\",\"addr\":\"%s\","
                              "\"lease\":\"%lld\",\"slots\":1}",
                              i ? "," : "", i, i, addr_b64,
                              (long long)mem[i].lease);
    n += (size_t)snprintf(v + n, cap - n, "],\"joiners\":[],\"source\":"
                          "\"node0\",\"pad\":\"");
    while (want > 0 && (long)n < want - 2)
        v[n++] = 'x';
    n += (size_t)snprintf(v + n, cap - n, "\"}");
    *len_p = (long)n;
    return v;
}

static void on_view_put(int status, const etcd_result_t *res, void *data)
{
    (void)res;
    *(int *)data = status == 0 ? 1 : -1;
}

/* One view write of `want` bytes (0: today's layout) to the n_watch
 * watchers: ms from the put to the last one. */
static double fanout_once(long want, long *len_p)
{
    long len;
    char *v = view_value(++cur_gen, n_mem, want, &len);
    if (v == NULL)
        return -1;
    n_seen = 0;
    int done = 0;
    uv_update_time(&loop);
    int64_t t0 = now_ms();
    int rc = etcd_put(etcd, VIEW_KEY, v, (size_t)len, 0, on_view_put, &done);
    free(v);
    *len_p = len;
    if (rc != 0 || !run_to(&n_seen, n_watch, 60000) || done < 0)
        return -1;
    return (double)(last_seen_ms - t0);
}

/* Members registered and watching, keeping their leases alive: one
 * keepalive period to settle, then the steady window. */
static void steady(const opts_t *o, row_t *r)
{
    long none = 0;
    run_to(&none, 1, o->ttl_s * 1000 / 3);
    n_ka = 0;
    measuring = 1;
    double c0 = etcd_cpu_s(), s0 = self_cpu_s();
    uv_update_time(&loop);
    int64_t t0 = now_ms();
    run_to(&none, 1, o->window_s * 1000);
    double secs = (double)(now_ms() - t0) / 1000;
    double cpu = etcd_cpu_s() - c0;
    measuring = 0;
    r->etcd_cpu_pct = 100 * cpu / secs;
    r->tool_cpu_pct = 100 * (self_cpu_s() - s0) / secs;
    r->ka_per_s = (double)n_ka / secs;
    r->per_key_us = n_ka > 0 ? cpu * 1e6 / (double)n_ka : 0;
    r->ka_p50_ms = pct(ka_ms, n_ka, 0.5);
    r->ka_p99_ms = pct(ka_ms, n_ka, 0.99);
}

/* Start watches until w members watch (w <= M). */
static int watch_grow(long w)
{
    n_watch = w < n_mem ? w : n_mem;
    watch_pump();
    if (!run_to(&n_reset, n_watch, 300000) || watch_failed > 0) {
        fprintf(stderr, "etcd-load: %ld of %ld watches started\n", n_reset,
                n_watch);
        return -1;
    }
    return 0;
}

static int setup(const opts_t *o, long m, row_t *r)
{
    mem = calloc((size_t)m, sizeof(*mem));
    if (mem == NULL)
        return -1;
    n_mem = m;
    ttl_s = o->ttl_s;
    next_reg = n_reg = reg_inflight = n_reset = reg_failed = 0;
    next_watch = watch_failed = 0;
    cur_gen = 0;
    fx_etcd_start(&et, 0);
    /* ringd times requests out after TTL/3; here, on 2 cores shared
     * with others, retries of requests that were only slow piled up on
     * etcd at 500 members and measured nothing: a request may take a
     * TTL (a lease renewed that late still holds). */
    etcd_config_t cfg = {.endpoints = et.url,
                         .request_timeout_ms = o->ttl_s * 1000};
    if (etcd_create(&loop, &cfg, &etcd) != 0)
        return -1;
    for (long i = 0; i < m; i++) {
        mem[i].idx = (int)i;
        uv_timer_init(&loop, &mem[i].ka);
        mem[i].ka.data = &mem[i];
    }
    uv_update_time(&loop);
    int64_t t0 = now_ms();
    reg_pump();
    if (!run_to(&n_reg, m, 120000) || reg_failed > 0) {
        fprintf(stderr, "etcd-load: %ld of %ld registered (%ld failed)\n",
                n_reg, m, reg_failed);
        return -1;
    }
    watch_what = o->watch_view_only ? VIEW_KEY : JOB_PREFIX;
    if (watch_grow(o->n_watchers > 0 ? o->watchers[0] : m) != 0)
        return -1;
    r->setup_s = (double)(now_ms() - t0) / 1000;
    return 0;
}

static void teardown(void)
{
    for (long i = 0; i < n_mem; i++) {
        etcd_watch_stop(mem[i].watch);
        uv_close((uv_handle_t *)&mem[i].ka, NULL);
    }
    etcd_destroy(etcd);
    etcd = NULL;
    fx_loop_drain(&loop);
    fx_done(); /* kills etcd and removes its data dir */
    free(mem);
    mem = NULL;
    n_mem = 0;
}

/* The rows' (watchers, view bytes, median fan-out ms, etcd CPU ms per
 * write) for the fits. */
#define MAX_FIT (MAX_SIZES * MAX_SIZES)
static double fit_w[MAX_FIT], fit_b[MAX_FIT], fit_ms[MAX_FIT];
static double fit_cpu[MAX_FIT];
static int n_fit;

/*
 * Least squares, in relative error (a 256-byte row weighs as much as a
 * 64 KB one), of y = W (a + b bytes) through the rows' y (the fan-out
 * time or etcd's CPU) of the largest watcher count: a, the cost per
 * watcher whatever the size, b the cost per byte per watcher. Only the
 * largest count, as etcd's cost per watcher grows with the watchers
 * (203 us of CPU at 256 bytes with 1000, 148 with 250: bench/README.md)
 * and a model of M members wants M's. 0, or -1 without two rows of
 * different sizes.
 */
static int fanout_fit(const double *y, double *a_p, double *b_p)
{
    double uu = 0, uv = 0, vv = 0, su = 0, sv = 0, top = 0;
    for (int i = 0; i < n_fit; i++)
        top = fit_w[i] > top ? fit_w[i] : top;
    for (int i = 0; i < n_fit; i++) {
        if (y[i] <= 0 || fit_w[i] != top)
            continue;
        double u = fit_w[i] / y[i], v = fit_w[i] * fit_b[i] / y[i];
        uu += u * u;
        uv += u * v;
        vv += v * v;
        su += u;
        sv += v;
    }
    double det = uu * vv - uv * uv;
    if (n_fit < 2 || det <= 1e-12 * uu * vv)
        return -1;
    *a_p = (su * vv - sv * uv) / det;
    *b_p = (uu * sv - uv * su) / det;
    return 0;
}

/* reps view writes of `want` bytes to the current watchers, into r. */
static void fanout_point(const opts_t *o, long want, row_t *r)
{
    double f[16];
    int n = 0;
    double c0 = etcd_cpu_s(), s0 = self_cpu_s();
    r->ok = 0;
    for (int i = 0; i < o->reps && i < 16; i++) {
        double ms = fanout_once(want, &r->view_len);
        if (ms < 0)
            break;
        f[n++] = ms;
    }
    if (n > 0) {
        r->fanout_etcd_s = (etcd_cpu_s() - c0) / n;
        r->fanout_tool_s = (self_cpu_s() - s0) / n;
    }
    if (n == o->reps) {
        r->fanout_max_ms = pct(f, n, 1.0);
        r->fanout_ms = pct(f, n, 0.5);
        r->ok = 1;
    }
    r->lost = n_lost;
}

static void print_row(const opts_t *o, long m, const row_t *r)
{
    printf("%s%ld\t%ld\t%s\t%ld\t%ld\t%.1f\t%.1f\t%.0f\t%.1f\t%.1f\t"
           "%.1f\t%.0f\t%.0f\t%.3f\t%.3f\t%.1f\t%ld\n",
           r->ok ? "" : "FAILED:", m, o->ttl_s,
           o->watch_view_only ? "view" : "prefix", n_watch, r->view_len,
           r->setup_s, r->etcd_cpu_pct, r->ka_per_s, r->ka_p50_ms,
           r->ka_p99_ms, r->per_key_us, r->fanout_ms, r->fanout_max_ms,
           r->fanout_etcd_s, r->fanout_tool_s, r->tool_cpu_pct, r->lost);
    fflush(stdout);
}

/*
 * One fresh etcd with M members: the steady window, then a row for each
 * watcher count (watches added between rows, so the counts share one
 * etcd and one set of leases) and view size. r is the last row.
 */
static void measure(const opts_t *o, long m, row_t *r)
{
    memset(r, 0, sizeof(*r));
    n_fit = 0;
    if (setup(o, m, r) != 0) {
        teardown();
        return;
    }
    if (ka_failed > 0)
        fprintf(stderr, "etcd-load: M=%ld: %ld keepalives failed while "
                "registering and starting watches\n", m, ka_failed);
    steady(o, r);
    if (ka_failed > 0)
        fprintf(stderr, "etcd-load: M=%ld: %ld keepalives failed by the "
                "end of the steady window\n", m, ka_failed);
    int nw = o->n_watchers > 0 ? o->n_watchers : 1;
    for (int w = 0; w < nw && (r->ok || w == 0); w++) {
        if (w > 0 && watch_grow(o->watchers[w]) != 0) {
            r->ok = 0;
            break;
        }
        for (int b = 0; b < o->n_bytes; b++) {
            long want = o->view_member_bytes > 0 ?
                        o->view_member_bytes * m : o->view_bytes[b];
            fanout_point(o, want, r);
            print_row(o, m, r);
            if (r->ok && n_fit < MAX_SIZES * MAX_SIZES) {
                fit_w[n_fit] = (double)n_watch;
                fit_b[n_fit] = (double)r->view_len;
                fit_cpu[n_fit] = r->fanout_etcd_s * 1e3;
                fit_ms[n_fit++] = r->fanout_ms;
            }
            if (!r->ok)
                break;
        }
    }
    if (ka_failed > 0)
        fprintf(stderr, "etcd-load: M=%ld: %ld keepalives failed in all, "
                "%ld members hit a failure\n", m, ka_failed, n_lost);
    ka_failed = n_lost = 0;
    teardown();
}

static void usage(FILE *out)
{
    fprintf(out,
"Usage: etcd-load [--members 100,250,500,1000] [--ttl 5] [--view-bytes N]\n"
"                 [--view-member-bytes B] [--watch prefix|view]\n"
"                 [--watchers LIST] [--window 10] [--reps 3]\n"
"  --members LIST   member counts to measure, one fresh etcd each\n"
"  --ttl S          lease TTL in seconds (default 5, ringd's); keepalive\n"
"                   every TTL/3, ringd's schedule (the demo uses TTL 2)\n"
"  --view-bytes LIST  the view's size, a row each (default 0: today's\n"
"                   layout, every member's record with its address)\n"
"  --view-member-bytes B  a view of B bytes per member instead\n"
"  --watch W        what each member watches: prefix (today: the job's\n"
"                   whole prefix) or view (the view key only)\n"
"  --watchers LIST  ascending watcher counts <= M, a row each (default:\n"
"                   every member watches); the others only keep leases\n"
"  --window S       the steady window for CPU and keepalives (default 10)\n"
"  --reps N         view writes timed per M (default 3, at most 16)\n");
}

/* A comma-separated list of up to MAX_SIZES values in [lo, hi]. */
static int parse_list(const char *s, long lo, long hi, long *v_p, int *n_p)
{
    int n = 0;
    while (*s != '\0' && n < MAX_SIZES) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi)
            return -1;
        v_p[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    if (n == 0)
        return -1;
    *n_p = n;
    return 0;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.members = {100, 250, 500, 1000}, .n_sizes = 4,
                  .ttl_s = 5, .n_bytes = 1, .window_s = 10, .reps = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (v == NULL)
            return -1;
        i++;
        if (strcmp(a, "--members") == 0 &&
            parse_list(v, 1, 100000, o->members, &o->n_sizes) == 0)
            continue;
        if (strcmp(a, "--view-bytes") == 0 &&
            parse_list(v, 0, 1499999, o->view_bytes, &o->n_bytes) == 0)
            continue;
        if (strcmp(a, "--watchers") == 0 &&
            parse_list(v, 1, 100000, o->watchers, &o->n_watchers) == 0)
            continue;
        char *end;
        long n = strtol(v, &end, 10);
        int num = *v != '\0' && *end == '\0' && n >= 0;
        if (strcmp(a, "--ttl") == 0 && num && n >= 2)
            o->ttl_s = n;
        else if (strcmp(a, "--view-member-bytes") == 0 && num &&
                 n < 100000)
            o->view_member_bytes = n;
        else if (strcmp(a, "--window") == 0 && num && n >= 1)
            o->window_s = n;
        else if (strcmp(a, "--reps") == 0 && num && n >= 1 && n <= 16)
            o->reps = (int)n;
        else if (strcmp(a, "--watch") == 0 && strcmp(v, "prefix") == 0)
            o->watch_view_only = 0;
        else if (strcmp(a, "--watch") == 0 && strcmp(v, "view") == 0)
            o->watch_view_only = 1;
        else
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    if (parse(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    unsigned char addr[ADDR_BYTES];
    for (int i = 0; i < ADDR_BYTES; i++)
        addr[i] = (unsigned char)(i * 37 + 11);
    etcd_b64_encode(addr, sizeof(addr), addr_b64);
    rd_log_set_level(RD_LOG_WARN);
    if (uv_loop_init(&loop) != 0)
        return 1;
    printf("members\tttl_s\twatch\twatchers\tview_bytes\tsetup_s\t"
           "etcd_cpu_pct\tka_per_s\tka_p50_ms\tka_p99_ms\tper_key_us\t"
           "view_fanout_ms\tview_fanout_max_ms\tfanout_etcd_cpu_s\t"
           "fanout_tool_cpu_s\ttool_cpu_pct\tka_lost\n");
    row_t last = {0};
    long last_m = 0;
    for (int i = 0; i < o.n_sizes; i++) {
        row_t r;
        measure(&o, o.members[i], &r);
        if (!r.ok && r.setup_s == 0) {
            printf("%ld\t%ld\t%s\tfailed (see stderr)\n", o.members[i],
                   o.ttl_s, o.watch_view_only ? "view" : "prefix");
            fflush(stdout);
            break;
        }
        if (!r.ok || r.lost > 0) {
            n_fit = 0; /* the fit is of the last M that held */
            printf("# stopped at M=%ld: %s\n", o.members[i], !r.ok ?
                   "a view write did not reach every watcher" :
                   "members' keepalives failed (leases at risk)");
            break;
        }
        last = r;
        last_m = o.members[i];
    }
    uv_loop_close(&loop);
    fx_done();
    if (last_m == 0)
        return 1;
    printf("etcd_load: members=%ld etcd_cpu_pct=%.1f view_fanout_ms=%.0f "
           "per_key_us=%.1f\n", last_m, last.etcd_cpu_pct, last.fanout_ms,
           last.per_key_us);
    double a, b, ca, cb;
    if (fanout_fit(fit_ms, &a, &b) == 0 &&
        fanout_fit(fit_cpu, &ca, &cb) == 0)
        printf("etcd_fanout: per_watcher_us=%.1f per_watcher_kb_us=%.2f "
               "cpu_per_watcher_us=%.1f cpu_per_watcher_kb_us=%.2f\n",
               a * 1e3, b * 1e6, ca * 1e3, cb * 1e6);
    return 0;
}
