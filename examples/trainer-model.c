/*
 * trainer-model.c - the C trainer's data, model and GEMMs (see
 * trainer-model.h); nothing here knows ringd.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <zlib.h>

#include "examples/trainer-model.h"

long model_size(long h)
{
    return h * NIN + h + NOUT * h + NOUT;
}

void model_view(model_t *m, float *base, long h)
{
    m->h = h;
    m->w1 = base;
    m->b1 = m->w1 + h * NIN;
    m->w2 = m->b1 + h;
    m->b2 = m->w2 + NOUT * h;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s)
{
    return (float)(splitmix64(s) >> 40) / (float)(1ull << 24);
}

uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- data ------------------------------------------------------------ */

int load_digits(data_t *d)
{
    gzFile f = gzopen(DIGITS_CSV, "rb");
    if (f == NULL)
        return -1;
    char line[1024];
    int n = 0;
    while (n < NSAMPLES && gzgets(f, line, sizeof(line)) != NULL) {
        char *p = line;
        for (int j = 0; j <= NIN; j++) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (j < NIN)
                d->x[n][j] = (float)v / 16.0f;
            else
                d->y[n] = (int)v;
            p = *end == ',' ? end + 1 : end;
        }
        n++;
    }
    gzclose(f);
    if (n != NSAMPLES)
        return -1;
    d->source = "sklearn digits (" DIGITS_CSV ")";
    return 0;
}

/* Ten noisy prototypes in 64 dimensions: learnable, deterministic. */
void make_synthetic(data_t *d)
{
    uint64_t s = 12345;
    float proto[NOUT][NIN];
    for (int c = 0; c < NOUT; c++)
        for (int j = 0; j < NIN; j++)
            proto[c][j] = uniform(&s) > 0.5f ? 1.0f : 0.0f;
    for (int i = 0; i < NSAMPLES; i++) {
        d->y[i] = i % NOUT;
        for (int j = 0; j < NIN; j++)
            d->x[i][j] = proto[d->y[i]][j] * 0.6f + uniform(&s) * 0.4f;
    }
    d->source = "synthetic (deterministic prototypes + noise)";
}

/* A fixed shuffle so that train and test mix all classes. */
void shuffle(data_t *d)
{
    uint64_t s = 777;
    for (int i = NSAMPLES - 1; i > 0; i--) {
        int j = (int)(splitmix64(&s) % (uint64_t)(i + 1));
        float tx[NIN];
        memcpy(tx, d->x[i], sizeof(tx));
        memcpy(d->x[i], d->x[j], sizeof(tx));
        memcpy(d->x[j], tx, sizeof(tx));
        int ty = d->y[i];
        d->y[i] = d->y[j];
        d->y[j] = ty;
    }
}

/* ---- dense layers: OpenBLAS or cuBLAS --------------------------------- */

static float *dev_buf(dense_t *g, int i, size_t n)
{
    if (g->dev_size[i] < n) {
        g->api->dev_free(g->dev[i]);
        g->dev[i] = NULL;
        g->dev_size[i] = 0;
        if (g->api->dev_malloc((void **)&g->dev[i], n * sizeof(float)) != 0)
            return NULL;
        g->dev_size[i] = n;
    }
    return g->dev[i];
}

static int h2d(dense_t *g, int i, const float *h, size_t n, float **d_p)
{
    *d_p = dev_buf(g, i, n ? n : 1);
    if (*d_p == NULL)
        return -1;
    return n ? g->api->memcpy_h2d(*d_p, h, n * sizeof(float)) : 0;
}

