/*
 * bench/ckpt-cost - what a checkpoint of a large f32 state costs.
 *
 * State: -s MiB (default 1024) of f32 "weights" drawn from N(0, 0.02^2), a
 * realistic scale for initialised and trained dense layers. The delta row
 * encodes the state after -k (default 50, the checkpoint interval
 * bench/ckpt-overhead.sh runs the daemon at: a delta's base is the
 * previous checkpoint, k steps back) SGD-like steps against the state
 * before them: w -= lr * g with lr 1e-3 and g ~ N(0, 0.02^2), an update of
 * about 1e-3 of each weight per step, the update-to-weight ratio usually
 * seen in healthy training. The k steps are drawn as one: the sum of k
 * independent N(0, s^2) gradients is one N(0, k s^2) draw (a model with
 * uncorrelated steps; a real trainer's steps are correlated and drift
 * further, which is what the real_* rows show).
 *
 * First the snapshot alone (the only stall on the training path), at 256
 * MiB and at -s, -r times each (default 7), alternating, as ms per GiB:
 *
 *   snapshot  MiB  median  min  max
 *
 * stage_copy is the writer's copy into its stage (ckpt_stage_copy into
 * ckpt_stage_alloc's buffer: faulted in, huge pages asked for; streaming
 * stores from CKPT_STREAM_MIN), stage_memcpy the same with glibc's
 * memcpy (the writer's copy before), malloc_memcpy the latter into a malloc
 * buffer faulted in by a memset (the old stage); first_copy_unfaulted is
 * a copy into a fresh malloc buffer (what the first checkpoint of the old
 * writer paid) and stage_alloc_prefault what ckpt_stage_alloc costs
 * (ckpt_writer_reserve: off the training path when called before the
 * first checkpoint). The last line's stall_ms_per_GiB is the median of
 * stage_copy at -s.
 *
 * Then per mode: the snapshot (a memcpy into a faulted stage),
 * then encode -n shards (default 4, as 4 nodes would, here one after
 * another) and write them atomically under a temp dir.
 *
 *   mode  stall_ms  total_ms  MBps  ratio
 *
 * total_ms runs from the snapshot to the last fsync; MBps is state bytes
 * per total second; ratio is state bytes over bytes written. gzip -6 is
 * zlib's deflate at level 6 (what gzip -6 runs), for comparison. The first
 * four rows are the issue's; delta_shuffle_zstd is what the daemon writes
 * (the arithmetic delta, CKPT_F_DELTA_SUB); xor_delta_shuffle_zstd is the
 * first format's XOR delta, the *bitshuffle* rows the bit-plane shuffle.
 * A "# delta gain" note gives what the delta alone buys: the size of
 * shuffle_zstd over that of delta_shuffle_zstd (the same shuffle and zstd
 * with and without the delta), and one the speed of the two shuffles
 * alone.
 * -l sets the zstd level (3), -t zstd's worker threads (0: the calling
 * thread, which is what the daemon's one checkpoint worker does). The last
 * line: ckpt: stall_ms_per_GiB=... delta_ratio=... delta_steps=...
 * delta_data=synthetic|real shuffle_ratio=... zstd_ratio=...: delta_ratio
 * is the delta gain above (size of shuffle+zstd / size of
 * delta+shuffle+zstd) over delta_steps steps; shuffle_ratio and zstd_ratio
 * are state bytes over bytes written. The training slowdown from
 * checkpoints is bench/ckpt-overhead.sh's own last line
 * (ckpt_overhead_pct=, also run by make bench).
 *
 * Real weights: -a A -b B name two raw f32 parameter files of the demo
 * trainer (examples/trainer --no-daemon --hidden 1024 --dump P
 * --dump-every 1: B a few real SGD steps after A); -b may be repeated (up
 * to 8, e.g. 1, 3, 10 and 50 steps after A). Then rows real_* encode B
 * (and B against A for the deltas) at their own size (tiling them up to 1
 * GiB would let zstd match the copies and overstate every ratio), and the
 * last line's ratios are those of the last -b; its delta_steps is the
 * difference of the step numbers the trainer's dump names end in (P.100,
 * P.150: 50), "?" when the names carry none.
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
    int xor_delta;     /* the first format's XOR delta */
    int bitshuffle;
} mode_t_;

/* The four rows first (ratio[] of the last line), then the
 * alternatives measured against them. delta_shuffle_zstd is what the
 * daemon writes: the arithmetic delta. */
