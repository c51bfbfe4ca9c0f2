/*
 * trainer.c - a data-parallel MLP classifier trained through libringd.
 *
 * Data: scikit-learn's digits (1797 8x8 images, 10 classes) read from
 * Debian's python3-sklearn with zlib, else a deterministic synthetic set of
 * the same shape (the first line of output says which). The first 1500
 * samples (after a fixed shuffle) train, the rest test.
 *
 * Model: 64 -> hidden (ReLU) -> 10, softmax cross-entropy, plain SGD.
 * The parameters live in a ringd buffer declared as the state region, so
 * a joining trainer receives them; gradients live in another ringd buffer
 * and are averaged with ringd_allreduce(AVG). Each step's global batch is
 * drawn from the step number alone, and trainer (rank, world) takes the
 * rank-th slice of it, so any world size computes the same global update.
 *
 * GEMMs: cuBLAS through kern_gpu when a GPU is present, else OpenBLAS.
 * The data, the model and the GEMMs are in trainer-model.c; this file is
 * the training loop through libringd.
 */
#include <errno.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "examples/trainer-model.h"
#include "include/ringd.h"

void openblas_set_num_threads(int);

typedef struct {
    const char *socket;
    long steps, batch, hidden, log_every;
    double lr, target_acc;
    uint64_t seed;
    const char *hash_log, *save, *data, *name;
    int no_daemon, cpu_only;
    long crash_at;   /* fault injection: SIGKILL itself in this step */
    long stop_after; /* fault injection: SIGSTOP itself after this step */
    long ckpt_at;          /* ask for a checkpoint after this step; -1 */
    long dump_every;       /* --dump: parameters every N steps; 0 */
    const char *dump;
    long stop_in;    /* fault injection: SIGSTOP itself in this step */
    long delay_ms;   /* a straggler for tests: extra compute per step */
    long async_n;    /* > 0: the gradients in that many asynchronous
                        allreduces */
    int fuse;        /* ... issued as one fusion group (2: backwards) */
    long fork_at;    /* fault injection: a child holding our socket */
} opts_t;

/* ---- the training loop ------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
"Usage: trainer [OPTION]...\n"
"Train an MLP on the digits data set, data-parallel through ringd.\n"
"  --socket PATH     ringd socket (default $RINGD_SOCKET or "
RINGD_DEFAULT_SOCKET ")\n"
"  --steps N         steps to train (default 400)\n"
"  --batch N         global batch size (default 64)\n"
"  --lr X            learning rate (default 0.5)\n"
"  --hidden N        hidden units (default 64)\n"
"  --seed N          parameter init and batch sampling seed (default 1)\n"
"  --log-every N     print loss/accuracy every N steps (default 50)\n"
"  --hash-log FILE   append 'step S gen G rank R world W hash H t_ms T loss L'\n"
"                    per step (T: wall clock, ms since the epoch; L: the\n"
"                    mean loss of this trainer's share of the batch)\n"
"  --save FILE       write the final parameters (raw f32) to FILE\n"
"  --data KIND       auto, digits or synthetic (default auto)\n"
"  --target-acc X    exit 3 if the final test accuracy is below X\n"
"  --no-daemon       train alone without ringd (the reference)\n"
"  --cpu             never use the GPU\n"
"  --name NAME       name shown in the daemon's log\n"
"  --crash-at-step S fault injection for tests: SIGKILL itself once step S\n"
"                    has begun, before its collectives\n"
"  --stop-after-step S  fault injection for tests: SIGSTOP itself after\n"
"                    step S, before the next step_begin\n"
"  --stop-in-step S  fault injection for tests: SIGSTOP itself once step S\n"
"                    has begun, before its collectives\n"
"  --step-delay-ms N a straggler for tests: N ms more compute per step\n"
"  --fork-at-step S  fault injection for tests: once step S has begun, fork\n"
"                    a child that keeps every descriptor (the daemon's socket\n"
"                    too, as a DataLoader worker does) and sleeps 120 s;\n"
"                    prints 'forked child PID'\n"
"  --ckpt-at S       ask ringd for a checkpoint after step S (once)\n"
"  --dump PREFIX     write the parameters (raw f32) to PREFIX.<step> ...\n"
"  --dump-every N    ... after every N-th step (default 0: never)\n"
"  --async N         average the gradients in N asynchronous allreduces,\n"
"                    waited for last to first (default 0: one blocking);\n"
"                    the daemons fuse those queued behind the running\n"
"                    one by arrival (ringd's ring-fuse-kib)\n"
"  --fuse            with --async: issue them as one fusion group (the\n"
"                    daemon runs them as one ring operation)\n"
"  --fuse-backwards  the same, the pieces issued last to first (the\n"
"                    pieces are not end to end in the buffer)\n"
"Signals (fault injection): SIGUSR1 closes the connection to the daemon\n"
"in the next step, SIGUSR2 after it; either way it reconnects at once.\n");
}

/* An option without a value: set, 1; else 0. */
static int flag_opt(opts_t *o, const char *a)
{
    if (strcmp(a, "--no-daemon") == 0)
        o->no_daemon = 1;
    else if (strcmp(a, "--cpu") == 0)
        o->cpu_only = 1;
    else if (strcmp(a, "--fuse") == 0)
        o->fuse = 1;
    else if (strcmp(a, "--fuse-backwards") == 0)
        o->fuse = 2;
    else
        return 0;
    return 1;
}

