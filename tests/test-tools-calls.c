/*
 * tools/calls.py, the check of which file of a folder calls which: the
 * folders that form a tree pass (daemon/ among them: no daemon file calls
 * into one that uses it, and the copy pool calls none), and a folder of
 * two files calling each other is caught.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/py-util.h"
#include "tests/task.h"

static int calls(const char *const *folders, const char *log)
{
    char script[600];
    th_src_path(script, sizeof(script), "tools/calls.py");
    const char *argv[10] = {"/usr/bin/python3", script, "--check"};
    int n = 3;
    for (int i = 0; folders[i] != NULL && n < 9; i++)
        argv[n++] = folders[i];
    argv[n] = NULL;
    pid_t p = th_spawn((char *const *)argv, log);
    td_track(p);
    return td_exit_code(p, 60000);
}

TEST_IMPL(tools_calls_no_cycle)
{
    if (python_unavailable("/usr/bin/python3") != NULL)
        TEST_SKIP_WHY("%s", python_unavailable("/usr/bin/python3"));
    td_daemon_t t;
    td_init(&t, "tools-calls");
    /* The source folders, relative to the source root. */
    char root[600], dirs[5][700];
    th_src_path(root, sizeof(root), "kernels");
    root[strlen(root) - strlen("kernels")] = '\0';
    const char *names[] = {"transport", "kernels", "client", "common",
                           "daemon"};
    const char *folders[6];
    for (int i = 0; i < 5; i++) {
        snprintf(dirs[i], sizeof(dirs[i]), "%s%s", root, names[i]);
        folders[i] = dirs[i];
    }
    folders[5] = NULL;
    const char *log = td_path(&t, "tree.log");
    int rc = calls(folders, log);
    td_dump(log);
    ASSERT_EQ(rc, 0);
    ASSERT(td_file_has(log, "no cycle"));
    ASSERT(!td_file_has(log, "CYCLE"));
    ASSERT(td_file_has(log, "  copy.c           -> -\n"));
    ASSERT(td_file_has(log, "  base.c           -> -\n"));

    /* a.c calls b.c, b.c calls a.c: a cycle, exit 1, both named. */
    char a[400], b[400];
    snprintf(a, sizeof(a), "%s/a.c", t.dir);
    snprintf(b, sizeof(b), "%s/b.c", t.dir);
    FILE *f = fopen(a, "w");
    ASSERT(f != NULL);
    fputs("int b_two(int x);\nint a_one(int x)\n{\n    return b_two(x);\n}\n",
          f);
    fclose(f);
    f = fopen(b, "w");
    ASSERT(f != NULL);
    fputs("int a_one(int x);\nint b_two(int x)\n{\n    return x ? "
          "a_one(x - 1) : 0;\n}\n", f);
    fclose(f);
    const char *cyc[] = {t.dir, NULL};
    log = td_path(&t, "cycle.log");
    rc = calls(cyc, log);
    td_dump(log);
    ASSERT_EQ(rc, 1);
    ASSERT(td_file_has(log, "CYCLE among a.c, b.c"));
    return 0;
}
