/*
 * test-chaos.c - the etcd start of chaos/cluster.sh against a taken port,
 * and a quick seeded chaos run inside the suite: chaos/chaos.sh
 * -s 1 -f 3 --quick (daemon kill + restart, hang by SIGSTOP, scale up only:
 * the faults that recover the same way every time) on 4 nodes in network
 * namespaces, bounded by timeout(1) well inside the runner's timeout so the
 * harness's own cleanup (a SIGTERM) runs. The harness is strict by default:
 * a stale replica step or an older checkpoint that does not restore fails
 * it; the test also reads both from the report (no stale step, and at
 * least one older checkpoint restored besides the newest). Needs root
 * (namespaces); skips otherwise, and under the sanitizers.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers.h"
#include "tests/task.h"

#if defined(__SANITIZE_ADDRESS__)
#define SAN_BUILD 1
#else
#define SAN_BUILD 0
#endif

static int field(const char *line, const char *key, long *out)
{
    const char *p = strstr(line, key);
    if (p == NULL)
        return -1;
    char *end;
    *out = strtol(p + strlen(key), &end, 10);
    return end == p + strlen(key) ? -1 : 0;
}

TEST_IMPL(chaos_quick)
{
    if (SAN_BUILD)
        TEST_SKIP_WHY("sanitizer build: the chaos run takes minutes there "
                      "and its daemons are the plain build's");
    if (geteuid() != 0)
        TEST_SKIP_WHY("needs root (network namespaces)");
    if (access("/usr/bin/etcd", X_OK) != 0 ||
        access("/usr/bin/timeout", X_OK) != 0)
        TEST_SKIP_WHY("needs /usr/bin/etcd and /usr/bin/timeout");
    char script[600];
    th_src_path(script, sizeof(script), "chaos/chaos.sh");
    ASSERT_MSG(access(script, X_OK) == 0, "chaos/chaos.sh not found");
    char *dir = th_mkdtemp("chaos-test");
    ASSERT(dir != NULL);
    char log[700];
    snprintf(log, sizeof(log), "%s/chaos.log", dir);
    setenv("BUILD", th_bindir(), 1);
    char *argv[] = {"/usr/bin/timeout", "-k", "10", "120", script, "-s", "1",
                    "-f", "3", "--quick", NULL};
    int64_t t0 = th_now_ms();
    pid_t pid = th_spawn(argv, log);
    ASSERT(pid > 0);
    int status = 0;
    ASSERT_OK(th_wait(pid, 150 * 1000, &status));
    int64_t took = th_now_ms() - t0;

    FILE *f = fopen(log, "r");
    ASSERT(f != NULL);
    char line[2048], last[2048] = "", stale[2048] = "", ckpt[2048] = "";
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "chaos: faults=", 14) == 0)
            snprintf(last, sizeof(last), "%s", line);
        else if (strncmp(line, "chaos: stale_steps=", 19) == 0)
            snprintf(stale, sizeof(stale), "%s", line);
        else if (strncmp(line, "  checkpoints: ", 15) == 0)
            snprintf(ckpt, sizeof(ckpt), "%s", line);
    }
    fclose(f);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || last[0] == 0) {
        char cmd[800];
        snprintf(cmd, sizeof(cmd), "tail -40 %s >&2", log);
        if (system(cmd) != 0) { /* best effort */ }
    }
    ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "chaos.sh exited with status %d after %lld ms", status,
               (long long)took);
    long faults, recovered, lost, dup, hangs;
    ASSERT_MSG(field(last, "faults=", &faults) == 0 &&
               field(last, "recovered=", &recovered) == 0 &&
               field(last, "lost_steps=", &lost) == 0 &&
               field(last, "duplicated_steps=", &dup) == 0 &&
               field(last, "hangs=", &hangs) == 0,
               "no report line in %s", log);
    ASSERT_EQ(faults, 3);
    ASSERT_EQ(recovered, faults);
    ASSERT_EQ(lost, 0);
    ASSERT_EQ(dup, 0);
    ASSERT_EQ(hangs, 0);
    long nstale, older;
    ASSERT_MSG(field(stale, "stale_steps=", &nstale) == 0,
               "no stale_steps line in %s", log);
    ASSERT_EQ(nstale, 0);
    const char *o = strstr(ckpt, "; the ");
    ASSERT_MSG(o != NULL && sscanf(o, "; the %ld older complete ones "
                                      "restore too", &older) == 1,
               "no older checkpoint restored: %s", ckpt);
    ASSERT_GE(older, 1);
    th_rmtree(dir);
    free(dir);
    return 0;
}

/* The repository's root, from the test binary's directory (build/ or
 * build/asan/). */