static int parse(opts_t *o, int argc, char **argv)
{
    *o = (opts_t){NULL, 400, 64, 64, 50, 0.5, 0, 1, NULL, NULL, "auto",
                  NULL, 0, 0, -1, -1, -1, 0, NULL, -1, 0, 0, 0, -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        char *end = NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (flag_opt(o, a)) {
            used = 0;
        } else if (v == NULL) {
            fprintf(stderr, "trainer: '%s' needs a value (or is unknown)\n",
                    a);
            return -1;
        } else if (strcmp(a, "--socket") == 0) {
            o->socket = v;
        } else if (strcmp(a, "--steps") == 0) {
            o->steps = strtol(v, &end, 10);
        } else if (strcmp(a, "--batch") == 0) {
            o->batch = strtol(v, &end, 10);
        } else if (strcmp(a, "--hidden") == 0) {
            o->hidden = strtol(v, &end, 10);
        } else if (strcmp(a, "--log-every") == 0) {
            o->log_every = strtol(v, &end, 10);
        } else if (strcmp(a, "--lr") == 0) {
            o->lr = strtod(v, &end);
        } else if (strcmp(a, "--target-acc") == 0) {
            o->target_acc = strtod(v, &end);
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = strtoull(v, &end, 10);
        } else if (strcmp(a, "--hash-log") == 0) {
            o->hash_log = v;
        } else if (strcmp(a, "--save") == 0) {
            o->save = v;
        } else if (strcmp(a, "--data") == 0) {
            o->data = v;
        } else if (strcmp(a, "--name") == 0) {
            o->name = v;
        } else if (strcmp(a, "--crash-at-step") == 0) {
            o->crash_at = strtol(v, &end, 10);
        } else if (strcmp(a, "--stop-after-step") == 0) {
            o->stop_after = strtol(v, &end, 10);
        } else if (strcmp(a, "--stop-in-step") == 0) {
            o->stop_in = strtol(v, &end, 10);
        } else if (strcmp(a, "--step-delay-ms") == 0) {
            o->delay_ms = strtol(v, &end, 10);
        } else if (strcmp(a, "--ckpt-at") == 0) {
            o->ckpt_at = strtol(v, &end, 10);
        } else if (strcmp(a, "--dump-every") == 0) {
            o->dump_every = strtol(v, &end, 10);
        } else if (strcmp(a, "--dump") == 0) {
            o->dump = v;
        } else if (strcmp(a, "--async") == 0) {
            o->async_n = strtol(v, &end, 10);
        } else if (strcmp(a, "--fork-at-step") == 0) {
            o->fork_at = strtol(v, &end, 10);
        } else {
            fprintf(stderr, "trainer: unknown option '%s'\n", a);
            return -1;
        }
        if (end != NULL && (*end != '\0' || end == v)) {
            fprintf(stderr, "trainer: bad value '%s' for %s\n", v, a);
            return -1;
        }
        i += used;
    }
    if (o->steps < 0 || o->batch < 1 || o->batch > 65536 || o->hidden < 1 ||
        o->hidden > 4096 || o->log_every < 1 || !(o->lr > 0) ||
        o->dump_every < 0 || o->async_n < 0 ||
        o->async_n > RINGD_MAX_OUTSTANDING) {
        fprintf(stderr, "trainer: value out of range (see --help)\n");
        return -1;
    }
    return 0;
}

