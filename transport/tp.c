/*
 * tp.c - UCP context, worker, endpoints and tagged messages.
 */
#include "transport/tp-int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"

#define TP_CLOSE_TIMEOUT_NS 1000000000LL
#define TP_DRAIN_SCRATCH (64 * 1024)

int tp__status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return 0;
    case UCS_ERR_CANCELED:
        return ST_EABORTED;
    case UCS_ERR_MESSAGE_TRUNCATED:
        return ST_EPEER_FORGED;
    case UCS_ERR_NO_MEMORY:
        return ST_ENOMEM;
    default:
        return ST_EPEER;
    }
}

void tp_config_default(tp_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    const char *m = getenv("RINGD_TP_ERR_MODE");
    if (m != NULL && strcmp(m, "none") == 0)
        cfg->err_mode_none = 1;
}

/*
 * ringd's UCX defaults (transport/README.md, "UCX defaults": what each
 * measured). ucp_config_modify hands a key it does not know to every
 * transport that has it, so "TX_SEG_SIZE" reaches tcp's; a value it sets
 * wins over the environment, hence the environment is asked first.
 */
static const struct {
    const char *env, *key, *value;
} tp_ucx_defaults[] = {
    {"UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "256K"},
    {"UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "1M"},
};

static int config_defaults(ucp_config_t *ucfg)
{
    size_t n = sizeof(tp_ucx_defaults) / sizeof(*tp_ucx_defaults);
    for (size_t i = 0; i < n; i++) {
        if (getenv(tp_ucx_defaults[i].env) != NULL)
            continue;
        ucs_status_t s = ucp_config_modify(ucfg, tp_ucx_defaults[i].key,
                                           tp_ucx_defaults[i].value);
        if (s != UCS_OK) {
            RD_ERROR("ucp_config_modify %s=%s: %s", tp_ucx_defaults[i].key,
                     tp_ucx_defaults[i].value, ucs_status_string(s));
            return ST_ECONFIG;
        }
    }
    return 0;
}

static int worker_create(tp_t *tp)
{
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t s = ucp_worker_create(tp->ctx, &wp, &tp->worker);
    if (s != UCS_OK) {
        RD_ERROR("ucp_worker_create: %s", ucs_status_string(s));
        return ST_ELINK;
    }
    s = ucp_worker_get_address(tp->worker, &tp->addr, &tp->addr_len);
    if (s != UCS_OK) {
        RD_ERROR("ucp_worker_get_address: %s", ucs_status_string(s));
        goto err_worker;
    }
    s = ucp_worker_get_efd(tp->worker, &tp->efd);
    if (s != UCS_OK) {
        RD_ERROR("ucp_worker_get_efd: %s", ucs_status_string(s));
        goto err_addr;
    }
    return 0;

err_addr:
    ucp_worker_release_address(tp->worker, tp->addr);
    tp->addr = NULL;
err_worker:
    ucp_worker_destroy(tp->worker);
    tp->worker = NULL;
    return ST_ELINK;
}

int tp_create(const tp_config_t *cfg, tp_t **tp_p)
{
    tp_config_t def;
    if (cfg == NULL) {
        tp_config_default(&def);
        cfg = &def;
    }
    tp_t *tp = calloc(1, sizeof(*tp));
    if (tp == NULL)
        return ST_ENOMEM;
    tp->err_mode_none = cfg->err_mode_none;

    int rc = ST_ECONFIG;
    ucp_config_t *ucfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &ucfg);
    if (s != UCS_OK) {
        RD_ERROR("ucp_config_read: %s", ucs_status_string(s));
        goto err_free;
    }
    if ((rc = config_defaults(ucfg)) != 0) {
        ucp_config_release(ucfg);
        goto err_free;
    }
    ucp_params_t p = {0};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    s = ucp_init(&p, ucfg, &tp->ctx);
    ucp_config_release(ucfg);
    if (s != UCS_OK) {
        RD_ERROR("ucp_init: %s", ucs_status_string(s));
        rc = ST_ELINK;
        goto err_free;
    }
    rc = worker_create(tp);
    if (rc != 0)
        goto err_ctx;
    *tp_p = tp;
    return 0;

err_ctx:
    ucp_cleanup(tp->ctx);
err_free:
    free(tp);
    return rc;
}

/*
 * Requests UCX never completed (a force-closed endpoint in error mode
 * NONE keeps its rendezvous sends) still reference memory UCX registered;
 * tearing the context down under them trips UCX's own assertions. Such a
 * worker is deliberately leaked: destroy never fails.
 */
void tp_destroy(tp_t *tp)
{
    if (tp == NULL)
        return;
    while (tp->peers != NULL)
        tp_peer_close(tp->peers, 1);
    if (tp->inflight > 0) {
        RD_WARN("tp: %ld request(s) never completed; leaking the worker",
                tp->inflight);
        return;
    }
    if (tp->worker != NULL) {
        if (tp->addr != NULL)
            ucp_worker_release_address(tp->worker, tp->addr);
        ucp_worker_destroy(tp->worker);
    }
    while (tp->zombies != NULL) {
        tp_peer_t *z = tp->zombies;
        tp->zombies = z->next;
        free(z);
    }
    if (tp->ctx != NULL)
        ucp_cleanup(tp->ctx);
    free(tp);
}

void tp_address(const tp_t *tp, const void **addr_p, size_t *len_p)
{
    *addr_p = tp->addr;
    *len_p = tp->addr_len;
}

int tp_err_mode_none(const tp_t *tp)
{
    return tp->err_mode_none;
}

/*
 * UCX calls this from inside ucp_worker_progress; closing the endpoint here
 * is not allowed, so only record the event and let tp_progress deliver it.
 */
static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    tp_peer_t *peer = arg;
    (void)ep;
    if (peer->failed || peer->closing)
        return;
    peer->failed = 1;
    peer->fail_status = ST_EPEER;
    peer->fail_pending = 1;
    peer->tp->fail_pending = 1;
    RD_WARN("peer endpoint failed: %s", ucs_status_string(status));
}

