/*
 * ringctl - operator's view of ringd.
 *
 *   ringctl [--socket PATH] status          the local daemon, over its socket
 *   ringctl --etcd URLS --job J members     the job as etcd holds it
 *   ringctl ... view | drain NODE | checkpoints
 *
 * Commands are a table; the etcd-backed ones read the keys that
 * membership writes, named by mb_key() and parsed by mb_node_parse() and
 * mb_view_parse(), with the blocking mode of the etcd client, and write
 * one: the drain request.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "common/status.h"
#include "job/job_auth.h"
#include "proto/proto.h"
#include "membership/etcd.h"
#include "membership/mb.h"
#include "tools/ringctl.h"

typedef struct {
    const char *name;
    const char *args;
    int nargs;
    int etcd; /* needs --etcd and --job */
    int (*fn)(const ctl_opts_t *o, char **argv);
    const char *help;
} ctl_cmd_t;

/* One request/reply on the daemon socket; 0 or an exit code. */
static int ctl_call(int fd, uint32_t type, uint32_t seq, void *rep,
                    size_t rep_len)
{
    proto_hdr_t h = {PROTO_MAGIC, PROTO_VERSION, (uint16_t)type, 0, seq};
    char buf[PROTO_MAX_MSG];
    size_t blen = 0;
    if (type == PROTO_T_HELLO) {
        proto_hello_t hello = {(uint32_t)getpid(), RINGD_API_VERSION,
                               "ringctl"};
        h.length = sizeof(hello);
        memcpy(buf + sizeof(h), &hello, sizeof(hello));
        blen = sizeof(hello);
    }
    memcpy(buf, &h, sizeof(h));
    struct pollfd p = {fd, POLLIN, 0};
    if (send(fd, buf, sizeof(h) + blen, MSG_NOSIGNAL) < 0 ||
        poll(&p, 1, 5000) != 1) {
        fprintf(stderr, "ringctl: the daemon does not answer\n");
        return EXIT_DOWN;
    }
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    const char *why = "connection closed";
    if (n >= (ssize_t)sizeof(h)) {
        memcpy(&h, buf, sizeof(h));
        if (proto_check_hdr(&h, (size_t)n, 1, &why) == 0)
            why = NULL;
    }
    if (why == NULL && (h.type & ~PROTO_REPLY) == PROTO_T_ERROR) {
        proto_error_rep_t e;
        memcpy(&e, buf + sizeof(h), sizeof(e));
        e.text[PROTO_TEXT - 1] = '\0';
        fprintf(stderr, "ringctl: daemon: %s\n", e.text);
        return EXIT_DOWN;
    }
    if (why != NULL || (h.type & ~PROTO_REPLY) != type) {
        fprintf(stderr, "ringctl: bad reply from the daemon: %s\n",
                why ? why : "wrong type");
        return EXIT_DOWN;
    }
    memcpy(rep, buf + sizeof(h), rep_len);
    return 0;
}

