/*
 * tp-int.h - transport internals shared by the files of transport/.
 */
#ifndef RINGD_TP_INT_H
#define RINGD_TP_INT_H

#include <ucp/api/ucp.h>

#include "transport/tp.h"

struct tp_peer {
    tp_t *tp;
    ucp_ep_h ep;
    tp_fail_cb fail_cb;
    void *fail_arg;
    int failed;       /* the endpoint reported an error */
    int fail_status;  /* ST_ code of that error */
    int fail_pending; /* event raised by UCX, not yet delivered */
    int closing;      /* ucp_ep_close_nbx was called */
    tp_peer_t *next;  /* all peers of tp, for tp_destroy */
};

struct tp_mem {
    tp_t *tp;
    ucp_mem_h memh;
};

struct tp {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;
    int err_mode_none;
    long inflight;    /* posted requests whose callback has not run */
    int fail_pending; /* some peer has an undelivered failure event */
    tp_peer_t *peers;
    tp_peer_t *zombies; /* closes that outlived their bound */
};

/* UCX status to ST_ code. */
int tp__status(ucs_status_t s);

#endif /* RINGD_TP_INT_H */