int tp_peer_connect(tp_t *tp, const void *addr, size_t len, tp_fail_cb cb,
                    void *cb_arg, tp_peer_t **peer_p)
{
    (void)len;
    tp_peer_t *peer = calloc(1, sizeof(*peer));
    if (peer == NULL)
        return ST_ENOMEM;
    peer->tp = tp;
    peer->fail_cb = cb;
    peer->fail_arg = cb_arg;

    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = addr;
    ep.err_mode = tp->err_mode_none ? UCP_ERR_HANDLING_MODE_NONE
                                    : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_err_cb;
    ep.err_handler.arg = peer;
    ucs_status_t s = ucp_ep_create(tp->worker, &ep, &peer->ep);
    if (s != UCS_OK) {
        RD_ERROR("ucp_ep_create: %s", ucs_status_string(s));
        free(peer);
        return ST_ELINK;
    }
    peer->next = tp->peers;
    tp->peers = peer;
    *peer_p = peer;
    return 0;
}

static void peer_unlink(tp_peer_t *peer)
{
    for (tp_peer_t **pp = &peer->tp->peers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == peer) {
            *pp = peer->next;
            return;
        }
    }
}

/*
 * Close the endpoint, waiting at most TP_CLOSE_TIMEOUT_NS. A close that
 * does not finish in time (a flush to a hung peer) is left to complete in
 * the background; the peer struct then stays on the zombie list, since UCX
 * may still call back with it, and is freed with the worker.
 */
void tp_peer_close(tp_peer_t *peer, int force)
{
    if (peer == NULL)
        return;
    tp_t *tp = peer->tp;
    ucp_request_param_t cp = {0};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = (force || peer->failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    peer->closing = 1;
    void *req = ucp_ep_close_nbx(peer->ep, &cp);
    peer_unlink(peer);
    int64_t deadline = rd_now_ns() + TP_CLOSE_TIMEOUT_NS;
    while (UCS_PTR_IS_PTR(req) &&
           ucp_request_check_status(req) == UCS_INPROGRESS) {
        ucp_worker_progress(tp->worker);
        if (rd_now_ns() > deadline) {
            RD_WARN("endpoint close timed out; finishing in background");
            ucp_request_free(req);
            peer->next = tp->zombies;
            tp->zombies = peer;
            return;
        }
    }
    if (UCS_PTR_IS_PTR(req))
        ucp_request_free(req);
    free(peer);
}

int tp_peer_failed(const tp_peer_t *peer)
{
    return peer->failed;
}

/* Append name to the comma-separated list in buf unless it is there. */
static void lanes_add(char *buf, size_t len, const char *name, size_t nlen)
{
    for (const char *p = buf; *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t l = end != NULL ? (size_t)(end - p) : strlen(p);
        if (l == nlen && memcmp(p, name, nlen) == 0)
            return;
        p += l + (end != NULL);
    }
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%.*s", used > 0 ? "," : "",
             (int)nlen, name);
}