typedef struct {
    opts_t o;
    ringd_client_t *c;
    data_t *data;
    dense_t dense;
    scratch_t sc;
    model_t m, g;
    float *params, *grads, *stats;
    long nparams;
    FILE *hash_log;
    unsigned long long next_step; /* after the last step this one ended */
} trainer_t;

static int setup(trainer_t *t)
{
    size_t pbytes = (size_t)t->nparams * sizeof(float);
    size_t gbytes = pbytes + 2 * sizeof(float);
    if (t->o.no_daemon) {
        t->params = calloc(1, pbytes);
        t->grads = calloc(1, gbytes);
    } else {
        ringd_opts_t ro;
        ringd_opts_init(&ro);
        ro.name = t->o.name;
        int rc = ringd_connect(&t->c, t->o.socket, &ro);
        if (rc != 0) {
            fprintf(stderr, "trainer: %s\n", ringd_strerror(rc));
            return -1;
        }
        t->params = ringd_buffer(t->c, pbytes);
        t->grads = ringd_buffer(t->c, gbytes);
    }
    if (t->params == NULL || t->grads == NULL) {
        fprintf(stderr, "trainer: buffers: %s\n", ringd_last_error(t->c));
        return -1;
    }
    t->stats = t->grads + t->nparams;
    model_view(&t->m, t->params, t->o.hidden);
    model_view(&t->g, t->grads, t->o.hidden);
    init_params(&t->m, t->o.seed);
    if (t->c != NULL && ringd_state(t->c, t->params, pbytes) != 0) {
        fprintf(stderr, "trainer: state: %s\n", ringd_last_error(t->c));
        return -1;
    }
    long rows = t->o.batch > NSAMPLES ? t->o.batch : NSAMPLES;
    long h = t->o.hidden;
    t->sc.x = calloc((size_t)rows * NIN, sizeof(float));
    t->sc.z1 = calloc((size_t)rows * h, sizeof(float));
    t->sc.a1 = calloc((size_t)rows * h, sizeof(float));
    t->sc.da1 = calloc((size_t)rows * h, sizeof(float));
    t->sc.z2 = calloc((size_t)rows * NOUT, sizeof(float));
    t->sc.dz2 = calloc((size_t)rows * NOUT, sizeof(float));
    t->sc.y = calloc((size_t)rows, sizeof(int));
    if (!t->sc.x || !t->sc.z1 || !t->sc.a1 || !t->sc.da1 || !t->sc.z2 ||
        !t->sc.dz2 || !t->sc.y)
        return -1;
    if (t->o.hash_log != NULL &&
        (t->hash_log = fopen(t->o.hash_log, "a")) == NULL) {
        fprintf(stderr, "trainer: %s: %s\n", t->o.hash_log, strerror(errno));
        return -1;
    }
    return 0;
}

/*
 * Fault injection for the chaos harness: SIGUSR1 makes the trainer close
 * its connection to the daemon in the middle of the next step (after
 * step_begin, before its collectives), SIGUSR2 between two steps (after a
 * step_end). Either way it reconnects at once with ringd_reconnect(), which
 * drops the socket without a BYE, as a trainer whose connection broke.
 */
static volatile sig_atomic_t close_mid, close_between;