static int cmd_status(const ctl_opts_t *o, char **argv)
{
    (void)argv;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", o->socket);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        fprintf(stderr, "ringctl: no ringd daemon at %s (%s)\n", o->socket,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return EXIT_DOWN;
    }
    proto_status_rep_t hello;
    proto_info_rep_t r;
    int rc = ctl_call(fd, PROTO_T_HELLO, 1, &hello, sizeof(hello));
    if (rc == 0)
        rc = ctl_call(fd, PROTO_T_STATUS, 2, &r, sizeof(r));
    proto_hdr_t bye = {PROTO_MAGIC, PROTO_VERSION, PROTO_T_BYE, 0, 3};
    (void)send(fd, &bye, sizeof(bye), MSG_NOSIGNAL);
    close(fd);
    if (rc != 0)
        return rc;
    r.backend[sizeof(r.backend) - 1] = '\0';
    r.node_id[sizeof(r.node_id) - 1] = '\0';
    r.state[sizeof(r.state) - 1] = '\0';
    ctl_slowest_t slow;
    int have_slow = o->etcd != NULL && o->etcd[0] != '\0' && o->job != NULL &&
                    o->job[0] != '\0' && ctl_slowest(o, &slow) == 0;
    if (o->json) {
        printf("{\"pid\":%u,\"node\":\"%s\",\"backend\":\"%s\","
               "\"state\":\"%s\",\"step\":%llu,\"generation\":%llu,"
               "\"node_rank\":%u,\"node_count\":%u,\"world\":%u,"
               "\"trainers\":%u,\"collectives\":%llu,\"bytes\":%llu,"
               "\"uptime_ms\":%llu,\"slowest\":%s%s%s}\n",
               r.pid, r.node_id, r.backend, r.state,
               (unsigned long long)r.step,
               (unsigned long long)r.generation, r.node_rank, r.node_count,
               r.world, r.trainers, (unsigned long long)r.collectives,
               (unsigned long long)r.bytes,
               (unsigned long long)r.uptime_ms, have_slow ? "\"" : "",
               have_slow ? slow.node : "null", have_slow ? "\"" : "");
        return EXIT_OK;
    }
    printf("ringd pid %u on node %s (backend %s), up %.1f s\n", r.pid,
           r.node_id, r.backend, (double)r.uptime_ms / 1e3);
    printf("state:       %s, step %llu, view generation %llu\n", r.state,
           (unsigned long long)r.step, (unsigned long long)r.generation);
    printf("view:        node %u of %u, %u trainers in the job\n",
           r.node_rank, r.node_count, r.world);
    printf("trainers:    %u on this node\n", r.trainers);
    printf("collectives: %llu (%.1f MiB)\n",
           (unsigned long long)r.collectives, (double)r.bytes / 1048576.0);
    if (have_slow)
        printf("slowest:     %s (waits %.3f ms a step on its predecessor, "
               "the other %d node%s %.3f-%.3f ms: they wait for it; %llu "
               "steps of generation %llu)\n", slow.node, slow.own_ms,
               slow.nodes - 1, slow.nodes == 2 ? "" : "s",
               slow.others_min_ms, slow.others_max_ms,
               (unsigned long long)slow.steps,
               (unsigned long long)slow.generation);
    return EXIT_OK;
}

/* ---- etcd-backed commands ----
 *
 * One blocking etcd client per run (a private loop, etcd_run). Every reply
 * is treated as hostile: a missing key, text that is not JSON or a field
 * of the wrong type is reported on one line and the command exits 1;
 * nothing read from etcd is trusted to be NUL-free, printable or small.
 */

void ctl_reply_free(ctl_reply_t *r)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        free((char *)r->kvs[i].key);
        free((char *)r->kvs[i].value);
    }
    free(r->kvs);
    memset(r, 0, sizeof(*r));
}

static int copy_kvs(ctl_reply_t *r, const etcd_kv_t *kvs, size_t n)
{
    r->kvs = calloc(n ? n : 1, sizeof(*r->kvs));
    if (r->kvs == NULL)
        return ST_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        etcd_kv_t *d = &r->kvs[i];
        char *v = malloc(kvs[i].value_len + 1);
        *d = kvs[i];
        d->key = strdup(kvs[i].key ? kvs[i].key : "");
        d->value = v;
        r->n_kvs++;
        if (d->key == NULL || v == NULL)
            return ST_ENOMEM;
        if (kvs[i].value_len > 0)
            memcpy(v, kvs[i].value, kvs[i].value_len);
        v[kvs[i].value_len] = '\0';
    }
    return 0;
}

static void on_reply(int status, const etcd_result_t *res, void *data)
{
    ctl_reply_t *r = data;
    r->done = 1;
    r->status = status;
    if (status != 0 || res == NULL) {
        r->status = status != 0 ? status : ST_EPROTO;
        return;
    }
    r->succeeded = res->succeeded;
    if (res->n_responses > 0) {
        r->status = copy_kvs(r, res->responses[0].kvs,
                             res->responses[0].n_kvs);
        r->sub_n_kvs = r->n_kvs;
    } else {
        r->status = copy_kvs(r, res->kvs, res->n_kvs);
    }
}

/* Say why etcd did not answer; returns the exit code. */
int ctl_etcd_fail(const ctl_etcd_t *c, int rc)
{
    const char *url = c->o->etcd;
    switch (rc) {
    case ST_EUNAVAIL:
    case ST_ETIMEDOUT:
    case ST_ELINK:
        fprintf(stderr, "ringctl: cannot reach etcd at %s: %s\n", url,
                st_strerror(rc));
        break;
    case ST_EPROTO:
        fprintf(stderr, "ringctl: etcd at %s sent a malformed reply\n",
                url);
        break;
    case -EACCES:
        fprintf(stderr, "ringctl: etcd at %s refused access (TLS "
                "verification, client certificate, user or password: "
                "see --etcd-ca, --etcd-cert, --etcd-user)\n", url);
        break;
    default:
        fprintf(stderr, "ringctl: etcd at %s: request failed: %s\n", url,
                st_strerror(rc));
        break;
    }
    return EXIT_DOWN;
}

