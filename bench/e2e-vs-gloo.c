/*
 * e2e-vs-gloo.c - bench/e2e against Gloo: launches of build/bench/e2e-gloo
 * (one set of n processes per ring variant), the best variant per size
 * for the busbw table, and the whole --vs-gloo run (the raw ring against
 * every variant, round by round).
 */
#include "bench/e2e-coord.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers.h"

static const char *const gloo_algos[NGLOO] = {"ring", "chunked", "new"};

/* One launch of n Gloo processes running algo over every size, iters
 * each: the slowest rank's median per size in us[], its CPU per GB in
 * cpu[] (every rank's CPU over the timed iterations, as the ring's). */
static void run_gloo_algo(bench_t *b, int n, int algo, int iters,
                          double *us, double *cpu)
{
    static int launch;
    char bin[4200], dir[512], nstr[8], its[8];
    snprintf(bin, sizeof(bin), "%s/bench/e2e-gloo", th_bindir());
    snprintf(dir, sizeof(dir), "%s/gloo-n%d-%s-%d", b->tmp, n,
             gloo_algos[algo], launch++);
    mkdir(dir, 0700);
    snprintf(nstr, sizeof(nstr), "%d", n);
    snprintf(its, sizeof(its), "%d", iters);
    worker_t w[MAXN];
    char sz[MAXSIZES][24];
    for (int s = 0; s < b->nsizes; s++)
        snprintf(sz[s], sizeof(sz[s]), "%zu", b->sizes[s]);
    for (int r = 0; r < n; r++) {
        char rk[12], lg[600];
        snprintf(rk, sizeof(rk), "%d", r);
        snprintf(lg, sizeof(lg), "%s/log%d", dir, r);
        char *argv[8 + MAXSIZES] = {bin, (char *)gloo_algos[algo], rk,
                                    nstr, dir, its};
        for (int s = 0; s < b->nsizes; s++)
            argv[6 + s] = sz[s];
        argv[6 + b->nsizes] = NULL;
        e2e__worker_spawn(&w[r], argv, lg);
    }
    for (int s = 0; s < b->nsizes; s++) {
        double worst = 0, cpu_s = 0;
        for (int r = 0; r < n; r++) {
            char line[128];
            size_t bytes;
            double t, c;
            e2e__worker_line(&w[r], line, sizeof(line));
            if (sscanf(line, "%zu %lf %lf", &bytes, &t, &c) != 3)
                e2e__die("gloo", line);
            if (t > worst)
                worst = t;
            cpu_s += c;
        }
        us[s] = worst;
        cpu[s] = cpu_per_gb(cpu_s, n, b->sizes[s], iters);
    }
    /* Only these: --vs-gloo keeps its ring processes up meanwhile. */
    for (int r = 0; r < n; r++) {
        fclose(w[r].to);
        int st;
        if (th_wait(w[r].pid, 30000, &st) != 0)
            th_kill(w[r].pid);
        e2e__kid_forget(w[r].pid);
        close(w[r].from);
    }
}

static int gloo_built(void)
{
    char bin[4200];
    snprintf(bin, sizeof(bin), "%s/bench/e2e-gloo", th_bindir());
    return access(bin, X_OK) == 0;
}

void e2e__run_gloo(bench_t *b, int n, int iters, gloo_t *g)
{
    memset(g, 0, sizeof(*g));
    for (int s = 0; s < b->nsizes; s++)
        g->algo[s] = "-";
    e2e__need_gloo();
    for (int a = 0; a < NGLOO; a++) {
        run_gloo_algo(b, n, a, iters, g->var_us[a], g->var_cpu[a]);
        for (int s = 0; s < b->nsizes; s++)
            if (g->us[s] == 0 || g->var_us[a][s] < g->us[s]) {
                g->us[s] = g->var_us[a][s];
                g->cpu[s] = g->var_cpu[a][s];
                g->algo[s] = gloo_algos[a];
            }
    }
}

/* One size at one n in --vs-gloo: per round, the ring's and each Gloo
 * variant's time and CPU per GB. */
typedef struct {
    double ring_us[MAXROUNDS], ring_cpu[MAXROUNDS];
    double var_us[NGLOO][MAXROUNDS], var_cpu[NGLOO][MAXROUNDS];
} vs_cell_t;

