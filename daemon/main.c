/*
 * main.c - the ringd process: configuration, the loop, signals and systemd.
 *
 * The one global of the daemon lives here (STYLE.md 4). Signals arrive as
 * uv_signal callbacks on the loop, so no handler touches state
 * asynchronously. systemd gets READY=1 once the socket listens, STATUS=
 * lines from the daemon, WATCHDOG=1 from a timer at half the watchdog
 * period, and STOPPING=1 when a drain begins.
 *
 * SIGTERM/SIGINT stop (a drain that tells trainers RINGD_ESHUTDOWN, exit
 * 0); SIGUSR2 restarts (a drain that tells them nothing, so that they
 * wait for the next ringd, exit DMN_EXIT_RESTART for the unit's
 * RestartForceExitStatus: `systemctl reload ringd`).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <systemd/sd-daemon.h>
#include <uv.h>

#include "common/log.h"
#include "common/status.h"
#include "daemon/dmn.h"

typedef struct {
    uv_loop_t loop;
    dmn_config_t cfg;
    dmn_t *dmn;
    uv_signal_t sigterm, sigint, sigusr2;
    uv_timer_t watchdog;
    int signals;
    int restart;          /* the drain is a restart: exit 75 */
} ringd_main_t;

static ringd_main_t g_main;

static void on_status(void *arg, const char *status)
{
    (void)arg;
    sd_notifyf(0, "STATUS=%s", status);
}

static void on_signal(uv_signal_t *s, int signum)
{
    ringd_main_t *m = s->data;
    m->restart = 0; /* a stop wins over a restart asked before */
    if (++m->signals > 1 || m->dmn == NULL) { /* NULL: between two jobs */
        RD_WARN("second signal (%s): exiting now", strsignal(signum));
        uv_stop(&m->loop);
        return;
    }
    RD_INFO("%s: draining", strsignal(signum));
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    dmn_drain(m->dmn);
}

/* SIGUSR2: drain for a restart. Once any drain is under way it changes
 * nothing (a stop stays a stop, a second restart is the same one). */
static void on_restart_signal(uv_signal_t *s, int signum)
{
    ringd_main_t *m = s->data;
    if (m->signals > 0 || m->dmn == NULL) {
        RD_INFO("%s: a drain is already under way", strsignal(signum));
        return;
    }
    if (!dmn_restart(m->dmn)) {
        RD_INFO("%s: the node drains to stop already (ringctl drain): "
                "no restart", strsignal(signum));
        return;
    }
    m->signals++;
    m->restart = 1;
    RD_INFO("%s: draining for a restart (exit %d; trainers wait for the "
            "next ringd)", strsignal(signum), DMN_EXIT_RESTART);
    /* No STOPPING=1: to systemd this is the main process exiting on its
     * own with 75, which RestartForceExitStatus=75 restarts. */
    sd_notify(0, "STATUS=draining for a restart");
}

/* Signals: uv_signal callbacks on the loop. */
static void start_signals(ringd_main_t *m)
{
    uv_signal_init(&m->loop, &m->sigterm);
    uv_signal_init(&m->loop, &m->sigint);
    uv_signal_init(&m->loop, &m->sigusr2);
    m->sigterm.data = m->sigint.data = m->sigusr2.data = m;
    uv_signal_start(&m->sigterm, on_signal, SIGTERM);
    uv_signal_start(&m->sigint, on_signal, SIGINT);
    uv_signal_start(&m->sigusr2, on_restart_signal, SIGUSR2);
    uv_unref((uv_handle_t *)&m->sigterm);
    uv_unref((uv_handle_t *)&m->sigint);
    uv_unref((uv_handle_t *)&m->sigusr2);
}

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    sd_notify(0, "WATCHDOG=1");
}

/* UCX reads its options from UCX_* variables: --ucx-opt TLS=tcp. */
static void export_ucx_opts(const dmn_config_t *cfg)
{
    for (int i = 0; i < cfg->nucx_opts; i++) {
        char name[128];
        const char *eq = strchr(cfg->ucx_opts[i], '=');
        int klen = (int)(eq - cfg->ucx_opts[i]);
        const char *pre = strncmp(cfg->ucx_opts[i], "UCX_", 4) ? "UCX_" : "";
        snprintf(name, sizeof(name), "%s%.*s", pre, klen, cfg->ucx_opts[i]);
        setenv(name, eq + 1, 1);
    }
}

