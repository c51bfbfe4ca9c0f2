/*
 * ringd and ringctl against a real etcd with TLS (client certificates
 * required) and password auth: a job trains through it; a user stripped
 * of its role is fenced with a clear line and comes back once the role
 * is granted again; a wrong CA or a wrong password is a clear line and a
 * node that never joins, not a crash; bad security settings are start-up
 * errors.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "tests/task.h"

#define SEC_JOB "secjob"

static void sec_env(void)
{
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    ASSERT_MSG(f != NULL, "%s: %s", path, strerror(errno));
    ASSERT(fputs(text, f) >= 0);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_EQ(chmod(path, mode), 0);
}

/*
 * TLS etcd (a server certificate: see FX_TLS_SERVER) with auth on: root
 * (for the test's etcdctl), and "ringd", "ringd1" and "ringd2" (same
 * password),
 * whose role may read and write /ringd/ only. Password files for ringd's
 * right and a wrong password, and a second CA that signed nothing etcd
 * shows.
 */
static void sec_etcd_start(fx_etcd_t *et)
{
    fx_etcd_start(et, FX_TLS_SERVER);
    const char *setup[] = {
        "user add root:rootpw", "user add ringd:ringdpw",
        "user add ringd1:ringdpw", "user add ringd2:ringdpw",
        "role add ringd",
        "role grant-permission ringd --prefix=true readwrite /ringd/",
        "user grant-role ringd ringd", "user grant-role ringd1 ringd",
        "user grant-role ringd2 ringd", "auth enable"};
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++)
        ASSERT_MSG(fx_etcdctl(et, setup[i]) == 0, "etcdctl %s failed, see "
                   "%s/etcdctl.log", setup[i], et->dir);
    snprintf(et->ctl_user, sizeof(et->ctl_user), "root:rootpw");
    write_file(fx_path(et, "ringd.pw"), "ringdpw\n", 0600);
    write_file(fx_path(et, "wrong.pw"), "ringdpw-not\n", 0600);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "cd %s && openssl req -x509 -newkey "
             "rsa:2048 -nodes -days 1 -subj /CN=other-ca -keyout other.key "
             "-out other-ca.crt >> openssl.log 2>&1", et->dir);
    ASSERT_MSG(system(cmd) == 0, "openssl failed, see %s/openssl.log",
               et->dir);
}

/* The etcd flags of a node or of ringctl: ca and pw name files in the
 * etcd dir. Fills a[] and returns the count. */
static int sec_flags(fx_etcd_t *et, const char *user, const char *ca,
                     const char *pw, const char **a)
{
    static char p[4][2][512];
    static int slot;
    char (*s)[512] = p[slot++ % 4];
    snprintf(s[0], 512, "%s", fx_path(et, ca));
    snprintf(s[1], 512, "%s", fx_path(et, pw));
    const char *f[] = {"--etcd", et->url, "--etcd-ca", s[0], "--etcd-user",
                       user, "--etcd-password-file", s[1]};
    for (int i = 0; i < 8; i++)
        a[i] = f[i];
    return 8;
}

/* A ring node of SEC_JOB with the given CA and password file. */
static void node_start(td_daemon_t *d, fx_etcd_t *et, const char *id,
                       const char *user, const char *ca, const char *pw)
{
    char name[32];
    snprintf(name, sizeof(name), "dmn-sec-%s", id);
    td_init(d, name);
    d->networked = 1;
    const char *a[32];
    int n = sec_flags(et, user, ca, pw, a);
    const char *rest[] = {"--job", SEC_JOB, "--node-id", id, "--trainers",
                          "1", "--lease-ttl", "2", "--min-nodes", "2",
                          "--log-level", "debug", NULL};
    for (int i = 0; rest[i] != NULL; i++)
        a[n++] = rest[i];
    a[n] = NULL;
    ASSERT_MSG(td_start(d, a) == 0, "daemon %s did not start", id);
}

/* Run build/ringctl with args (NULL-ended), output in log; asserts it
 * exited on its own within 15 s and returns its exit code. */
