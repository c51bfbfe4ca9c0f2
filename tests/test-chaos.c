/*
 * test-chaos.c - a quick seeded chaos run inside the suite: chaos/chaos.sh
 * -s 1 -f 3 --quick (daemon kill + restart, hang by SIGSTOP, scale up only:
 * the faults that recover the same way every time) on 4 nodes in network
 * namespaces, bounded by timeout(1) well inside the runner's timeout so the
 * harness's own cleanup (a SIGTERM) runs. The harness is strict by default:
 * a stale replica step or an older checkpoint that does not restore fails
 * it; the test also reads both from the report (no stale step, and at
 * least one older checkpoint restored besides the newest). Needs root
 * (namespaces); skips otherwise, and under the sanitizers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    snprintf(script, sizeof(script), "%s/../chaos/chaos.sh", th_bindir());
    if (access(script, X_OK) != 0)
        snprintf(script, sizeof(script), "%s/../../chaos/chaos.sh",
                 th_bindir());
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