static const char *repo_root(void)
{
    static char root[600];
    snprintf(root, sizeof(root), "%s/..", th_bindir());
    char probe[700];
    snprintf(probe, sizeof(probe), "%s/chaos/cluster.sh", root);
    if (access(probe, R_OK) != 0)
        snprintf(root, sizeof(root), "%s/../..", th_bindir());
    return root;
}

/* A whole file, NUL-terminated (caller frees); NULL if unreadable. */
static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b != NULL) {
        n += fread(b + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        char *nb = realloc(b, cap *= 2);
        if (nb == NULL)
            free(b);
        b = nb;
    }
    fclose(f);
    if (b != NULL)
        b[n] = 0;
    return b;
}

/* A listening socket on 127.0.0.1 (kept open by the caller); its port. */
static int hold_port(int *fd_p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    ASSERT_OK(bind(fd, (struct sockaddr *)&a, sizeof(a)));
    ASSERT_OK(listen(fd, 1));
    ASSERT_OK(getsockname(fd, (struct sockaddr *)&a, &len));
    *fd_p = fd;
    return ntohs(a.sin_port);
}

/*
 * chaos/cluster.sh's etcd start (rd_start_etcd, or rd_start_etcd3 with
 * three=1) against a port taken between its choice and etcd's bind: the
 * test listens on a port and makes the busy_at-th port rd_free_port
 * picks that one (the race it cannot see: free when checked, taken when
 * etcd binds). The start must try other ports, come up healthy on them
 * and say so. The script kills its etcds by pid on exit.
 */
static void etcd_port_taken(int three, int busy_at)
{
    int hold;
    int busy = hold_port(&hold);
    char *dir = th_mkdtemp("chaos-etcdport");
    ASSERT(dir != NULL);
    char script[4096], log[700];
    snprintf(log, sizeof(log), "%s/out.log", dir);
    snprintf(script, sizeof(script),
             "set -u; cd '%s' || exit 3\n"
             "T='%s'; NETNS=0; PIDS=(); ETCD_SECURE=0\n"
             "die() { echo \"die: $*\"; exit 1; }\n"
             "trap 'for p in \"${PIDS[@]}\"; do kill -9 $p 2>/dev/null;"
             " wait $p 2>/dev/null; done' EXIT\n"
             ". chaos/cluster.sh\n"
             "eval \"orig_$(declare -f rd_free_port)\"\n"
             "rd_free_port() {\n"
             "    local n=$(( $(cat \"$T/n\" 2>/dev/null || echo 0) + 1 ))\n"
             "    echo $n >\"$T/n\"\n"
             "    if [ $n = %d ]; then echo %d; else orig_rd_free_port; fi\n"
             "}\n"
             "if [ %d = 1 ]; then rd_start_etcd3 porttest; P=(${EPS[@]});\n"
             "else rd_start_etcd porttest; P=($EP); fi\n"
             "for p in ${P[@]}; do rd_wait_etcd 5 $p || die \"$p not healthy\";"
             " echo \"port $p healthy\"; done\n"
             "echo done\n",
             repo_root(), dir, busy_at, busy, three);
    char *argv[] = {"/bin/bash", "-c", script, NULL};
    pid_t pid = th_spawn(argv, log);
    ASSERT(pid > 0);
    int status = 0;
    ASSERT_OK(th_wait(pid, 60000, &status));
    close(hold);
    char *out = read_all(log);
    ASSERT(out != NULL);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "%s", out);
    ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "the etcd start failed on a taken port (status %d)", status);
    ASSERT_MSG(strstr(out, "were taken (try 1 of") != NULL,
               "the start did not say it retried:\n%s", out);
    char busy_line[64];
    snprintf(busy_line, sizeof(busy_line), "port %d healthy", busy);
    ASSERT_MSG(strstr(out, busy_line) == NULL, "etcd on the taken port?");
    int healthy = 0;
    for (const char *p = out; (p = strstr(p, " healthy\n")) != NULL; p++)
        healthy++;
    ASSERT_EQ(healthy, three ? 3 : 1);
    ASSERT(strstr(out, "\ndone\n") != NULL);
    free(out);
    th_rmtree(dir);
    free(dir);
}

TEST_IMPL(chaos_etcd_port_taken)
{
    if (access("/usr/bin/etcd", X_OK) != 0)
        TEST_SKIP_WHY("needs /usr/bin/etcd");
    etcd_port_taken(0, 1);
    return 0;
}

TEST_IMPL(chaos_etcd3_port_taken)
{
    if (access("/usr/bin/etcd", X_OK) != 0)
        TEST_SKIP_WHY("needs /usr/bin/etcd");
    etcd_port_taken(1, 2);
    return 0;
}