/* Wait for r; 0 or an exit code (the error already reported). On a
 * timeout the request may still be queued: the caller destroys the
 * client before r goes out of scope, which cancels it silently. */
int ctl_wait(ctl_etcd_t *c, int queued, ctl_reply_t *r)
{
    if (queued != 0)
        return ctl_etcd_fail(c, queued);
    int rc = etcd_run(c->etcd, &r->done, c->run_ms);
    if (rc == 0)
        rc = r->status;
    if (rc != 0) {
        ctl_reply_free(r);
        return ctl_etcd_fail(c, rc);
    }
    return 0;
}

int ctl_get(ctl_etcd_t *c, const char *key, int prefix,
                   ctl_reply_t *r)
{
    memset(r, 0, sizeof(*r));
    return ctl_wait(c, etcd_get(c->etcd, key, prefix, on_reply, r), r);
}

/* The per-endpoint timeouts of the client, times the endpoints it may
 * try, plus a margin: etcd_run only bounds a client that misbehaves. */
int ctl_open(const ctl_opts_t *o, ctl_etcd_t *c)
{
    etcd_config_t cfg = {.endpoints = o->etcd, .connect_timeout_ms = 1000,
                         .request_timeout_ms = 3000,
                         .ca_file = o->etcd_ca, .cert_file = o->etcd_cert,
                         .key_file = o->etcd_key, .user = o->etcd_user,
                         .password_file = o->etcd_password_file};
    if ((o->etcd_user == NULL) != (o->etcd_password_file == NULL) ||
        (o->etcd_cert == NULL) != (o->etcd_key == NULL)) {
        fprintf(stderr, "ringctl: --etcd-user goes with "
                "--etcd-password-file, --etcd-cert with --etcd-key\n");
        return EXIT_USAGE;
    }
    long n_eps = 1;
    for (const char *p = o->etcd; *p; p++)
        n_eps += *p == ',';
    c->o = o;
    c->run_ms = n_eps * (cfg.connect_timeout_ms + cfg.request_timeout_ms) +
                1000;
    int rc = etcd_create(NULL, &cfg, &c->etcd);
    if (rc != 0 && o->etcd_password_file != NULL) {
        fprintf(stderr, "ringctl: bad --etcd '%s' or --etcd-password-file "
                "'%s': %s\n", o->etcd, o->etcd_password_file,
                st_strerror(rc));
        return rc == ST_ECONFIG ? EXIT_USAGE : EXIT_DOWN;
    }
    if (rc != 0) {
        fprintf(stderr, "ringctl: bad --etcd '%s': %s\n", o->etcd,
                st_strerror(rc));
        return rc == ST_ECONFIG ? EXIT_USAGE : EXIT_DOWN;
    }
    return 0;
}

/* Copy s into buf with control and non-ASCII bytes as '?', so that text
 * from etcd cannot drive the operator's terminal. */
const char *ctl_safe(const char *s, char *buf, size_t n)
{
    size_t i = 0;
    for (; s != NULL && s[i] != '\0' && i + 1 < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[i] = ch < 0x20 || ch >= 0x7f ? '?' : (char)ch;
    }
    buf[i] = '\0';
    return buf;
}

const char *ctl_key_tail(const char *key, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(key, prefix, n) == 0 ? key + n : key;
}

/* Node records and the leader key -> a table or a JSON array. A record
 * that does not parse is reported and makes the exit status 1; the
 * others are still listed. */
/* One node record, listed as a table row or appended to arr as stored
 * with its node id and leadership. 0, or EXIT_DOWN when it does not
 * parse (reported). */
