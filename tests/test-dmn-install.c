/*
 * make install into a staging tree (DESTDIR, PREFIX=/usr as a package
 * does): the tree holds what the installed unit and ringd.pc name, a
 * program builds and links against the tree through pkg-config, and
 * systemd-analyze verify has nothing to say about the installed unit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* The source tree: the first directory above the build dir with the
 * Makefile and deploy/ringd.service. */
static void repo_root(char *out, size_t n)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s", th_bindir());
    for (int up = 0; up < 4; up++) {
        char probe[1100];
        snprintf(probe, sizeof(probe), "%s/deploy/ringd.service", p);
        if (access(probe, R_OK) == 0) {
            ASSERT(realpath(p, out) != NULL && strlen(out) < n);
            return;
        }
        strncat(p, "/..", sizeof(p) - strlen(p) - 1);
    }
    TEST_FAIL_("no source tree above %s", th_bindir());
}

static int run_sh(const char *cmd, const char *log)
{
    char full[8192];
    snprintf(full, sizeof(full), "( %s ) > %s 2>&1", cmd, log);
    int st = system(full);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The value of "key" at the start of a line of text ("Key=" or "key="),
 * up to the end of the line or the first space; static buffer. */
static const char *field(const char *text, const char *key)
{
    static char v[512];
    size_t kl = strlen(key);
    for (const char *l = text; l != NULL && *l; l = strchr(l, '\n')) {
        if (*l == '\n')
            l++;
        if (strncmp(l, key, kl) == 0) {
            size_t n = strcspn(l + kl, " \n");
            ASSERT(n < sizeof(v));
            memcpy(v, l + kl, n);
            v[n] = '\0';
            return v;
        }
    }
    return NULL;
}

/* DESTDIR + path is a regular file (executable when x). */
static void in_tree(const char *dest, const char *path, int x)
{
    char p[1024];
    struct stat st;
    snprintf(p, sizeof(p), "%s%s", dest, path);
    ASSERT_MSG(stat(p, &st) == 0 && S_ISREG(st.st_mode),
               "%s is not in the installed tree", path);
    if (x)
        ASSERT_MSG(st.st_mode & S_IXUSR, "%s is not executable", path);
}

/* The unit: its binary and config are in the tree; its user is made by
 * the installed sysusers.d file; it keeps only CAP_IPC_LOCK. Returns the
 * unit's text (caller frees); its path in up. */
static char *check_unit(const char *destdir, char *up, size_t uplen)
{
    snprintf(up, uplen, "%s/lib/systemd/system/ringd.service",
             destdir);
    char *unit = td_read(up, NULL);
    ASSERT_MSG(unit != NULL, "no unit at %s", up);
    char exec[512];
    snprintf(exec, sizeof(exec), "%s", field(unit, "ExecStart="));
    ASSERT_STR_EQ(exec, "/usr/bin/ringd");
    in_tree(destdir, exec, 1);
    const char *conf = strstr(unit, "--config ");
    ASSERT(conf != NULL);
    char cpath[256];
    ASSERT_EQ(sscanf(conf + 9, "%255s", cpath), 1);
    ASSERT_STR_EQ(cpath, "/etc/ringd/ringd.conf");
    in_tree(destdir, cpath, 0);
    ASSERT_STR_EQ(field(unit, "User="), "ringd");
    ASSERT_STR_EQ(field(unit, "CapabilityBoundingSet="), "CAP_IPC_LOCK");
    ASSERT_STR_EQ(field(unit, "AmbientCapabilities="), "CAP_IPC_LOCK");
    ASSERT_STR_EQ(field(unit, "RuntimeDirectory="), "ringd");
    in_tree(destdir, "/usr/lib/sysusers.d/ringd.conf", 0);
    char sp[1024];
    snprintf(sp, sizeof(sp), "%s/usr/lib/sysusers.d/ringd.conf", destdir);
    ASSERT(td_file_has(sp, "\nu ringd "));
    in_tree(destdir, "/usr/bin/ringctl", 1);

    return unit;
}

/* ringd.pc: the library and header where it says; a program builds and
 * links against the tree with its flags. Returns the .pc's text. */
static char *check_pkgconfig(td_daemon_t *t, const char *destdir)
{
    char cmd[4096];
    char pc[1024];
    snprintf(pc, sizeof(pc), "%s/usr/lib/pkgconfig/ringd.pc", destdir);
    char *pct = td_read(pc, NULL);
    ASSERT_MSG(pct != NULL, "no ringd.pc");
    char lib[600], inc[600];
    snprintf(lib, sizeof(lib), "%s/libringd.so", field(pct, "libdir="));
    snprintf(inc, sizeof(inc), "%s/ringd.h", field(pct, "includedir="));
    in_tree(destdir, lib, 0);
    in_tree(destdir, inc, 0);
    const char *prog = td_path(t, "p.c");
    FILE *f = fopen(prog, "w");
    ASSERT(f != NULL);
    fputs("#include <ringd.h>\nint main(void) { ringd_client_t *c; "
          "return ringd_connect(&c, \"/nonexistent\", NULL) == 0; }\n", f);
    fclose(f);
    char out[600];
    snprintf(out, sizeof(out), "%s", td_path(t, "p"));
    /* A sanitizer build installs an instrumented library: link the same
     * runtime. */
#ifdef __SANITIZE_ADDRESS__
    const char *san = "-fsanitize=address,undefined";
#else
    const char *san = "";
#endif
    snprintf(cmd, sizeof(cmd), "cc %s %s -o %s $(PKG_CONFIG_SYSROOT_DIR=%s "
             "PKG_CONFIG_LIBDIR=%s/usr/lib/pkgconfig pkg-config --cflags "
             "--libs ringd) && LD_LIBRARY_PATH=%s/usr/lib %s", san, prog, out,
             destdir, destdir, destdir, out);
    const char *clog = td_path(t, "cc.log");
    int rc = run_sh(cmd, clog);
    if (rc != 0)
        td_dump(clog);
    ASSERT_EQ(rc, 0);

    return pct;
}

/* systemd-analyze verify, on the installed unit with ExecStart in the
 * tree (offline it checks that the binary exists): no output. */
static void verify_unit(td_daemon_t *t, const char *destdir, const char *up)
{
    char cmd[4096];
    int rc;
    const char *sa = access("/usr/bin/systemd-analyze", X_OK) == 0
                         ? "/usr/bin/systemd-analyze"
                         : NULL;
    if (sa != NULL) {
        const char *vu = td_path(t, "ringd.service");
        snprintf(cmd, sizeof(cmd), "sed 's|^ExecStart=/usr/bin/ringd|"
                 "ExecStart=%s/usr/bin/ringd|' %s > %s && %s verify %s",
                 destdir, up, vu, sa, vu);
        const char *vlog = td_path(t, "verify.log");
        rc = run_sh(cmd, vlog);
        size_t len = 0;
        char *vo = td_read(vlog, &len);
        ASSERT_MSG(rc == 0 && len == 0, "systemd-analyze verify: exit %d:\n%s",
                   rc, vo ? vo : "");
        free(vo);
    }
}

TEST_IMPL(dmn_install_tree)
{
    td_daemon_t t;
    td_init(&t, "dmn-install");
    char root[1024], bin[1024], cmd[4096];
    repo_root(root, sizeof(root));
    ASSERT(realpath(th_bindir(), bin) != NULL);
    const char *dest = td_path(&t, "root");
    char destdir[512];
    snprintf(destdir, sizeof(destdir), "%s", dest);
    const char *log = td_path(&t, "install.log");
    snprintf(cmd, sizeof(cmd), "make -C %s BUILD=%s PREFIX=/usr DESTDIR=%s "
             "install", root, bin, destdir);
    if (run_sh(cmd, log) != 0)
        td_dump(log);
    ASSERT_EQ(run_sh(cmd, log), 0);

    char up[1024];
    char *unit = check_unit(destdir, up, sizeof(up));
    char *pct = check_pkgconfig(&t, destdir);

    /* The Python package, told where the library went. */
    in_tree(destdir, "/usr/lib/python3/dist-packages/ringd/__init__.py", 0);
    char cfg[1024];
    snprintf(cfg, sizeof(cfg),
             "%s/usr/lib/python3/dist-packages/ringd/_config.py", destdir);
    ASSERT(td_file_has(cfg, "\"/usr/lib\""));
    /* The launcher, told where the package went. */
    in_tree(destdir, "/usr/bin/ringrun", 1);
    char rr[1024];
    snprintf(rr, sizeof(rr), "%s/usr/bin/ringrun", destdir);
    ASSERT(td_file_has(rr, "\nPYTHONDIR = "
                           "\"/usr/lib/python3/dist-packages\"\n"));

    verify_unit(&t, destdir, up);
    free(unit);
    free(pct);
    return 0;
}