/*
 * No kind is skipped for want of nodes: from 2 nodes, a scale_down (which
 * needs 3) and a kill_adjacent (which needs 4) each start nodes first
 * until they can run, in one quick round of both kinds on loopback.
 * Before, both were skipped ("2 nodes left", "3 nodes or fewer left").
 */
TEST_IMPL(chaos_kill_adjacent_adds_node)
{
    if (SAN_BUILD)
        TEST_SKIP_WHY("sanitizer build: the chaos run takes minutes there "
                      "and its daemons are the plain build's");
    if (access("/usr/bin/etcd", X_OK) != 0 ||
        access("/usr/bin/timeout", X_OK) != 0)
        TEST_SKIP_WHY("needs /usr/bin/etcd and /usr/bin/timeout");
    char script[700];
    snprintf(script, sizeof(script), "%s/chaos/chaos.sh", repo_root());
    ASSERT_MSG(access(script, X_OK) == 0, "chaos/chaos.sh not found");
    char *dir = th_mkdtemp("chaos-grow");
    ASSERT(dir != NULL);
    char log[700];
    snprintf(log, sizeof(log), "%s/chaos.log", dir);
    setenv("BUILD", th_bindir(), 1);
    setenv("CHAOS_NETNS", "0", 1);
    setenv("CHAOS_CKPT_INTERVAL", "0", 1);
    setenv("ETCD_SECURE", "0", 1);
    /* Loopback steps are fast: enough of them for both faults, each at
     * least 1 ms, so that a fast machine cannot run the job to its end
     * while the faults (paced by time) are still to come. */
    setenv("CHAOS_STEPS_PER_FAULT", "10000", 1);
    setenv("CHAOS_STEP_DELAY_MS", "1", 1);
    char *argv[] = {"/usr/bin/timeout", "-k", "10", "150", script, "-s", "3",
                    "-n", "2", "-f", "2", "--quick", "--kinds",
                    "scale_down,kill_adjacent", NULL};
    pid_t pid = th_spawn(argv, log);
    ASSERT(pid > 0);
    int status = 0;
    ASSERT_OK(th_wait(pid, 180 * 1000, &status));
    char *out = read_all(log);
    ASSERT(out != NULL);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "%s", out);
    ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "chaos.sh exited with status %d", status);
    ASSERT_MSG(strstr(out, ": skipped (only ") == NULL,
               "a kind was skipped for want of nodes");
    long n;
    const char *row = strstr(out, "\n  scale_down ");
    ASSERT_MSG(row != NULL && sscanf(row, "\n  scale_down %ld", &n) == 1 &&
               n == 1, "scale_down was not injected once");
    row = strstr(out, "\n  kill_adjacent ");
    ASSERT_MSG(row != NULL && sscanf(row, "\n  kill_adjacent %ld", &n) == 1 &&
               n == 1, "kill_adjacent was not injected once");
    ASSERT(strstr(out, "  scale_down: too few nodes for it") != NULL);
    ASSERT(strstr(out, "  kill_adjacent: too few nodes for it") != NULL);
    const char *last = strstr(out, "chaos: faults=");
    ASSERT(last != NULL);
    long faults, recovered, hangs;
    ASSERT(field(last, "faults=", &faults) == 0 &&
           field(last, "recovered=", &recovered) == 0 &&
           field(last, "hangs=", &hangs) == 0);
    ASSERT_EQ(faults, 2);
    ASSERT_EQ(recovered, 2);
    ASSERT_EQ(hangs, 0);
    free(out);
    th_rmtree(dir);
    free(dir);
    return 0;
}

/*
 * A fault's SIGSTOP lasts its whole time whatever else sends SIGCONT
 * (rd_stop_until, chaos/cluster.sh): the kernel does when the process
 * group that started the harness becomes orphaned, which once ended a
 * hung_trainer 12.8 s in, before the step timeout. Here the stray
 * SIGCONT comes once the process is stopped: the helper must log it, stop
 * the process again within the fault's 3 s, and continue it at the end.
 */
