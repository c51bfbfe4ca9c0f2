/*
 * Buffers come and go: 500 distinct buffers reduced in one step by two
 * trainers (no cap of 64), all freed afterwards and unmapped in the daemon
 * too; the misuse of ringd_buffer_free; ids reused; the daemon's
 * per-client limits on buffers and bytes.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

#define NBUF 500
#define NEL 4

/* Mappings of client buffers in the daemon, from its /proc maps. */
static int daemon_maps(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    char *s = td_read(path, NULL);
    ASSERT(s != NULL);
    int n = 0;
    for (char *p = s; (p = strstr(p, "memfd:ringd-buffer")) != NULL; p++)
        n++;
    free(s);
    return n;
}

typedef struct {
    const char *sock;
    int rank;           /* from the view */
    float *bufs[NBUF];
    ringd_client_t *c;
    int step_done;
} trainer_t;

/* One trainer: every buffer filled with (rank + 1) * (i + k), each
 * summed in turn, in one step. */
static void *trainer_run(void *arg)
{
    trainer_t *t = arg;
    ASSERT_OK(ringd_connect(&t->c, t->sock, NULL));
    for (int i = 0; i < NBUF; i++) {
        t->bufs[i] = ringd_buffer(t->c, NEL * sizeof(float));
        ASSERT_MSG(t->bufs[i] != NULL, "buffer %d: %s", i,
                   ringd_last_error(t->c));
    }
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(t->c, &v));
    ASSERT_EQ(v.world, 2);
    t->rank = (int)v.rank;
    for (int i = 0; i < NBUF; i++) {
        for (int k = 0; k < NEL; k++)
            t->bufs[i][k] = (float)((t->rank + 1) * (i + k));
        ASSERT_OK(ringd_allreduce(t->c, t->bufs[i], NEL, RINGD_F32,
                                  RINGD_SUM));
    }
    ASSERT_OK(ringd_step_end(t->c));
    t->step_done = 1;
    return NULL;
}

TEST_IMPL(client_buffers_500_freed)
{
    td_daemon_t t;
    td_init(&t, "client-bufs");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    trainer_t tr[2] = {{.sock = t.sock}, {.sock = t.sock}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ASSERT_OK(pthread_create(&th[i], NULL, trainer_run, &tr[i]));
    for (int i = 0; i < 2; i++)
        ASSERT_OK(pthread_join(th[i], NULL));
    ASSERT(tr[0].step_done && tr[1].step_done);
    ASSERT_NE(tr[0].rank, tr[1].rank);
    /* rank 0 gave 1x, rank 1 gave 2x: every buffer holds 3 (i + k). */
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NBUF; i++)
            for (int k = 0; k < NEL; k++)
                ASSERT_MSG(tr[r].bufs[i][k] == (float)(3 * (i + k)),
                           "trainer %d buffer %d [%d] = %g", r, i, k,
                           (double)tr[r].bufs[i][k]);
    ASSERT_EQ(daemon_maps(t.pid), 2 * NBUF);

    /* Misuse: not the start of a buffer, twice the same, NULL. */
    ringd_client_t *c = tr[0].c;
    ASSERT_EQ(ringd_buffer_free(c, tr[0].bufs[7] + 1), RINGD_EINVAL);
    ASSERT(strstr(ringd_last_error(c), "not the start of a buffer"));
    ASSERT_EQ(ringd_buffer_free(NULL, tr[0].bufs[7]), RINGD_EINVAL);
    ASSERT_EQ(ringd_buffer_free(c, NULL), RINGD_EINVAL);
    /* The state region's buffer stays. */
    ASSERT_OK(ringd_state(c, tr[0].bufs[3], NEL * sizeof(float)));
    ASSERT_EQ(ringd_buffer_free(c, tr[0].bufs[3]), RINGD_ESTATE);
    ASSERT(strstr(ringd_last_error(c), "state region"));

    /* Free everything else: the daemon unmaps each. */
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NBUF; i++)
            if (r != 0 || i != 3)
                ASSERT_OK(ringd_buffer_free(tr[r].c, tr[r].bufs[i]));
    ASSERT_EQ(ringd_buffer_free(c, tr[0].bufs[7]), RINGD_EINVAL);
    ASSERT_EQ(daemon_maps(t.pid), 1);

    /* Freed ids are reused and work; so does a reconnect, which now
     * registers sparse ids (only 3 and the new one survive). */
    ASSERT_OK(ringd_reconnect(c));
    ringd_close(tr[1].c);
    ASSERT_EQ(daemon_maps(t.pid), 1);
    float *again = ringd_buffer(c, NEL * sizeof(float));
    ASSERT(again != NULL);
    ASSERT_EQ(daemon_maps(t.pid), 2);
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

TEST_IMPL(client_buffer_limits)
{
    td_daemon_t t;
    td_init(&t, "client-buflim");
    const char *flags[] = {"--max-client-buffers", "100",
                           "--max-client-mib", "8", NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    /* Bytes: 8 MiB in all, counted over every mapped buffer. */
    char *big = ringd_buffer(c, 6u << 20);
    ASSERT(big != NULL);
    ASSERT(ringd_buffer(c, 3u << 20) == NULL);
    ASSERT_MSG(strstr(ringd_last_error(c), "--max-client-mib") != NULL,
               "%s", ringd_last_error(c));
    ASSERT_OK(ringd_buffer_free(c, big));
    big = ringd_buffer(c, 8u << 20);
    ASSERT_MSG(big != NULL, "%s", ringd_last_error(c));
    ASSERT_OK(ringd_buffer_free(c, big));
    /* Count: 100 at once, the 101st refused until one is freed. */
    void *b[100];
    for (int i = 0; i < 100; i++) {
        b[i] = ringd_buffer(c, 64);
        ASSERT_MSG(b[i] != NULL, "buffer %d: %s", i, ringd_last_error(c));
    }
    ASSERT(ringd_buffer(c, 64) == NULL);
    ASSERT(strstr(ringd_last_error(c), "--max-client-buffers") != NULL);
    ASSERT_OK(ringd_buffer_free(c, b[40]));
    b[40] = ringd_buffer(c, 64);
    ASSERT(b[40] != NULL);
    /* The refusals harmed nothing: a step over the reused id works. */
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c, &v));
    ((float *)b[40])[0] = 2.5f;
    ASSERT_OK(ringd_allreduce(c, b[40], 1, RINGD_F32, RINGD_SUM));
    ASSERT(((float *)b[40])[0] == 2.5f);
    ASSERT_OK(ringd_step_end(c));
    ASSERT(td_file_has(t.log, "client buffer limit"));
    ringd_close(c);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
