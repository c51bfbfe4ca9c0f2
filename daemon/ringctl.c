/*
 * ringctl - operator's view of ringd.
 *
 *   ringctl [--socket PATH] status          the local daemon, over its socket
 *   ringctl [--etcd URLS --job J] members   (etcd: not implemented yet)
 *   ringctl ... view | drain NODE | checkpoints
 *
 * Commands are a table: the etcd-backed ones are listed (so --help shows
 * the whole CLI) and fail with a clear message and exit 3 until the
 * membership module lands; each then only needs its function.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/proto.h"

enum { EXIT_OK = 0, EXIT_DOWN = 1, EXIT_USAGE = 2, EXIT_NOTIMPL = 3 };

typedef struct {
    const char *socket;
    const char *etcd;
    const char *job;
    int json;
} ctl_opts_t;

typedef struct {
    const char *name;
    const char *args;
    int nargs;
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
    if (o->json) {
        printf("{\"pid\":%u,\"node\":\"%s\",\"backend\":\"%s\","
               "\"state\":\"%s\",\"step\":%llu,\"generation\":%llu,"
               "\"node_rank\":%u,\"node_count\":%u,\"world\":%u,"
               "\"trainers\":%u,\"collectives\":%llu,\"bytes\":%llu,"
               "\"uptime_ms\":%llu}\n",
               r.pid, r.node_id, r.backend, r.state,
               (unsigned long long)r.step,
               (unsigned long long)r.generation, r.node_rank, r.node_count,
               r.world, r.trainers, (unsigned long long)r.collectives,
               (unsigned long long)r.bytes,
               (unsigned long long)r.uptime_ms);
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
    return EXIT_OK;
}

static int cmd_etcd(const ctl_opts_t *o, char **argv)
{
    (void)o;
    fprintf(stderr, "ringctl: '%s' reads the job from etcd, which this "
            "build of ringctl cannot do yet (the membership module is not "
            "linked in); use 'ringctl status' or the daemon's /metrics\n",
            argv[0]);
    return EXIT_NOTIMPL;
}

static const ctl_cmd_t cmds[] = {
    {"status", "", 0, cmd_status,
     "state of the local daemon: step, view, trainers, collectives"},
    {"members", "", 0, cmd_etcd, "nodes of the job and their slots (etcd)"},
    {"view", "", 0, cmd_etcd, "the current view: generation, ring order"},
    {"drain", " NODE", 1, cmd_etcd,
     "ask NODE to leave the job at the next step boundary"},
    {"checkpoints", "", 0, cmd_etcd, "checkpoint manifests in etcd"},
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
        fprintf(out, "  %-14s %s\n", left, cmds[i].help);
    }
    fprintf(out,
"\n"
"Options:\n"
"  --socket PATH  the local daemon's socket (default $RINGD_SOCKET or\n"
"                 " RINGD_DEFAULT_SOCKET ")\n"
"  --etcd URLS    etcd endpoints (members, view, drain, checkpoints)\n"
"  --job NAME     the job (members, view, drain, checkpoints)\n"
"  --json         machine-readable output (status)\n"
"  -h, --help     this help\n"
"\n"
"Exit status: 0 ok, 1 daemon unreachable, 2 usage error,\n"
"3 command not implemented in this build.\n");
}

int main(int argc, char **argv)
{
    ctl_opts_t o = {getenv("RINGD_SOCKET"), NULL, NULL, 0};
    if (o.socket == NULL || o.socket[0] == '\0')
        o.socket = RINGD_DEFAULT_SOCKET;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return EXIT_OK;
        } else if (strcmp(a, "--json") == 0) {
            o.json = 1;
        } else if (i + 1 < argc && strcmp(a, "--socket") == 0) {
            o.socket = argv[++i];
        } else if (i + 1 < argc && strcmp(a, "--etcd") == 0) {
            o.etcd = argv[++i];
        } else if (i + 1 < argc && strcmp(a, "--job") == 0) {
            o.job = argv[++i];
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
    for (size_t k = 0; k < NCMDS; k++) {
        if (strcmp(argv[i], cmds[k].name) != 0)
            continue;
        if (argc - i - 1 != cmds[k].nargs) {
            fprintf(stderr, "ringctl: usage: ringctl %s%s\n", cmds[k].name,
                    cmds[k].args);
            return EXIT_USAGE;
        }
        return cmds[k].fn(&o, argv + i);
    }
    fprintf(stderr, "ringctl: unknown command '%s' (see --help)\n",
            argv[i]);
    return EXIT_USAGE;
}