static int ringctl(const char *const *args, const char *log)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    const char *argv[32] = {path};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(log);
    pid_t pid = th_spawn((char *const *)argv, log);
    ASSERT_GT(pid, 0);
    int st;
    if (th_wait(pid, 15000, &st) != 0) {
        th_kill(pid);
        TEST_FAIL_("ringctl: no exit within 15 s");
    }
    ASSERT_MSG(WIFEXITED(st), "ringctl killed by signal %d", WTERMSIG(st));
    return WEXITSTATUS(st);
}

/* ringctl members with the given CA and password file. */
static int members(fx_etcd_t *et, const char *ca, const char *pw,
                   const char *log)
{
    const char *a[32];
    int n = sec_flags(et, "ringd", ca, pw, a);
    a[n++] = "--job";
    a[n++] = SEC_JOB;
    a[n++] = "members";
    a[n] = NULL;
    return ringctl(a, log);
}

static int td_count(const char *path, const char *needle)
{
    char *s = td_read(path, NULL);
    int n = 0;
    for (char *p = s; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(s);
    return n;
}

typedef struct {
    const char *path;
    const char *needle;
    int count;
} count_t;

static int count_reached(void *p)
{
    count_t *c = p;
    return td_count(c->path, c->needle) >= c->count;
}

/* The process is stopped (state T in /proc/PID/stat). */
static int is_stopped(void *p)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", *(pid_t *)p);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    return rp != NULL && rp[1] == ' ' && rp[2] == 'T';
}

#define DENIED "etcd refused this node's credentials"

/*
 * Two nodes over TLS + auth train. After step 20 the trainers stop
 * themselves and n1's etcd user loses its role: n1 logs the refusal and
 * fences, stays up, says so again at each retry, and the job goes on
 * without it: n0's trainer finishes alone, on a view of one member. Once
 * the role is back n1 registers again.
 */
TEST_IMPL(dmn_sec_etcd_tls_auth_job)
{
    sec_env();
    fx_etcd_t et = {0};
    sec_etcd_start(&et);
    td_daemon_t d[2];
    node_start(&d[0], &et, "n0", "ringd", "ca.crt", "ringd.pw");
    node_start(&d[1], &et, "n1", "ringd1", "ca.crt", "ringd.pw");
    pid_t tr[2];
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--steps", "60", "--stop-after-step", "20",
                              "--hash-log", td_path(&d[i], "h"), NULL};
        tr[i] = td_trainer(&d[i], args, td_path(&d[i], "t.log"));
    }
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(td_poll(is_stopped, &tr[i], 60000) == 0,
                   "trainer of n%d never reached step 20", i);

    /* ringctl with the same settings sees both nodes. */
    const char *log = td_path(&d[0], "ctl.log");
    ASSERT_EQ(members(&et, "ca.crt", "ringd.pw", log), 0);
    ASSERT(td_file_has(log, "n0 ") && td_file_has(log, "n1 "));

    /* The role goes: etcd 3.4 still renews the lease, the read after the
     * keepalive is refused. */
    ASSERT_EQ(fx_etcdctl(&et, "user revoke-role ringd1 ringd"), 0);
    ASSERT_MSG(td_wait_file(d[1].log, DENIED " at its credentials check",
                            15000) == 0, "n1 never said etcd refused it");
    ASSERT(td_wait_file(d[1].log, "fenced (Permission denied)", 5000) == 0);
    /* Its re-registration is refused too, and says so. */
    ASSERT(td_wait_file(d[1].log, DENIED " at the old lease's revoke",
                        5000) == 0);
    ASSERT_EQ(kill(d[1].pid, 0), 0);
    /* n0 goes on alone: a view of one member. */
    ASSERT_MSG(td_wait_file(d[0].log, "1 member, me #0", 15000) == 0,
               "n0 never had a view without n1");
    ASSERT(!td_file_has(d[0].log, DENIED));
    /* ringctl sees n0 alone (asked while n0's trainer still runs: a node
     * whose last trainer has ended steps out of the job). */
    ASSERT_EQ(members(&et, "ca.crt", "ringd.pw", log), 0);
    ASSERT(td_file_has(log, "n0 ") && !td_file_has(log, "n1 "));
    ASSERT_EQ(kill(tr[0], SIGCONT), 0);
    int rc = td_exit_code(tr[0], 120000);
    if (rc != 0) {
        td_dump(td_path(&d[0], "t.log"));
        td_dump(d[0].log);
    }
    ASSERT_MSG(rc == 0, "trainer of n0 exited %d", rc);
    static td_hashes_t h0;
    td_read_hashes(td_path(&d[0], "h"), &h0);
    ASSERT_EQ(h0.nsteps, 60);
    ASSERT_EQ(h0.world[20], 2);
    ASSERT_EQ(h0.world[59], 1);
    /* A retry is no silent loop: it says the same again. */
    ASSERT(td_wait_file(d[1].log, "retry 2 in", 15000) == 0);
    ASSERT_EQ(kill(d[1].pid, 0), 0);

    /* The role is back: n1 registers again by itself. */
    ASSERT_EQ(fx_etcdctl(&et, "user grant-role ringd1 ringd"), 0);
    count_t c = {d[1].log, "node record written", 2};
    rc = td_poll(count_reached, &c, 30000);
    if (rc != 0)
        td_dump(d[1].log);
    ASSERT_MSG(rc == 0, "n1 did not register again");
    th_kill(tr[1]);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(&d[i], 30000), 0);
    return fx_done();
}

