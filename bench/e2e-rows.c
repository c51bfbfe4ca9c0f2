/*
 * e2e-rows.c - bench/e2e's rows that are not busbw tables (e2e.c has
 * those): the per-step cost of a state region and the daemons' CPU per
 * step, the asynchronous and fused allreduces against blocking ones, and
 * the per-step latency of a small allreduce at 2, 4 and 8 nodes.
 */
#include "bench/e2e-coord.h"

#include <stdio.h>

#include "include/ringd.h"

#define STATE_BYTES (1024 * MiB)

/*
 * The per-step cost of a 1 GiB state region: a trainer that does nothing
 * but step_begin/step_end, with and without the state, at n = 2 and in a
 * one-node job (where the daemon keeps a per-step snapshot for joiners).
 * Then the daemons' CPU time per step while their trainers "compute"
 * (sleep COMPUTE_MS) before a 1 MiB allreduce: what the ring's progress
 * takes from trainers and loaders.
 */
void e2e__run_steps(bench_t *b, steps_t *out)
{
    static cluster_t plain, st2, st1;
    double tp[MAXROUNDS], t2[MAXROUNDS], t1[MAXROUNDS], cpu[MAXROUNDS];
    e2e__cluster_up(b, &plain, "e2e-steps-plain", 2, 1, MiB, 0);
    e2e__cluster_up(b, &st2, "e2e-steps-state2", 2, 1, MiB, STATE_BYTES);
    e2e__cluster_up(b, &st1, "e2e-steps-state1", 1, 1, MiB, STATE_BYTES);
    for (int r = 0; r < b->rounds; r++) {
        tp[r] = e2e__group_run(plain.tr, 2, 0, 20);
        t2[r] = e2e__group_run(st2.tr, 2, 0, 20);
        t1[r] = e2e__group_run(st1.tr, 1, 0, 20);
        double c0 = e2e__cluster_cpu(&plain);
        e2e__group_run_ms(plain.tr, 2, MiB, 10, COMPUTE_MS);
        cpu[r] = (e2e__cluster_cpu(&plain) - c0) / 2 / 11 * 1e3;
    }
    double base = e2e__median(tp, b->rounds) / 1e3;
    out->overhead_ms[0] = e2e__median(t2, b->rounds) / 1e3 - base;
    out->overhead_ms[1] = e2e__median(t1, b->rounds) / 1e3 - base;
    out->cpu_ms_per_step = e2e__median(cpu, b->rounds);
    e2e__cluster_down(&st1);
    e2e__cluster_down(&st2);
    e2e__cluster_down(&plain);
    e2e__kill_kids();
}

/* As group_run, each worker reducing bytes as `pieces` asynchronous
 * allreduces. */
static double group_run_pieces(worker_t *w, int nw, size_t bytes, int iters,
                               int pieces)
{
    for (int i = 0; i < nw; i++) {
        fprintf(w[i].to, "run %zu %d 0 %d\n", bytes, iters, pieces);
        fflush(w[i].to);
    }
    double worst = 0;
    for (int i = 0; i < nw; i++) {
        char line[256];
        double us, mean;
        e2e__worker_line(&w[i], line, sizeof(line));
        if (sscanf(line, "ok %lf %lf", &us, &mean) != 2)
            e2e__die("worker run", line);
        if (us > worst)
            worst = us;
    }
    return worst;
}

#define ASYNC_PIECES 64

#define SMALL_PIECES 128
#define SMALL_BYTES (1 * MiB)


/*
 * 64 MiB reduced as ASYNC_PIECES asynchronous allreduces of 1 MiB, all
 * outstanding at once, against one blocking allreduce of 64 MiB, in the
 * same rounds of one n = 2 job: what queuing costs or saves per
 * collective (the daemon runs them back to back on the ring, no round
 * trip to the trainer between them, no fusion). Then the small-tensor
 * case, where that round trip dominates: SMALL_PIECES allreduces of
 * 8 KiB, asynchronous, and asynchronous in one fusion group (one ring
 * operation), against blocking one after the other.
 */