static int print_node(const etcd_kv_t *kv, const char *node,
                      const char *lead, cJSON *arr)
{
    char b1[64], b2[64];
    mb_node_rec_t rec;
    const char *why;
    if (mb_node_parse(node, kv->value, kv->value_len, &rec, &why) != 0) {
        fprintf(stderr, "ringctl: bad node record for '%s' (%zu "
                "bytes): %s\n", ctl_safe(node, b1, sizeof(b1)), kv->value_len,
                why);
        return EXIT_DOWN;
    }
    int is_leader = strcmp(node, lead) == 0;
    if (arr != NULL) {
        cJSON *o = cJSON_ParseWithLength(kv->value, kv->value_len);
        cJSON_DeleteItemFromObjectCaseSensitive(o, "node");
        cJSON_DeleteItemFromObjectCaseSensitive(o, "leader");
        cJSON_AddItemToObject(o, "node", cJSON_CreateString(node));
        cJSON_AddBoolToObject(o, "leader", is_leader);
        cJSON_AddItemToArray(arr, o);
    } else {
        printf("%-16s %-20s %5d %8lld %-16llx %s\n",
               ctl_safe(node, b1, sizeof(b1)),
               ctl_safe(rec.member.host, b2, sizeof(b2)), rec.member.slots,
               rec.pid < 0 ? 0 : (long long)rec.pid,
               (unsigned long long)rec.member.lease,
               is_leader ? "yes" : "no");
    }
    mb_node_rec_free(&rec);
    return 0;
}

/* Node records and the leader key -> a table or a JSON array. A record
 * that does not parse is reported and makes the exit status 1; the
 * others are still listed. */
static int cmd_members(const ctl_opts_t *o, char **argv)
{
    (void)argv;
    ctl_etcd_t c;
    ctl_reply_t nodes, leader;
    char prefix[MB_KEY_MAX], lkey[MB_KEY_MAX];
    if (mb_key(prefix, sizeof(prefix), o->job, MB_KEY_NODES, NULL, 0, 0) ||
        mb_key(lkey, sizeof(lkey), o->job, MB_KEY_LEADER, NULL, 0, 0))
        return EXIT_USAGE;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    rc = ctl_get(&c, prefix, 1, &nodes);
    if (rc != 0)
        goto out_destroy;
    rc = ctl_get(&c, lkey, 0, &leader);
    if (rc != 0)
        goto out_nodes;
    const char *lead = leader.n_kvs > 0 ? leader.kvs[0].value : "";
    if (nodes.n_kvs == 0) {
        if (o->json)
            printf("[]\n");
        else
            printf("no nodes registered for job %s\n", o->job);
        goto out_leader;
    }
    cJSON *arr = o->json ? cJSON_CreateArray() : NULL;
    if (!o->json)
        printf("%-16s %-20s %5s %8s %-16s %s\n", "NODE", "HOST", "SLOTS",
               "PID", "LEASE", "LEADER");
    for (size_t i = 0; i < nodes.n_kvs; i++) {
        const etcd_kv_t *kv = &nodes.kvs[i];
        if (print_node(kv, ctl_key_tail(kv->key, prefix), lead, arr) != 0)
            rc = EXIT_DOWN;
    }
    if (arr != NULL) {
        char *s = cJSON_PrintUnformatted(arr);
        if (s != NULL)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(arr);
    }
out_leader:
    ctl_reply_free(&leader);
out_nodes:
    ctl_reply_free(&nodes);
out_destroy:
    etcd_destroy(c.etcd);
    return rc;
}

/* Check the view with the parser membership uses; print it unless json
 * (then the caller prints the stored text). 0 or EXIT_DOWN. */
static int print_view(const char *job, const char *text, size_t len,
                      int json)
{
    mb_view_t *v;
    const char *why;
    if (mb_view_parse(text, len, &v, &why) != 0) {
        fprintf(stderr, "ringctl: bad view of job %s in etcd (%zu bytes): "
                "%s\n", job, len, why);
        return EXIT_DOWN;
    }
    char b1[64], b2[64];
    if (!json) {
        const char *src = v->source_index >= 0
                              ? v->members[v->source_index].node
                              : NULL;
        printf("generation %llu, step %llu, %zu members, source %s\n",
               (unsigned long long)v->generation,
               (unsigned long long)v->step, v->n_members,
               src ? ctl_safe(src, b1, sizeof(b1)) : "(none)");
    }
    for (size_t i = 0; !json && i < v->n_members; i++) {
        const mb_member_t *m = &v->members[i];
        if (m->joiner)
            printf("%4zu  %-16s %-20s joiner\n", i,
                   ctl_safe(m->node, b1, sizeof(b1)),
                   ctl_safe(m->host, b2, sizeof(b2)));
        else
            printf("%4zu  %-16s %s\n", i, ctl_safe(m->node, b1, sizeof(b1)),
                   ctl_safe(m->host, b2, sizeof(b2)));
    }
    mb_view_free(v);
    return 0;
}

