/*
 * metrics.c - a minimal HTTP/1.0 server on the loop for /metrics
 * (Prometheus text format 0.0.4) and /healthz. One request per connection,
 * answered and closed; requests larger than 4 KiB are refused. It only ever
 * binds the configured address (127.0.0.1:9464 by default).
 */
#include "daemon/dmn-int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

#define HTTP_MAX_REQ 4096
#define HTTP_MAX_BODY 32768 /* the hop histograms: ~0.8 KiB a peer */

typedef struct {
    uv_tcp_t tcp;
    uv_write_t wr;
    dmn_t *d;
    size_t len;
    int answered;
    char req[HTTP_MAX_REQ];
    char out[HTTP_MAX_BODY + 256];
} http_conn_t;

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf_t;

static void sb_printf(sbuf_t *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf_t *s, const char *fmt, ...)
{
    if (s->len >= s->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        s->len += (size_t)n < s->cap - s->len ? (size_t)n : s->cap - s->len;
}

static void metric(sbuf_t *s, const char *name, const char *type,
                   const char *help, double v)
{
    sb_printf(s, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
              type, name, v);
}

/* Fine at the low end: a recovery without a lease expiry takes tens of
 * milliseconds, one that waits for a lease TTL takes seconds. */
const double dmn__recovery_le[DMN_RECOVERY_BUCKETS] = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

void dmn__metrics_observe_recovery(dmn_t *d, double s)
{
    for (int i = 0; i < DMN_RECOVERY_BUCKETS; i++)
        if (s <= dmn__recovery_le[i]) {
            d->stats.recovery_hist[i]++;
            return;
        }
}

/* Prometheus buckets are cumulative; the last one, +Inf, is the count. */
static void recovery_histogram(sbuf_t *s, const dmn_stats_t *st)
{
    const char *n = "ringd_recovery_seconds";
    sb_printf(s, "# HELP %s Recoveries: from a broken step to the next "
                 "completed step.\n# TYPE %s histogram\n", n, n);
    uint64_t cum = 0;
    for (int i = 0; i < DMN_RECOVERY_BUCKETS; i++) {
        cum += st->recovery_hist[i];
        sb_printf(s, "%s_bucket{le=\"%g\"} %llu\n", n, dmn__recovery_le[i],
                  (unsigned long long)cum);
    }
    sb_printf(s, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n"
                 "%s_count %llu\n", n, (unsigned long long)st->recoveries, n,
              st->recovery_seconds_sum, n,
              (unsigned long long)st->recoveries);
}

static double queued(const dmn_t *d)
{
    uint64_t n = 0;
    for (const dmn_conn_t *c = d->conns; c != NULL; c = c->next)
        n += c->q_len;
    return (double)n;
}

/* Per predecessor: the peer label is a node id, which has no '/' but
 * may hold a quote or a backslash; those are escaped as the format says. */
static void hop_histograms(sbuf_t *s, dmn_t *d)
{
    static job_hops_t h; /* the loop's thread only; too big for its stack */
    if (job_hop_stats(d->job, &h) != 0)
        return;
    const char *n = "ringd_hop_wait_seconds";
    sb_printf(s, "# HELP %s Per step: time this node waited on its ring "
                 "predecessor (peer).\n# TYPE %s histogram\n", n, n);
    for (size_t p = 0; p < h.n; p++) {
        char peer[2 * sizeof(h.peers[p].peer)], *o = peer;
        for (const char *c = h.peers[p].peer; *c != '\0'; c++) {
            if (*c == '"' || *c == '\\')
                *o++ = '\\';
            *o++ = *c == '\n' ? ' ' : *c;
        }
        *o = '\0';
        uint64_t cum = 0;
        for (int i = 0; i < JOB_HOP_BUCKETS; i++) {
            cum += h.peers[p].bucket[i];
            sb_printf(s, "%s_bucket{peer=\"%s\",le=\"%g\"} %llu\n", n, peer,
                      job_hop_le[i], (unsigned long long)cum);
        }
        sb_printf(s, "%s_bucket{peer=\"%s\",le=\"+Inf\"} %llu\n"
                     "%s_sum{peer=\"%s\"} %.17g\n%s_count{peer=\"%s\"} %llu\n",
                  n, peer, (unsigned long long)h.peers[p].steps, n, peer,
                  h.peers[p].sum_s, n, peer,
                  (unsigned long long)h.peers[p].steps);
    }
}

/* Suspicions: what this node reported, kept back, and acted on. */
static void blame_metrics(sbuf_t *s, dmn_t *d)
{
    job_blame_t b;
    if (job_blame_stats(d->job, &b) != 0)
        return;
    const char *n = "ringd_suspicions_reported_total";
    sb_printf(s, "# HELP %s Suspicions of a peer this node reported, by "
                 "kind (hard: its endpoint failed; silent: no heartbeat; "
                 "lossy: its heartbeats stall on the link).\n"
                 "# TYPE %s counter\n%s{kind=\"hard\"} %llu\n"
                 "%s{kind=\"silent\"} %llu\n%s{kind=\"lossy\"} %llu\n",
              n, n, n, (unsigned long long)b.reported_hard, n,
              (unsigned long long)b.reported_silent, n,
              (unsigned long long)b.reported_lossy);
    metric(s, "ringd_suspicions_withheld_total", "counter",
           "Suspicions not reported: this node's own path to etcd was slow.",
           b.withheld);
    metric(s, "ringd_suspects_convicted_total", "counter",
           "Suspects whose lease this node revoked on the members' reports.",
           b.convicted);
}

/* Identity, the view, the step, the local trainers. */
static void render_node_metrics(dmn_t *d, sbuf_t *s)
{
    const dmn_stats_t *st = &d->stats;
    sb_printf(s, "# HELP ringd_info Build and identity.\n"
                 "# TYPE ringd_info gauge\n"
                 "ringd_info{version=\"%s\",backend=\"%s\",node=\"%s\"} 1\n",
              DMN_VERSION, job_name(d->job), d->cfg->node_id);
    metric(s, "ringd_up", "gauge", "1 while serving, 0 once drained.",
           d->state != DMN_STEP_DRAINED);
    metric(s, "ringd_uptime_seconds", "gauge", "Seconds since start.",
           (double)(dmn__now_ms() - d->start_ms) / 1e3);
    metric(s, "ringd_view_generation", "gauge", "Current view generation.",
           (double)d->view.generation);
    metric(s, "ringd_view_members", "gauge", "Nodes in the current view.",
           d->view.node_count);
    metric(s, "ringd_view_trainers", "gauge",
           "Trainers of the whole job in the current view.",
           d->view.global_trainers);
    metric(s, "ringd_agreements_total", "counter",
           "Step starts that agreed the trainer counts of every node "
           "(only after a change, a checkpoint request or a step without "
           "a collective; a view change agrees them too, uncounted).",
           (double)d->view.agreements);
    metric(s, "ringd_node_rank", "gauge", "This node's rank in the view.",
           d->view.node_rank);
    metric(s, "ringd_step", "gauge", "The job's current step.",
           (double)d->step);
    metric(s, "ringd_trainers", "gauge", "Trainers connected to this node.",
           dmn__trainer_count(d));
    metric(s, "ringd_trainers_joined_total", "counter",
           "Trainers admitted at a step boundary.", st->trainers_joined);
    metric(s, "ringd_trainers_lost_total", "counter",
           "Trainers that vanished without saying goodbye.",
           st->trainers_lost);
    metric(s, "ringd_trainers_stalled_total", "counter",
           "Trainers taken out of a step by --step-timeout.",
           st->trainers_stalled);
    metric(s, "ringd_step_timeout_wakeups_total", "counter",
           "Times the --step-timeout timer fired (armed for the earliest "
           "deadline of the trainers in their turn, so about one per "
           "trainer timed out).", st->stall_wakeups);
}

/* The writers' copy and encode times, per shard (primary, replica). */
static void writer_metrics(sbuf_t *s, dmn_t *d)
{
    ckpt_writer_stats_t w[2];
    for (int i = 0; i < 2; i++)
        ckpt_writer_stats(dmn__ckpt_writer(d, i), &w[i]);
    static const struct { const char *name, *help; } m[] = {
        {"ringd_checkpoint_shard_copy_seconds_total",
         "Snapshot copies of this node's shards, wall time."},
        {"ringd_checkpoint_shard_copy_cpu_seconds_total",
         "The same copies on their thread's CPU clock."},
        {"ringd_checkpoint_shard_copy_page_faults_total",
         "Minor page faults during the copies."},
        {"ringd_checkpoint_encode_seconds_total",
         "Encoding and writing the shards (nice 19), wall time."},
        {"ringd_checkpoint_encode_cpu_seconds_total",
         "The same on the writer's CPU clock."},
        {"ringd_checkpoint_shards_written_total",
         "Shards this node's writers wrote."},
    };
    for (size_t k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
        sb_printf(s, "# HELP %s %s\n# TYPE %s counter\n", m[k].name,
                  m[k].help, m[k].name);
        for (int i = 0; i < 2; i++) {
            uint64_t v[] = {w[i].copy_ns, w[i].copy_cpu_ns,
                            w[i].copy_faults, w[i].write_ns,
                            w[i].write_cpu_ns, w[i].written};
            sb_printf(s, "%s{shard=\"%s\"} %.17g\n", m[k].name,
                      i ? "replica" : "primary",
                      k == 2 || k == 5 ? (double)v[k] : (double)v[k] / 1e9);
        }
    }
}

/* Where checkpoints and the state copies spend time. */
static void ckpt_metrics(dmn_t *d, sbuf_t *s)
{
    const dmn_stats_t *st = &d->stats;
    metric(s, "ringd_checkpoint_holds_total", "counter",
           "Collectives answered only after the snapshot copies.",
           st->ckpt_holds);
    metric(s, "ringd_checkpoint_hold_seconds_total", "counter",
           "Time completed collectives were held for the copies.",
           st->ckpt_hold_seconds);
    metric(s, "ringd_checkpoint_hold_seconds_max", "gauge",
           "The longest such hold.", st->ckpt_hold_max_seconds);
    metric(s, "ringd_checkpoint_copies_total", "counter",
           "Checkpoint boundaries whose two shards were copied.",
           st->ckpt_copies);
    metric(s, "ringd_checkpoint_copy_seconds_total", "counter",
           "Checkpoint boundaries to both shards copied (off the loop).",
           st->ckpt_copy_seconds);
    metric(s, "ringd_checkpoint_loop_seconds_total", "counter",
           "Main-loop time in checkpoint and state-copy code.",
           st->ckpt_loop_seconds);
    metric(s, "ringd_state_snapshots_total", "counter",
           "One-node per-step state snapshots, copied off the loop.",
           st->snapshots);
    metric(s, "ringd_state_snapshot_seconds_total", "counter",
           "Time of those copies.", st->snapshot_seconds);
    metric(s, "ringd_loop_copy_bytes_total", "counter",
           "State bytes copied on the main loop's thread.",
           (double)__atomic_load_n(&st->loop_copy_bytes, __ATOMIC_RELAXED));
    if (dmn__ckpt_writer(d, 0) == NULL || dmn__ckpt_writer(d, 1) == NULL)
        return;
    writer_metrics(s, d);
    metric(s, "ringd_checkpoint_writing", "gauge",
           "1 while a shard is being copied, encoded or written.",
           dmn__ckpt_writing(d));
}

/* Where a collective's copies into and out of staging ran: the loop
 * takes only the small ones (step-queue.c, coll_copy). */
static void coll_copy_metrics(sbuf_t *s, const dmn_stats_t *st)
{
    const char *n = "ringd_collective_copy_bytes_total";
    sb_printf(s, "# HELP %s Bytes a collective copied into or out of "
              "staging (a broadcast to several trainers, the copying "
              "path), by the thread that copied them.\n# TYPE %s counter\n"
              "%s{thread=\"loop\"} %.17g\n%s{thread=\"pool\"} %.17g\n",
              n, n, n,
              (double)__atomic_load_n(&st->coll_copy_loop_bytes,
                                      __ATOMIC_RELAXED),
              n,
              (double)__atomic_load_n(&st->coll_copy_pool_bytes,
                                      __ATOMIC_RELAXED));
}

static void unmap_metrics(sbuf_t *s, const dmn_stats_t *st)
{
    const char *n = "ringd_buffer_unmap_bytes_total";
    sb_printf(s, "# HELP %s Bytes of trainer buffers unmapped, by the "
              "thread that unmapped them (large ones on the pool).\n"
              "# TYPE %s counter\n%s{thread=\"loop\"} %.17g\n"
              "%s{thread=\"pool\"} %.17g\n", n, n, n,
              (double)st->unmap_loop_bytes, n,
              (double)st->unmap_pool_bytes);
}

/* Steps, collectives, recoveries, checkpoints, protocol errors. */
static void render_step_metrics(dmn_t *d, sbuf_t *s)
{
    const dmn_stats_t *st = &d->stats;
    metric(s, "ringd_steps_total", "counter", "Steps completed.",
           st->steps);
    metric(s, "ringd_aborted_steps_total", "counter",
           "Steps aborted and redone.", st->aborted_steps);
    metric(s, "ringd_uncommitted_steps_total", "counter",
           "Steps every trainer here ended that the job did not commit "
           "(this node was dropped first): redone.",
           st->uncommitted_steps);
    metric(s, "ringd_collectives_total", "counter",
           "Collectives completed.", st->collectives);
    metric(s, "ringd_collectives_zero_copy_total", "counter",
           "Collectives run in the one local trainer's buffer.",
           st->coll_zero_copy);
    metric(s, "ringd_collectives_fused_total", "counter",
           "Collectives run fused with others in one ring operation.",
           st->coll_fused);
    metric(s, "ringd_collectives_fused_in_place_total", "counter",
           "Fused collectives whose pieces lay end to end in every local "
           "trainer's buffer: run there, not gathered into staging.",
           st->coll_fused_in_place);
    metric(s, "ringd_collectives_fused_auto_total", "counter",
           "Of the fused collectives, those the daemon fused by arrival "
           "(asynchronous allreduces queued behind a running one).",
           st->coll_fused_auto);
    metric(s, "ringd_fusion_asks_total", "counter",
           "Small allreduces the nodes ran to agree how many queued "
           "allreduces the next ring operation takes.", st->fuse_asks);
    metric(s, "ringd_collectives_queued", "gauge",
           "Collectives the node's trainers issued that await their "
           "result (asynchronous ones queue).", queued(d));
    metric(s, "ringd_collective_bytes_total", "counter",
           "Bytes reduced or broadcast (per node, once).", st->coll_bytes);
    metric(s, "ringd_collective_seconds_total", "counter",
           "Time spent in the backend for collectives.", st->coll_seconds);
    metric(s, "ringd_collective_errors_total", "counter",
           "Collectives that failed (reshape, mismatch, abort).",
           st->coll_errors);
    coll_copy_metrics(s, st);
    unmap_metrics(s, st);
    metric(s, "ringd_allreduce_busbw_bytes_per_second", "gauge",
           "Bus bandwidth of the last allreduce: bytes/s * 2(n-1)/n.",
           st->last_busbw);
    metric(s, "ringd_loop_lag_max_seconds", "gauge",
           "Worst lateness of a 10 ms main-loop timer since the last "
           "scrape.",
           st->loop_lag_max);
    metric(s, "ringd_view_changes_total", "counter",
           "View changes seen at step starts.", st->view_changes);
    metric(s, "ringd_recoveries_total", "counter",
           "Recoveries: aborted step to next completed step.",
           st->recoveries);
    recovery_histogram(s, st);
    metric(s, "ringd_recovery_seconds_last", "gauge",
           "Time of the last recovery.", st->last_recovery_seconds);
    metric(s, "ringd_state_restores_total", "counter",
           "Joiners whose state region was filled.", st->restores);
    metric(s, "ringd_checkpoint_requests_total", "counter",
           "Checkpoint requests from trainers.", st->ckpt_requests);
    metric(s, "ringd_checkpoints_total", "counter",
           "Checkpoints completed (every shard and replica written).",
           st->ckpt_taken);
    metric(s, "ringd_checkpoint_failures_total", "counter",
           "Checkpoints that failed.", st->ckpt_failed);
    metric(s, "ringd_checkpoints_skipped_total", "counter",
           "Checkpoints skipped: the previous one was still being written.",
           st->ckpt_skipped);
    ckpt_metrics(d, s);
    metric(s, "ringd_protocol_errors_total", "counter",
           "Malformed client messages rejected.", st->proto_errors);
    hop_histograms(s, d);
    blame_metrics(s, d);
}

static void render_metrics(dmn_t *d, sbuf_t *s)
{
    render_node_metrics(d, s);
    render_step_metrics(d, s);
}

static void http_closed(uv_handle_t *h)
{
    free(h->data);
}

static void http_written(uv_write_t *wr, int status)
{
    (void)status;
    http_conn_t *hc = wr->data;
    uv_close((uv_handle_t *)&hc->tcp, http_closed);
}

static void http_answer(http_conn_t *hc, int code, const char *ctype,
                        const char *body, size_t blen)
{
    const char *reason = code == 200 ? "OK" : code == 404 ? "Not Found"
                        : code == 503 ? "Service Unavailable"
                                      : "Bad Request";
    int n = snprintf(hc->out, sizeof(hc->out),
                     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     code, reason, ctype, blen);
    size_t len = (size_t)n;
    if (len + blen > sizeof(hc->out))
        blen = sizeof(hc->out) - len;
    memcpy(hc->out + len, body, blen);
    uv_buf_t b = uv_buf_init(hc->out, (unsigned)(len + blen));
    hc->answered = 1;
    hc->wr.data = hc;
    uv_read_stop((uv_stream_t *)&hc->tcp);
    if (uv_write(&hc->wr, (uv_stream_t *)&hc->tcp, &b, 1, http_written) != 0)
        uv_close((uv_handle_t *)&hc->tcp, http_closed);
}

static void http_route(http_conn_t *hc)
{
    dmn_t *d = hc->d;
    char path[64] = "";
    if (sscanf(hc->req, "GET %63s HTTP/", path) != 1) {
        http_answer(hc, 400, "text/plain", "bad request\n", 12);
        return;
    }
    if (strcmp(path, "/metrics") == 0) {
        char *body = malloc(HTTP_MAX_BODY);
        if (body == NULL) {
            uv_close((uv_handle_t *)&hc->tcp, http_closed);
            return;
        }
        sbuf_t s = {body, 0, HTTP_MAX_BODY};
        render_metrics(d, &s);
        d->stats.loop_lag_max = 0; /* a window per scrape */
        http_answer(hc, 200, "text/plain; version=0.0.4", body, s.len);
        free(body);
    } else if (strcmp(path, "/healthz") == 0) {
        /* Unhealthy from the request on, not from the step boundary: a
         * balancer or orchestrator must stop sending work at once. */
        if ((d->flags & DMN_F_DRAIN_REQUESTED) ||
            d->state == DMN_STEP_DRAINED)
            http_answer(hc, 503, "text/plain", "draining\n", 9);
        else
            http_answer(hc, 200, "text/plain", "ok\n", 3);
    } else {
        http_answer(hc, 404, "text/plain", "not found\n", 10);
    }
}

static void http_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    (void)hint;
    http_conn_t *hc = h->data;
    *b = uv_buf_init(hc->req + hc->len,
                     (unsigned)(sizeof(hc->req) - 1 - hc->len));
}