/*
 * UCX 1.13 has no query for an endpoint's transports, only
 * ucp_ep_print_info, whose lane lines read
 * "lane[0]:  1:tcp/lo.0 md[1] -> ...": the name is between "N:" and the
 * ".N" of the device index.
 */
int tp_peer_lanes(const tp_peer_t *peer, char *buf, size_t len)
{
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (len == 0 || f == NULL) {
        RD_ERROR("tp_peer_lanes: no memory for the endpoint's info");
        return ST_ENOMEM;
    }
    ucp_ep_print_info(peer->ep, f);
    fclose(f);
    buf[0] = '\0';
    for (const char *p = text; (p = strstr(p, "lane[")) != NULL; p++) {
        const char *colon = strchr(p, ':');
        if (colon == NULL)
            break;
        const char *name = colon + 1;
        while (*name == ' ')
            name++;
        while (*name >= '0' && *name <= '9')
            name++;
        if (*name++ != ':')
            continue;
        size_t nlen = strcspn(name, " \n");
        const char *dot = memchr(name, '.', nlen);
        lanes_add(buf, len, name, dot != NULL ? (size_t)(dot - name) : nlen);
    }
    free(text);
    if (buf[0] == '\0') {
        RD_ERROR("tp_peer_lanes: UCX printed no lanes for the endpoint");
        return ST_EINVAL;
    }
    return 0;
}

int tp_mem_map(tp_t *tp, void *buf, size_t len, tp_mem_t **mem_p)
{
    tp_mem_t *mem = calloc(1, sizeof(*mem));
    if (mem == NULL)
        return ST_ENOMEM;
    ucp_mem_map_params_t mp = {0};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buf;
    mp.length = len;
    ucs_status_t s = ucp_mem_map(tp->ctx, &mp, &mem->memh);
    if (s != UCS_OK) {
        RD_ERROR("ucp_mem_map(%zu bytes): %s", len, ucs_status_string(s));
        free(mem);
        return ST_ENOMEM;
    }
    mem->tp = tp;
    *mem_p = mem;
    return 0;
}

void tp_mem_unmap(tp_mem_t *mem)
{
    if (mem == NULL)
        return;
    ucs_status_t s = ucp_mem_unmap(mem->tp->ctx, mem->memh);
    if (s != UCS_OK)
        RD_WARN("ucp_mem_unmap: %s", ucs_status_string(s));
    free(mem);
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    tp_req_t *req = user_data;
    req->status = tp__status(status);
    req->ucx_ = NULL;
    req->tp_->inflight--;
    ucp_request_free(request);
    req->cb(req);
}

static void recv_cb(void *request, ucs_status_t status,
                    const ucp_tag_recv_info_t *info, void *user_data)
{
    tp_req_t *req = user_data;
    req->status = tp__status(status);
    if (status == UCS_OK) {
        req->length = info->length;
        req->tag = info->sender_tag;
    }
    req->ucx_ = NULL;
    req->tp_->inflight--;
    ucp_request_free(request);
    req->cb(req);
}

static void req_param(ucp_request_param_t *p, tp_mem_t *mem, tp_req_t *req)
{
    memset(p, 0, sizeof(*p));
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                      UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p->user_data = req;
    if (mem != NULL) {
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p->memh = mem->memh;
    }
}

int tp_send(tp_peer_t *peer, const void *buf, size_t len, uint64_t tag,
            tp_mem_t *mem, tp_req_t *req)
{
    if (peer->failed)
        return peer->fail_status;
    ucp_request_param_t p;
    req_param(&p, mem, req);
    p.cb.send = send_cb;
    req->status = ST_AGAIN;
    req->length = len;
    req->tag = tag;
    req->tp_ = peer->tp;
    peer->tp->inflight++;
    void *r = ucp_tag_send_nbx(peer->ep, buf, len, tag, &p);
    if (UCS_PTR_IS_ERR(r)) {
        peer->tp->inflight--;
        RD_ERROR("ucp_tag_send_nbx: %s",
                 ucs_status_string(UCS_PTR_STATUS(r)));
        return tp__status(UCS_PTR_STATUS(r));
    }
    /* The callback may already have run inside the call and freed r. */
    req->ucx_ = req->status == ST_AGAIN ? r : NULL;
    return 0;
}

