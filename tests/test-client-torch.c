/*
 * ringd.torch against real daemons (tests/py/elastic_train.py,
 * tests/py/elastic_unit.py, examples/torch/train.py): DistributedOptimizer
 * against one process, in ringd memory and staged; elastic.State through
 * kills, joins and checkpoints. Each skips (saying why) where torch cannot
 * be imported, and in sanitizer builds (see tests/py-util.h).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/py-util.h"
#include "tests/task.h"

/* ringd.torch.elastic without a job (tests/py/elastic_unit.py): the
 * ElasticSampler through simulated view changes and redone steps sees
 * every sample of each epoch exactly once; State's tensors are the state
 * region, training through it is bitwise unchanged, another replica
 * restores model, Adam's moments and step, sampler, RNG and extras from
 * its bytes, and another layout is refused. Skips only without torch. */
TEST_IMPL(client_python_elastic_unit)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_daemon_t t;
    td_init(&t, "client-pyel");
    if (!have_numpy(py, td_path(&t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (!py_imports(py, "import torch", td_path(&t, "torch.log"))) {
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    }
    char lib[600], script[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, sizeof(script), "tests/py/elastic_unit.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    ASSERT_OK(td_start(&t, NULL));
    const char *argv[] = {py, script, "--socket", t.sock, NULL};
    const char *log = td_path(&t, "elastic.log");
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    int rc = td_exit_code(p, 240000);
    td_dump(log);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(log, "PASS elastic"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* Set up RINGD_LIB/PYTHONPATH and the script path; 0, or TEST_SKIP where
 * torch (or numpy) cannot be imported, saying so. */
static int torch_env(td_daemon_t *t, const char *name, char *script,
                     size_t len)
{
    const char *py = "/usr/bin/python3";
    if (python_unavailable(py) != NULL)
        TEST_SKIP_WHY("%s", python_unavailable(py));
    td_init(t, name);
    if (!have_numpy(py, td_path(t, "numpy.log")))
        TEST_SKIP_WHY("numpy cannot be imported by /usr/bin/python3");
    if (!py_imports(py, "import torch", td_path(t, "torch.log"))) {
        TEST_SKIP_WHY("torch cannot be imported by %s", py);
    }
    char lib[600], pypath[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", th_bindir());
    th_src_path(script, len, "tests/py/elastic_train.py");
    th_src_path(pypath, sizeof(pypath), "client/python");
    setenv("RINGD_LIB", lib, 1);
    setenv("PYTHONPATH", pypath, 1);
    return 0;
}

/* elastic_train.py with argv[2..] (NULL-ended) and its log; its pid. */
static pid_t train_py(td_daemon_t *t, const char *script, const char *name,
                      const char *const *extra)
{
    char log[300], out[320], stdo[320];
    snprintf(log, sizeof(log), "%s", td_path(t, name));
    snprintf(out, sizeof(out), "%s.pt", log);
    snprintf(stdo, sizeof(stdo), "%s.out", log);
    const char *argv[32] = {"/usr/bin/python3", script, "--log", log,
                            "--out", out, "--socket", t->sock};
    int n = 8;
    for (int i = 0; extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t p = th_spawn((char *const *)argv, stdo);
    td_track(p);
    return p;
}

static int py_ok(const char *const *argv, const char *log)
{
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    int rc = td_exit_code(p, 120000);
    td_dump(log);
    return rc;
}

/* The text after `key` on the last line of path holding it. */
static void last_field(const char *path, const char *key, char *out,
                       size_t len)
{
    char *s = td_read(path, NULL);
    ASSERT_MSG(s != NULL, "%s missing", path);
    char *hit = NULL;
    for (char *p = s; (p = strstr(p, key)) != NULL; p++)
        hit = p;
    ASSERT_MSG(hit != NULL, "no '%s' in %s", key, path);
    hit += strlen(key);
    size_t n = strcspn(hit, " \n");
    snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), hit);
    free(s);
}

/*
 * 2 trainers x DistributedOptimizer (SGD with momentum, whose update
 * scales with the gradient, so a wrong average shows) reach the
 * parameters of one process on the same global batch: within 1e-5, and
 * with backward_passes_per_step=4 against a 4x batch; bf16 compression
 * within 1e-2 of that (one node: no wire, the daemon reduces in f32; the
 * bf16 wire is client_python_torch_dopt_nodes'). The two replicas are
 * bitwise identical each time.
 */
TEST_IMPL(client_python_torch_dopt)
{
    char script[600];
    td_daemon_t t[3];
    int rc = torch_env(&t[0], "client-pydopt", script, sizeof(script));
    if (rc != 0)
        return rc;
    static const char *cfg[3][4] = {{"1", "none", "1e-5", "plain"},
                                    {"4", "none", "1e-5", "k4"},
                                    {"1", "bf16", "1e-2", "bf16"}};
    const char *flags[] = {"--trainers", "2", NULL};
    for (int i = 0; i < 3; i++) {
        if (i > 0)
            td_init(&t[i], "client-pydopt");
        ASSERT_OK(td_start(&t[i], flags));
        const char *extra[] = {"--mode", "ringd", "--k", cfg[i][0],
                               "--compression", cfg[i][1], "--opt", "sgd",
                               NULL};
        pid_t a = train_py(&t[i], script, "a.log", extra);
        pid_t b = train_py(&t[i], script, "b.log", extra);
        char ref[300];
        snprintf(ref, sizeof(ref), "%s", td_path(&t[i], "ref.pt"));
        const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                               "--k", cfg[i][0], "--opt", "sgd", "--out",
                               ref, NULL};
        ASSERT_EQ(py_ok(rargv, td_path(&t[i], "ref.out")), 0);
        ASSERT_EQ(td_exit_code(a, 120000), 0);
        ASSERT_EQ(td_exit_code(b, 120000), 0);
        char da[64], db[64], pa[300], pb[300];
        last_field(td_path(&t[i], "a.log"), "final digest ", da, sizeof(da));
        last_field(td_path(&t[i], "b.log"), "final digest ", db, sizeof(db));
        ASSERT_STR_EQ(da, db);
        snprintf(pa, sizeof(pa), "%s", td_path(&t[i], "a.log.pt"));
        snprintf(pb, sizeof(pb), "%s", td_path(&t[i], "b.log.pt"));
        const char *c1[] = {"/usr/bin/python3", script, "--compare", pa, ref,
                            cfg[i][2], NULL};
        ASSERT_EQ(py_ok(c1, td_path(&t[i], "cmp1.out")), 0);
        const char *c2[] = {"/usr/bin/python3", script, "--compare", pa, pb,
                            "0", NULL};
        ASSERT_EQ(py_ok(c2, td_path(&t[i], "cmp2.out")), 0);
        printf("# %s: replicas %s, matches one process\n", cfg[i][3], da);
        ASSERT_EQ(td_stop(&t[i], 30000), 0);
    }
    return 0;
}

/*
 * 2 nodes x 2 trainers (etcd, UCX on loopback) x DistributedOptimizer
 * with three fusion buckets: the 4 replicas end bitwise identical and
 * within 1e-5 of one process on the same global batch (the 4 trainers'
 * gradients averaged), with Adam and backward_passes_per_step 1 and 4
 * (against a 4x batch), with SGD (momentum) and 4, and with SGD and bf16
 * compression within 1e-2 of the f32 process (and at least 1e-5 from it:
 * the wire was bf16). Every step of every trainer also checks the overlap
 * (elastic_train.py --check-overlap): a bucket's allreduce was issued
 * before the last gradient hook fired, and only step() waited.
 */
TEST_IMPL(client_python_torch_dopt_nodes)
{
    char script[600];
    td_daemon_t d[2];
    int rc = torch_env(&d[0], "client-pydn-a", script, sizeof(script));
    if (rc != 0)
        return rc;
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t etcd = {0};
    fx_etcd_start(&etcd, 0);
    /* SGD with momentum too: Adam's update hardly changes when every
     * gradient is scaled alike, so a sum instead of an average shows in
     * SGD only. Then the tolerance, and how far at least: the f32 runs
     * end within 2e-7 of one process, so a bf16 run as close never went
     * through bf16. */
    static const char *cfg[4][5] = {{"1", "adam", "none", "1e-5", "0"},
                                    {"4", "adam", "none", "1e-5", "0"},
                                    {"4", "sgd", "none", "1e-5", "0"},
                                    {"1", "sgd", "bf16", "1e-2", "1e-5"}};
    for (int v = 0; v < 4; v++) {
        char job[32];
        snprintf(job, sizeof(job), "pydn%d", v);
        if (v > 0)
            td_init(&d[0], "client-pydn-a");
        td_init(&d[1], "client-pydn-b");
        for (int i = 0; i < 2; i++) {
            d[i].networked = 1;
            const char *flags[] = {"--etcd", etcd.url, "--job", job,
                                   "--node-id", i ? "b" : "a",
                                   "--trainers", "2", "--min-nodes", "2",
                                   NULL};
            ASSERT_OK(td_start(&d[i], flags));
        }
        const char *extra[] = {"--mode", "ringd", "--k", cfg[v][0],
                               "--opt", cfg[v][1],
                               "--compression", cfg[v][2],
                               "--bucket-cap-mb", "0.0004",
                               "--check-overlap", NULL};
        static const char *names[4] = {"t0.log", "t1.log", "t0.log",
                                       "t1.log"};
        pid_t p[4];
        for (int j = 0; j < 4; j++)
            p[j] = train_py(&d[j / 2], script, names[j], extra);
        char ref[300];
        snprintf(ref, sizeof(ref), "%s", td_path(&d[0], "ref.pt"));
        const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                               "--world", "4", "--k", cfg[v][0], "--opt",
                               cfg[v][1], "--out", ref, NULL};
        ASSERT_EQ(py_ok(rargv, td_path(&d[0], "ref.out")), 0);
        char dg[4][64];
        for (int j = 0; j < 4; j++) {
            const char *log = td_path(&d[j / 2], names[j]);
            int code = td_exit_code(p[j], 180000);
            if (code != 0) {
                char out[320];
                snprintf(out, sizeof(out), "%s.out", log);
                td_dump(log);
                td_dump(out);
            }
            ASSERT_EQ(code, 0);
            ASSERT_MSG(td_file_has(log, "overlap checked 30 steps, "
                                   "3 buckets"), "%s: no overlap check",
                       log);
            last_field(log, "final digest ", dg[j], sizeof(dg[j]));
            ASSERT_STR_EQ(dg[j], dg[0]);
        }
        char pa[300];
        snprintf(pa, sizeof(pa), "%s.pt", td_path(&d[1], "t1.log"));
        const char *c1[] = {"/usr/bin/python3", script, "--compare", pa, ref,
                            cfg[v][3], "--differ-by", cfg[v][4], NULL};
        ASSERT_EQ(py_ok(c1, td_path(&d[0], "cmp.out")), 0);
        printf("# k=%s %s %s: 4 replicas %s, match one process\n",
               cfg[v][0], cfg[v][1], cfg[v][2], dg[0]);
        for (int i = 0; i < 2; i++)
            ASSERT_EQ(td_stop(&d[i], 30000), 0);
    }
    return fx_done();
}

/* One job of 2 nodes x 2 trainers (etcd et, job name job) of
 * elastic_train.py with extra (NULL-ended): every trainer exits 0, all 4
 * end with the same final digest; logs gets their log paths. */
static void nodes_job(fx_etcd_t *et, const char *job, const char *script,
                      const char *const *extra, char logs[4][300])
{
    td_daemon_t d[2];
    for (int i = 0; i < 2; i++) {
        td_init(&d[i], i ? "client-pyst-b" : "client-pyst-a");
        d[i].networked = 1;
        const char *flags[] = {"--etcd", et->url, "--job", job,
                               "--node-id", i ? "b" : "a",
                               "--trainers", "2", "--min-nodes", "2",
                               NULL};
        ASSERT_OK(td_start(&d[i], flags));
    }
    static const char *names[4] = {"t0.log", "t1.log", "t0.log", "t1.log"};
    pid_t p[4];
    for (int j = 0; j < 4; j++) {
        p[j] = train_py(&d[j / 2], script, names[j], extra);
        snprintf(logs[j], 300, "%s", td_path(&d[j / 2], names[j]));
    }
    char dg[4][64];
    for (int j = 0; j < 4; j++) {
        int code = td_exit_code(p[j], 180000);
        if (code != 0) {
            char out[320];
            snprintf(out, sizeof(out), "%s.out", logs[j]);
            td_dump(logs[j]);
            td_dump(out);
        }
        ASSERT_EQ(code, 0);
        last_field(logs[j], "final digest ", dg[j], sizeof(dg[j]));
        ASSERT_STR_EQ(dg[j], dg[0]);
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&d[i], 30000), 0);
}

#define MAX_STEPS 64

/* The digest each "step S ... digest D" line of the 4 logs gives for S
 * (all 4 agree: replicas are bitwise identical at every step). */
static void step_digests(char logs[4][300], char dg[MAX_STEPS][20])
{
    memset(dg, 0, MAX_STEPS * 20);
    for (int j = 0; j < 4; j++) {
        FILE *f = fopen(logs[j], "r");
        ASSERT_MSG(f != NULL, "%s missing", logs[j]);
        char line[4096], d[20];
        int step;
        while (fgets(line, sizeof(line), f) != NULL) {
            if (sscanf(line, "step %d gen %*d rank %*d world %*d epoch %*d "
                       "digest %19s", &step, d) != 2)
                continue;
            ASSERT(step >= 0 && step < MAX_STEPS);
            if (dg[step][0] == '\0')
                snprintf(dg[step], 20, "%s", d);
            ASSERT_MSG(strcmp(dg[step], d) == 0, "step %d: %s has %s, "
                       "another replica %s", step, logs[j], d, dg[step]);
        }
        fclose(f);
    }
}

/*
 * 2 nodes x 2 trainers, nothing of the model in ringd memory
 * (elastic_train.py --staging: each gradient copied into its bucket once
 * ready and the result copied back into .grad; the State's tensors
 * written into the region at each commit): Adam's job gives, at each of
 * its 30 steps, the digest of parameters and moments that the same job
 * gives with the gradients in ringd memory (bitwise: the same sums in the
 * same order), on all 4 replicas, and the same final parameters; the
 * overlap holds (a bucket issued before backward ends). Then SGD with bf16
 * compression through staging (the bucket a bf16 buffer, cast before the
 * copy): within 1e-2 of one f32 process, at least 1e-5 from it.
 */
TEST_IMPL(client_python_torch_staged_nodes)
{
    char script[600];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pyst", script, sizeof(script));
    if (rc != 0)
        return rc;
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t etcd = {0};
    fx_etcd_start(&etcd, 0);
    const char *inplace[] = {"--mode", "ringd", "--opt", "adam",
                             "--bucket-cap-mb", "0.0004", "--check-overlap",
                             NULL};
    const char *staged[] = {"--mode", "ringd", "--opt", "adam",
                            "--bucket-cap-mb", "0.0004", "--check-overlap",
                            "--staging", NULL};
    static char la[4][300], lb[4][300], lc[4][300];
    static char da[MAX_STEPS][20], db[MAX_STEPS][20];
    nodes_job(&etcd, "pyst0", script, inplace, la);
    nodes_job(&etcd, "pyst1", script, staged, lb);
    step_digests(la, da);
    step_digests(lb, db);
    int n = 0;
    for (int s = 0; s < MAX_STEPS; s++) {
        ASSERT_MSG(strcmp(da[s], db[s]) == 0, "step %d: in ringd memory "
                   "%s, staged %s", s, da[s], db[s]);
        n += da[s][0] != '\0';
    }
    ASSERT_EQ(n, 30);
    for (int j = 0; j < 4; j++) {
        ASSERT_MSG(td_file_has(lb[j], "staged: 3 buckets, 16 tensors"),
                   "%s: not staged", lb[j]);
        ASSERT(td_file_has(lb[j], "overlap checked 30 steps, 3 buckets"));
    }
    char pa[320], pb[320];
    snprintf(pa, sizeof(pa), "%s.pt", la[0]);
    snprintf(pb, sizeof(pb), "%s.pt", lb[3]);
    const char *same[] = {"/usr/bin/python3", script, "--compare", pa, pb,
                          "0", NULL};
    ASSERT_EQ(py_ok(same, td_path(&t, "same.out")), 0);
    printf("# staged = in ringd memory at each of %d steps: %s\n", n,
           db[29]);

    const char *bf16[] = {"--mode", "ringd", "--opt", "sgd",
                          "--compression", "bf16", "--bucket-cap-mb",
                          "0.0004", "--staging", NULL};
    nodes_job(&etcd, "pyst2", script, bf16, lc);
    char ref[300], pc[320];
    snprintf(ref, sizeof(ref), "%s", td_path(&t, "ref.pt"));
    const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                           "--world", "4", "--opt", "sgd", "--out", ref,
                           NULL};
    ASSERT_EQ(py_ok(rargv, td_path(&t, "ref.out")), 0);
    snprintf(pc, sizeof(pc), "%s.pt", lc[2]);
    const char *near[] = {"/usr/bin/python3", script, "--compare", pc, ref,
                          "1e-2", "--differ-by", "1e-5", NULL};
    ASSERT_EQ(py_ok(near, td_path(&t, "bf16.out")), 0);
    return fx_done();
}

/* Why the CUDA tests cannot run here, or NULL. */
static const char *no_cuda(td_daemon_t *t)
{
    if (!py_imports("/usr/bin/python3",
                    "import torch\nassert torch.cuda.is_available()",
                    td_path(t, "cuda.log")))
        return "/usr/bin/python3 has no torch with a GPU (no torch, a "
               "CPU build, or torch.cuda.is_available() False); "
               "tests/gpu/run.sh runs these where there is one";
    return NULL;
}

/*
 * The CUDA path (tests/gpu/torch-staging.sh runs it on a GPU machine):
 * 2 nodes x 2 trainers with the model on the GPU (elastic_train.py
 * --device cuda), gradients copied on a side stream into buckets
 * page-locked with cudaHostRegister, the State's tensors copied into the
 * region at each commit. Adam: the 4 replicas bitwise identical at every
 * step, within 1e-4 of one CPU process (the GPU sums in another order);
 * SGD with bf16 compression (cast on the device before the copy): within
 * 1e-2 of it and at least 1e-5 from it.
 */
TEST_IMPL(client_python_torch_cuda_nodes)
{
    char script[600];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pycuda", script, sizeof(script));
    if (rc != 0)
        return rc;
    if (no_cuda(&t) != NULL)
        TEST_SKIP_WHY("%s", no_cuda(&t));
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t etcd = {0};
    fx_etcd_start(&etcd, 0);
    static const char *cfg[2][5] = {{"adam", "none", "1e-4", "0", "pycu0"},
                                    {"sgd", "bf16", "1e-2", "1e-5",
                                     "pycu1"}};
    for (int v = 0; v < 2; v++) {
        static char logs[4][300], dg[MAX_STEPS][20];
        const char *extra[] = {"--mode", "ringd", "--opt", cfg[v][0],
                               "--compression", cfg[v][1],
                               "--bucket-cap-mb", "0.0004", "--device",
                               "cuda", NULL};
        nodes_job(&etcd, cfg[v][4], script, extra, logs);
        step_digests(logs, dg);
        for (int j = 0; j < 4; j++)
            ASSERT_MSG(td_file_has(logs[j], "staged: 3 buckets, "),
                       "%s: not staged", logs[j]);
        char ref[300], pt[320];
        snprintf(ref, sizeof(ref), "%s", td_path(&t, "ref.pt"));
        const char *rargv[] = {"/usr/bin/python3", script, "--mode", "ref",
                               "--world", "4", "--opt", cfg[v][0], "--out",
                               ref, NULL};
        ASSERT_EQ(py_ok(rargv, td_path(&t, "ref.out")), 0);
        snprintf(pt, sizeof(pt), "%s.pt", logs[1]);
        const char *near[] = {"/usr/bin/python3", script, "--compare", pt,
                              ref, cfg[v][2], "--differ-by", cfg[v][3],
                              NULL};
        ASSERT_EQ(py_ok(near, td_path(&t, "cmp.out")), 0);
        printf("# cuda %s %s: 4 replicas %s at step 29\n", cfg[v][0],
               cfg[v][1], dg[29]);
    }
    return fx_done();
}

/* The joiner (c.log) got the state of the step before it: its restored
 * digest and Adam step are those b logged after that step. */
static void joiner_got_state_before(td_daemon_t *t)
{
    char rs[32], rd[64], ra[32], want[200];
    last_field(td_path(t, "c.log"), "restored ", rs, sizeof(rs));
    last_field(td_path(t, "c.log"), " adam_step ", ra, sizeof(ra));
    (void)ra;
    char *cl = td_read(td_path(t, "c.log"), NULL);
    ASSERT(cl != NULL);
    char adam[32];
    ASSERT_EQ(sscanf(strstr(cl, "restored "),
                     "restored %*d digest %63s adam_step %31s", rd, adam),
              2);
    free(cl);
    snprintf(want, sizeof(want), "step %d gen ", atoi(rs) - 1);
    char *bl = td_read(td_path(t, "b.log"), NULL);
    ASSERT(bl != NULL);
    char *line = strstr(bl, want);
    ASSERT_MSG(line != NULL, "b.log lacks '%s'", want);
    char bd[64], ba[32];
    ASSERT_EQ(sscanf(strstr(line, "digest "), "digest %63s adam_step %31s",
                     bd, ba), 2);
    free(bl);
    ASSERT_STR_EQ(rd, bd);
    ASSERT_STR_EQ(adam, ba);
    ASSERT_EQ(atoi(adam), atoi(rs)); /* one Adam step per job step */
    printf("# joiner restored at step %s: digest %s, adam_step %s\n", rs, rd,
           adam);
}

/*
 * elastic.run through a trainer killed and one joining: 2 trainers start,
 * a third joins (restored: it gets the model, Adam's moments and step
 * counter, the sampler's position, exactly the state another trainer
 * logged after the step before), one of the first two is SIGKILLed
 * mid-run, the job carries on; on_reset saw the worlds 3 then 2; every
 * epoch completed saw each sample exactly once; the two survivors end
 * bitwise identical. more: further flags of elastic_train.py for every
 * trainer (NULL-ended); must: a line every trainer's log must hold, or
 * NULL.
 */
static int kill_join(const char *name, const char *const *more,
                     const char *must)
{
    char script[600];
    td_daemon_t t;
    int rc = torch_env(&t, name, script, sizeof(script));
    if (rc != 0)
        return rc;
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    char stop[300], tmp[320];
    snprintf(stop, sizeof(stop), "%s", td_path(&t, "stop"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", stop);
    const char *extra[16] = {"--mode", "ringd", "--pace-ms", "20",
                             "--stop-file", stop};
    for (int i = 0; more[i] != NULL && i < 9; i++)
        extra[6 + i] = more[i];
    pid_t a = train_py(&t, script, "a.log", extra);
    pid_t b = train_py(&t, script, "b.log", extra);
    ASSERT_OK(td_wait_file(td_path(&t, "b.log"), "step 5 ", 60000));
    pid_t c = train_py(&t, script, "c.log", extra);
    ASSERT_OK(td_wait_file(td_path(&t, "c.log"), "restored ", 60000));
    ASSERT_OK(td_wait_file(td_path(&t, "c.log"), "world 3 ", 60000));
    kill(a, SIGKILL);
    ASSERT_EQ(td_exit_code(a, 10000), 128 + SIGKILL);
    ASSERT_OK(td_wait_file(t.log, "lost at step", 10000));
    ASSERT_OK(td_wait_file(td_path(&t, "c.log"), "world 2 ", 60000));
    /* Stop 20 steps on, at the same step everywhere. */
    char now[32];
    last_field(td_path(&t, "c.log"), "\nstep ", now, sizeof(now));
    FILE *f = fopen(tmp, "w");
    ASSERT(f != NULL);
    fprintf(f, "%d\n", atoi(now) + 20);
    fclose(f);
    ASSERT_OK(rename(tmp, stop));
    ASSERT_EQ(td_exit_code(b, 120000), 0);
    ASSERT_EQ(td_exit_code(c, 120000), 0);

    joiner_got_state_before(&t);

    char fb[64], fc[64];
    last_field(td_path(&t, "b.log"), "final digest ", fb, sizeof(fb));
    last_field(td_path(&t, "c.log"), "final digest ", fc, sizeof(fc));
    ASSERT_STR_EQ(fb, fc);
    ASSERT(td_file_has(td_path(&t, "b.log"), "resets [3, 2]"));
    char la[300], lb[300], lc[300];
    snprintf(la, sizeof(la), "%s", td_path(&t, "a.log"));
    snprintf(lb, sizeof(lb), "%s", td_path(&t, "b.log"));
    snprintf(lc, sizeof(lc), "%s", td_path(&t, "c.log"));
    const char *chk[] = {"/usr/bin/python3", script, "--check", la, lb, lc,
                         NULL};
    ASSERT_EQ(py_ok(chk, td_path(&t, "check.out")), 0);
    for (int i = 0; must != NULL && i < 3; i++) {
        const char *log[3] = {la, lb, lc};
        ASSERT_MSG(td_file_has(log[i], must), "no '%s' in %s", must,
                   log[i]);
    }
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

TEST_IMPL(client_python_elastic_kill_join)
{
    const char *more[] = {NULL};
    return kill_join("client-pykill", more, NULL);
}

/*
 * The same with nothing of the model in ringd memory (--staging): the
 * gradients are staged through copies into the buckets and back, the
 * State's tensors written into the region at every step's commit and
 * copied out of it on the joiner. The joiner still gets the exact state
 * (digest and Adam's step) a trainer logged, and the survivors end
 * identical.
 */
TEST_IMPL(client_python_torch_staged_kill_join)
{
    const char *more[] = {"--staging", NULL};
    return kill_join("client-pykills", more,
                     "staged: 1 buckets, 16 tensors of the state");
}

/* The same with the model on the GPU (tests/gpu/torch-staging.sh). */
TEST_IMPL(client_python_torch_cuda_kill_join)
{
    td_daemon_t t;
    td_init(&t, "client-pykillc0");
    if (python_unavailable("/usr/bin/python3") != NULL)
        TEST_SKIP_WHY("%s", python_unavailable("/usr/bin/python3"));
    if (no_cuda(&t) != NULL)
        TEST_SKIP_WHY("%s", no_cuda(&t));
    const char *more[] = {"--device", "cuda", NULL};
    return kill_join("client-pykillc", more, "staged: 1 buckets, ");
}

/*
 * A checkpoint of an elastic.State exported with `python3 -m
 * ringd.torch.export` (decoded and checked by `ringctl dump`): its bytes
 * are the live state a trainer logged after the step before the
 * checkpoint's, and a python without ringd loads it with plain torch.load
 * into a fresh model and Adam (step counter included).
 */
TEST_IMPL(client_python_torch_export)
{
    char script[600];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pyexp", script, sizeof(script));
    if (rc != 0)
        return rc;
    char ckpt[300], exp[300], man[400], live[300];
    snprintf(ckpt, sizeof(ckpt), "%s", td_path(&t, "ckpt"));
    snprintf(live, sizeof(live), "%s", td_path(&t, "a.log.pt.live"));
    snprintf(exp, sizeof(exp), "%s", td_path(&t, "export.pt"));
    /* One checkpoint only, at step 10: with an earlier one still being
     * written (a loaded machine), the daemon would skip step 10's. */
    const char *flags[] = {"--ckpt-interval", "10", "--ckpt-dir", ckpt,
                           NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *extra[] = {"--mode", "ringd", "--steps", "12",
                           "--save-live", "9", NULL};
    pid_t a = train_py(&t, script, "a.log", extra);
    ASSERT_EQ(td_exit_code(a, 120000), 0);
    snprintf(man, sizeof(man),
             "%s/standalone/step-00000000000000000010/MANIFEST.json", ckpt);
    ASSERT_OK(td_wait_file(man, "\"step\"", 30000));
    const char *ex[] = {"/usr/bin/python3", "-m", "ringd.torch.export",
                        "--ckpt-dir", ckpt, "--out", exp, NULL};
    ASSERT_EQ(py_ok(ex, td_path(&t, "export.out")), 0);
    char step[32], digest[64], want[128];
    last_field(td_path(&t, "export.out"), "step ", step, sizeof(step));
    last_field(td_path(&t, "export.out"), "digest ", digest, sizeof(digest));
    ASSERT_STR_EQ(step, "10:");
    snprintf(want, sizeof(want), "digest %s adam_step 10 ", digest);
    ASSERT_MSG(td_file_has(td_path(&t, "a.log"), want), "'%s' not in the "
               "trainer's log", want);
    unsetenv("PYTHONPATH");
    const char *load[] = {"/usr/bin/python3", "-I", "-c",
        "import sys, torch\n"
        "d = torch.load(sys.argv[1])\n"
        "assert 'ringd' not in sys.modules\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),\n"
        "                        torch.nn.Linear(32, 3))\n"
        "m.load_state_dict(d['model'])\n"
        "o = torch.optim.Adam(m.parameters())\n"
        "o.load_state_dict(d['optimizer'])\n"
        "st = o.state[next(m.parameters())]\n"
        "assert float(st['step']) == 10, st['step']\n"
        "assert st['exp_avg'].abs().sum() > 0\n"
        "assert o.param_groups[0]['lr'] == 0.01\n"
        "assert d['step'] == 10 and d['sampler']['processed'] == 40\n"
        "live = torch.load(sys.argv[2])\n"
        "for k, v in live['model'].items():\n"
        "    assert torch.equal(d['model'][k], v), k\n"
        "for i, s in live['optimizer']['state'].items():\n"
        "    for k, v in s.items():\n"
        "        assert torch.equal(d['optimizer']['state'][i][k], v), k\n"
        "print('plain torch.load ok: equals the live state after step 9')",
        exp, live, NULL};
    ASSERT_EQ(py_ok(load, td_path(&t, "load.out")), 0);
    ASSERT(td_file_has(td_path(&t, "load.out"), "plain torch.load ok"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* examples/torch/train.py, the LeNet on digits, through ringd with two
 * trainers for 4 epochs: both finish with the same test accuracy, at least
 * 0.85 (0.92 here). */
TEST_IMPL(client_python_torch_example)
{
    char script[600], ex[600], acc[2][32];
    td_daemon_t t;
    int rc = torch_env(&t, "client-pyex", script, sizeof(script));
    if (rc != 0)
        return rc;
    if (access("/usr/lib/python3/dist-packages/sklearn/datasets/data/"
               "digits.csv.gz", R_OK) != 0)
        TEST_SKIP_WHY("scikit-learn's digits are not installed");
    th_src_path(ex, sizeof(ex), "examples/torch/train.py");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    pid_t p[2];
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {"/usr/bin/python3", ex, "--socket", t.sock,
                              "--epochs", "4", NULL};
        p[i] = th_spawn((char *const *)argv, td_path(&t, i ? "b" : "a"));
        td_track(p[i]);
    }
    for (int i = 0; i < 2; i++) {
        int st = td_exit_code(p[i], 180000);
        td_dump(td_path(&t, i ? "b" : "a"));
        ASSERT_EQ(st, 0);
        last_field(td_path(&t, i ? "b" : "a"), "final: test_accuracy ",
                   acc[i], sizeof(acc[i]));
    }
    ASSERT_STR_EQ(acc[0], acc[1]);
    ASSERT_MSG(atof(acc[0]) >= 0.85, "test accuracy %s", acc[0]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A daemon of a ring job (real etcd) with one trainer slot. */
static void ring_node(td_daemon_t *d, fx_etcd_t *et, int i,
                      const char *min_nodes)
{
    static char ids[8][16];
    char name[32];
    snprintf(name, sizeof(name), "client-pyring-n%d", i);
    snprintf(ids[i], sizeof(ids[i]), "n%d", i);
    td_init(d, name);
    d->networked = 1;
    const char *flags[] = {"--etcd", et->url, "--job", "pyring",
                           "--node-id", ids[i], "--trainers", "1",
                           "--lease-ttl", "2", "--min-nodes", min_nodes,
                           NULL};
    ASSERT_OK(td_start(d, flags));
}

/* The joiner's log says it restored a state (parameters and Adam's
 * moments by digest, Adam's step counter) that survivor a or b logged. */
static void joiner_got(const char *joiner, const char *a, const char *b)
{
    char rs[32], rd[64], adam[32], want[128];
    last_field(joiner, "restored ", rs, sizeof(rs));
    char *cl = td_read(joiner, NULL);
    ASSERT(cl != NULL);
    ASSERT_EQ(sscanf(strstr(cl, "restored "),
                     "restored %*d digest %63s adam_step %31s", rd, adam),
              2);
    free(cl);
    snprintf(want, sizeof(want), "digest %s adam_step %s ", rd, adam);
    ASSERT_MSG(td_file_has(a, want) || td_file_has(b, want),
               "no survivor logged '%s'", want);
    printf("# joiner restored at step %s: digest %s, adam_step %s\n", rs, rd,
           adam);
}

/*
 * elastic.run in a real 3-node ring job: a daemon is SIGKILLed mid-epoch
 * (its trainer fails, the other two carry on in a 2-node view), a fourth
 * node joins and its trainer receives the state (Adam's moments and step
 * counter as a survivor logged them); every epoch completed saw each
 * sample exactly once, one of them losing a trainer midway; Adam's step
 * counter is the job's step + 1 on every trainer's every step; the
 * survivors and the joiner end identical.
 */
TEST_IMPL(client_python_ring_kill_join)
{
    char script[600];
    td_daemon_t d[4];
    int rc = torch_env(&d[0], "client-pyring", script, sizeof(script));
    if (rc != 0)
        return rc;
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    fx_etcd_t et = {0};
    fx_etcd_start(&et, 0);
    /* In torch_env's dir, which outlives d[0]'s re-init by ring_node. */
    char stop[300], tmp[320];
    snprintf(stop, sizeof(stop), "%s", td_path(&d[0], "stop"));
    snprintf(tmp, sizeof(tmp), "%s.tmp", stop);
    const char *extra[] = {"--mode", "ringd", "--pace-ms", "20",
                           "--stop-file", stop, NULL};
    pid_t p[4];
    for (int i = 0; i < 3; i++) {
        ring_node(&d[i], &et, i, "3");
        p[i] = train_py(&d[i], script, "t.log", extra);
    }
    ASSERT_OK(td_wait_file(td_path(&d[0], "t.log"), "world 3 ", 120000));
    ASSERT_OK(td_wait_file(td_path(&d[0], "t.log"), "step 10 ", 60000));
    th_kill(d[1].pid);
    d[1].pid = 0;
    ASSERT_OK(td_wait_file(td_path(&d[0], "t.log"), "world 2 ", 60000));
    ring_node(&d[3], &et, 3, "1");
    p[3] = train_py(&d[3], script, "t.log", extra);
    ASSERT_OK(td_wait_file(td_path(&d[3], "t.log"), "restored ", 120000));
    ASSERT_OK(td_wait_file(td_path(&d[3], "t.log"), "world 3 ", 60000));
    char now[32];
    last_field(td_path(&d[3], "t.log"), "\nstep ", now, sizeof(now));
    FILE *f = fopen(tmp, "w");
    ASSERT(f != NULL);
    fprintf(f, "%d\n", atoi(now) + 20);
    fclose(f);
    ASSERT_OK(rename(tmp, stop));
    int live[3] = {0, 2, 3};
    for (int k = 0; k < 3; k++) {
        int st = td_exit_code(p[live[k]], 120000);
        if (st != 0)
            td_dump(td_path(&d[live[k]], "t.log.out"));
        ASSERT_EQ(st, 0);
    }
    ASSERT_NE(td_exit_code(p[1], 30000), 0); /* lost its daemon */
    char l[4][300];
    for (int i = 0; i < 4; i++)
        snprintf(l[i], sizeof(l[i]), "%s", td_path(&d[i], "t.log"));
    const char *chk[] = {"/usr/bin/python3", script, "--shrunk", "1",
                         "--check", l[0], l[1], l[2], l[3], NULL};
    ASSERT_EQ(py_ok(chk, td_path(&d[0], "check.out")), 0);
    joiner_got(l[3], l[0], l[2]);
    char f0[64], f2[64], f3[64];
    last_field(l[0], "final digest ", f0, sizeof(f0));
    last_field(l[2], "final digest ", f2, sizeof(f2));
    last_field(l[3], "final digest ", f3, sizeof(f3));
    ASSERT_STR_EQ(f0, f2);
    ASSERT_STR_EQ(f0, f3);
    for (int k = 0; k < 3; k++)
        ASSERT_EQ(td_stop(&d[live[k]], 30000), 0);
    return fx_done();
}
