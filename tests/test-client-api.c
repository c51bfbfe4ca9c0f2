/*
 * libringd against a real ringd: the clear error without a daemon, API
 * misuse, and reconnecting after a daemon restart.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

TEST_IMPL(client_no_daemon)
{
    td_daemon_t t;
    td_init(&t, "client-nod");
    ringd_client_t *c = NULL;
    /* No socket file at all. */
    ASSERT_EQ(ringd_connect(&c, t.sock, NULL), RINGD_ENODAEMON);
    ASSERT(c == NULL);
    /* A leftover socket file nobody listens on. */
    const char *plain = td_path(&t, "plain");
    FILE *f = fopen(plain, "w");
    ASSERT(f != NULL);
    fclose(f);
    ASSERT_EQ(ringd_connect(&c, plain, NULL), RINGD_ENODAEMON);
    ASSERT(strstr(ringd_strerror(RINGD_ENODAEMON), "no ringd daemon"));
    /* Every code has a description. */
    for (int rc = 0; rc >= RINGD_EABORTED; rc--)
        ASSERT(strcmp(ringd_strerror(rc), "unknown error") != 0);
    ASSERT_STR_EQ(ringd_strerror(-999), "unknown error");
    ringd_close(NULL);
    return 0;
}

TEST_IMPL(client_api_misuse)
{
    td_daemon_t t;
    td_init(&t, "client-misuse");
    ASSERT_OK(td_start(&t, NULL));
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    float *buf = ringd_buffer(c, 1000 * sizeof(float));
    ASSERT(buf != NULL);
    float local[4] = {0};
    ASSERT_EQ(ringd_allreduce(c, buf, 4, RINGD_F32, RINGD_SUM),
              RINGD_ESTATE);
    ASSERT_EQ(ringd_step_end(c), RINGD_ESTATE);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.rank, 0);
    ASSERT_EQ(v.world, 1);
    ASSERT_EQ(ringd_allreduce(c, local, 4, RINGD_F32, RINGD_SUM),
              RINGD_EINVAL);
    ASSERT(strstr(ringd_last_error(c), "not inside a buffer"));
    ASSERT_EQ(ringd_allreduce(c, buf + 1020, 20, RINGD_F32, RINGD_SUM),
              RINGD_EINVAL);
    ASSERT_EQ(ringd_allreduce(c, buf, 4, (ringd_dtype_t)17, RINGD_SUM),
              RINGD_EINVAL);
    ASSERT_EQ(ringd_broadcast(c, buf, 16, 5), RINGD_EINVAL);
    for (int i = 0; i < 1000; i++)
        buf[i] = (float)i;
    ASSERT_OK(ringd_allreduce(c, buf, 1000, RINGD_F32, RINGD_AVG));
    ASSERT(buf[999] == 999.0f);
    ASSERT_OK(ringd_broadcast(c, buf, 64, 0));
    ASSERT_OK(ringd_step_end(c));
    ASSERT_EQ(ringd_checkpoint(c), RINGD_ENOTSUP);
    ASSERT_EQ(ringd_state(c, local, sizeof(local)), RINGD_EINVAL);
    ASSERT_OK(ringd_state(c, buf, 64));
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* One step with an allreduce SUM of buf[0..n) on a one-trainer job. */
static int one_step(ringd_client_t *c, float *buf, int n)
{
    ringd_view_t v;
    int rc = ringd_step_begin(c, &v);
    if (rc != 0)
        return rc;
    for (int i = 0; i < n; i++)
        buf[i] = (float)(i + 1);
    rc = ringd_allreduce(c, buf, (size_t)n, RINGD_F32, RINGD_SUM);
    if (rc != 0)
        return rc;
    for (int i = 0; i < n; i++)
        ASSERT(buf[i] == (float)(i + 1));
    return ringd_step_end(c);
}

TEST_IMPL(client_reconnect)
{
    td_daemon_t t;
    td_init(&t, "client-reconn");
    ASSERT_OK(td_start(&t, NULL));
    ringd_opts_t o;
    ringd_opts_init(&o);
    o.auto_reconnect = 0;
    o.timeout_ms = 20000;
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, &o));
    float *buf = ringd_buffer(c, 4096);
    ASSERT(buf != NULL);
    ASSERT_OK(ringd_state(c, buf, 64));
    ASSERT_OK(one_step(c, buf, 256));

    /* The daemon dies: the next call says so clearly. */
    kill(t.pid, SIGKILL);
    ASSERT_EQ(td_exit_code(t.pid, 10000), 128 + SIGKILL);
    ringd_view_t v;
    ASSERT_EQ(ringd_step_begin(c, &v), RINGD_EDISCONNECTED);
    ASSERT(strstr(ringd_last_error(c), "ringd_reconnect"));
    /* Still down: reconnect says there is no daemon. */
    ASSERT_EQ(ringd_reconnect(c), RINGD_ENODAEMON);

    /* A new daemon on the same path (the stale socket is replaced). */
    ASSERT_OK(td_start(&t, NULL));
    ASSERT_OK(ringd_reconnect(c));
    ASSERT_OK(one_step(c, buf, 256)); /* same buffer, re-registered */

    /* Automatic reconnect on step_begin. */
    kill(t.pid, SIGKILL);
    ASSERT_EQ(td_exit_code(t.pid, 10000), 128 + SIGKILL);
    ASSERT_OK(td_start(&t, NULL));
    ringd_close(c);
    o.auto_reconnect = 1;
    ASSERT_OK(ringd_connect(&c, t.sock, &o));
    buf = ringd_buffer(c, 4096);
    ASSERT(buf != NULL);
    ASSERT_OK(one_step(c, buf, 16));
    kill(t.pid, SIGKILL);
    ASSERT_EQ(td_exit_code(t.pid, 10000), 128 + SIGKILL);
    ASSERT_OK(td_start(&t, NULL));
    ASSERT_OK(one_step(c, buf, 16)); /* reconnects by itself */
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