/*
 * A node with a CA that did not sign etcd's certificate, and one with a
 * wrong password: each logs the refusal, stays up without joining, and
 * drains cleanly. A node whose user is deleted while it is in the job
 * fences with the same line. ringctl says "refused access" for both
 * mistakes, and reads the job with the right settings.
 */
TEST_IMPL(dmn_sec_etcd_refused)
{
    sec_env();
    fx_etcd_t et = {0};
    sec_etcd_start(&et);
    td_daemon_t ca, pw;
    node_start(&ca, &et, "badca", "ringd", "other-ca.crt", "ringd.pw");
    node_start(&pw, &et, "badpw", "ringd", "ca.crt", "wrong.pw");
    td_daemon_t *d[] = {&ca, &pw};
    for (int i = 0; i < 2; i++) {
        int rc = td_wait_file(d[i]->log, DENIED " at the lease grant",
                              15000);
        if (rc != 0)
            td_dump(d[i]->log);
        ASSERT_MSG(rc == 0, "%s: no refusal logged",
                   i ? "wrong password" : "wrong CA");
        ASSERT_EQ(kill(d[i]->pid, 0), 0);
    }
    ASSERT(td_file_has(ca.log, "SSL"));
    ASSERT(td_file_has(pw.log, "authentication failed"));

    /* A registered node whose user is deleted: its token is invalid, the
     * one fresh authentication it tries fails, and it fences. Which
     * request meets the refusal first depends on timing: the read that
     * follows a keepalive (fenced with EACCES), or, when the lease was
     * already lost (a slow sanitizer build), the re-registration's check
     * of the old lease (fenced for the lost lease, then refused). */
    td_daemon_t gone;
    node_start(&gone, &et, "gone", "ringd2", "ca.crt", "ringd.pw");
    ASSERT(td_wait_file(gone.log, "node record written", 15000) == 0);
    ASSERT_EQ(fx_etcdctl(&et, "user delete ringd2"), 0);
    int rc = td_wait_file(gone.log, DENIED " at ", 15000);
    if (rc != 0)
        td_dump(gone.log);
    ASSERT_MSG(rc == 0, "deleted user: no refusal logged");
    int at_check = td_file_has(gone.log, DENIED " at its credentials check");
    ASSERT(at_check ||
           td_file_has(gone.log, DENIED " at the old lease's check"));
    ASSERT(td_file_has(gone.log, "re-authenticating"));
    ASSERT(td_file_has(gone.log, at_check ? "fenced (Permission denied)"
                                          : "fenced ("));
    ASSERT_EQ(kill(gone.pid, 0), 0);
    ASSERT_EQ(td_stop(&gone, 30000), 0);

    const char *log = td_path(&ca, "ctl.log");
    ASSERT_EQ(members(&et, "other-ca.crt", "ringd.pw", log), 1);
    ASSERT(td_file_has(log, "refused access"));
    ASSERT_EQ(members(&et, "ca.crt", "wrong.pw", log), 1);
    ASSERT(td_file_has(log, "refused access"));
    ASSERT_EQ(members(&et, "ca.crt", "ringd.pw", log), 0);
    ASSERT(!td_file_has(log, "badca") && !td_file_has(log, "badpw"));
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(td_stop(d[i], 30000), 0);
    return fx_done();
}

