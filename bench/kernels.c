/*
 * bench/kernels - throughput of the CPU kernels against memcpy.
 *
 * For 64 MiB buffers (the f32 side), prints one TSV row per kernel:
 *   kernel  dtype  bytes  GBps  memcpy_GBps  ratio
 * GBps counts bytes read plus bytes written (an in-place sum of 64 MiB
 * reads 128 MiB and writes 64 MiB); memcpy_GBps is memcpy of the same
 * 64 MiB measured the same way (read + write) right before each row, so
 * the ratio compares like with like even when the machine is busy. Each
 * figure is the best of REPS timed runs after one warm-up. The last line is
 * f32_sum_ratio=<ratio>. Options: -n MiB, -r reps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kern.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct {
    const char *kernel;
    kern_dtype_t dt;
    const kern_table_t *t;
    int kind; /* 0 reduce, 1 cast to 16, 2 cast from 16, 3 wire */
    int op_or_fmt;
} row_t;

static size_t nbytes = 64u << 20;
static int reps = 5;
static char *A, *B, *C;

static double best_of(void (*fn)(const row_t *), const row_t *r)
{
    fn(r); /* warm-up: page faults, caches */
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        fn(r);
        double dt = now_s() - t0;
        if (dt < best)
            best = dt;
    }
    return best;
}

static void do_memcpy(const row_t *r)
{
    (void)r;
    memcpy(C, A, nbytes);
}

static void do_row(const row_t *r)
{
    size_t n = nbytes / kern_dtype_size(r->dt);
    switch (r->kind) {
    case 0:
        r->t->reduce[r->dt][r->op_or_fmt](A, B, n);
        break;
    case 1:
        (r->op_or_fmt ? r->t->f32_to_bf16 : r->t->f32_to_f16)(C, A,
                                                              nbytes / 4);
        break;
    case 2:
        (r->op_or_fmt ? r->t->bf16_to_f32 : r->t->f16_to_f32)(A, C,
                                                              nbytes / 4);
        break;
    default:
        r->t->wire_reduce[r->op_or_fmt][KERN_SUM]((float *)(void *)A, C,
                                                  nbytes / 4);
        break;
    }
}

/* Bytes read + written by one call of the row's kernel. */
static double traffic(const row_t *r)
{
    switch (r->kind) {
    case 0: return 3.0 * (double)nbytes;          /* read 2, write 1 */
    case 1: return 1.5 * (double)nbytes;          /* read f32, write half */
    case 2: return 1.5 * (double)nbytes;
    default: return 2.5 * (double)nbytes;         /* acc r+w, wire read */
    }
}

int main(int argc, char **argv)
{
    int c;
    while ((c = getopt(argc, argv, "n:r:h")) != -1) {
        switch (c) {
        case 'n': nbytes = (size_t)atol(optarg) << 20; break;
        case 'r': reps = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-n MiB] [-r reps]\n", argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (nbytes == 0 || reps <= 0) {
        fprintf(stderr, "kernels: -n and -r must be positive\n");
        return 2;
    }
    A = aligned_alloc(64, nbytes);
    B = aligned_alloc(64, nbytes);
    C = aligned_alloc(64, nbytes);
    if (!A || !B || !C) {
        fprintf(stderr, "kernels: cannot allocate 3 x %zu bytes\n", nbytes);
        return 1;
    }
    /* Small finite values: no denormal or overflow slow paths anywhere. */
    for (size_t i = 0; i < nbytes / 4; i++) {
        ((float *)(void *)A)[i] = (float)(i % 1000) * 1e-3f;
        ((float *)(void *)B)[i] = (float)(i % 777) * 1e-3f;
    }
    memset(C, 0, nbytes);

    const kern_table_t *best = kern_table_best();
    row_t rows[32];
    int nr = 0;
    static const kern_dtype_t sum_dts[] = {KERN_F32, KERN_F64, KERN_F16,
                                           KERN_BF16, KERN_I32, KERN_U8};
    for (size_t i = 0; i < sizeof(sum_dts) / sizeof(sum_dts[0]); i++)
        rows[nr++] = (row_t){"sum", sum_dts[i], best, 0, KERN_SUM};
    rows[nr++] = (row_t){"max", KERN_F32, best, 0, KERN_MAX};
    rows[nr++] = (row_t){"cast_f32_to_bf16", KERN_F32, best, 1, 1};
    rows[nr++] = (row_t){"cast_f32_to_f16", KERN_F32, best, 1, 0};
    rows[nr++] = (row_t){"cast_bf16_to_f32", KERN_BF16, best, 2, 1};
    rows[nr++] = (row_t){"cast_f16_to_f32", KERN_F16, best, 2, 0};
    rows[nr++] = (row_t){"wire_bf16_sum", KERN_F32, best, 3, 1};
    rows[nr++] = (row_t){"wire_f16_sum", KERN_F32, best, 3, 0};
    static const char *const isa_rows[] = {"sum@scalar", "sum@avx2",
                                           "sum@avx512"};
    for (int isa = 0; isa < KERN_ISA_COUNT; isa++) {
        const kern_table_t *t = kern_table((kern_isa_t)isa);
        if (t != NULL)
            rows[nr++] = (row_t){isa_rows[isa], KERN_F32, t, 0, KERN_SUM};
    }

    printf("# kernels: isa=%s buffers=%zu MiB best of %d\n", best->name,
           nbytes >> 20, reps);
    printf("kernel\tdtype\tbytes\tGBps\tmemcpy_GBps\tratio\n");
    double f32_ratio = 0;
    for (int i = 0; i < nr; i++) {
        double mc = 2.0 * (double)nbytes / best_of(do_memcpy, NULL) / 1e9;
        double gb = traffic(&rows[i]) / best_of(do_row, &rows[i]) / 1e9;
        double ratio = gb / mc;
        printf("%s\t%s\t%zu\t%.2f\t%.2f\t%.3f\n", rows[i].kernel,
               kern_dtype_name(rows[i].dt), nbytes, gb, mc, ratio);
        if (i == 0)
            f32_ratio = ratio;
    }
    printf("f32_sum_ratio=%.3f\n", f32_ratio);
    free(A);
    free(B);
    free(C);
    return 0;
}