/* The per-round ratios against that round's fastest Gloo variant. */
static void vs_print(const bench_t *b, int n, size_t bytes, vs_cell_t *c,
                     double *bw_ratio_p, double *cpu_ratio_p)
{
    double g_us[MAXROUNDS], g_cpu[MAXROUNDS], bw[MAXROUNDS], cpu[MAXROUNDS];
    int wins[NGLOO] = {0}, best = 0;
    for (int r = 0; r < b->rounds; r++) {
        int a = 0;
        for (int k = 1; k < NGLOO; k++)
            if (c->var_us[k][r] < c->var_us[a][r])
                a = k;
        wins[a]++;
        g_us[r] = c->var_us[a][r];
        g_cpu[r] = c->var_cpu[a][r];
        bw[r] = g_us[r] / c->ring_us[r];
        cpu[r] = c->ring_cpu[r] / g_cpu[r];
    }
    for (int k = 1; k < NGLOO; k++)
        if (wins[k] > wins[best])
            best = k;
    *bw_ratio_p = e2e__median(bw, b->rounds);
    *cpu_ratio_p = e2e__median(cpu, b->rounds);
    printf("%d\t%zu\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%.3f\t%.3f\n", n, bytes,
           busbw(bytes, e2e__median(c->ring_us, b->rounds), n),
           e2e__median(c->ring_cpu, b->rounds),
           busbw(bytes, e2e__median(g_us, b->rounds), n),
           e2e__median(g_cpu, b->rounds), gloo_algos[best], *bw_ratio_p,
           *cpu_ratio_p);
    for (int k = 0; k < NGLOO; k++)
        printf("# gloo %s n=%d bytes=%zu: busbw %.3f GB/s, %.3f CPU s/GB "
               "(medians of %d rounds)\n", gloo_algos[k], n, bytes,
               busbw(bytes, e2e__median(c->var_us[k], b->rounds), n),
               e2e__median(c->var_cpu[k], b->rounds), b->rounds);
}
/* A ratio against a peer that did not run is no figure: say what is
 * missing rather than print 0 (make bench installs libgloo-dev). */
void e2e__need_gloo(void)
{
    if (!gloo_built())
        e2e__die("gloo", "bench/e2e-gloo was not built: install "
                 "libgloo-dev (make bench-deps) and rebuild");
}

/*
 * --vs-gloo: the raw ring against every Gloo ring variant at n = 2 and 4,
 * interleaved round by round (the ring's processes stay up; Gloo's are
 * launched per variant per round, as Gloo needs), nothing else.
 */
int e2e__run_vs_gloo(bench_t *b)
{
    e2e__need_gloo();
    printf("n\tbytes\tring_busbw\tring_cpu_s_per_GB\tgloo_busbw"
           "\tgloo_cpu_s_per_GB\tgloo_algo\tring_vs_gloo"
           "\tring_cpu_over_gloo\n");
    double bw64[2] = {0, 0}, cpu64[2] = {0, 0};
    for (int ni = 0; ni < 2; ni++) {
        int n = ni ? 4 : 2;
        char job[32];
        worker_t rg[MAXN];
        static vs_cell_t cell[MAXSIZES];
        snprintf(job, sizeof(job), "vs-gloo-n%d", n);
        e2e__ring_group_up(b, job, n, b->sizes[b->nsizes - 1], rg);
        for (int r = 0; r < b->rounds; r++) {
            for (int s = 0; s < b->nsizes; s++) {
                int it = iters_for(b->sizes[s]);
                cell[s].ring_us[r] = e2e__group_run(rg, n, b->sizes[s], it);
                cell[s].ring_cpu[r] = cpu_per_gb(e2e__group_cpu(), n,
                                                 b->sizes[s], it);
            }
            for (int a = 0; a < NGLOO; a++) {
                double us[MAXSIZES], cpu[MAXSIZES];
                /* Gloo's iterations: the ring's count at the largest
                 * size, as its launch runs every size. */
                run_gloo_algo(b, n, a, iters_for(b->sizes[b->nsizes - 1]),
                              us, cpu);
                for (int s = 0; s < b->nsizes; s++) {
                    cell[s].var_us[a][r] = us[s];
                    cell[s].var_cpu[a][r] = cpu[s];
                }
            }
        }
        e2e__group_quit(rg, n);
        e2e__kill_kids();
        for (int s = 0; s < b->nsizes; s++) {
            double bw, cpu;
            vs_print(b, n, b->sizes[s], &cell[s], &bw, &cpu);
            if (b->sizes[s] == 64 * MiB) {
                bw64[ni] = bw;
                cpu64[ni] = cpu;
            }
        }
    }
    printf("e2e: ring_vs_gloo_n2=%.3f ring_vs_gloo_n4=%.3f "
           "ring_cpu_over_gloo_n2=%.3f ring_cpu_over_gloo_n4=%.3f\n",
           bw64[0], bw64[1], cpu64[0], cpu64[1]);
    return 0;
}
