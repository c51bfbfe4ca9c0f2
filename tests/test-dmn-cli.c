/*
 * ringd as an operator sees it: --help, bad command lines and config files,
 * sd_notify, SIGTERM, /metrics and /healthz, the systemd unit.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/dmn.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* Run build/<bin> with args; returns its exit code, output in log. */
static int run_bin(const char *bin, const char *const *args,
                   const char *log)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", th_bindir(), bin);
    const char *argv[24] = {path};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(log);
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    return td_exit_code(pid, 30000);
}

static int run_ringd(td_daemon_t *t, const char *const *args,
                     const char *log)
{
    (void)t;
    return run_bin("ringd", args, log);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

TEST_IMPL(dmn_help_and_version)
{
    td_daemon_t t;
    td_init(&t, "dmn-help");
    const char *log = td_path(&t, "out");
    const char *h[] = {"--help", NULL};
    ASSERT_EQ(run_ringd(&t, h, log), 0);
    const char *want[] = {"Usage: ringd", "--standalone", "--trainers",
                          "--etcd", "--ucx-opt", "--metrics", "SIGTERM",
                          "Exit status", "ringd.conf"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ASSERT_MSG(td_file_has(log, want[i]), "--help lacks %s", want[i]);
    ASSERT(!td_file_has(log, "--backend")); /* test-only, hidden */
    const char *v[] = {"--version", NULL};
    ASSERT_EQ(run_ringd(&t, v, log), 0);
    ASSERT(td_file_has(log, "ringd " DMN_VERSION));
    return 0;
}

TEST_IMPL(dmn_bad_command_lines)
{
    td_daemon_t t;
    td_init(&t, "dmn-badcli");
    const char *log = td_path(&t, "out");
    const char *conf1 = td_path(&t, "a.conf");
    const char *conf2 = td_path(&t, "b.conf");
    const char *conf3 = td_path(&t, "c.conf");
    write_file(conf1, "# comment\nstandalone = true\nbogus = 1\n");
    write_file(conf2, "standalone = true\ntrainers = many\n");
    write_file(conf3, "just some words\n");
    char want1[300], want2[300], want3[300];
    snprintf(want1, sizeof(want1), "%s:3: unknown key 'bogus'", conf1);
    snprintf(want2, sizeof(want2), "%s:2: bad number 'many'", conf2);
    snprintf(want3, sizeof(want3), "%s:1: expected 'key = value'", conf3);
    struct {
        const char *args[8];
        int code;
        const char *want;
    } cases[] = {
        {{"--bogus"}, 2, "unknown option '--bogus'"},
        {{"--standalone", "--trainers"}, 2, "needs a value"},
        {{"--standalone", "--trainers", "abc"}, 2, "bad number 'abc'"},
        {{"--standalone", "--trainers", "-1"}, 2, "bad number '-1'"},
        {{"--standalone", "--lease-ttl", "0"}, 2, "bad number '0'"},
        {{"--standalone", "--log-level", "loud"}, 2, "bad log level"},
        {{"--standalone", "--ring-wire", "fp8"}, 2, "bad ring-wire 'fp8'"},
        {{"--standalone", "--ring-chunk-kib", "0"}, 2, "bad number '0'"},
        {{"--standalone", "--ring-bidirectional=both"}, 2,
         "bad boolean 'both' for 'ring-bidirectional' (want true, auto or "
         "false)"},
        {{"--standalone", "--ucx-opt", "TLS"}, 2, "want KEY=VAL"},
        {{"--standalone", "stray"}, 2, "unexpected argument 'stray'"},
        {{"--standalone", "-c", "/nonexistent/r.conf"}, 2,
         "cannot read config file /nonexistent/r.conf"},
        {{"--standalone", "--config", "/dev/null", "--socket",
          "/nonexistent-dir/x.sock"}, 1, "cannot listen on"},
        {{"--standalone", "--config", "/dev/null", "--socket",
          td_path(&t, "m.sock"), "--metrics", "nowhere"},
         1, "bad metrics address"},
        {{"--config", "/dev/null"}, 2, "--etcd is required unless --standalone"},
        {{"--config", "/dev/null", "--etcd", "http://127.0.0.1:1", "--job",
          "a/b"}, 2, "contain no '/'"},
        {{"-c", conf1}, 2, want1},
        {{"-c", conf2}, 2, want2},
        {{"-c", conf3}, 2, want3},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int code = run_ringd(&t, cases[i].args, log);
        if (code != cases[i].code || !td_file_has(log, cases[i].want))
            td_dump(log);
        ASSERT_MSG(code == cases[i].code, "case %zu: exit %d, want %d", i,
                   code, cases[i].code);
        ASSERT_MSG(td_file_has(log, cases[i].want), "case %zu: no '%s'", i,
                   cases[i].want);
    }
    return 0;
}

TEST_IMPL(dmn_config_file_and_flags)
{
    td_daemon_t t;
    td_init(&t, "dmn-conf");
    const char *conf = td_path(&t, "r.conf");
    write_file(conf, "# ringd\n  socket = /from/file.sock  # trailing\n"
                     "trainers=3\nstandalone = yes\nucx-opt = TLS=tcp\n"
                     "log-level = debug\nring-grid-min-nodes = 24\n"
                     "ring-wire = f16\nring-chunk-kib = 256\n\n");
    char *argv[] = {"ringd", "-c", (char *)conf, "--socket", "/flag.sock",
                    "--ucx-opt=NET_DEVICES=lo", "--job", "j1",
                    "--ring-grid-max-kib", "64", "--ring-bidirectional",
                    "--ring-wire=bf16", NULL};
    dmn_config_t cfg;
    dmn_config_init(&cfg);
    ASSERT_EQ(cfg.ring_grid_min_nodes, 16); /* the grid from 16 nodes */
    ASSERT_EQ(cfg.ring_chunk_kib, 1024);
    ASSERT_STR_EQ(cfg.ring_wire, "none");
    ASSERT_EQ(cfg.ring_bidirectional, 2); /* auto: two rings by size */
    ASSERT_OK(dmn_config_load(&cfg, 12, argv, stderr));
    ASSERT_EQ(cfg.ring_grid_min_nodes, 24);
    ASSERT_EQ(cfg.ring_chunk_kib, 256);
    ASSERT_STR_EQ(cfg.ring_wire, "bf16"); /* the flag wins */
    ASSERT_EQ(cfg.ring_bidirectional, 1);
    ASSERT_EQ(cfg.ring_grid_max_kib, 64);
    ASSERT_STR_EQ(cfg.socket_path, "/flag.sock");
    ASSERT_EQ(cfg.trainers, 3);
    ASSERT_EQ(cfg.standalone, 1);
    ASSERT_STR_EQ(cfg.backend, "solo");
    ASSERT_STR_EQ(cfg.job, "j1");
    ASSERT_STR_EQ(cfg.log_level, "debug");
    ASSERT_EQ(cfg.nucx_opts, 2);
    ASSERT_STR_EQ(cfg.ucx_opts[0], "TLS=tcp");
    ASSERT_STR_EQ(cfg.ucx_opts[1], "NET_DEVICES=lo");
    ASSERT_STR_EQ(cfg.metrics_addr, "127.0.0.1:9464");
    dmn_config_free(&cfg);
    dmn_config_free(NULL);
    return 0;
}

/* ring-bidirectional: auto by default; true, false or auto from a file,
 * a bare flag (true), "=VALUE" or the next word when it is a value. */
TEST_IMPL(dmn_config_bidir_auto)
{
    td_daemon_t t;
    td_init(&t, "dmn-bidir");
    const char *conf = td_path(&t, "r.conf");
    write_file(conf, "standalone = yes\nring-bidirectional = false\n");
    struct {
        char *argv[6];
        int argc, want;
    } cases[] = {
        {{"ringd", "-c", (char *)conf}, 3, 0},
        {{"ringd", "-c", (char *)conf, "--ring-bidirectional"}, 4, 1},
        {{"ringd", "-c", (char *)conf, "--ring-bidirectional", "auto"}, 5, 2},
        {{"ringd", "-c", (char *)conf, "--ring-bidirectional=auto"}, 4, 2},
        {{"ringd", "--standalone", "--ring-bidirectional", "no"}, 4, 0},
        {{"ringd", "--standalone"}, 2, 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dmn_config_t cfg;
        dmn_config_init(&cfg);
        ASSERT_OK(dmn_config_load(&cfg, cases[i].argc, cases[i].argv,
                                  stderr));
        ASSERT_MSG(cfg.ring_bidirectional == cases[i].want,
                   "case %zu: %d, want %d", i, cfg.ring_bidirectional,
                   cases[i].want);
        dmn_config_free(&cfg);
    }
    return 0;
}

TEST_IMPL(dmn_sd_notify_and_sigterm)
{
    td_daemon_t t;
    td_init(&t, "dmn-notify");
    t.keep_notify = 1;
    setenv("WATCHDOG_USEC", "200000", 1);
    ASSERT_OK(td_start(&t, NULL));
    unsetenv("WATCHDOG_USEC");
    for (int i = 0; i < 3; i++)
        ASSERT_OK(td_notify_wait(&t, "WATCHDOG=1", 5000));
    kill(t.pid, SIGTERM);
    ASSERT_OK(td_notify_wait(&t, "STOPPING=1", 10000));
    ASSERT_EQ(td_exit_code(t.pid, 30000), 0);
    ASSERT(td_file_has(t.log, "ping every 100 ms"));
    ASSERT(td_file_has(t.log, "ringd exiting (drained)"));
    return 0;
}

/* SIGTERM mid-training: the step in progress finishes, the trainer is
 * told to stop and exits 0, and so does ringd. */
TEST_IMPL(dmn_sigterm_drains_trainer)
{
    td_daemon_t t;
    td_init(&t, "dmn-drain");
    ASSERT_OK(td_start(&t, NULL));
    const char *args[] = {"--steps", "1000000", "--log-every", "100000",
                          "--hash-log", td_path(&t, "h"), NULL};
    pid_t p = td_trainer(&t, args, td_path(&t, "t.log"));
    ASSERT_OK(td_wait_file(td_path(&t, "h"), "step 10 ", 60000));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    ASSERT_EQ(td_exit_code(p, 30000), 0);
    ASSERT(td_file_has(td_path(&t, "t.log"), "daemon drains: stopping"));
    ASSERT(td_file_has(t.log, "drained at step"));
    ASSERT(!td_file_has(t.log, "lost at")); /* a drain loses nobody */
    return 0;
}

TEST_IMPL(dmn_metrics_and_healthz)
{
    td_daemon_t t;
    td_init(&t, "dmn-metrics");
    ASSERT_OK(td_start(&t, NULL));
    /* 5 gradient allreduces + 1 loss allreduce on the last step. */
    const char *args[] = {"--steps", "5", NULL};
    ASSERT_EQ(td_exit_code(td_trainer(&t, args, td_path(&t, "t.log")),
                           60000), 0);
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL);
    ASSERT(strstr(m, "HTTP/1.0 200 OK") == m);
    const char *names[] = {
        "ringd_view_generation 1\n", "ringd_view_members 1\n",
        "ringd_steps_total 5\n", "ringd_collectives_total 6\n",
        "ringd_collective_bytes_total ", "ringd_trainers 0\n",
        "ringd_allreduce_busbw_bytes_per_second ",
        "ringd_view_changes_total 0\n", "ringd_recovery_seconds_last ",
        "ringd_checkpoints_total 0\n", "ringd_trainers_joined_total 1\n",
        "# TYPE ringd_collectives_total counter\n", "ringd_info{"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        ASSERT_MSG(strstr(m, names[i]) != NULL, "no '%s' in:\n%s",
                   names[i], m);
    free(m);
    char *h = td_http_get(t.metrics_port, "/healthz");
    ASSERT(h != NULL && strstr(h, "200 OK") && strstr(h, "\r\n\r\nok\n"));
    free(h);
    char *n = td_http_get(t.metrics_port, "/nope");
    ASSERT(n != NULL && strstr(n, "404"));
    free(n);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* The first of promtool's usual homes that exists, or NULL. */
static const char *find_promtool(void)
{
    const char *where[] = {"/usr/bin/promtool", "/usr/local/bin/promtool",
                           "/bin/promtool"};
    for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++)
        if (access(where[i], X_OK) == 0)
            return where[i];
    return NULL;
}

/* A real scraper's checker accepts the live /metrics, scraped after a
 * recovery so that the recovery histogram holds an observation: one of
 * two trainers SIGKILLs itself mid-step, the other redoes that step. */
TEST_IMPL(dmn_metrics_promtool)
{
    const char *promtool = find_promtool();
    if (promtool == NULL) {
        TEST_SKIP_WHY("promtool is not installed (Debian package "
                      "prometheus; make deps installs it)");
    }
    td_daemon_t t;
    td_init(&t, "dmn-promtool");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    const char *crash[] = {"--steps", "8", "--crash-at-step", "3", NULL};
    const char *rest[] = {"--steps", "8", NULL};
    pid_t a = td_trainer(&t, crash, td_path(&t, "a.log"));
    pid_t b = td_trainer(&t, rest, td_path(&t, "b.log"));
    ASSERT_EQ(td_exit_code(a, 60000), 128 + SIGKILL);
    ASSERT_EQ(td_exit_code(b, 60000), 0);

    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL && strstr(m, "HTTP/1.0 200 OK") == m);
    const char *want[] = {"# TYPE ringd_recovery_seconds histogram\n",
                          "ringd_recovery_seconds_bucket{le=\"0.01\"} ",
                          "ringd_recovery_seconds_bucket{le=\"+Inf\"} 1\n",
                          "ringd_recovery_seconds_count 1\n",
                          "ringd_recovery_seconds_sum "};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        ASSERT_MSG(strstr(m, want[i]) != NULL, "no '%s' in:\n%s", want[i],
                   m);
    const char *body = strstr(m, "\r\n\r\n");
    ASSERT(body != NULL);
    const char *path = td_path(&t, "metrics.txt");
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(body + 4, f);
    fclose(f);
    free(m);

    /* promtool exits 0 with no output on a clean exposition; lint
     * problems exit 3 and are printed. */
    const char *out = td_path(&t, "promtool.txt");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s check metrics <%s >%s 2>&1", promtool,
             path, out);
    int rc = system(cmd);
    char *said = td_read(out, NULL);
    ASSERT_MSG(rc == 0 && said != NULL && said[0] == '\0',
               "promtool check metrics (status %d) says:\n%s", rc,
               said != NULL ? said : "(nothing)");
    free(said);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

TEST_IMPL(dmn_second_daemon_refused)
{
    td_daemon_t t;
    td_init(&t, "dmn-second");
    ASSERT_OK(td_start(&t, NULL));
    const char *log = td_path(&t, "second.log");
    const char *args[] = {"--standalone", "--config", "/dev/null",
                          "--metrics", "off", "--socket", t.sock, NULL};
    ASSERT_EQ(run_ringd(&t, args, log), 1);
    ASSERT(td_file_has(log, "another ringd already listens"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* systemd-analyze verify the unit (ExecStart pointed at the built binary,
 * which verify checks exists); any output at all is a failure, since
 * unknown keys only warn. */
TEST_IMPL(dmn_systemd_unit_verifies)
{
    const char *sa = access("/usr/bin/systemd-analyze", X_OK) == 0
                         ? "/usr/bin/systemd-analyze"
                     : access("/bin/systemd-analyze", X_OK) == 0
                         ? "/bin/systemd-analyze"
                         : NULL;
    if (sa == NULL)
        TEST_SKIP_WHY("systemd-analyze is not installed");
    td_daemon_t t;
    td_init(&t, "dmn-unit");
    char src[600];
    th_src_path(src, sizeof(src), "deploy/ringd.service");
    char *unit = td_read(src, NULL);
    ASSERT_MSG(unit != NULL, "cannot read %s", src);
    const char *exec = "ExecStart=/usr/local/bin/ringd";
    char *at = strstr(unit, exec);
    ASSERT(at != NULL);
    const char *dst = td_path(&t, "ringd.service");
    FILE *f = fopen(dst, "w");
    ASSERT(f != NULL);
    fprintf(f, "%.*sExecStart=%s/ringd%s", (int)(at - unit), unit,
            th_bindir(), at + strlen(exec));
    fclose(f);
    free(unit);
    const char *log = td_path(&t, "verify.log");
    const char *argv[] = {sa, "verify", dst, NULL};
    pid_t pid = th_spawn((char *const *)argv, log);
    td_track(pid);
    int code = td_exit_code(pid, 60000);
    size_t len = 0;
    char *out = td_read(log, &len);
    ASSERT_MSG(code == 0 && len == 0, "systemd-analyze verify: exit %d:\n%s",
               code, out ? out : "");
    free(out);
    return 0;
}

TEST_IMPL(dmn_ringctl)
{
    td_daemon_t t;
    td_init(&t, "dmn-ctl");
    ASSERT_OK(td_start(&t, NULL));
    const char *log = td_path(&t, "ctl.log");
    const char *st[] = {"--socket", t.sock, "status", NULL};
    ASSERT_EQ(run_bin("ringctl", st, log), 0);
    ASSERT(td_file_has(log, "backend solo"));
    ASSERT(td_file_has(log, "state:       idle, step 0"));
    const char *js[] = {"--socket", t.sock, "--json", "status", NULL};
    ASSERT_EQ(run_bin("ringctl", js, log), 0);
    ASSERT(td_file_has(log, "\"backend\":\"solo\""));
    const char *mem[] = {"--socket", t.sock, "members", NULL};
    ASSERT_EQ(run_bin("ringctl", mem, log), 2);
    ASSERT(td_file_has(log, "needs --etcd URLS and --job NAME"));
    const char *drain[] = {"drain", NULL};
    ASSERT_EQ(run_bin("ringctl", drain, log), 2);
    ASSERT(td_file_has(log, "usage: ringctl drain NODE"));
    const char *bad[] = {"frobnicate", NULL};
    ASSERT_EQ(run_bin("ringctl", bad, log), 2);
    const char *help[] = {"--help", NULL};
    ASSERT_EQ(run_bin("ringctl", help, log), 0);
    ASSERT(td_file_has(log, "checkpoints"));
    const char *gone[] = {"--socket", td_path(&t, "none.sock"), "status",
                          NULL};
    ASSERT_EQ(run_bin("ringctl", gone, log), 1);
    ASSERT(td_file_has(log, "no ringd daemon at"));
    /* ringctl is not a trainer: it neither joins nor is lost. */
    ASSERT(!td_file_has(t.log, "lost at"));
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
