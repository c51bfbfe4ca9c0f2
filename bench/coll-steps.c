/*
 * coll-steps.c - the C side of bench/torch-layer.py: one trainer that runs
 * steps made only of collectives, timing each whole step.
 *
 *     coll-steps SOCKET STEPS WARMUP OUT BYTES[,BYTES...]
 *
 * Each step: ringd_step_begin, one asynchronous f32 avg allreduce per
 * bucket (BYTES each, one ringd buffer per bucket, all issued before the
 * first wait, as DistributedOptimizer issues its buckets), a wait for
 * each in order, ringd_step_end. After WARMUP untimed steps, STEPS timed
 * ones; per line of OUT, one step's wall time and this process's CPU
 * time in it (ms: what the client itself spent). The Python side runs
 * the very same collectives through ringd.torch, so the difference is
 * what the Python layer costs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/ringd.h"

#define MAX_BUCKETS RINGD_MAX_OUTSTANDING

typedef struct {
    ringd_client_t *c;
    int n;
    float *buf[MAX_BUCKETS];
    size_t count[MAX_BUCKETS];
} coll_t;

static double clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int fail(coll_t *k, const char *what, int rc)
{
    fprintf(stderr, "coll-steps: %s: %s (%s)\n", what, ringd_strerror(rc),
            k->c ? ringd_last_error(k->c) : "");
    return rc;
}

/* One bucket per comma-separated byte count, each in its own buffer. */
static int make_buckets(coll_t *k, char *list)
{
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t bytes = strtoull(tok, NULL, 10);
        if (k->n == MAX_BUCKETS || bytes < sizeof(float)) {
            fprintf(stderr, "coll-steps: bad bucket '%s' (at most %d)\n",
                    tok, MAX_BUCKETS);
            return RINGD_EINVAL;
        }
        k->count[k->n] = bytes / sizeof(float);
        k->buf[k->n] = ringd_buffer(k->c, bytes);
        if (k->buf[k->n] == NULL)
            return fail(k, "ringd_buffer", RINGD_ENOMEM);
        k->n++;
    }
    return 0;
}

static int one_step(coll_t *k)
{
    ringd_view_t v;
    ringd_handle_t h[MAX_BUCKETS];
    int rc = ringd_step_begin(k->c, &v);
    if (rc != 0)
        return fail(k, "ringd_step_begin", rc);
    for (int i = 0; i < k->n; i++) {
        rc = ringd_allreduce_async(k->c, k->buf[i], k->count[i], RINGD_F32,
                                   RINGD_AVG, &h[i]);
        if (rc != 0)
            return fail(k, "ringd_allreduce_async", rc);
    }
    for (int i = 0; i < k->n; i++) {
        rc = ringd_wait(k->c, h[i]);
        if (rc != 0)
            return fail(k, "ringd_wait", rc);
    }
    rc = ringd_step_end(k->c);
    return rc != 0 ? fail(k, "ringd_step_end", rc) : 0;
}

static int run_steps(coll_t *k, int steps, int warmup, FILE *out)
{
    for (int i = 0; i < warmup + steps; i++) {
        double t0 = clock_ms(CLOCK_MONOTONIC);
        double c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
        int rc = one_step(k);
        if (rc != 0)
            return rc;
        if (i >= warmup)
            fprintf(out, "%.4f %.4f\n", clock_ms(CLOCK_MONOTONIC) - t0,
                    clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: coll-steps SOCKET STEPS WARMUP OUT "
                        "BYTES[,BYTES...]\n");
        return 2;
    }
    coll_t k = {0};
    ringd_opts_t opts;
    ringd_opts_init(&opts);
    opts.name = "coll-steps";
    int rc = ringd_connect(&k.c, argv[1], &opts);
    if (rc != 0) {
        fail(&k, "ringd_connect", rc);
        return 1;
    }
    FILE *out = fopen(argv[4], "w");
    if (out == NULL) {
        perror(argv[4]);
        goto err_close;
    }
    rc = make_buckets(&k, argv[5]);
    if (rc == 0)
        rc = run_steps(&k, atoi(argv[2]), atoi(argv[3]), out);
    if (fclose(out) != 0 && rc == 0)
        rc = RINGD_ESYS;
    ringd_close(k.c);
    return rc != 0;

err_close:
    ringd_close(k.c);
    return 1;
}
