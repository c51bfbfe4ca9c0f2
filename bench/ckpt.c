/*
 * bench/ckpt - what a checkpoint of a large f32 state costs.
 *
 * State: -s MiB (default 1024) of f32 "weights" drawn from N(0, 0.02^2), a
 * realistic scale for initialised and trained dense layers. The delta row
 * encodes the state after -k (default 3) SGD-like steps against the state
 * before them: w -= lr * g with lr 1e-3 and g ~ N(0, 0.02^2), an update of
 * about 1e-3 of each weight per step, the update-to-weight ratio usually
 * seen in healthy training (the demo trainer's own steps replace this
 * model once it checkpoints through the daemon). Each row: snapshot (the
 * memcpy into a staging buffer: the only stall on the training path), then
 * encode -n shards (default 4, as 4 nodes would, here one after another)
 * and write them atomically under a temp dir.
 *
 *   mode  stall_ms  total_ms  MBps  ratio
 *
 * total_ms runs from the snapshot to the last fsync; MBps is state bytes
 * per total second; ratio is state bytes over bytes written. gzip -6 is
 * zlib's deflate at level 6 (what gzip -6 runs), for comparison. The last
 * -l sets the zstd level (3), -t zstd's worker threads (0: the calling
 * thread, which is what the daemon's one checkpoint worker does). The last
 * line: ckpt: stall_ms_per_GiB=... overhead_pct=... delta_ratio=...
 * shuffle_ratio=... zstd_ratio=... (overhead_pct is the training slowdown
 * with checkpoints every K steps, measured by bench/ckpt-overhead.sh and
 * passed in with -o; "n/a" otherwise).
 *
 * Real weights: -a A -b B name two raw f32 parameter files of the demo
 * trainer (examples/trainer --dump P --dump-every 1: B a few real SGD
 * steps after A). Then rows real_* encode B (and B against A for the
 * delta) at their own size (tiling them up to 1 GiB would let zstd match
 * the copies and overstate every ratio), and the last line's ratios are
 * those of the real weights.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint/ckpt.h"
#include "tests/helpers.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double unif(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return ((double)(rs >> 11) + 0.5) / 9007199254740992.0;
}

static void normal_fill(float *w, size_t n, double sigma)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        double r = sqrt(-2.0 * log(unif())), t = 2 * M_PI * unif();
        w[i] = (float)(sigma * r * cos(t));
        w[i + 1] = (float)(sigma * r * sin(t));
    }
}

typedef struct {
    const char *name;
    int zlib;          /* deflate instead of zstd */
    uint32_t elem;     /* shuffle element size */
    int delta;
} mode_t_;

static int zthreads = 0, zlevel = 3;

static size_t encode_all(const mode_t_ *m, const char *root, uint64_t step,
                         const float *state, const float *base, size_t bytes,
                         uint32_t nshards)
{
    ckpt_codec_t codec = {.level = zlevel, .threads = zthreads,
                          .elem_size = m->elem};
    size_t written = 0;
    for (uint32_t i = 0; i < nshards; i++) {
        ckpt_shard_info_t info = {.step = step, .shard = i,
                                  .nshards = nshards, .total_size = bytes};
        ckpt_shard_range(bytes, nshards, i, 4, &info.offset, &info.raw_size);
        const char *raw = (const char *)state + info.offset;
        void *file = NULL;
        size_t len = 0;
        if (m->zlib) {
            uLongf cap = compressBound(info.raw_size);
            file = malloc(cap);
            if (file == NULL ||
                compress2(file, &cap, (const Bytef *)raw, info.raw_size, 6) !=
                    Z_OK) {
                fprintf(stderr, "ckpt: zlib failed\n");
                exit(1);
            }
            len = cap;
        } else {
            if (m->delta) {
                info.flags = CKPT_F_DELTA;
                info.base_step = step - 1;
            }
            if (ckpt_shard_encode(&codec, &info, raw,
                                  m->delta ? (const char *)base + info.offset
                                           : NULL,
                                  &file, &len) != 0) {
                fprintf(stderr, "ckpt: encode failed\n");
                exit(1);
            }
        }
        if (ckpt_store_put(root, step, i, 0, file, len) != 0) {
            fprintf(stderr, "ckpt: write failed under %s\n", root);
            exit(1);
        }
        written += len;
        free(file);
    }
    return written;
}

static float *load(const char *path, size_t *bytes_p)
{
    FILE *f = fopen(path, "rb");
    float *p = NULL;
    long n = -1;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 &&
        n % 4 == 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (p = malloc((size_t)n)) != NULL &&
        fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    if (f != NULL)
        fclose(f);
    *bytes_p = n > 0 ? (size_t)n : 0;
    return p;
}