void e2e__run_async(bench_t *b, async_t *out)
{
    static cluster_t c;
    size_t bytes = 64 * MiB;
    double one[MAXROUNDS], many[MAXROUNDS], ratio[MAXROUNDS];
    double sa[MAXROUNDS], sb[MAXROUNDS], sr[MAXROUNDS];
    double sf[MAXROUNDS], fr[MAXROUNDS], mf[MAXROUNDS], mr[MAXROUNDS];
    double bf[MAXROUNDS], br[MAXROUNDS];
    e2e__cluster_up(b, &c, "e2e-async", 2, 1, bytes, 0);
    e2e__group_run(c.tr, 2, MiB, 1); /* the job forms */
    int it = b->quick ? 3 : iters_for(bytes);
    double autos = 0, asks = 0;
    for (int r = 0; r < b->rounds; r++) {
        one[r] = e2e__group_run(c.tr, 2, bytes, it);
        double a0 = td_metric(&c.d[0], "ringd_collectives_fused_auto_total");
        double k0 = td_metric(&c.d[0], "ringd_fusion_asks_total");
        many[r] = group_run_pieces(c.tr, 2, bytes, it, ASYNC_PIECES);
        autos += td_metric(&c.d[0], "ringd_collectives_fused_auto_total") -
                 a0;
        asks += td_metric(&c.d[0], "ringd_fusion_asks_total") - k0;
        ratio[r] = one[r] / many[r];
        mf[r] = group_run_pieces(c.tr, 2, bytes, it,
                                 RINGD_MAX_OUTSTANDING + ASYNC_PIECES);
        mr[r] = one[r] / mf[r];
        bf[r] = group_run_pieces(c.tr, 2, bytes, it,
                                 2 * RINGD_MAX_OUTSTANDING + ASYNC_PIECES);
        br[r] = one[r] / bf[r];
        sa[r] = group_run_pieces(c.tr, 2, SMALL_BYTES, it, SMALL_PIECES);
        sb[r] = group_run_pieces(c.tr, 2, SMALL_BYTES, it, -SMALL_PIECES);
        sr[r] = sb[r] / sa[r];
        sf[r] = group_run_pieces(c.tr, 2, SMALL_BYTES, it,
                                 RINGD_MAX_OUTSTANDING + SMALL_PIECES);
        fr[r] = sb[r] / sf[r];
    }
    out->many_fused_us = e2e__median(mf, b->rounds);
    out->fused_one_ratio = e2e__median(mr, b->rounds);
    out->back_fused_us = e2e__median(bf, b->rounds);
    out->back_one_ratio = e2e__median(br, b->rounds);
    out->small_fused_us = e2e__median(sf, b->rounds);
    out->fused_ratio = e2e__median(fr, b->rounds);
    out->small_async_us = e2e__median(sa, b->rounds);
    out->small_block_us = e2e__median(sb, b->rounds);
    out->small_ratio = e2e__median(sr, b->rounds);
    /* a run is one warm-up and it timed (e2e-worker.c) */
    out->many_auto_share = autos / ((double)b->rounds * (it + 1) *
                                    ASYNC_PIECES);
    out->many_asks = asks / ((double)b->rounds * (it + 1));
    out->one_us = e2e__median(one, b->rounds);
    out->many_us = e2e__median(many, b->rounds);
    out->ratio = e2e__median(ratio, b->rounds);
    e2e__cluster_down(&c);
    e2e__kill_kids();
}