int tp_recv(tp_t *tp, void *buf, size_t len, uint64_t tag, uint64_t mask,
            tp_mem_t *mem, tp_req_t *req)
{
    ucp_request_param_t p;
    req_param(&p, mem, req);
    p.cb.recv = recv_cb;
    req->status = ST_AGAIN;
    req->length = 0;
    req->tag = 0;
    req->tp_ = tp;
    tp->inflight++;
    void *r = ucp_tag_recv_nbx(tp->worker, buf, len, tag, mask, &p);
    if (UCS_PTR_IS_ERR(r)) {
        tp->inflight--;
        RD_ERROR("ucp_tag_recv_nbx: %s",
                 ucs_status_string(UCS_PTR_STATUS(r)));
        return tp__status(UCS_PTR_STATUS(r));
    }
    req->ucx_ = req->status == ST_AGAIN ? r : NULL;
    return 0;
}

void tp_cancel(tp_t *tp, tp_req_t *req)
{
    if (req->ucx_ != NULL)
        ucp_request_cancel(tp->worker, req->ucx_);
}

static void drain_cb(void *request, ucs_status_t status,
                     const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)status;
    (void)info;
    free(user_data);
    ucp_request_free(request);
}

/* Receive one probed message into a scratch buffer the callback frees. */
static int drain_one(tp_t *tp, uint64_t tag, size_t length)
{
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg =
        ucp_tag_probe_nb(tp->worker, tag, (ucp_tag_t)-1, 1, &info);
    if (msg == NULL)
        return 0;
    size_t n = length < TP_DRAIN_SCRATCH ? length : TP_DRAIN_SCRATCH;
    void *scratch = malloc(n ? n : 1);
    if (scratch == NULL)
        return ST_ENOMEM;
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                     UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = drain_cb;
    p.user_data = scratch;
    void *r = ucp_tag_msg_recv_nbx(tp->worker, scratch, n, msg, &p);
    if (UCS_PTR_IS_ERR(r)) {
        free(scratch);
        return 0;
    }
    return 1;
}

int tp_drain(tp_t *tp, tp_stale_fn stale, void *arg)
{
    int dropped = 0;
    for (;;) {
        ucp_tag_recv_info_t info;
        if (ucp_tag_probe_nb(tp->worker, 0, 0, 0, &info) == NULL)
            break;
        if (!stale(arg, info.sender_tag))
            break;
        int rc = drain_one(tp, info.sender_tag, info.length);
        if (rc <= 0)
            break;
        dropped++;
    }
    return dropped;
}

int tp_probe(tp_t *tp, uint64_t tag, uint64_t mask, size_t *len_p)
{
    ucp_tag_recv_info_t info;
    if (ucp_tag_probe_nb(tp->worker, tag, mask, 0, &info) == NULL)
        return 0;
    *len_p = info.length;
    return 1;
}

/* Deliver failure events outside UCX callbacks, once per peer. */
static unsigned deliver_failures(tp_t *tp)
{
    unsigned n = 0;
    tp->fail_pending = 0;
    for (tp_peer_t *p = tp->peers; p != NULL; p = p->next) {
        if (!p->fail_pending)
            continue;
        p->fail_pending = 0;
        n++;
        if (p->fail_cb != NULL)
            p->fail_cb(p->fail_arg, p, p->fail_status);
    }
    return n;
}

unsigned tp_progress(tp_t *tp)
{
    unsigned n = ucp_worker_progress(tp->worker);
    if (tp->fail_pending)
        n += deliver_failures(tp);
    return n;
}

int tp_arm(tp_t *tp)
{
    ucs_status_t s = ucp_worker_arm(tp->worker);
    if (s == UCS_OK)
        return 0;
    if (s == UCS_ERR_BUSY)
        return ST_AGAIN;
    RD_ERROR("ucp_worker_arm: %s", ucs_status_string(s));
    return ST_ELINK;
}

int tp_efd(const tp_t *tp)
{
    return tp->efd;
}

int tp_wait(tp_t *tp, int timeout_ms)
{
    int rc = tp_arm(tp);
    if (rc != 0)
        return rc == ST_AGAIN ? 0 : rc;
    struct pollfd pfd = {.fd = tp->efd, .events = POLLIN};
    int n = poll(&pfd, 1, timeout_ms);
    if (n < 0 && errno != EINTR) {
        RD_ERROR("poll on worker efd: %s", strerror(errno));
        return -errno;
    }
    /* Not an error: the caller's loop decides what a quiet spell means. */
    return n == 0 ? ST_ETIMEDOUT : 0;
}

void tp_signal(tp_t *tp)
{
    ucs_status_t s = ucp_worker_signal(tp->worker);
    if (s != UCS_OK)
        RD_WARN("ucp_worker_signal: %s", ucs_status_string(s));
}