/* The four modes on the trainer's real weights: ratio[] gets theirs. */
static int real_rows(const char *fa, const char *fb, const char *root,
                     uint32_t nshards, double *ratio)
{
    static const mode_t_ modes[] = {
        {"real_shuffle_zstd", 0, 4, 0},
        {"real_delta_shuffle_zstd", 0, 4, 1},
        {"real_zstd", 0, 1, 0},
        {"real_gzip-6", 1, 1, 0},
    };
    size_t na, nb;
    float *a = load(fa, &na), *b = load(fb, &nb);
    if (a == NULL || b == NULL || na != nb) {
        fprintf(stderr, "ckpt: cannot read two f32 files of one size: %s "
                "%s\n", fa, fb);
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        double t0 = now_s();
        size_t out = encode_all(&modes[i], root, (uint64_t)(20 + i), b, a,
                                nb, nshards);
        double t1 = now_s();
        ratio[i] = (double)nb / (double)out;
        printf("%s\t-\t%.1f\t%.0f\t%.3f\n", modes[i].name, (t1 - t0) * 1e3,
               (double)nb / 1e6 / (t1 - t0), ratio[i]);
        ckpt_store_retain(root, 0);
    }
    printf("# real_*: %zu bytes of demo-trainer weights (%s), delta "
           "against %s\n", nb, fb, fa);
    free(a);
    free(b);
    return 0;
}

int main(int argc, char **argv)
{
    size_t mib = 1024;
    uint32_t nshards = 4;
    int ksteps = 3, c;
    const char *fa = NULL, *fb = NULL, *overhead = "n/a";
    while ((c = getopt(argc, argv, "s:n:k:l:t:a:b:o:h")) != -1) {
        switch (c) {
        case 'a': fa = optarg; break;
        case 'b': fb = optarg; break;
        case 'o': overhead = optarg; break;
        case 'l': zlevel = atoi(optarg); break;
        case 't': zthreads = atoi(optarg); break;
        case 's': mib = (size_t)atol(optarg); break;
        case 'n': nshards = (uint32_t)atoi(optarg); break;
        case 'k': ksteps = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-s MiB] [-n shards] [-k steps] "
                    "[-l zstd level] [-t zstd threads]\n", argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (mib == 0 || nshards == 0 || ksteps < 1) {
        fprintf(stderr, "ckpt: -s, -n and -k must be positive\n");
        return 2;
    }
    size_t bytes = mib << 20, n = bytes / 4;
    float *w0 = malloc(bytes), *w1 = malloc(bytes), *stage = malloc(bytes);
    float *g = malloc(bytes);
    if (!w0 || !w1 || !stage || !g) {
        fprintf(stderr, "ckpt: cannot allocate 4 x %zu MiB\n", mib);
        return 1;
    }
    normal_fill(w0, n, 0.02);
    memcpy(w1, w0, bytes);
    for (int k = 0; k < ksteps; k++) {
        normal_fill(g, n, 0.02);
        for (size_t i = 0; i < n; i++)
            w1[i] -= 1e-3f * g[i];
    }
    free(g);
    memset(stage, 0, bytes); /* fault the staging pages in, as a daemon
                                that keeps its staging buffer would */
    char *root = th_mkdtemp("ringd-bench-ckpt");
    if (root == NULL) {
        fprintf(stderr, "ckpt: no temp dir\n");
        return 1;
    }

    static const mode_t_ modes[] = {
        {"shuffle_zstd", 0, 4, 0},
        {"delta_shuffle_zstd", 0, 4, 1},
        {"zstd", 0, 1, 0},
        {"gzip-6", 1, 1, 0},
    };
    double ratio[4], stall_best = 1e30;
    printf("# ckpt: %zu MiB f32 state, N(0,0.02^2), %u shards, zstd level "
           "%d, %d worker threads, delta after %d SGD steps\n", mib,
           nshards, zlevel, zthreads, ksteps);
    printf("mode\tstall_ms\ttotal_ms\tMBps\tratio\n");
    for (int i = 0; i < 4; i++) {
        const float *src = modes[i].delta ? w1 : w0;
        double t0 = now_s();
        memcpy(stage, src, bytes); /* the snapshot */
        double t1 = now_s();
        size_t out = encode_all(&modes[i], root, (uint64_t)(10 + i), stage,
                                w0, bytes, nshards);
        double t2 = now_s();
        ratio[i] = (double)bytes / (double)out;
        double stall = (t1 - t0) * 1e3;
        if (stall < stall_best)
            stall_best = stall;
        printf("%s\t%.1f\t%.0f\t%.0f\t%.3f\n", modes[i].name, stall,
               (t2 - t0) * 1e3, (double)bytes / 1e6 / (t2 - t0), ratio[i]);
        fflush(stdout);
        ckpt_store_retain(root, 0);
    }
    if (fa != NULL && fb != NULL && real_rows(fa, fb, root, nshards, ratio))
        return 1;
    th_rmtree(root);
    free(root);
    printf("ckpt: stall_ms_per_GiB=%.1f overhead_pct=%s delta_ratio=%.3f "
           "shuffle_ratio=%.3f zstd_ratio=%.3f\n",
           stall_best * 1024.0 / (double)mib, overhead, ratio[1], ratio[0],
           ratio[2]);
    free(w0);
    free(w1);
    free(stage);
    return 0;
}