static void http_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    (void)b;
    http_conn_t *hc = s->data;
    if (hc->answered)
        return;
    if (n < 0) {
        uv_close((uv_handle_t *)s, http_closed);
        return;
    }
    hc->len += (size_t)n;
    hc->req[hc->len] = '\0';
    if (strstr(hc->req, "\r\n\r\n") != NULL ||
        strstr(hc->req, "\n\n") != NULL)
        http_route(hc);
    else if (hc->len >= sizeof(hc->req) - 1)
        http_answer(hc, 400, "text/plain", "request too large\n", 18);
}

static void http_accept(uv_stream_t *srv, int status)
{
    dmn_t *d = srv->data;
    if (status != 0)
        return;
    http_conn_t *hc = calloc(1, sizeof(*hc));
    if (hc == NULL)
        return;
    hc->d = d;
    uv_tcp_init(d->loop, &hc->tcp);
    hc->tcp.data = hc;
    if (uv_accept(srv, (uv_stream_t *)&hc->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&hc->tcp, http_alloc, http_read) != 0)
        uv_close((uv_handle_t *)&hc->tcp, http_closed);
}

int dmn__metrics_start(dmn_t *d)
{
    const char *spec = d->cfg->metrics_addr;
    if (spec == NULL || strcmp(spec, "off") == 0)
        return 0;
    char host[64];
    const char *colon = strrchr(spec, ':');
    if (colon == NULL || (size_t)(colon - spec) >= sizeof(host)) {
        RD_ERROR("bad metrics address '%s' (want ADDR:PORT)", spec);
        return ST_ECONFIG;
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    struct sockaddr_storage ss;
    int rc = ST_ECONFIG;
    if (*end == '\0' && port >= 0 && port <= 65535)
        rc = strchr(host, ':') != NULL
                 ? uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)&ss)
                 : uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&ss);
    if (rc != 0) {
        RD_ERROR("bad metrics address '%s' (want ADDR:PORT)", spec);
        return ST_ECONFIG;
    }
    uv_tcp_init(d->loop, &d->http);
    d->http.data = d;
    d->flags |= DMN_F_HTTP_ON;
    rc = uv_tcp_bind(&d->http, (struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&d->http, 16, http_accept);
    if (rc != 0) {
        RD_ERROR("metrics: cannot listen on %s: %s", spec, uv_strerror(rc));
        return rc;
    }
    RD_INFO("metrics on http://%s/metrics", spec);
    return 0;
}

void dmn__metrics_stop(dmn_t *d)
{
    if (!(d->flags & DMN_F_HTTP_ON))
        return;
    d->flags &= ~DMN_F_HTTP_ON;
    d->open_handles++;
    uv_close((uv_handle_t *)&d->http, dmn__handle_closed);
}