static void start_watchdog(ringd_main_t *m)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return;
    uint64_t ms = usec / 2000 ? usec / 2000 : 1;
    uv_timer_init(&m->loop, &m->watchdog);
    uv_timer_start(&m->watchdog, on_watchdog, 0, ms);
    uv_unref((uv_handle_t *)&m->watchdog);
    RD_INFO("systemd watchdog: ping every %llu ms", (unsigned long long)ms);
}

static void close_cb(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

#define RC_NEXT_JOB 1000 /* serve(): the job ended, serve the next one */

/* One daemon object's life: create, run until it drains. */
static int serve(ringd_main_t *m)
{
    dmn_hooks_t hooks = {on_status, m};
    int rc = dmn_create(&m->loop, &m->cfg, &hooks, &m->dmn);
    if (rc != 0) {
        RD_ERROR("ringd could not start: %s", st_strerror(rc));
        return 1;
    }
    sd_notifyf(0, "READY=1\nSTATUS=serving %s (%s)", m->cfg.socket_path,
               m->cfg.backend);
    RD_INFO("ringd %s ready (node %s, backend %s%s)", DMN_VERSION,
            m->cfg.node_id, m->cfg.backend,
            m->cfg.job == NULL && m->cfg.etcd != NULL && !m->cfg.standalone
                ? ", serving the job its first trainer names" : "");
    uv_run(&m->loop, UV_RUN_DEFAULT);
    rc = dmn_done(m->dmn) ? 0 : 1;
    if (rc == 0 && m->signals == 0 && dmn_job_ended(m->dmn))
        return RC_NEXT_JOB;
    if (rc != 0 && m->signals > 1)
        rc = 0; /* asked twice to stop: a stop, not a failure */
    if (rc == 0 && m->restart)
        rc = DMN_EXIT_RESTART;
    RD_INFO("ringd exiting (%s)", rc == DMN_EXIT_RESTART
                                      ? "drained for a restart"
                                  : rc == 0 ? "drained" : "aborted");
    return rc;
}

/*
 * The job's last trainer left and the node left the job: tear the daemon
 * object down (its socket too) and let serve() build a fresh one for the
 * next job, in the same process. The signal and watchdog handles stay
 * (unreferenced: serve() ends its loop with uv_stop, and here the loop
 * ends once the old object's handles have closed). A signal in between
 * stops (m->dmn is NULL).
 */
static void next_job(ringd_main_t *m)
{
    dmn_destroy(m->dmn);
    m->dmn = NULL;
    uv_run(&m->loop, UV_RUN_DEFAULT);
    RD_INFO("left the job: ready for the next one");
}

int main(int argc, char **argv)
{
    ringd_main_t *m = &g_main;
    dmn_config_init(&m->cfg);
    int rc = dmn_config_load(&m->cfg, argc, argv, stderr);
    if (rc != 0) {
        dmn_config_free(&m->cfg);
        return 2;
    }
    if (m->cfg.want_help || m->cfg.want_version) {
        if (m->cfg.want_help)
            dmn_config_usage(stdout);
        else
            printf("ringd %s (protocol %d)\n", DMN_VERSION, 1);
        dmn_config_free(&m->cfg);
        return 0;
    }
    rd_log_level_t lvl = RD_LOG_INFO;
    (void)rd_log_parse_level(m->cfg.log_level, &lvl);
    rd_log_set_level(lvl);
    export_ucx_opts(&m->cfg);

    uv_loop_init(&m->loop);
    start_signals(m);
    start_watchdog(m);
    while ((rc = serve(m)) == RC_NEXT_JOB) {
        next_job(m);
        if (m->signals > 0) {
            rc = 0; /* stopped between two jobs */
            break;
        }
    }
    dmn_destroy(m->dmn);
    m->dmn = NULL;
    uv_walk(&m->loop, close_cb, NULL);
    uv_run(&m->loop, UV_RUN_DEFAULT);
    uv_loop_close(&m->loop);
    dmn_config_free(&m->cfg);
    return rc == 0 || rc == DMN_EXIT_RESTART ? rc : 1;
}
