/*
 * e2e.h - what bench/e2e's coordinator (e2e.c) and its measured processes
 * (e2e-worker.c) share.
 */
#ifndef RINGD_BENCH_E2E_H
#define RINGD_BENCH_E2E_H

#include <stddef.h>
#include <stdint.h>

#define MiB ((size_t)1024 * 1024)
#define MAXN 8 /* the step-latency runs; the busbw tables use 2 and 4 */
#define MAXT 2
#define MAXSIZES 8
#define MAXROUNDS 16
#define CMD_TIMEOUT_MS 180000

/* Print "e2e: what: detail" and exit 1. */
void e2e__die(const char *what, const char *detail)
    __attribute__((noreturn));
/* This process's CPU time, every thread, in seconds. */
double e2e__cpu_self(void);
/* The median of v[0..n) (sorts v). */
double e2e__median(double *v, int n);

/* The worker processes' mains (e2e --trainer / --ring). */
int e2e__trainer_main(const char *sock, size_t max, size_t state);
int e2e__ring_main(const char *dir, uint32_t rank, uint32_t n, size_t max);

#endif