static void on_close_signal(int sig)
{
    if (sig == SIGUSR1)
        close_mid = 1;
    else
        close_between = 1;
}

static void close_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_close_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
}

/* Closes the connection and opens a new one if *flag is set. Returns 1
 * when it did (the caller goes back to step_begin), 0 when not. */
static int close_if_asked(trainer_t *t, volatile sig_atomic_t *flag,
                          const char *where, long s)
{
    if (!*flag || t->c == NULL)
        return 0;
    *flag = 0;
    int rc = ringd_reconnect(t->c);
    printf("connection closed %s step %ld and reopened: %s\n", where, s,
           ringd_strerror(rc));
    return 1;
}

/* A child that holds every descriptor of ours and sleeps, as a forked
 * DataLoader worker does: the daemon's socket stays open after we die. */
static void fork_holder(void)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        sleep(120);
        _exit(0);
    }
    printf("forked child %d\n", (int)p);
}

/* A collective; returns 0, 1 to redo the step, -1 to stop. */
static int collective(trainer_t *t, float *p, long n, ringd_op_t op)
{
    if (t->c == NULL)
        return 0;
    int rc = ringd_allreduce(t->c, p, (size_t)n, RINGD_F32, op);
    if (rc == RINGD_ERESHAPE || rc == RINGD_EDISCONNECTED ||
        rc == RINGD_EFENCED) {
        /* Fenced: the node lost its lease; step_begin waits until the
         * node is back in the job (and its state restored). */
        printf("collective: %s; redoing the step\n", ringd_strerror(rc));
        return 1;
    }
    if (rc != 0)
        fprintf(stderr, "trainer: allreduce: %s\n", ringd_last_error(t->c));
    return rc == 0 ? 0 : -1;
}

/*
 * The gradients in o.async_n pieces, all issued before any is waited for,
 * then waited for last to first. Returns as collective() does; a view
 * change fails every piece, which it reports.
 */
static int collective_async(trainer_t *t, float *p, long n)
{
    long k = t->o.async_n < n ? t->o.async_n : n;
    ringd_handle_t h[RINGD_MAX_OUTSTANDING];
    long issued = 0;
    int rc = t->o.fuse ? ringd_group_start(t->c) : 0;
    for (; issued < k && rc == 0; issued++) {
        long j = t->o.fuse == 2 ? k - 1 - issued : issued;
        long lo = n * j / k, hi = n * (j + 1) / k;
        rc = ringd_allreduce_async(t->c, p + lo, (size_t)(hi - lo),
                                   RINGD_F32, RINGD_AVG, &h[issued]);
    }
    if (rc != 0 && issued > 0)
        issued--; /* that one has no handle */
    if (t->o.fuse && (rc == 0 || issued > 0)) {
        int e = ringd_group_end(t->c);
        if (rc == 0)
            rc = e;
    }
    int reshaped = 0, failed = rc != 0;
    for (long i = issued - 1; i >= 0; i--) {
        int w = ringd_wait(t->c, h[i]);
        reshaped += w == RINGD_ERESHAPE;
        if (w != 0 && !failed)
            rc = w;
        failed |= w != 0;
    }
    if (reshaped > 0 || rc == RINGD_ERESHAPE)
        printf("async: %d of %ld outstanding handles failed with "
               "RINGD_ERESHAPE\n", reshaped, issued);
    if (rc == RINGD_ERESHAPE || rc == RINGD_EDISCONNECTED ||
        rc == RINGD_EFENCED) {
        printf("collective: %s; redoing the step\n", ringd_strerror(rc));
        return 1;
    }
    if (rc != 0)
        fprintf(stderr, "trainer: allreduce: %s\n", ringd_last_error(t->c));
    return rc == 0 ? 0 : -1;
}

/* The parameters after `steps` steps, raw f32, to <dump>.<steps>: real
 * weights for the checkpoint benchmark's delta ratio. */