/* Y[m x n] = X[m x k] W[n x k]^T + b[n] */
static int dense_fwd(dense_t *g, int m, int n, int k, const float *X,
                     const float *W, const float *b, float *Y)
{
    if (m == 0)
        return 0;
    if (g->gpu != NULL) {
        float *dX, *dW, *db, *dY;
        if (h2d(g, 0, X, (size_t)m * k, &dX) || h2d(g, 1, W, (size_t)n * k,
                                                     &dW) ||
            h2d(g, 2, b, (size_t)n, &db) ||
            (dY = dev_buf(g, 3, (size_t)m * n)) == NULL ||
            g->api->dense_forward(g->blas, m, n, k, dX, dW, db, dY) != 0)
            return -1;
        return g->api->memcpy_d2h(Y, dY, (size_t)m * n * sizeof(float));
    }
    for (int i = 0; i < m; i++)
        memcpy(Y + (size_t)i * n, b, (size_t)n * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, X, k,
                W, k, 1.0f, Y, n);
    return 0;
}

/* dW = dY^T X, db = colsum(dY), dX = dY W (when dX != NULL); m may be 0. */
static int dense_bwd(dense_t *g, int m, int n, int k, const float *X,
                     const float *W, const float *dY, float *dX, float *dW,
                     float *db)
{
    if (m == 0) {
        memset(dW, 0, (size_t)n * k * sizeof(float));
        memset(db, 0, (size_t)n * sizeof(float));
        return 0;
    }
    if (g->gpu != NULL) {
        float *gX, *gW, *gdY, *gdX = NULL, *gdW, *gdb;
        if (h2d(g, 0, X, (size_t)m * k, &gX) ||
            h2d(g, 1, W, (size_t)n * k, &gW) ||
            h2d(g, 2, dY, (size_t)m * n, &gdY) ||
            (dX && (gdX = dev_buf(g, 3, (size_t)m * k)) == NULL) ||
            (gdW = dev_buf(g, 4, (size_t)n * k)) == NULL ||
            (gdb = dev_buf(g, 5, (size_t)n)) == NULL ||
            g->api->dense_backward(g->blas, m, n, k, gX, gW, gdY, gdX, gdW,
                                   gdb) != 0)
            return -1;
        if (dX && g->api->memcpy_d2h(dX, gdX, (size_t)m * k * sizeof(float)))
            return -1;
        if (g->api->memcpy_d2h(dW, gdW, (size_t)n * k * sizeof(float)))
            return -1;
        return g->api->memcpy_d2h(db, gdb, (size_t)n * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dY, n,
                X, k, 0.0f, dW, k);
    for (int j = 0; j < n; j++) {
        float s = 0;
        for (int i = 0; i < m; i++)
            s += dY[(size_t)i * n + j];
        db[j] = s;
    }
    if (dX != NULL)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f,
                    dY, n, W, k, 0.0f, dX, k);
    return 0;
}

void dense_open(dense_t *g, int cpu_only)
{
    memset(g, 0, sizeof(*g));
    if (cpu_only || kern_gpu_open(NULL, &g->gpu) != 0) {
        g->gpu = NULL;
        printf("gemm: OpenBLAS on the CPU\n");
        return;
    }
    g->api = kern_gpu_api(g->gpu);
    if (g->api->blas_create(&g->blas) != 0) {
        kern_gpu_close(g->gpu);
        g->gpu = NULL;
        printf("gemm: cuBLAS unusable, OpenBLAS on the CPU\n");
        return;
    }
    printf("gemm: cuBLAS on %s\n", kern_gpu_describe(g->gpu));
}

void dense_close(dense_t *g)
{
    if (g->gpu == NULL)
        return;
    for (int i = 0; i < 6; i++)
        g->api->dev_free(g->dev[i]);
    g->api->blas_destroy(g->blas);
    kern_gpu_close(g->gpu);
}

/* ---- the model -------------------------------------------------------- */

void init_params(model_t *m, uint64_t seed)
{
    uint64_t s = seed;
    float r1 = 1.0f / sqrtf((float)NIN), r2 = 1.0f / sqrtf((float)m->h);
    for (long i = 0; i < m->h * NIN; i++)
        m->w1[i] = (2 * uniform(&s) - 1) * r1;
    for (long i = 0; i < NOUT * m->h; i++)
        m->w2[i] = (2 * uniform(&s) - 1) * r2;
    memset(m->b1, 0, (size_t)m->h * sizeof(float));
    memset(m->b2, 0, NOUT * sizeof(float));
}