TEST_IMPL(chaos_stop_survives_sigcont)
{
    char *dir = th_mkdtemp("chaos-stop");
    ASSERT(dir != NULL);
    char script[4096], log[700];
    snprintf(log, sizeof(log), "%s/out.log", dir);
    snprintf(script, sizeof(script),
             "set -u; cd '%s' || exit 3\n"
             "T='%s'; NETNS=0; PIDS=()\n"
             "die() { echo \"die: $*\"; exit 1; }\n"
             ". chaos/cluster.sh\n"
             "state() { local l; read -r l </proc/$1/stat; l=${l##*) };"
             " echo ${l%%%% *}; }\n"
             "until_() { local i; for i in $(seq 200); do eval \"$1\" &&"
             " return 0; sleep 0.01; done; return 1; }\n"
             "sleep 1000 & v=$!\n"
             "trap 'kill -9 $v 2>/dev/null' EXIT\n"
             "t=${EPOCHREALTIME/./}\n"
             "rd_stop_until $v $(( ${t:0:13} + 3000 )) \"$T/cont\"\n"
             "until_ '[ -s \"$T/cont.seen\" ]' || die 'never stopped'\n"
             "kill -CONT $v\n"
             "until_ '[ -s \"$T/cont\" ]' || die 'the stray SIGCONT was not"
             " seen'\n"
             "until_ '[ $(state $v) = T ]' || die 'not stopped again'\n"
             "echo stopped again\n"
             "wait $HELPER\n"
             "until_ '[ $(state $v) != T ]' || die 'not continued at the end'\n"
             "echo continued\n",
             repo_root(), dir);
    char *argv[] = {"/bin/bash", "-c", script, NULL};
    pid_t pid = th_spawn(argv, log);
    ASSERT(pid > 0);
    int status = 0;
    ASSERT_OK(th_wait(pid, 30000, &status));
    char *out = read_all(log);
    ASSERT(out != NULL);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "%s", out);
    ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "the stop did not hold (status %d)", status);
    ASSERT(strstr(out, "stopped again\ncontinued\n") != NULL);
    free(out);
    char path[800];
    snprintf(path, sizeof(path), "%s/cont", dir);
    out = read_all(path);
    ASSERT_MSG(out != NULL && out[0] != 0, "no stray SIGCONT logged");
    free(out);
    th_rmtree(dir);
    free(dir);
    return 0;
}

/*
 * The end-of-run check of a job restart's replay (check_replay in
 * chaos/chaoslib/checks.py) on hash logs made here: the killed
 * incarnation (node1) logged steps 0-8, the restarted one (node2) resumed
 * at the checkpoint of step 5 and redid 5-8 at the same world size, step
 * 7 with another hash. The check must compare those 4 steps and find the
 * one that differs. (The bash harness's awk once named a variable
 * "split", a syntax error, so it compared nothing and passed every run.)
 */
TEST_IMPL(chaos_replay_check)
{
    if (access("/usr/bin/python3", X_OK) != 0)
        TEST_SKIP_WHY("needs /usr/bin/python3");
    char *dir = th_mkdtemp("chaos-replay");
    ASSERT(dir != NULL);
    char path[800];
    for (int k = 1; k <= 2; k++) {
        snprintf(path, sizeof(path), "%s/hash-%d.log", dir, k);
        FILE *f = fopen(path, "w");
        ASSERT(f != NULL);
        for (int s = k == 1 ? 0 : 5; s <= (k == 1 ? 8 : 9); s++)
            fprintf(f, "step %d gen %d rank 0 world 1 hash %016x t_ms %d "
                    "loss 1\n", s, k, k == 2 && s == 7 ? 0xbad : s, s);
        fclose(f);
    }
    char script[2048], log[700];
    snprintf(log, sizeof(log), "%s/out.log", dir);
    snprintf(script, sizeof(script),
             "import os, sys\n"
             "from types import SimpleNamespace as NS\n"
             "sys.dont_write_bytecode = True\n"
             "sys.path.insert(0, '%s/chaos')\n"
             "from chaoslib import checks\n"
             "T = '%s'\n"
             "cl = NS(path=lambda *p: os.path.join(T, *p))\n"
             "run = NS(cl=cl, cfg=NS(steps=10), fail=[], replayed=0,\n"
             "         replay_bad=0, restart_lines=[],\n"
             "         restarts=[(0, 5, 8, [1], [2])])\n"
             "checks.check_hashes(run)\n"
             "checks.check_replay(run, run.restarts[0], [])\n"
             "print('replayed=%%d bad=%%d lost=%%d' %%\n"
             "      (run.replayed, run.replay_bad, run.lost))\n",
             repo_root(), dir);
    char *argv[] = {"/usr/bin/python3", "-c", script, NULL};
    pid_t pid = th_spawn(argv, log);
    ASSERT(pid > 0);
    int status = 0;
    ASSERT_OK(th_wait(pid, 30000, &status));
    char *out = read_all(log);
    ASSERT(out != NULL);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        strstr(out, "replayed=4 bad=1 lost=0") == NULL)
        fprintf(stderr, "%s", out);
    ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "the replay check failed (status %d)", status);
    ASSERT_MSG(strstr(out, "replayed=4 bad=1 lost=0") != NULL,
               "the replay check did not compare steps 5-8 and find step 7");
    free(out);
    th_rmtree(dir);
    free(dir);
    return 0;
}