static int dump_params(const trainer_t *t, long steps)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s.%ld", t->o.dump, steps);
    FILE *f = fopen(path, "wb");
    size_t n = (size_t)t->nparams;
    int ok = f != NULL && fwrite(t->params, sizeof(float), n, f) == n;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    if (!ok)
        fprintf(stderr, "trainer: %s: %s\n", path, strerror(errno));
    return ok ? 0 : -1;
}

/* ringd_step_begin with the trainer's answers to what it returns: 0 to
 * run the step, 1 to ask again (fenced: the node is rejoining), 2 when
 * the daemon drains, -1 on error. */
static int begin_step(trainer_t *t, ringd_view_t *v, int *fenced_tries)
{
    int rc = ringd_step_begin(t->c, v);
    if (rc == RINGD_ESHUTDOWN) {
        printf("daemon drains: stopping before step %llu\n",
               t->next_step);
        return 2;
    }
    if (rc == RINGD_EFENCED && ++*fenced_tries <= 600) {
        /* wait (up to a minute) for the node to rejoin */
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        return 1;
    }
    if (rc != 0) {
        fprintf(stderr, "trainer: step_begin: %s\n", ringd_last_error(t->c));
        return -1;
    }
    *fenced_tries = 0;
    t->next_step = v->step; /* until it ends: a drain now stops before it */
    if (v->restored)
        printf("joined at step %llu: parameters restored\n",
               (unsigned long long)v->step);
    return 0;
}

/* After step s was applied: a requested checkpoint, a parameter dump,
 * the hash-log line. 0 or -1. */
static int after_step(trainer_t *t, const ringd_view_t *v, long s,
                      double shard_loss)
{
    const opts_t *o = &t->o;
    if (t->c != NULL && s == o->ckpt_at) {
        int crc = ringd_checkpoint(t->c);
        printf("checkpoint requested after step %ld: %s\n", s,
               ringd_strerror(crc));
    }
    if (o->dump != NULL && o->dump_every > 0 &&
        (s + 1) % o->dump_every == 0 && dump_params(t, s + 1) != 0)
        return -1;
    if (t->hash_log != NULL) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        fprintf(t->hash_log, "step %ld gen %llu rank %u world %u hash "
                "%016llx t_ms %lld loss %.5f\n", s,
                (unsigned long long)v->generation, v->rank, v->world,
                (unsigned long long)fnv1a(t->params, (size_t)t->nparams *
                                                         sizeof(float)),
                (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000,
                shard_loss);
        fflush(t->hash_log);
    }
    return 0;
}

/* Returns 0 after the last step, 2 when the daemon drains, -1 on error. */
static int train(trainer_t *t)
{
    const opts_t *o = &t->o;
    ringd_view_t v = {0, 1, 0, 1, 0, 1, 0};
    int fenced_tries = 0;
    for (;;) {
        if (t->c != NULL) {
            int rc = begin_step(t, &v, &fenced_tries);
            if (rc == 1)
                continue;
            if (rc != 0)
                return rc;
        }
        if ((long)v.step >= o->steps)
            return 0;
        long s = (long)v.step;
        if (s == o->crash_at && t->c != NULL)
            raise(SIGKILL); /* mid-step: the daemon counts us in it */
        if (s == o->fork_at && t->c != NULL) {
            t->o.fork_at = -1;
            fork_holder();
        }
        if (s == o->stop_in && t->c != NULL) {
            t->o.stop_in = -1; /* once: not again when the step is redone */
            raise(SIGSTOP);    /* mid-step: the others wait in a collective */
        }
        if (o->delay_ms > 0) {
            struct timespec d = {o->delay_ms / 1000,
                                 o->delay_ms % 1000 * 1000000L};
            nanosleep(&d, NULL);
        }
        if (gradients(&t->dense, &t->m, &t->g, &t->sc, t->data, s, o->batch,
                      v.rank, v.world, o->seed, t->stats) != 0)
            return -1;
        /* This trainer's shard's mean loss, before the SUM below. */
        long rows = o->batch * (v.rank + 1) / v.world -
                    o->batch * v.rank / v.world;
        double shard_loss = rows > 0 ? t->stats[0] / (double)rows : 0;
        int log_now = (s + 1) % o->log_every == 0 || s + 1 == o->steps;
        if (close_if_asked(t, &close_mid, "in", s))
            continue;
        int rc = t->o.async_n > 0 && t->c != NULL
                     ? collective_async(t, t->grads, t->nparams)
                     : collective(t, t->grads, t->nparams, RINGD_AVG);
        if (rc == 0 && log_now)
            rc = collective(t, t->stats, 2, RINGD_SUM);
        if (rc < 0)
            return -1;
        if (rc > 0)
            continue;
        cblas_saxpy((int)t->nparams, -(float)o->lr, t->grads, 1, t->params,
                    1);
        if (t->c != NULL && ringd_step_end(t->c) != 0) {
            fprintf(stderr, "trainer: step_end: %s\n",
                    ringd_last_error(t->c));
            continue; /* step_begin reconnects */
        }
        t->next_step = (unsigned long long)s + 1;
        if (after_step(t, &v, s, shard_loss) != 0)
            return -1;
        if (s == o->stop_after && t->c != NULL)
            raise(SIGSTOP); /* between steps: a test resumes it */
        if (log_now && v.rank == 0)
            printf("step %5ld  world %u  loss %.4f  batch_acc %.3f  "
                   "test_acc %.4f\n", s + 1, v.world,
                   t->stats[0] / (float)o->batch,
                   t->stats[1] / (float)o->batch,
                   test_accuracy(&t->dense, &t->m, &t->sc, t->data,
                                 NSAMPLES));
        if (t->c == NULL)
            v.step++;
        (void)close_if_asked(t, &close_between, "after", s);
    }
}