/* Forward over rows; logits in sc->z2. */
static int forward(dense_t *g, const model_t *m, scratch_t *sc, int rows)
{
    int h = (int)m->h;
    if (dense_fwd(g, rows, h, NIN, sc->x, m->w1, m->b1, sc->z1))
        return -1;
    for (long i = 0; i < (long)rows * h; i++)
        sc->a1[i] = sc->z1[i] > 0 ? sc->z1[i] : 0;
    return dense_fwd(g, rows, NOUT, h, sc->a1, m->w2, m->b2, sc->z2);
}

/* Softmax in place; returns the loss sum and counts correct answers. */
static double softmax_loss(float *z, const int *y, int rows, int *correct)
{
    double loss = 0;
    for (int i = 0; i < rows; i++) {
        float *r = z + (size_t)i * NOUT, mx = r[0], sum = 0;
        int arg = 0;
        for (int j = 1; j < NOUT; j++)
            if (r[j] > mx) {
                mx = r[j];
                arg = j;
            }
        for (int j = 0; j < NOUT; j++) {
            r[j] = expf(r[j] - mx);
            sum += r[j];
        }
        for (int j = 0; j < NOUT; j++)
            r[j] /= sum;
        loss -= log(fmax(r[y[i]], 1e-12));
        *correct += arg == y[i];
    }
    return loss;
}

/*
 * Gradients of the shard [lo, hi) of the global batch, scaled so that the
 * AVG over `world` trainers is the mean over the whole batch.
 */
int gradients(dense_t *g, const model_t *m, model_t *gr,
                     scratch_t *sc, const data_t *d, long step, long batch,
                     uint32_t rank, uint32_t world, uint64_t seed,
                     float stats[2])
{
    long lo = batch * rank / world, hi = batch * (rank + 1) / world;
    int rows = (int)(hi - lo), h = (int)m->h, correct = 0;
    for (int i = 0; i < rows; i++) {
        uint64_t s = seed * 1000003ull + (uint64_t)(step * batch + lo + i);
        int idx = (int)(splitmix64(&s) % NTRAIN);
        memcpy(sc->x + (size_t)i * NIN, d->x[idx], NIN * sizeof(float));
        sc->y[i] = d->y[idx];
    }
    if (forward(g, m, sc, rows))
        return -1;
    double loss = softmax_loss(sc->z2, sc->y, rows, &correct);
    float scale = (float)world / (float)batch;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < NOUT; j++)
            sc->dz2[(size_t)i * NOUT + j] =
                (sc->z2[(size_t)i * NOUT + j] - (j == sc->y[i])) * scale;
    if (dense_bwd(g, rows, NOUT, h, sc->a1, m->w2, sc->dz2, sc->da1, gr->w2,
                  gr->b2))
        return -1;
    for (long i = 0; i < (long)rows * h; i++)
        if (sc->z1[i] <= 0)
            sc->da1[i] = 0;
    if (dense_bwd(g, rows, h, NIN, sc->x, m->w1, sc->da1, NULL, gr->w1,
                  gr->b1))
        return -1;
    stats[0] = (float)loss;
    stats[1] = (float)correct;
    return 0;
}

double test_accuracy(dense_t *g, const model_t *m, scratch_t *sc,
                            const data_t *d, long cap)
{
    int correct = 0, done = 0;
    while (done < NSAMPLES - NTRAIN) {
        int rows = (int)(NSAMPLES - NTRAIN - done < cap ? NSAMPLES - NTRAIN
                                                              - done
                                                        : cap);
        for (int i = 0; i < rows; i++) {
            memcpy(sc->x + (size_t)i * NIN, d->x[NTRAIN + done + i],
                   NIN * sizeof(float));
            sc->y[i] = d->y[NTRAIN + done + i];
        }
        if (forward(g, m, sc, rows))
            return -1;
        (void)softmax_loss(sc->z2, sc->y, rows, &correct);
        done += rows;
    }
    return (double)correct / (NSAMPLES - NTRAIN);
}