/* ringd's exit status and stderr for args (NULL-ended). */
static int ringd_rc(td_daemon_t *t, const char *const *args)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringd", th_bindir());
    const char *argv[32] = {path};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(t->log);
    pid_t pid = th_spawn((char *const *)argv, t->log);
    ASSERT_GT(pid, 0);
    int st;
    ASSERT_MSG(th_wait(pid, 15000, &st) == 0, "ringd did not exit");
    ASSERT(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Half a setting, or a file that is not there, is a start-up error
 * naming it: exit 2 before anything is started. */
TEST_IMPL(dmn_sec_config_errors)
{
    td_daemon_t t;
    td_init(&t, "dmn-sec-cfg");
    const char *base[] = {"--etcd", "https://127.0.0.1:1", "--job", "j",
                          "--socket", t.sock, "--metrics", "off"};
    struct {
        const char *k1, *v1, *k2, *v2, *want;
    } cases[] = {
        {"--etcd-user", "ringd", NULL, NULL, "go together"},
        {"--etcd-cert", "/etc/hostname", NULL, NULL, "go together"},
        {"--etcd-user", "ringd", "--etcd-password-file", "/nonexistent/pw",
         "cannot read etcd-password file /nonexistent/pw"},
        {"--etcd-ca", "/nonexistent/ca", NULL, NULL,
         "cannot read etcd-ca file /nonexistent/ca"},
        {"--etcd-ca", "/tmp", NULL, NULL, "not a regular file"},
        {"--socket-mode", "0999", NULL, NULL, "bad socket mode '0999'"},
        {"--socket-mode", "1777", NULL, NULL, "bad socket mode '1777'"},
        {"--socket-group", "no-such-group-rd", NULL, NULL,
         "unknown socket group 'no-such-group-rd'"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *a[16];
        int n = 0;
        for (; n < 8; n++)
            a[n] = base[n];
        a[n++] = cases[c].k1;
        a[n++] = cases[c].v1;
        if (cases[c].k2 != NULL) {
            a[n++] = cases[c].k2;
            a[n++] = cases[c].v2;
        }
        a[n] = NULL;
        int rc = ringd_rc(&t, a);
        if (rc != 2 || !td_file_has(t.log, cases[c].want))
            td_dump(t.log);
        ASSERT_EQ(rc, 2);
        ASSERT_MSG(td_file_has(t.log, cases[c].want), "case %zu: no '%s'",
                   c, cases[c].want);
    }
    return 0;
}

/* ---- the local socket ---- */

/* Test users and a group, made with useradd/groupadd and removed at
 * exit: "in" has the socket group as primary group, "sup" as a
 * supplementary one, "out" has neither. */
static char grp_name[32], user_in[32], user_sup[32], user_out[32];

static void users_remove(void)
{
    char cmd[256];
    const char *u[] = {user_in, user_sup, user_out};
    for (int i = 0; i < 3; i++) {
        if (u[i][0] == '\0')
            continue;
        snprintf(cmd, sizeof(cmd), "userdel %s >/dev/null 2>&1", u[i]);
        (void)!system(cmd);
    }
    if (grp_name[0] != '\0') {
        snprintf(cmd, sizeof(cmd), "groupdel %s >/dev/null 2>&1", grp_name);
        (void)!system(cmd);
    }
}

/* Run a shell command made like printf; its exit status. */
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void users_make(void)
{
    int id = (int)getpid() % 100000;
    snprintf(grp_name, sizeof(grp_name), "rdtg%d", id);
    snprintf(user_in, sizeof(user_in), "rdti%d", id);
    snprintf(user_sup, sizeof(user_sup), "rdts%d", id);
    snprintf(user_out, sizeof(user_out), "rdto%d", id);
    atexit(users_remove);
    const char *add = "useradd -M -N -s /usr/sbin/nologin";
    ASSERT_EQ(sh("groupadd %s", grp_name), 0);
    ASSERT_EQ(sh("%s -g %s %s", add, grp_name, user_in), 0);
    ASSERT_EQ(sh("%s -g nogroup -G %s %s", add, grp_name, user_sup), 0);
    ASSERT_EQ(sh("%s -g nogroup %s", add, user_out), 0);
}

static unsigned id_of(const char *what, const char *name)
{
    char cmd[128], buf[32] = "";
    snprintf(cmd, sizeof(cmd), "id %s %s", what, name);
    FILE *p = popen(cmd, "r");
    ASSERT(p != NULL);
    ASSERT(fgets(buf, sizeof(buf), p) != NULL);
    pclose(p);
    return (unsigned)strtoul(buf, NULL, 10);
}

/* A trainer of 20 steps run as user (setpriv: the user's uid, primary
 * and supplementary groups); its log in t's dir. */
static pid_t trainer_as(td_daemon_t *t, const char *user, const char *log)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/examples/trainer", th_bindir());
    const char *argv[] = {"/usr/bin/setpriv", "--reuid", user, "--regid",
                          NULL, "--init-groups", path, "--socket", t->sock,
                          "--cpu", "--steps", "20", NULL};
    char gid[16];
    snprintf(gid, sizeof(gid), "%u", id_of("-g", user));
    argv[4] = gid;
    pid_t pid = th_spawn((char *const *)argv, td_path(t, log));
    td_track(pid);
    return pid;
}

static void daemon_socket(td_daemon_t *t, const char *mode)
{
    td_init(t, "dmn-sec-sock");
    /* The users must reach the socket inside the temp dir. */
    ASSERT_EQ(chmod(t->dir, 0711), 0);
    const char *a[] = {"--socket-group", grp_name, "--socket-mode", mode,
                       NULL};
    ASSERT_MSG(td_start(t, a) == 0, "daemon did not start");
}

/*
 * Locked socket: it is made with the socket group and mode 0660. A
 * trainer of a user whose primary group it is, and one of a user with it
 * as a supplementary group, connect and train; the daemon logs the
 * kernel's pid and uid for them. A user outside the group cannot open
 * the socket at all; with a looser mode (0666) it opens it, and the
 * daemon refuses it on SO_PEERCRED, logging its pid and uid.
 */
TEST_IMPL(dmn_sec_socket_group)
{
    if (geteuid() != 0)
        TEST_SKIP_WHY("needs root for useradd and setpriv");
    users_make();
    unsigned gid = id_of("-g", user_in);
    td_daemon_t t;
    daemon_socket(&t, "0660");
    struct stat st;
    ASSERT_EQ(stat(t.sock, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0660);
    ASSERT_EQ(st.st_gid, gid);

    const char *users[] = {user_in, user_sup};
    for (int i = 0; i < 2; i++) {
        char lg[32], want[96];
        snprintf(lg, sizeof(lg), "t%d.log", i);
        pid_t p = trainer_as(&t, users[i], lg);
        int rc = td_exit_code(p, 60000);
        if (rc != 0) {
            td_dump(td_path(&t, lg));
            td_dump(t.log);
        }
        ASSERT_MSG(rc == 0, "trainer of %s exited %d", users[i], rc);
        snprintf(want, sizeof(want), "accepted (pid %d, uid %u)", (int)p,
                 id_of("-u", users[i]));
        ASSERT_MSG(td_file_has(t.log, want), "no '%s' in the log", want);
    }
    pid_t p = trainer_as(&t, user_out, "out.log");
    ASSERT_NE(td_exit_code(p, 60000), 0);
    ASSERT(td_file_has(td_path(&t, "out.log"), "ermission denied"));
    ASSERT(!td_file_has(t.log, "refused a local connection"));
    ASSERT_EQ(td_stop(&t, 30000), 0);

    daemon_socket(&t, "0666");
    ASSERT_EQ(stat(t.sock, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0666);
    p = trainer_as(&t, user_out, "out.log");
    ASSERT_NE(td_exit_code(p, 60000), 0);
    char want[128];
    snprintf(want, sizeof(want), "refused a local connection from pid %d "
             "uid %u", (int)p, id_of("-u", user_out));
    if (!td_file_has(t.log, want))
        td_dump(t.log);
    ASSERT_MSG(td_file_has(t.log, want), "no '%s' in the log", want);
    ASSERT(td_file_has(t.log, "not in the socket group"));
    p = trainer_as(&t, user_in, "t2.log");
    ASSERT_EQ(td_exit_code(p, 60000), 0);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