static int cmd_view(const ctl_opts_t *o, char **argv)
{
    (void)argv;
    ctl_etcd_t c;
    ctl_reply_t r;
    char key[MB_KEY_MAX];
    if (mb_key(key, sizeof(key), o->job, MB_KEY_VIEW, NULL, 0, 0) != 0)
        return EXIT_USAGE;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    rc = ctl_get(&c, key, 0, &r);
    if (rc != 0)
        goto out_destroy;
    if (r.n_kvs == 0) {
        fprintf(stderr, "ringctl: job %s has no view in etcd (no daemon "
                "has formed one yet)\n", o->job);
        rc = EXIT_DOWN;
    } else {
        rc = print_view(o->job, r.kvs[0].value, r.kvs[0].value_len,
                        o->json);
        if (rc == 0 && o->json)
            printf("%s\n", r.kvs[0].value);
    }
    ctl_reply_free(&r);
out_destroy:
    etcd_destroy(c.etcd);
    return rc;
}

/* "ringctl", or with a job secret the value signed for the lease that
 * holds the node's record now. */
static int drain_value(const ctl_opts_t *o, ctl_etcd_t *c, const char *nkey,
                       const char *dkey, char **value_p)
{
    if (o->job_secret_file == NULL) {
        *value_p = strdup("ringctl");
        return *value_p != NULL ? 0 : EXIT_DOWN;
    }
    job_auth_t *a = NULL;
    if (job_auth_load(o->job_secret_file, &a) != 0) {
        fprintf(stderr, "ringctl: cannot use --job-secret-file %s\n",
                o->job_secret_file);
        return EXIT_USAGE;
    }
    ctl_reply_t r;
    int rc = ctl_get(c, nkey, 0, &r);
    const void *sec;
    size_t len;
    job_auth_secret(a, &sec, &len);
    /* No record: the txn below refuses the drain and says why. */
    int64_t lease = rc == 0 && r.n_kvs > 0 ? r.kvs[0].lease : 0;
    if (rc == 0 && mb_drain_value(sec, len, dkey, lease, value_p) != 0)
        rc = EXIT_DOWN;
    ctl_reply_free(&r);
    job_auth_destroy(a);
    return rc;
}

/* The drain key is written only while NODE's record exists (one txn), so
 * a typo or a node that already left is refused rather than leaving a
 * drain request for a future node of that name. */
static int cmd_drain(const ctl_opts_t *o, char **argv)
{
    const char *node = argv[1];
    char nkey[MB_KEY_MAX], dkey[MB_KEY_MAX], b[64];
    if (node[0] == '\0' || strchr(node, '/') != NULL ||
        strlen(node) > 200) {
        fprintf(stderr, "ringctl: '%s' is not a node name\n",
                ctl_safe(node, b, sizeof(b)));
        return EXIT_DOWN;
    }
    if (mb_key(nkey, sizeof(nkey), o->job, MB_KEY_NODE, node, 0, 0) ||
        mb_key(dkey, sizeof(dkey), o->job, MB_KEY_DRAIN, node, 0, 0))
        return EXIT_USAGE;
    ctl_etcd_t c;
    ctl_reply_t r = {0};
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    char *value = NULL;
    if ((rc = drain_value(o, &c, nkey, dkey, &value)) != 0)
        goto out_destroy;
    etcd_cmp_t cmp = {nkey, ETCD_CMP_CREATE, ETCD_CMP_GREATER, 0, NULL, 0};
    etcd_op_t ops[] = {{ETCD_OP_RANGE, dkey, 0, NULL, 0, 0},
                       {ETCD_OP_PUT, dkey, 0, value, strlen(value), 0}};
    rc = ctl_wait(&c, etcd_txn(c.etcd, &cmp, 1, ops, 2, NULL, 0, on_reply,
                               &r), &r);
    if (rc != 0)
        goto out_destroy;
    if (!r.succeeded) {
        fprintf(stderr, "ringctl: '%s' is not a registered node of job %s "
                "(see ringctl members)\n", ctl_safe(node, b, sizeof(b)),
                o->job);
        rc = EXIT_DOWN;
    } else if (r.sub_n_kvs > 0) {
        printf("drain of %s was already requested; it leaves at its next "
               "step boundary\n", node);
    } else {
        printf("drain of %s requested (%s); it leaves at its next step "
               "boundary\n", node, dkey);
    }
    ctl_reply_free(&r);
out_destroy:
    free(value);
    etcd_destroy(c.etcd);
    return rc;
}