int main(int argc, char **argv)
{
    trainer_t t = {0};
    if (parse(&t.o, argc, argv) != 0)
        return 2;
    openblas_set_num_threads(1);
    close_signals_install();
    setvbuf(stdout, NULL, _IOLBF, 0);
    t.data = calloc(1, sizeof(*t.data));
    if (t.data == NULL)
        return 1;
    if (strcmp(t.o.data, "synthetic") == 0 || load_digits(t.data) != 0) {
        if (strcmp(t.o.data, "digits") == 0) {
            fprintf(stderr, "trainer: cannot read %s (install "
                    "python3-sklearn)\n", DIGITS_CSV);
            return 1;
        }
        make_synthetic(t.data);
    }
    shuffle(t.data);
    printf("data: %s, %d train / %d test\n", t.data->source, NTRAIN,
           NSAMPLES - NTRAIN);
    dense_open(&t.dense, t.o.cpu_only);
    t.nparams = model_size(t.o.hidden);
    int rc = setup(&t) == 0 ? train(&t) : -1;
    double acc = -1;
    if (rc >= 0) {
        acc = test_accuracy(&t.dense, &t.m, &t.sc, t.data, NSAMPLES);
        printf("final: test_accuracy %.4f hash %016llx\n", acc,
               (unsigned long long)fnv1a(t.params, (size_t)t.nparams *
                                                       sizeof(float)));
    }
    if (rc >= 0 && t.o.save != NULL) {
        FILE *f = fopen(t.o.save, "wb");
        if (f == NULL || fwrite(t.params, sizeof(float), (size_t)t.nparams,
                                f) != (size_t)t.nparams)
            rc = -1;
        if (f != NULL)
            fclose(f);
    }
    if (t.hash_log != NULL)
        fclose(t.hash_log);
    if (t.o.no_daemon) {
        free(t.params);
        free(t.grads);
    }
    ringd_close(t.c);
    dense_close(&t.dense);
    free(t.sc.x), free(t.sc.z1), free(t.sc.a1), free(t.sc.da1);
    free(t.sc.z2), free(t.sc.dz2), free(t.sc.y), free(t.data);
    if (rc < 0)
        return 1;
    if (t.o.target_acc > 0 && acc < t.o.target_acc) {
        fprintf(stderr, "trainer: accuracy %.4f below target %.4f\n", acc,
                t.o.target_acc);
        return 3;
    }
    return 0;
}