void e2e__print_async(const async_t *a)
{
    printf("# %d outstanding async allreduces of 1 MiB vs one of 64 MiB "
           "(n=2, one trainer per node): busbw %.3f vs %.3f GB/s, ratio "
           "%.3f; the %d in one fusion group: busbw %.3f, ratio %.3f "
           "(end to end: in the buffer); issued backwards (in the "
           "pieces): busbw %.3f, ratio %.3f\n",
           ASYNC_PIECES, busbw(64 * MiB, a->many_us, 2),
           busbw(64 * MiB, a->one_us, 2), a->ratio, ASYNC_PIECES,
           busbw(64 * MiB, a->many_fused_us, 2), a->fused_one_ratio,
           busbw(64 * MiB, a->back_fused_us, 2), a->back_one_ratio);
    printf("# the %d outstanding ones: %.1f%% fused by the daemon by "
           "arrival, %.2f asks per %d (ring-fuse-kib)\n", ASYNC_PIECES,
           100 * a->many_auto_share, a->many_asks, ASYNC_PIECES);
    printf("# %d allreduces of %zu KiB (n=2): asynchronous %.1f us, "
           "fused in one group %.1f us, blocking one after the other "
           "%.1f us; speed-up %.2f (async), %.2f (fused)\n",
           SMALL_PIECES, SMALL_BYTES / SMALL_PIECES / 1024,
           a->small_async_us, a->small_fused_us, a->small_block_us,
           a->small_ratio, a->fused_ratio);
}

#define STEP_LAT_BYTES 4096

/* One round of STEP_LAT steps on cl: the slowest trainer's median. */
static double step_round(cluster_t *cl, int n, int iters)
{
    for (int w = 0; w < n; w++) {
        fprintf(cl->tr[w].to, "step %d %d\n", STEP_LAT_BYTES, iters);
        fflush(cl->tr[w].to);
    }
    double worst = 0;
    for (int w = 0; w < n; w++) {
        char line[256];
        double med, mean;
        e2e__worker_line(&cl->tr[w], line, sizeof(line));
        if (sscanf(line, "ok %lf %lf", &med, &mean) != 2)
            e2e__die("worker step", line);
        if (med > worst)
            worst = med;
    }
    return worst;
}

/*
 * The per-step latency of a 4 KiB allreduce at n = 2, 4, 8 nodes, one
 * trainer each: the slowest trainer's median over 200 steps (50 with
 * --quick) of step_begin + allreduce + step_end, in us. Two jobs side by
 * side, rounds interleaved: the default (step_end waits for the commit
 * round) in us[], and one with --step-commit=false in off_us[].
 */
void e2e__run_step_latency(bench_t *b, double us[3], double off_us[3])
{
    static const int ns[3] = {2, 4, 8};
    int iters = b->quick ? 50 : 200;
    for (int k = 0; k < 3; k++) {
        static cluster_t cl, off;
        char job[32], job_off[40];
        snprintf(job, sizeof(job), "e2e-steplat-n%d", ns[k]);
        snprintf(job_off, sizeof(job_off), "e2e-steplat-nocommit-n%d",
                 ns[k]);
        cl.flag = NULL;
        off.flag = "--step-commit=false";
        e2e__cluster_up(b, &cl, job, ns[k], 1, STEP_LAT_BYTES, 0);
        e2e__cluster_up(b, &off, job_off, ns[k], 1, STEP_LAT_BYTES, 0);
        e2e__group_run(cl.tr, ns[k], STEP_LAT_BYTES, 1); /* the job forms */
        e2e__group_run(off.tr, ns[k], STEP_LAT_BYTES, 1);
        double r[MAXROUNDS], r_off[MAXROUNDS];
        for (int i = 0; i < b->rounds; i++) {
            r[i] = step_round(&cl, ns[k], iters);
            r_off[i] = step_round(&off, ns[k], iters);
        }
        us[k] = e2e__median(r, b->rounds);
        off_us[k] = e2e__median(r_off, b->rounds);
        e2e__cluster_down(&cl);
        e2e__cluster_down(&off);
        e2e__kill_kids();
    }
    printf("# per-step latency of a %d-byte allreduce (step_begin + "
           "allreduce + step_end, one trainer per node): n=2 %.0f us, "
           "n=4 %.0f us, n=8 %.0f us; without the commit round "
           "(--step-commit=false, interleaved): %.0f, %.0f, %.0f us\n",
           STEP_LAT_BYTES, us[0], us[1], us[2], off_us[0], off_us[1],
           off_us[2]);
    fflush(stdout);
}