static const ctl_cmd_t cmds[] = {
    {"status", "", 0, 0, cmd_status,
     "the local daemon (step, view, trainers); the slowest node (etcd)"},
    {"members", "", 0, 1, cmd_members,
     "nodes of the job: host, slots, pid, lease, leader (etcd)"},
    {"view", "", 0, 1, cmd_view,
     "the current view: generation, step, ring order (etcd)"},
    {"drain", " NODE", 1, 1, cmd_drain,
     "ask NODE to leave the job at the next step boundary (etcd)"},
    {"generation", "", 0, 1, cmd_generation,
     "the job's view generation now (0: no view yet) (etcd)"},
    {"wait-member", " NODE GEN", 2, 1, cmd_wait_member,
     "wait (--timeout) until NODE is a member of a view after GEN (etcd)"},
    {"checkpoints", "", 0, 1, cmd_checkpoints,
     "checkpoint records of the job (etcd)"},
    {"verify", " STEP", 1, 0, cmd_verify,
     "check both copies of every shard of a checkpoint (--ckpt-dir)"},
    {"dump", " STEP FILE", 2, 0, cmd_dump,
     "the checked state of a checkpoint into FILE (--ckpt-dir)"},
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static void usage(FILE *out)
{
    fprintf(out,
"Usage: ringctl [OPTION]... COMMAND [ARG]\n"
"Inspect and steer ringd, the elastic data-parallel training daemon.\n"
"\n"
"Commands:\n");
    for (size_t i = 0; i < NCMDS; i++) {
        char left[32];
        snprintf(left, sizeof(left), "%s%s", cmds[i].name, cmds[i].args);
        fprintf(out, "  %-16s %s\n", left, cmds[i].help);
    }
    fprintf(out,
"\n"
"Options:\n"
"  --socket PATH  the local daemon's socket (default $RINGD_SOCKET or\n"
"                 " RINGD_DEFAULT_SOCKET ")\n"
"  --etcd URLS    etcd endpoints, comma-separated, tried in order (default\n"
"                 $RINGD_ETCD); required by members, view, drain,\n"
"                 checkpoints\n"
"  --job NAME     the job (default $RINGD_JOB); required with --etcd\n"
"  --etcd-ca FILE CA bundle for https:// endpoints ($RINGD_ETCD_CA)\n"
"  --etcd-cert FILE, --etcd-key FILE\n"
"                 client certificate and key ($RINGD_ETCD_CERT,\n"
"                 $RINGD_ETCD_KEY)\n"
"  --etcd-user NAME, --etcd-password-file FILE\n"
"  --job-secret-file FILE   the job's secret: drain signs its request\n"
"                 etcd user and the file whose first line is its\n"
"                 password ($RINGD_ETCD_USER, $RINGD_ETCD_PASSWORD_FILE)\n"
"  --ckpt-dir DIR checkpoint directory for verify (default\n"
"                 /var/lib/ringd/ckpt); the job's files are in DIR/JOB\n"
"                 (DIR/standalone without --job); verify reads the\n"
"                 manifest from etcd with --etcd, else from DIR\n"
"  --json         machine-readable output (status, members, view,\n"
"                 checkpoints)\n"
"  --timeout S    how long wait-member waits, 1..86400 (default 120)\n"
"  -h, --help     this help\n"
"\n"
"\n"
"A rolling upgrade, one node at a time (daemon/README.md):\n"
"  g=$(ringctl generation); ssh NODE systemctl reload ringd;\n"
"  ringctl wait-member NODE \"$g\" || stop\n"
"\n"
"Exit status: 0 ok; 1 failure (daemon or etcd unreachable, a bad reply,\n"
"drain of a node that is not registered, a checkpoint not restorable,\n"
"wait-member timed out); 2 usage error.\n");
}

/* An environment default; empty counts as unset. */
static const char *env_opt(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* The defaults, from the environment where it says. */
static void opts_init(ctl_opts_t *o)
{
    *o = (ctl_opts_t){getenv("RINGD_SOCKET"), getenv("RINGD_ETCD"),
                      getenv("RINGD_JOB"), "/var/lib/ringd/ckpt", 0};
    if (o->socket == NULL || o->socket[0] == '\0')
        o->socket = RINGD_DEFAULT_SOCKET;
    o->timeout_s = 120;
    o->etcd_ca = env_opt("RINGD_ETCD_CA");
    o->etcd_cert = env_opt("RINGD_ETCD_CERT");
    o->etcd_key = env_opt("RINGD_ETCD_KEY");
    o->etcd_user = env_opt("RINGD_ETCD_USER");
    o->etcd_password_file = env_opt("RINGD_ETCD_PASSWORD_FILE");
}

/* --timeout's value: seconds, 1..86400. */
static int parse_timeout(const char *v, unsigned *t_p)
{
    char *end;
    errno = 0;
    unsigned long t = strtoul(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || t < 1 ||
        t > 86400) {
        fprintf(stderr, "ringctl: --timeout '%s': want seconds, 1..86400\n",
                v);
        return EXIT_USAGE;
    }
    *t_p = (unsigned)t;
    return 0;
}

/* The options that take a value, and where it goes. */
static const char **value_opt(ctl_opts_t *o, const char *a)
{
    static const struct { const char *name; size_t off; } v[] = {
        {"--socket", offsetof(ctl_opts_t, socket)},
        {"--etcd", offsetof(ctl_opts_t, etcd)},
        {"--job", offsetof(ctl_opts_t, job)},
        {"--ckpt-dir", offsetof(ctl_opts_t, ckpt_dir)},
        {"--etcd-ca", offsetof(ctl_opts_t, etcd_ca)},
        {"--etcd-cert", offsetof(ctl_opts_t, etcd_cert)},
        {"--etcd-key", offsetof(ctl_opts_t, etcd_key)},
        {"--etcd-user", offsetof(ctl_opts_t, etcd_user)},
        {"--etcd-password-file", offsetof(ctl_opts_t, etcd_password_file)},
        {"--job-secret-file", offsetof(ctl_opts_t, job_secret_file)},
    };
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++)
        if (strcmp(a, v[k].name) == 0)
            return (const char **)((char *)o + v[k].off);
    return NULL;
}

/*
 * The options before the command; *i_p: the command's index. -1: go on,
 * else the exit status (help printed, or a usage error).
 */
static int parse_opts(int argc, char **argv, ctl_opts_t *o, int *i_p)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        const char **slot = i + 1 < argc ? value_opt(o, a) : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return EXIT_OK;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (slot != NULL) {
            *slot = argv[++i];
        } else if (i + 1 < argc && strcmp(a, "--timeout") == 0) {
            if (parse_timeout(argv[++i], &o->timeout_s) != 0)
                return EXIT_USAGE;
        } else {
            fprintf(stderr, "ringctl: unknown option or missing value: "
                    "'%s' (see --help)\n", a);
            return EXIT_USAGE;
        }
    }
    if (i == argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    *i_p = i;
    return -1;
}