static const mode_t_ modes[] = {
    {"shuffle_zstd", 0, 4, 0, 0, 0},
    {"delta_shuffle_zstd", 0, 4, 1, 0, 0},
    {"zstd", 0, 1, 0, 0, 0},
    {"gzip-6", 1, 1, 0, 0, 0},
    {"xor_delta_shuffle_zstd", 0, 4, 1, 1, 0},
    {"delta_bitshuffle_zstd", 0, 4, 1, 0, 1},
    {"bitshuffle_zstd", 0, 4, 0, 0, 1},
};
#define NMODES ((int)(sizeof(modes) / sizeof(modes[0])))

static int zthreads = 0, zlevel = 3;
/* One encoder for every shard, as a writer keeps one: its buffers are
 * faulted in once, not for every shard. */
static ckpt_encoder_t *benc;

static size_t encode_all(const mode_t_ *m, const char *root, uint64_t step,
                         const float *state, const float *base, size_t bytes,
                         uint32_t nshards)
{
    ckpt_codec_t codec = {.level = zlevel, .threads = zthreads,
                          .elem_size = m->elem, .xor_delta = m->xor_delta,
                          .bitshuffle = m->bitshuffle};
    size_t written = 0;
    for (uint32_t i = 0; i < nshards; i++) {
        ckpt_shard_info_t info = {.step = step, .shard = i,
                                  .nshards = nshards, .total_size = bytes};
        ckpt_shard_range(bytes, nshards, i, 4, &info.offset, &info.raw_size);
        const char *raw = (const char *)state + info.offset;
        void *zfile = NULL; /* gzip's, freed here */
        const void *file = NULL;
        size_t len = 0;
        if (m->zlib) {
            uLongf cap = compressBound(info.raw_size);
            zfile = malloc(cap);
            if (zfile == NULL ||
                compress2(zfile, &cap, (const Bytef *)raw, info.raw_size,
                          6) != Z_OK) {
                fprintf(stderr, "ckpt: zlib failed\n");
                exit(1);
            }
            file = zfile;
            len = cap;
        } else {
            if (m->delta) {
                info.flags = CKPT_F_DELTA;
                info.base_step = step - 1;
            }
            if (ckpt_encoder_encode(benc, &codec, &info, raw,
                                    m->delta ? (const char *)base +
                                                   info.offset
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
        free(zfile);
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

/* What the delta alone buys: each delta row against the same shuffle and
 * zstd without it. */
static void delta_gain_note(const double *ratio)
{
    printf("# delta gain (shuffle+zstd size / delta+shuffle+zstd size): "
           "%.2fx (xor delta %.2fx; bit-shuffle %.2fx)\n",
           ratio[1] / ratio[0], ratio[4] / ratio[0], ratio[5] / ratio[6]);
}

/* The step a trainer dump's name ends in (P.150: 150), or -1. */
static long dump_step(const char *path)
{
    const char *dot = strrchr(path, '.');
    char *end;
    if (dot == NULL || dot[1] < '0' || dot[1] > '9')
        return -1;
    long v = strtol(dot + 1, &end, 10);
    return *end == '\0' ? v : -1;
}

/* Every mode on the trainer's real weights: ratio[] gets theirs. */
static int real_rows(const char *fa, const char *fb, const char *root,
                     uint32_t nshards, double *ratio)
{
    size_t na, nb;
    float *a = load(fa, &na), *b = load(fb, &nb);
    if (a == NULL || b == NULL || na != nb) {
        fprintf(stderr, "ckpt: cannot read two f32 files of one size: %s "
                "%s\n", fa, fb);
        return 1;
    }
    for (int i = 0; i < NMODES; i++) {
        double t0 = now_s();
        size_t out = encode_all(&modes[i], root, (uint64_t)(20 + i), b, a,
                                nb, nshards);
        double t1 = now_s();
        ratio[i] = (double)nb / (double)out;
        printf("real_%s\t-\t%.1f\t%.0f\t%.3f\n", modes[i].name,
               (t1 - t0) * 1e3, (double)nb / 1e6 / (t1 - t0), ratio[i]);
        ckpt_store_retain(root, 0);
    }
    printf("# real_*: %zu bytes of demo-trainer weights (%s), delta "
           "against %s\n", nb, fb, fa);
    delta_gain_note(ratio);
    free(a);
    free(b);
    return 0;
}

/* Throughput of the two shuffles alone (one thread, MB/s). */
static void shuffle_speed(const void *src, void *dst, size_t bytes)
{
    double t0 = now_s();
    ckpt_shuffle(dst, src, bytes, 4);
    double t1 = now_s();
    ckpt_bitshuffle(dst, src, bytes);
    double t2 = now_s();
    printf("# shuffle speed: byte-shuffle %.0f MB/s, bit-shuffle %.0f MB/s "
           "(scalar 8x8 transposes)\n", (double)bytes / 1e6 / (t1 - t0),
           (double)bytes / 1e6 / (t2 - t1));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ms per GiB of a copy of `bytes` that took `sec`. */
static double per_gib(double sec, size_t bytes)
{
    return sec * 1e3 * (double)(1u << 30) / (double)bytes;
}

/*
 * The snapshot alone, `reps` times at `bytes`: memcpy into a stage from
 * ckpt_stage_alloc (faulted in, huge pages asked for: what the writer
 * does) and into one from malloc faulted in by a memset (4 KiB pages
 * unless THP is "always"), alternating so both see the same machine; plus
 * the one-off costs: the first copy into a fresh malloc buffer (the old
 * writer's first checkpoint) and ckpt_stage_alloc (the fault-in, done by
 * ckpt_writer_reserve off the training path). Returns the median of the
 * first in ms per GiB.
 */
static double stall_rows(const void *src, size_t bytes, int reps)
{
    double sc[32], st[32], ml[32]; /* ms/GiB: writer's, stage, malloc */
    if (reps > 32)
        reps = 32;
    double t0 = now_s();
    unsigned char *stage = ckpt_stage_alloc(bytes);
    double t1 = now_s();
    unsigned char *fresh = malloc(bytes), *plain = malloc(bytes);
    if (stage == NULL || fresh == NULL || plain == NULL) {
        fprintf(stderr, "ckpt: cannot allocate the stall buffers\n");
        exit(1);
    }
    double t2 = now_s();
    memcpy(fresh, src, bytes);
    __asm__ volatile("" : : "r"(fresh) : "memory"); /* keep the copy */
    double t3 = now_s();
    free(fresh);
    memset(plain, 0, bytes);
    __asm__ volatile("" : : "r"(plain) : "memory"); /* fault it in */
    for (int r = 0; r < reps; r++) {
        double z = now_s();
        ckpt_stage_copy(stage, src, bytes);
        double a = now_s();
        memcpy(stage, src, bytes);
        double b = now_s();
        memcpy(plain, src, bytes);
        __asm__ volatile("" : : "r"(plain) : "memory");
        double c = now_s();
        sc[r] = per_gib(a - z, bytes);
        st[r] = per_gib(b - a, bytes);
        ml[r] = per_gib(c - b, bytes);
    }
    free(plain);
    qsort(sc, (size_t)reps, sizeof(double), cmp_double);
    qsort(st, (size_t)reps, sizeof(double), cmp_double);
    qsort(ml, (size_t)reps, sizeof(double), cmp_double);
    size_t mib = bytes >> 20;
    printf("stage_copy\t%zu\t%.1f\t%.1f\t%.1f\n", mib, sc[reps / 2],
           sc[0], sc[reps - 1]);
    printf("stage_memcpy\t%zu\t%.1f\t%.1f\t%.1f\n", mib, st[reps / 2],
           st[0], st[reps - 1]);
    printf("malloc_memcpy\t%zu\t%.1f\t%.1f\t%.1f\n", mib, ml[reps / 2],
           ml[0], ml[reps - 1]);
    printf("first_copy_unfaulted\t%zu\t%.1f\t-\t-\n", mib,
           per_gib(t3 - t2, bytes));
    printf("stage_alloc_prefault\t%zu\t%.1f\t-\t-\n", mib,
           per_gib(t1 - t0, bytes));
    fflush(stdout);
    ckpt_stage_free(stage, bytes);
    return sc[reps / 2];
}

/* One row per codec mode: the snapshot copy, then the encode of every
 * shard; fills ratio[] (raw bytes / encoded bytes). */
static void mode_rows(const float *w0, const float *w1, float *stage,
                      size_t bytes, const char *root, uint32_t nshards,
                      double *ratio)
{
    printf("mode\tstall_ms\ttotal_ms\tMBps\tratio\n");
    for (int i = 0; i < NMODES; i++) {
        const float *src = modes[i].delta ? w1 : w0;
        double t0 = now_s();
        memcpy(stage, src, bytes); /* the snapshot, as the writer's */
        double t1 = now_s();
        size_t out = encode_all(&modes[i], root, (uint64_t)(10 + i), stage,
                                w0, bytes, nshards);
        double t2 = now_s();
        ratio[i] = (double)bytes / (double)out;
        printf("%s\t%.1f\t%.0f\t%.0f\t%.3f\n", modes[i].name,
               (t1 - t0) * 1e3,
               (t2 - t0) * 1e3, (double)bytes / 1e6 / (t2 - t0), ratio[i]);
        fflush(stdout);
        ckpt_store_retain(root, 0);
    }
}

typedef struct {
    size_t mib;
    uint32_t nshards;
    int ksteps, reps, nb;
    const char *fa, *fb[8];
} bench_opts_t;

/* 0, or the exit status for a bad command line (0 for -h). */
static int parse_args(int argc, char **argv, bench_opts_t *o, int *exit_p)
{
    int c;
    *o = (bench_opts_t){.mib = 1024, .nshards = 4, .ksteps = 50, .reps = 7};
    while ((c = getopt(argc, argv, "s:n:k:l:t:a:b:r:h")) != -1) {
        switch (c) {
        case 'a': o->fa = optarg; break;
        case 'b':
            if (o->nb == 8) {
                fprintf(stderr, "ckpt: at most 8 -b\n");
                *exit_p = 2;
                return -1;
            }
            o->fb[o->nb++] = optarg;
            break;
        case 'r': o->reps = atoi(optarg); break;
        case 'l': zlevel = atoi(optarg); break;
        case 't': zthreads = atoi(optarg); break;
        case 's': o->mib = (size_t)atol(optarg); break;
        case 'n': o->nshards = (uint32_t)atoi(optarg); break;
        case 'k': o->ksteps = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-s MiB] [-n shards] [-k steps] "
                    "[-l zstd level] [-t zstd threads] [-r reps] "
                    "[-a A -b B [-b B2]...]\n", argv[0]);
            *exit_p = c == 'h' ? 0 : 2;
            return -1;
        }
    }
    if (o->mib == 0 || o->nshards == 0 || o->ksteps < 1 || o->reps < 1 ||
        (o->nb > 0 && o->fa == NULL)) {
        fprintf(stderr, "ckpt: -s, -n, -k and -r must be positive, -b "
                "needs -a\n");
        *exit_p = 2;
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_opts_t o;
    int code;
    if (parse_args(argc, argv, &o, &code) != 0)
        return code;
    size_t mib = o.mib;
    uint32_t nshards = o.nshards;
    int ksteps = o.ksteps, reps = o.reps, nb = o.nb;
    const char *fa = o.fa, *const *fb = o.fb;
    size_t bytes = mib << 20, n = bytes / 4;
    float *w0 = malloc(bytes), *w1 = malloc(bytes), *g = malloc(bytes);
    float *stage = ckpt_stage_alloc(bytes); /* as ckpt_writer_reserve */
    if (!w0 || !w1 || !stage || !g) {
        fprintf(stderr, "ckpt: cannot allocate 4 x %zu MiB\n", mib);
        return 1;
    }
    normal_fill(w0, n, 0.02);
    normal_fill(g, n, 0.02 * sqrt((double)ksteps));
    for (size_t i = 0; i < n; i++)
        w1[i] = w0[i] - 1e-3f * g[i];
    free(g);
    char *root = th_mkdtemp("ringd-bench-ckpt");
    if (root == NULL || ckpt_encoder_create(&benc) != 0) {
        fprintf(stderr, "ckpt: no temp dir or encoder\n");
        return 1;
    }

    double ratio[NMODES];
    printf("# snapshot copies, ms per GiB over %d runs each (median, min, "
           "max)\n", reps);
    printf("snapshot\tMiB\tmedian\tmin\tmax\n");
    if (bytes > ((size_t)256 << 20))
        stall_rows(w0, (size_t)256 << 20, reps);
    double stall = stall_rows(w0, bytes, reps);
    printf("# ckpt: %zu MiB f32 state, N(0,0.02^2), %u shards, zstd level "
           "%d, %d worker threads, delta after %d SGD steps\n", mib,
           nshards, zlevel, zthreads, ksteps);
    mode_rows(w0, w1, stage, bytes, root, nshards, ratio);
    delta_gain_note(ratio);
    shuffle_speed(w1, stage, bytes);
    long dsteps = ksteps;
    for (int i = 0; i < nb; i++) {
        if (real_rows(fa, fb[i], root, nshards, ratio))
            return 1;
        long sa = dump_step(fa), sb = dump_step(fb[i]);
        dsteps = sa >= 0 && sb > sa ? sb - sa : -1;
    }
    th_rmtree(root);
    free(root);
    char ds[24] = "?";
    if (dsteps > 0)
        snprintf(ds, sizeof ds, "%ld", dsteps);
    printf("ckpt: stall_ms_per_GiB=%.1f delta_ratio=%.3f delta_steps=%s "
           "delta_data=%s shuffle_ratio=%.3f zstd_ratio=%.3f\n", stall,
           ratio[1] / ratio[0], ds, nb > 0 ? "real" : "synthetic",
           ratio[0], ratio[2]);
    free(w0);
    free(w1);
    ckpt_stage_free(stage, bytes);
    ckpt_encoder_destroy(benc);
    return 0;
}
