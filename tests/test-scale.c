/*
 * test-scale.c - a shortened `make scale` inside the suite: chaos/scale.sh
 * with 10 nodes, 2 SIGKILLed at once and 2 joining, on loopback (real
 * etcd, real daemons and trainers), bounded by timeout(1) well inside the
 * runner's timeout so the script's own cleanup (its EXIT trap) runs.
 * It asserts what the script found, never its times: the kill recovered
 * into a later generation whose world is exactly the 8 survivors (both
 * victims out in that view), the join reached a world of 10, no step was
 * lost or diverged in the hash logs, and every replica's final
 * parameters are bitwise identical. Skipped under the sanitizers (20
 * instrumented processes on this machine's 2 cores take minutes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers.h"
#include "tests/task.h"


/* The value of "key" (e.g. "identical=") in line, into out. */
static int word(const char *line, const char *key, char *out, size_t n)
{
    const char *p = strstr(line, key);
    if (p == NULL)
        return -1;
    p += strlen(key);
    size_t len = strcspn(p, " \n");
    if (len == 0 || len >= n)
        return -1;
    memcpy(out, p, len);
    out[len] = '\0';
    return 0;
}

static void dump_tail(const char *log)
{
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "tail -30 %s >&2", log);
    if (system(cmd) != 0) { /* best effort */ }
}

/* scale.sh's report (log) of 10 nodes, 2 killed and 2 joining: both
 * recovered, no step lost or doubled, identical replicas, the grid. */
static void check_report(const char *log, int status)
{
    FILE *f = fopen(log, "r");
    ASSERT(f != NULL);
    char line[2048], last[2048] = "", kill[2048] = "", hashes[2048] = "",
         rec[2048] = "", grid[2048] = "";
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "scale: nodes=", 13) == 0)
            snprintf(last, sizeof(last), "%s", line);
        else if (strncmp(line, "scale: kill: ", 13) == 0)
            snprintf(kill, sizeof(kill), "%s", line);
        else if (strncmp(line, "scale: hash logs: ", 18) == 0)
            snprintf(hashes, sizeof(hashes), "%s", line);
        else if (strncmp(line, "scale: recovered: ", 18) == 0)
            snprintf(rec, sizeof(rec), "%s", line);
        else if (strncmp(line, "scale: grid: ", 13) == 0)
            snprintf(grid, sizeof(grid), "%s", line);
    }
    fclose(f);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || last[0] == 0)
        dump_tail(log);
    ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "scale.sh exited with status %d", status);

    char v[64];
    ASSERT_MSG(word(last, "nodes=", v, sizeof(v)) == 0 &&
               strcmp(v, "10") == 0, "no report line in %s", log);
    ASSERT_MSG(word(last, "identical=", v, sizeof(v)) == 0 &&
               strcmp(v, "yes") == 0, "replicas differ: %s", last);
    /* "generation G0 -> G1 (world 8: yes)": a later generation without
     * both victims. */
    long g0, g1, world;
    char ok[8];
    const char *k = strstr(kill, "generation ");
    ASSERT_MSG(k != NULL && sscanf(k, "generation %ld -> %ld (world %ld: "
                                      "%3[a-z])", &g0, &g1, &world,
                                   ok) == 4, "no kill line: %s", kill);
    ASSERT_GT(g1, g0);
    ASSERT_EQ(world, 8);
    ASSERT_STR_EQ(ok, "yes");
    ASSERT_MSG(strstr(rec, "kill=yes join=yes") != NULL,
               "an event did not recover: %s", rec);
    long lost, dup;
    ASSERT_MSG(sscanf(hashes, "scale: hash logs: %ld steps lost, %ld with",
                      &lost, &dup) == 2, "no hash line: %s", hashes);
    ASSERT_EQ(lost, 0);
    ASSERT_EQ(dup, 0);
    long on_grid, surv;
    ASSERT_MSG(sscanf(grid, "scale: grid: %ld of %ld", &on_grid, &surv) == 2,
               "no grid line: %s", grid);
    ASSERT_EQ(surv, 10);
    ASSERT_EQ(on_grid, surv);
}

TEST_IMPL(scale_quick)
{
    if (SAN_BUILD)
        TEST_SKIP_WHY("sanitizer build: 20 instrumented processes take "
                      "minutes on 2 cores");
    if (access("/usr/bin/etcd", X_OK) != 0 ||
        access("/usr/bin/timeout", X_OK) != 0)
        TEST_SKIP_WHY("needs /usr/bin/etcd and /usr/bin/timeout");
    char script[600];
    th_src_path(script, sizeof(script), "chaos/scale.sh");
    ASSERT_MSG(access(script, X_OK) == 0, "chaos/scale.sh not found");
    char *dir = th_mkdtemp("scale-test");
    ASSERT(dir != NULL);
    char log[700];
    snprintf(log, sizeof(log), "%s/scale.log", dir);
    setenv("BUILD", th_bindir(), 1);
    setenv("NODES", "10", 1);
    setenv("KILL", "2", 1);
    setenv("JOIN", "2", 1);
    setenv("SCALE_WINDOW", "50", 1);
    /* The grid through the kill and the join (10, 8, 10 nodes: ragged
     * rows), after a short flat job for the flat figure. */
    setenv("SCALE_RING2D", "--ring-grid-min-nodes 4", 1);
    char *argv[] = {"/usr/bin/timeout", "-k", "10", "150", script, NULL};
    pid_t pid = th_spawn(argv, log);
    ASSERT(pid > 0);
    int status = 0;
    ASSERT_OK(th_wait(pid, 180 * 1000, &status));

    check_report(log, status);
    th_rmtree(dir);
    free(dir);
    return 0;
}