/* Run the command argv[0] with its arguments. */
static int run_cmd(const ctl_opts_t *o, int argc, char **argv)
{
    for (size_t k = 0; k < NCMDS; k++) {
        if (strcmp(argv[0], cmds[k].name) != 0)
            continue;
        if (argc - 1 != cmds[k].nargs) {
            fprintf(stderr, "ringctl: usage: ringctl %s%s\n", cmds[k].name,
                    cmds[k].args);
            return EXIT_USAGE;
        }
        if (cmds[k].etcd && (o->etcd == NULL || o->etcd[0] == '\0' ||
                             o->job == NULL || o->job[0] == '\0' ||
                             strchr(o->job, '/') != NULL)) {
            fprintf(stderr, "ringctl: '%s' needs --etcd URLS and --job "
                    "NAME (or $RINGD_ETCD and $RINGD_JOB; a job name has "
                    "no '/')\n\n", cmds[k].name);
            usage(stderr);
            return EXIT_USAGE;
        }
        return cmds[k].fn(o, argv);
    }
    fprintf(stderr, "ringctl: unknown command '%s' (see --help)\n",
            argv[0]);
    return EXIT_USAGE;
}

int main(int argc, char **argv)
{
    ctl_opts_t o;
    opts_init(&o);
    /* The etcd client logs each endpoint that fails over; an operator
     * wants the one line ringctl prints, unless asked for more. */
    if (getenv("RINGD_LOG_LEVEL") == NULL)
        rd_log_set_level(RD_LOG_ERROR);
    int i = 0;
    int rc = parse_opts(argc, argv, &o, &i);
    return rc >= 0 ? rc : run_cmd(&o, argc - i, argv + i);
}
