/*
 * What the tests that run /usr/bin/python3 against a real ringd share
 * (tests/test-client-python.c, tests/test-client-torch.c): why they cannot
 * run, whether a module imports, where the source tree is.
 */
#ifndef RINGD_TESTS_PY_UTIL_H
#define RINGD_TESTS_PY_UTIL_H

#include <stdio.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"


/* Why the Python tests cannot run here, or NULL. */
static inline const char *python_unavailable(const char *py)
{
    if (SAN_BUILD)
        return "sanitizer build: /usr/bin/python3 cannot load an "
               "ASan-instrumented libringd.so without preloading the "
               "sanitizer runtime (the plain build runs these tests)";
    if (access(py, X_OK) != 0)
        return "/usr/bin/python3 is not installed";
    return NULL;
}

static inline int have_numpy(const char *py, const char *log)
{
    const char *argv[] = {py, "-c", "import numpy", NULL};
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    return td_exit_code(pid, 60000) == 0;
}

/* 1 if py can run the Python code `module` (an import, say) cleanly. */
static inline int py_imports(const char *py, const char *module,
                             const char *log)
{
    const char *argv[] = {py, "-c", module, NULL};
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    return td_exit_code(pid, 60000) == 0;
}

#endif
