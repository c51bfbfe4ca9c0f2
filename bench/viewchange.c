/*
 * viewchange.c - time from a node's crash to every survivor installing
 * the view without it, when a ring neighbour reports it (mb_suspect) and
 * the leader revokes its lease. A real etcd on loopback, 4 members on one
 * loop; each repetition crashes one non-leader, measures, then brings a
 * fresh member back. Prints a TSV table, then
 *   view_change_median_ms=<median> max_ms=<max>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "membership/mb.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/task.h"

#define N 4
#define REPS 20

typedef struct {
    char name[16];
    mb_t *mb;
    uint64_t gen;
    int n_members;
    int has_victim; /* last view lists the victim's name */
} node_t;

static uv_loop_t loop;
static fx_etcd_t etcd_;
static node_t nodes[N];
static const char *victim_name = "";

static void on_view(const mb_view_t *v, void *data)
{
    node_t *n = data;
    n->gen = v->generation;
    n->n_members = (int)v->n_members;
    n->has_victim = 0;
    for (size_t i = 0; i < v->n_members; i++)
        if (strcmp(v->members[i].node, victim_name) == 0)
            n->has_victim = 1;
}

static void start_node(int i)
{
    node_t *n = &nodes[i];
    memset(n, 0, sizeof(*n));
    snprintf(n->name, sizeof(n->name), "n%d", i);
    mb_config_t cfg = {.job = "bench", .node = n->name, .host = "h",
                       .addr = "addr", .addr_len = 4, .ttl_s = 5,
                       .min_members = N,
                       .etcd = {.endpoints = etcd_.url}};
    mb_callbacks_t cb = {.on_view = on_view};
    ASSERT_OK(mb_create(&loop, &cfg, &cb, n, &n->mb));
    ASSERT_OK(mb_start(n->mb));
}

static int skip_ = -1;
static uint64_t min_gen_;

/* Every live node installed a view >= min_gen_ with N (or N-1) members. */
static int all_full(void *p)
{
    int want = *(int *)p;
    for (int i = 0; i < N; i++) {
        if (i == skip_)
            continue;
        if (nodes[i].gen < min_gen_ || nodes[i].n_members != want)
            return 0;
        if (want == N - 1 && nodes[i].has_victim)
            return 0;
    }
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    ASSERT_OK(uv_loop_init(&loop));
    fx_etcd_start(&etcd_, 0);
    for (int i = 0; i < N; i++)
        start_node(i);
    int want = N;
    ASSERT(fx_run_until_fn(&loop, all_full, &want, 15000));
    double ms[REPS];
    printf("rep\tvictim\tview_change_ms\n");
    for (int r = 0; r < REPS; r++) {
        int victim = -1, reporter;
        /* A non-leader, rotating; its ring neighbour reports it. */
        for (int k = 0; k < N; k++) {
            int i = (r + k) % N;
            if (!mb_is_leader(nodes[i].mb)) {
                victim = i;
                break;
            }
        }
        reporter = (victim + 1) % N;
        victim_name = nodes[victim].name;
        min_gen_ = nodes[reporter].gen + 1;
        /* Crash: the process is gone (no more keepalives), then a ring
         * neighbour reports it. */
        int64_t t0 = th_now_ms();
        mb_destroy(nodes[victim].mb);
        nodes[victim].mb = NULL;
        skip_ = victim;
        ASSERT_OK(mb_suspect(nodes[reporter].mb, victim_name, "bench"));
        want = N - 1;
        ASSERT(fx_run_until_fn(&loop, all_full, &want, 10000));
        ms[r] = (double)(th_now_ms() - t0);
        printf("%d\t%s\t%.0f\n", r, victim_name, ms[r]);
        fflush(stdout);
        /* Bring it back as a new member before the next round. */
        victim_name = "";
        start_node(victim);
        skip_ = -1;
        min_gen_ = nodes[reporter].gen + 1;
        want = N;
        ASSERT(fx_run_until_fn(&loop, all_full, &want, 10000));
    }
    qsort(ms, REPS, sizeof(ms[0]), cmp_double);
    double median = (ms[REPS / 2 - 1] + ms[REPS / 2]) / 2;
    for (int i = 0; i < N; i++)
        mb_destroy(nodes[i].mb);
    fx_loop_drain(&loop);
    uv_loop_close(&loop);
    printf("view_change_median_ms=%.0f max_ms=%.0f\n", median,
           ms[REPS - 1]);
    return fx_done();
}
