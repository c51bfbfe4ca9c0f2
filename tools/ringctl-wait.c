/*
 * ringctl-wait.c - the commands a rolling upgrade runs between nodes:
 * `generation` (the job's view generation now) and `wait-member NODE GEN`
 * (until NODE is a member of a view later than GEN, or --timeout).
 *
 * A node that restarts leaves the job and comes back as a new
 * incarnation, so the view that takes it back has a later generation
 * than any view before the restart: "a member of a view after GEN" is
 * the event, where GEN was read before the restart. Its state is copied
 * in during that view's install; a node that holds the only copy of the
 * job's state waits for that install before it leaves (daemon/README.md,
 * "Restart and stop"), so the next node may go as soon as this holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "membership/mb.h"
#include "tools/ringctl.h"

/* How often wait-member reads the view: a restart takes seconds. */
#define CTL_WAIT_POLL_MS 200
/* A node id is a key segment (ringd's --node-id); no more than this. */
#define CTL_NODE_MAX 255

/* The job's view, parsed, into *v_p (the caller frees it). 0; 1 when
 * the job has no view yet; else an exit code, said on stderr. */
static int read_view(const ctl_opts_t *o, ctl_etcd_t *c, mb_view_t **v_p)
{
    char key[MB_KEY_MAX];
    if (mb_key(key, sizeof(key), o->job, MB_KEY_VIEW, NULL, 0, 0) != 0)
        return EXIT_USAGE;
    ctl_reply_t r;
    int rc = ctl_get(c, key, 0, &r);
    if (rc != 0)
        return rc;
    if (r.n_kvs == 0) {
        ctl_reply_free(&r);
        return 1;
    }
    const char *why;
    if (mb_view_parse(r.kvs[0].value, r.kvs[0].value_len, v_p, &why) != 0) {
        fprintf(stderr, "ringctl: bad view of job %s in etcd (%zu bytes): "
                "%s\n", o->job, r.kvs[0].value_len, why);
        rc = EXIT_DOWN;
    }
    ctl_reply_free(&r);
    return rc;
}

int cmd_generation(const ctl_opts_t *o, char **argv)
{
    (void)argv;
    ctl_etcd_t c;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    mb_view_t *v = NULL;
    rc = read_view(o, &c, &v);
    if (rc == 1) {
        printf("0\n"); /* no view yet: any view comes after it */
        rc = EXIT_OK;
    } else if (rc == 0) {
        printf("%llu\n", (unsigned long long)v->generation);
        mb_view_free(v);
    }
    etcd_destroy(c.etcd);
    return rc;
}

/* GEN: a generation, digits only (what `ringctl generation` prints). */
static int parse_generation(const char *s, unsigned long long *g)
{
    if (s[0] < '0' || s[0] > '9' || strlen(s) > 20)
        return -1;
    char *end;
    errno = 0;
    *g = strtoull(s, &end, 10);
    return errno == 0 && *end == '\0' ? 0 : -1;
}

/* 1 when node is a member of v; *joiner set. */
static int view_lists(const mb_view_t *v, const char *node, int *joiner)
{
    for (size_t i = 0; i < v->n_members; i++)
        if (strcmp(v->members[i].node, node) == 0) {
            *joiner = v->members[i].joiner;
            return 1;
        }
    return 0;
}

int cmd_wait_member(const ctl_opts_t *o, char **argv)
{
    const char *node = argv[1];
    unsigned long long after;
    char b[64];
    if (node[0] == '\0' || strlen(node) > CTL_NODE_MAX ||
        strchr(node, '/') != NULL) {
        fprintf(stderr, "ringctl: wait-member: NODE must be 1..%d bytes "
                "without '/'\n", CTL_NODE_MAX);
        return EXIT_USAGE;
    }
    if (parse_generation(argv[2], &after) != 0) {
        fprintf(stderr, "ringctl: wait-member: GEN '%s' is not a "
                "generation (the number `ringctl generation` printed "
                "before the restart)\n", ctl_safe(argv[2], b, sizeof(b)));
        return EXIT_USAGE;
    }
    ctl_etcd_t c;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    int64_t t0 = rd_now_ns();
    int64_t deadline = t0 + (int64_t)o->timeout_s * 1000000000;
    unsigned long long seen = 0;
    for (;;) {
        mb_view_t *v = NULL;
        rc = read_view(o, &c, &v);
        if (rc > 1)
            break; /* etcd failed or a bad view: said */
        int joiner = 0;
        if (rc == 0) {
            seen = v->generation;
            int member = view_lists(v, node, &joiner);
            if (member && v->generation > after) {
                printf("%s is a member of view %llu (step %llu%s), %.1f s "
                       "after the wait began\n", ctl_safe(node, b, sizeof(b)),
                       (unsigned long long)v->generation,
                       (unsigned long long)v->step,
                       joiner ? ", taken in as a joiner" : "",
                       (double)(rd_now_ns() - t0) / 1e9);
                mb_view_free(v);
                rc = EXIT_OK;
                break;
            }
            mb_view_free(v);
        }
        if (rd_now_ns() >= deadline) {
            fprintf(stderr, "ringctl: %s is not a member of a view after "
                    "generation %llu within %u s (the newest is %llu): is "
                    "its ringd running and its trainers connected? (see "
                    "ringctl members)\n", ctl_safe(node, b, sizeof(b)), after,
                    o->timeout_s, seen);
            rc = EXIT_DOWN;
            break;
        }
        struct timespec ts = {0, CTL_WAIT_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    etcd_destroy(c.etcd);
    return rc;
}
