/*
 * trainer-model.h - the C trainer's model, apart from ringd: the digits
 * data, a 64 -> hidden (ReLU) -> 10 MLP with softmax cross-entropy, its
 * GEMMs on OpenBLAS or on cuBLAS through kern_gpu. trainer.c holds the
 * training loop through libringd.
 */
#ifndef RINGD_EXAMPLES_TRAINER_MODEL_H
#define RINGD_EXAMPLES_TRAINER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_gpu.h"

#define NIN 64
#define NOUT 10
#define NSAMPLES 1797
#define NTRAIN 1500
#define DIGITS_CSV "/usr/lib/python3/dist-packages/sklearn/datasets/data/" \
                   "digits.csv.gz"


typedef struct {
    float x[NSAMPLES][NIN];
    int y[NSAMPLES];
    const char *source;
} data_t;

/* Layout of the parameter (and gradient) vector. */
typedef struct {
    long h;
    float *w1, *b1, *w2, *b2;
} model_t;

/* Dense layers: cuBLAS when a GPU is present (device buffers kept for
 * reuse), else OpenBLAS. */
typedef struct {
    kern_gpu_t *gpu;
    const kern_cuda_api_t *api;
    void *blas;
    float *dev[6];
    size_t dev_size[6];
} dense_t;

/* Activations of up to a batch's rows. */
typedef struct {
    float *x, *z1, *a1, *z2, *dz2, *da1;
    int *y;
} scratch_t;

/* Elements of the parameter vector for `hidden` units. */
long model_size(long hidden);
/* Points m's layers into base (model_size(h) floats). */
void model_view(model_t *m, float *base, long h);
void init_params(model_t *m, uint64_t seed);
uint64_t fnv1a(const void *p, size_t n);

/* 0, or -1 when Debian's python3-sklearn digits cannot be read. */
int load_digits(data_t *d);
void make_synthetic(data_t *d);
/* A fixed shuffle so that train and test mix all classes. */
void shuffle(data_t *d);

void dense_open(dense_t *g, int cpu_only);
void dense_close(dense_t *g);

/*
 * Gradients into gr of trainer (rank, world)'s shard of step's global
 * batch (drawn from seed and step alone), scaled so that the AVG over
 * world trainers is the mean over the whole batch; stats[0] the loss
 * sum, stats[1] the correct answers. 0, or -1 on a GPU error.
 */
int gradients(dense_t *g, const model_t *m, model_t *gr, scratch_t *sc,
              const data_t *d, long step, long batch, uint32_t rank,
              uint32_t world, uint64_t seed, float stats[2]);
/* Accuracy on the held-out samples, cap rows at a time; -1 on error. */
double test_accuracy(dense_t *g, const model_t *m, scratch_t *sc,
                     const data_t *d, long cap);

#endif
