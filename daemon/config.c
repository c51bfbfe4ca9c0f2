/*
 * config.c - ringd's flags and config file.
 *
 * One table of keys serves both: a flag --KEY VALUE (or --KEY=VALUE) and a
 * file line "KEY = VALUE" set the same field, so the two can never drift.
 * Flags are applied after the file, so they win.
 */
#include "daemon/dmn.h"
#include "daemon/dmn-parse.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"
#include "proto/proto.h"

/* K_AUTO: a K_BOOL that also takes "auto" (2), its default. */
typedef enum { K_STR, K_U32, K_BOOL, K_AUTO, K_UCX } key_type_t;

typedef struct {
    const char *name;
    key_type_t type;
    size_t off;
    uint32_t min, max;   /* K_U32 bounds */
    const char *arg;
    const char *help;
} cfg_key_t;

#define F(field) offsetof(dmn_config_t, field)

static const cfg_key_t keys[] = {
    {"etcd", K_STR, F(etcd), 0, 0, "URLS",
     "etcd endpoints, comma-separated (http://10.0.0.1:2379,...)"},
    {"etcd-ca", K_STR, F(etcd_ca), 0, 0, "FILE",
     "CA bundle that signed etcd's certificate, for https:// endpoints "
     "(default: the system's CAs)"},
    {"etcd-cert", K_STR, F(etcd_cert), 0, 0, "FILE",
     "client certificate for etcd (with --etcd-key), when etcd checks "
     "client certificates"},
    {"etcd-key", K_STR, F(etcd_key), 0, 0, "FILE",
     "the client certificate's private key"},
    {"etcd-user", K_STR, F(etcd_user), 0, 0, "NAME",
     "etcd user for password authentication (with --etcd-password-file)"},
    {"etcd-password-file", K_STR, F(etcd_password_file), 0, 0, "FILE",
     "file whose first line is the etcd user's password (mode 0600 or "
     "0640: a password is never given on the command line)"},
    {"job-secret-file", K_STR, F(job_secret_file), 0, 0, "FILE",
     "file holding the job secret (16 bytes or more, not readable by "
     "every user): ring neighbours prove to each other that they hold "
     "it (default: none, neighbours are trusted)"},
    {"job", K_STR, F(job), 0, 0, "NAME",
     "job name (etcd key prefix); pins the job: a trainer naming another "
     "is refused. Without it (with --etcd) ringd serves the job its first "
     "trainer names (RINGD_JOB, job=): 1..64 characters of "
     "[A-Za-z0-9_.-], not starting with '.'; one job at a time"},
    {"jobs", K_STR, F(jobs), 0, 0, "LIST",
     "without --job: the job names trainers may name, comma-separated; an "
     "entry ending in '*' is a prefix (default: any valid name)"},
    {"job-secret-dir", K_STR, F(job_secret_dir), 0, 0, "DIR",
     "without --job: job NAME's secret is DIR/NAME.secret (same rules as "
     "--job-secret-file; a job without its file is refused); default: "
     "--job-secret-file for every job"},
    {"job-grace", K_U32, F(job_grace_ms), 0, 3600000, "MS",
     "without --job: when the job's last trainer here dies (no clean "
     "leave), the node stays in the job, stepped out, for MS milliseconds "
     "so that a replacement (ringrun restarts it) rejoins at a step "
     "boundary with the job's state; then it leaves the job. A clean "
     "leave of the last trainer leaves at once. 0: at once (default "
     "10000)"},
    {"node-id", K_STR, F(node_id), 0, 0, "ID",
     "this node's id in the job (default: the hostname)"},
    {"host", K_STR, F(host), 0, 0, "NAME",
     "host name for ring order: nodes of one host are neighbours "
     "(default: the hostname)"},
    {"min-nodes", K_U32, F(min_nodes), 1, 100000, "N",
     "the job's first view waits for N nodes (default 1)"},
    {"ring-deadline-ms", K_U32, F(ring_deadline_ms), 100, 3600000, "MS",
     "a ring collective that makes no progress this long fails; membership "
     "(the lease) normally notices a dead node first (default 10000)"},
    {"liveness-ms", K_U32, F(liveness_ms), 0, 600000, "MS",
     "a ring neighbour that sends neither heartbeats (its daemon sends "
     "them every 100 ms whatever its trainer does) nor data this long is "
     "suspected at once: a stopped or cut-off daemon leaves the job in "
     "about this time, not its lease TTL; a slow trainer never looks like "
     "that. With it on, a neighbour whose heartbeats stall on its link (a "
     "lossy link) is reported too; a node is evicted when two members "
     "report it. 0: off (default 1000)"},
    {"ring-chunk-kib", K_U32, F(ring_chunk_kib), 1, 1048576, "KIB",
     "pipeline chunk of the ring's messages, in KiB; a job option (the "
     "job's first view fixes it, every node follows; default 1024)"},
    {"ring-bidirectional", K_AUTO, F(ring_bidirectional), 0, 0,
     "true|false|auto",
     "allreduce on two rings at once, half the data each way round: "
     "true for every allreduce, auto (default) for those of 16 to 128 MiB, "
     "where two rings measured as fast or faster; a job option"},
    {"ring-wire", K_STR, F(ring_wire), 0, 0, "none|bf16|f16",
     "the default compression of f32 allreduces on the wire (16 bits a "
     "value, f32 accumulation; a trainer may choose per call); a job "
     "option (default none)"},
    {"ring-grid-min-nodes", K_U32, F(ring_grid_min_nodes), 0, 1000000, "N",
     "allreduce on the two-level ring (rows of a host's nodes, then "
     "columns) when the job has N nodes or more; 0 = always the flat "
     "ring; a job option (default 16: at 64 nodes here a 4 KiB step took "
     "57 ms on the grid, 105 ms flat)"},
    {"ring-grid-max-kib", K_U32, F(ring_grid_max_kib), 0, 4194304, "KIB",
     "the two-level ring only for tensors up to KIB KiB, larger ones on "
     "the flat ring; a job option (default 0: any size)"},
    {"ring-fuse-kib", K_U32, F(ring_fuse_kib), 0, 1048576, "KIB",
     "asynchronous allreduces queued behind the one running (not in a "
     "trainer's group) run as one ring operation of up to KIB KiB, the "
     "nodes agreeing on how many; 0 = each alone (results then do not "
     "depend on timing, see the README); a job option (default 65536)"},
    {"ring-grid-cols", K_U32, F(ring_grid_cols), 0, 1000000, "N",
     "row width of the two-level ring; 0 = a row per host when the hosts "
     "are alike, else about sqrt(nodes); a job option (default 0)"},
    {"step-commit", K_BOOL, F(step_commit), 0, 0, NULL,
     "a trainer's step_end returns once every node finished the step (one "
     "byte a node around the ring), so a node dropped from the job just "
     "then cannot count a step the others redo without it; false saves "
     "that round trip a step and allows such stale steps; a job option "
     "(default true)"},
    {"step-timeout", K_U32, F(step_timeout_ms), 0, 86400000, "MS",
     "a trainer that began a step (or got a collective's result, or had "
     "its step_end answered) and then sends nothing for MS milliseconds "
     "makes this node step out of the "
     "job until it comes back or another trainer connects; 0 = off "
     "(default 0: the job waits for a slow trainer)"},
    {"ucx-opt", K_UCX, 0, 0, 0, "KEY=VAL",
     "set UCX_KEY=VAL for UCX (repeatable), e.g. TLS=tcp"},
    {"socket-group", K_STR, F(socket_group), 0, 0, "GROUP",
     "group of the local socket: its members (besides root and ringd's "
     "own user) may connect (default: ringd's group)"},
    {"socket-mode", K_STR, F(socket_mode), 0, 0, "MODE",
     "permission bits of the local socket, octal (default 0660); every "
     "connection is checked against the kernel's credentials of the peer "
     "(SO_PEERCRED) whatever the mode"},
    {"socket", K_STR, F(socket_path), 0, 0, "PATH",
     "local API socket (default /run/ringd/ringd.sock)"},
    {"ckpt-dir", K_STR, F(ckpt_dir), 0, 0, "DIR",
     "checkpoint directory (default /var/lib/ringd/ckpt)"},
    {"ckpt-interval", K_U32, F(ckpt_interval), 0, 100000000, "STEPS",
     "checkpoint every STEPS steps, 0 = never (default 0)"},
    {"lease-ttl", K_U32, F(lease_ttl), 1, 3600, "SEC",
     "etcd lease TTL in seconds (default 5)"},
    {"metrics", K_STR, F(metrics_addr), 0, 0, "ADDR:PORT",
     "metrics HTTP address, or \"off\" (default 127.0.0.1:9464)"},
    {"log-level", K_STR, F(log_level), 0, 0, "LEVEL",
     "error, warn, info or debug (default info)"},
    {"trainers", K_U32, F(trainers), 0, 4096, "N",
     "local trainers to gather before the first step (default 0: go with "
     "whoever is there)"},
    {"max-clients", K_U32, F(max_clients), 1, 65536, "N",
     "local connections served at once; more are closed at once, so a "
     "flood of clients cannot take the descriptors etcd and UCX need "
     "(default 256)"},
    {"max-client-buffers", K_U32, F(max_client_buffers), 1,
     PROTO_MAX_BUFFERS, "N",
     "shared buffers one client may have mapped at once; each is a mapping "
     "of the daemon's, which the kernel limits (default 4096)"},
    {"max-client-mib", K_U32, F(max_client_mib), 1, UINT32_MAX, "MIB",
     "bytes one client may have mapped at once, in MiB: the daemon writes "
     "results into those pages, so they are its memory too (default: the "
     "machine's memory)"},
    {"standalone", K_BOOL, F(standalone), 0, 0, NULL,
     "one-node job: no etcd, no ring"},
    {"backend", K_STR, F(backend), 0, 0, NULL, NULL}, /* hidden: tests */
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

/* A value a K_AUTO key takes as the next word of a command line. */
static int is_auto_word(const char *v)
{
    static const char *const w[] = {"true", "false", "auto", "yes", "no",
                                    "1", "0"};
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
        if (strcmp(v, w[i]) == 0)
            return 1;
    return 0;
}

static void set_str(char **dst, const char *v)
{
    free(*dst);
    *dst = strdup(v);
}

/* Physical memory in MiB (at least 1, at most what a u32 holds). */
static uint32_t machine_mib(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return UINT32_MAX;
    uint64_t mib = (uint64_t)pages * (uint64_t)page >> 20;
    return mib == 0 ? 1 : mib > UINT32_MAX ? UINT32_MAX : (uint32_t)mib;
}

void dmn_config_init(dmn_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    char host[256] = "localhost";
    (void)gethostname(host, sizeof(host) - 1);
    set_str(&cfg->node_id, host);
    set_str(&cfg->host, host);
    cfg->min_nodes = 1;
    cfg->ring_deadline_ms = 10000;
    cfg->liveness_ms = 1000;
    cfg->job_grace_ms = 10000;
    cfg->step_commit = 1;
    cfg->ring_bidirectional = 2; /* auto */
    cfg->ring_grid_min_nodes = 16;
    cfg->ring_chunk_kib = 1024;
    cfg->ring_fuse_kib = 65536;
    set_str(&cfg->ring_wire, "none");
    set_str(&cfg->socket_path, "/run/ringd/ringd.sock");
    set_str(&cfg->socket_mode, "0660");
    set_str(&cfg->ckpt_dir, "/var/lib/ringd/ckpt");
    set_str(&cfg->metrics_addr, "127.0.0.1:9464");
    set_str(&cfg->log_level, "info");
    cfg->lease_ttl = 5;
    cfg->max_clients = 256;
    cfg->max_client_buffers = 4096;
    cfg->max_client_mib = machine_mib();
}

void dmn_config_free(dmn_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].type == K_STR)
            free(*(char **)((char *)cfg + keys[i].off));
    for (int i = 0; i < cfg->nucx_opts; i++)
        free(cfg->ucx_opts[i]);
    free(cfg->config_path);
    memset(cfg, 0, sizeof(*cfg));
}

static const cfg_key_t *find_key(const char *name, size_t len)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strlen(keys[i].name) == len &&
            strncmp(keys[i].name, name, len) == 0)
            return &keys[i];
    return NULL;
}

/* Set one key; on error writes the reason (without location) to why. */
static int set_key(dmn_config_t *cfg, const cfg_key_t *k, const char *v,
                   char *why, size_t wlen)
{
    char *end;
    switch (k->type) {
    case K_STR:
        if (v[0] == '\0') {
            snprintf(why, wlen, "empty value for '%s'", k->name);
            return ST_ECONFIG;
        }
        if (strlen(v) > DMN_CONFIG_VALUE_MAX) {
            snprintf(why, wlen, "value for '%s' is %zu bytes (at most %d)",
                     k->name, strlen(v), DMN_CONFIG_VALUE_MAX);
            return ST_ECONFIG;
        }
        set_str((char **)((char *)cfg + k->off), v);
        return 0;
    case K_U32: {
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (v[0] == '\0' || v[0] == '-' || *end != '\0' || errno != 0 ||
            n < k->min || n > k->max) {
            snprintf(why, wlen, "bad number '%s' for '%s' (want %u..%u)", v,
                     k->name, k->min, k->max);
            return ST_ECONFIG;
        }
        *(uint32_t *)((char *)cfg + k->off) = (uint32_t)n;
        return 0;
    }
    case K_AUTO:
    case K_BOOL:
        if (k->type == K_AUTO && strcmp(v, "auto") == 0) {
            *(int *)((char *)cfg + k->off) = 2;
        } else if (strcmp(v, "true") == 0 || strcmp(v, "yes") == 0 ||
            strcmp(v, "1") == 0) {
            *(int *)((char *)cfg + k->off) = 1;
        } else if (strcmp(v, "false") == 0 || strcmp(v, "no") == 0 ||
                   strcmp(v, "0") == 0) {
            *(int *)((char *)cfg + k->off) = 0;
        } else {
            snprintf(why, wlen, "bad boolean '%s' for '%s' (want true%s "
                     "false)", v, k->name, k->type == K_AUTO ? ", auto or"
                                                           : " or");
            return ST_ECONFIG;
        }
        return 0;
    case K_UCX:
        if (strchr(v, '=') == NULL || v[0] == '=') {
            snprintf(why, wlen, "bad UCX option '%s' (want KEY=VAL)", v);
            return ST_ECONFIG;
        }
        if (cfg->nucx_opts == DMN_MAX_UCX_OPTS) {
            snprintf(why, wlen, "at most %d UCX options", DMN_MAX_UCX_OPTS);
            return ST_ECONFIG;
        }
        cfg->ucx_opts[cfg->nucx_opts++] = strdup(v);
        return 0;
    }
    return ST_ECONFIG;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' ||
                     s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* Why the file opened as fd is no config source, or NULL. Only a
 * regular file of bounded size is one (and /dev/null, an empty config the
 * tests and packaging use): a FIFO or a device may never end, and a huge
 * file is a mistake, not a configuration. */
static const char *not_a_config(int fd, char *why, size_t wlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return strerror(errno);
    if (S_ISDIR(st.st_mode))
        return "is a directory";
    if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3))
        return NULL;                        /* /dev/null */
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, wlen, "not a regular file (a %s)",
                 S_ISFIFO(st.st_mode)   ? "FIFO"
                 : S_ISCHR(st.st_mode)  ? "character device"
                 : S_ISBLK(st.st_mode)  ? "block device"
                 : S_ISSOCK(st.st_mode) ? "socket"
                                        : "special file");
        return why;
    }
    if (st.st_size > DMN_CONFIG_FILE_MAX) {
        snprintf(why, wlen, "%lld bytes, over the limit of %d",
                 (long long)st.st_size, DMN_CONFIG_FILE_MAX);
        return why;
    }
    return NULL;
}

static int load_file(dmn_config_t *cfg, const char *path, int must_exist,
                     FILE *err)
{
    /* O_NONBLOCK: opening a FIFO with no writer would block here. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        if (!must_exist && errno == ENOENT)
            return 0;
        fprintf(err, "ringd: cannot read config file %s: %s\n", path,
                strerror(errno));
        return ST_ECONFIG;
    }
    char why[128];
    const char *bad = not_a_config(fd, why, sizeof(why));
    FILE *f = NULL;
    if (bad == NULL &&
        (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
         (f = fdopen(fd, "r")) == NULL))
        bad = strerror(errno);
    if (bad != NULL) {
        fprintf(err, "ringd: cannot read config file %s: %s\n", path, bad);
        close(fd);
        return ST_ECONFIG;
    }
    int rc = dmn__config_read(cfg, f, path, err);
    fclose(f);
    return rc;
}

/*
 * One line of f into buf (cap bytes, NUL-terminated, without its '\n'):
 * its length, -1 at the end of the file, CFG_LINE_LONG when it is longer
 * than cap - 1 bytes (the rest of the file is not read), CFG_LINE_NUL
 * when it holds a NUL byte. Bounded: a source that never ends a line
 * costs cap bytes, not all memory.
 */
enum { CFG_LINE_LONG = -2, CFG_LINE_NUL = -3 };

static int read_line(FILE *f, char *buf, size_t cap)
{
    size_t n = 0;
    int ch, nul = 0;
    while ((ch = getc(f)) != EOF && ch != '\n') {
        if (n + 1 >= cap)
            return CFG_LINE_LONG;
        nul |= ch == '\0';
        buf[n++] = (char)ch;
    }
    buf[n] = '\0';
    if (ch == EOF && n == 0)
        return -1;
    return nul ? CFG_LINE_NUL : (int)n;
}

/* One line of a config file: a comment, blank, or "key = value". */
static int config_line(dmn_config_t *cfg, char *line, const char *path,
                       int lineno, char *why, size_t wlen, FILE *err)
{
    char *hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
    char *s = trim(line);
    if (*s == '\0')
        return 0;
    char *eq = strchr(s, '=');
    if (eq == NULL) {
        fprintf(err, "ringd: %s:%d: expected 'key = value'\n", path,
                lineno);
        return ST_ECONFIG;
    }
    *eq = '\0';
    char *k = trim(s), *v = trim(eq + 1);
    const cfg_key_t *key = find_key(k, strlen(k));
    if (key == NULL) {
        fprintf(err, "ringd: %s:%d: unknown key '%s'\n", path, lineno, k);
        return ST_ECONFIG;
    }
    if (set_key(cfg, key, v, why, wlen) != 0) {
        fprintf(err, "ringd: %s:%d: %s\n", path, lineno, why);
        return ST_ECONFIG;
    }
    return 0;
}

int dmn__config_read(dmn_config_t *cfg, FILE *f, const char *path,
                     FILE *err)
{
    /* A line longer than the limit is an error, never split: its tail
     * would be parsed as a setting. */
    char *line = malloc(DMN_CONFIG_LINE_MAX + 2), why[256];
    if (line == NULL) {
        fprintf(err, "ringd: %s: out of memory\n", path);
        return ST_ECONFIG;
    }
    int len, lineno = 0, rc = 0;
    size_t total = 0;
    while (rc == 0 &&
           (len = read_line(f, line, DMN_CONFIG_LINE_MAX + 2)) != -1) {
        lineno++;
        if (len == CFG_LINE_NUL) {
            fprintf(err, "ringd: %s:%d: NUL byte in line\n", path, lineno);
            rc = ST_ECONFIG;
            break;
        }
        if (len == CFG_LINE_LONG || len > DMN_CONFIG_LINE_MAX) {
            fprintf(err, "ringd: %s:%d: line over %d bytes\n", path, lineno,
                    DMN_CONFIG_LINE_MAX);
            rc = ST_ECONFIG;
            break;
        }
        total += (size_t)len + 1;
        if (total > DMN_CONFIG_FILE_MAX) {
            fprintf(err, "ringd: %s:%d: over %d bytes in all\n", path,
                    lineno, DMN_CONFIG_FILE_MAX);
            rc = ST_ECONFIG;
            break;
        }
        rc = config_line(cfg, line, path, lineno, why, sizeof(why), err);
    }
    if (rc == 0 && ferror(f)) {
        fprintf(err, "ringd: %s:%d: read error: %s\n", path, lineno + 1,
                strerror(errno));
        rc = ST_ECONFIG;
    }
    free(line);
    return rc;
}

/*
 * Walk argv; with apply = 0 only --config/--help/--version are taken (so
 * the file can be read first), with apply = 1 everything else.
 */
static int parse_flags(dmn_config_t *cfg, int argc, char **argv, int apply,
                       FILE *err)
{
    char why[256];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            cfg->want_help = 1;
            continue;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            cfg->want_version = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 && strcmp(a, "-c") != 0) {
            fprintf(err, "ringd: unexpected argument '%s' (see --help)\n", a);
            return ST_ECONFIG;
        }
        const char *name = strcmp(a, "-c") == 0 ? "config" : a + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        int is_config = nlen == 6 && strncmp(name, "config", 6) == 0;
        const cfg_key_t *k = is_config ? NULL : find_key(name, nlen);
        if (!is_config && k == NULL) {
            fprintf(err, "ringd: unknown option '%s' (see --help)\n", a);
            return ST_ECONFIG;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (v == NULL && k != NULL && k->type == K_AUTO && i + 1 < argc &&
            is_auto_word(argv[i + 1])) {
            v = argv[++i]; /* --ring-bidirectional auto, as --help says */
        } else if (v == NULL && k != NULL &&
                   (k->type == K_BOOL || k->type == K_AUTO)) {
            v = "true";
        } else if (v == NULL) {
            if (i + 1 >= argc) {
                fprintf(err, "ringd: option '%s' needs a value\n", a);
                return ST_ECONFIG;
            }
            v = argv[++i];
        }
        if (is_config) {
            if (!apply)
                set_str(&cfg->config_path, v);
            continue;
        }
        if (apply && set_key(cfg, k, v, why, sizeof(why)) != 0) {
            fprintf(err, "ringd: %s\n", why);
            return ST_ECONFIG;
        }
    }
    return 0;
}

/* A file the daemon will need later, checked now so that a typo is a
 * start-up error (exit 2), not a node that never joins. */
static int check_readable(const char *key, const char *path, FILE *err)
{
    struct stat st;
    if (path == NULL)
        return 0;
    if (access(path, R_OK) != 0 || stat(path, &st) != 0) {
        fprintf(err, "ringd: cannot read %s file %s: %s\n", key, path,
                strerror(errno));
        return ST_ECONFIG;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(err, "ringd: %s file %s is not a regular file\n", key,
                path);
        return ST_ECONFIG;
    }
    return 0;
}

/* Anyone who can read the job secret can join the job. */
int dmn__config_check_secret(const char *path, FILE *err)
{
    struct stat st;
    if (check_readable("job-secret", path, err) != 0)
        return ST_ECONFIG;
    if (path != NULL && stat(path, &st) == 0 && (st.st_mode & S_IROTH)) {
        fprintf(err, "ringd: job-secret file %s is readable by every user "
                "(chmod 0600 or 0640)\n", path);
        return ST_ECONFIG;
    }
    return 0;
}

static int validate_etcd_security(const dmn_config_t *cfg, FILE *err)
{
    if ((cfg->etcd_cert == NULL) != (cfg->etcd_key == NULL)) {
        fprintf(err, "ringd: --etcd-cert and --etcd-key go together\n");
        return ST_ECONFIG;
    }
    if ((cfg->etcd_user == NULL) != (cfg->etcd_password_file == NULL)) {
        fprintf(err, "ringd: --etcd-user and --etcd-password-file go "
                "together\n");
        return ST_ECONFIG;
    }
    if (check_readable("etcd-ca", cfg->etcd_ca, err) != 0 ||
        check_readable("etcd-cert", cfg->etcd_cert, err) != 0 ||
        check_readable("etcd-key", cfg->etcd_key, err) != 0 ||
        check_readable("etcd-password", cfg->etcd_password_file, err) != 0)
        return ST_ECONFIG;
    return dmn__config_check_secret(cfg->job_secret_file, err);
}

/* A daemon that pins no job: what its trainers may name. */
static int validate_unpinned(const dmn_config_t *cfg, FILE *err)
{
    if (cfg->job != NULL || cfg->standalone || cfg->etcd == NULL) {
        if (cfg->jobs != NULL || cfg->job_secret_dir != NULL) {
            fprintf(err, "ringd: --jobs and --job-secret-dir are for a "
                    "ringd that pins no job (--etcd without --job)\n");
            return ST_ECONFIG;
        }
        return 0;
    }
    if (cfg->job_secret_dir != NULL) {
        struct stat st;
        if (stat(cfg->job_secret_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(err, "ringd: job-secret-dir %s is not a directory\n",
                    cfg->job_secret_dir);
            return ST_ECONFIG;
        }
    }
    return 0;
}

/* The socket's group and mode, resolved once at start-up so that a typo
 * is exit 2, not a socket nobody can use. */
static int validate_socket(dmn_config_t *cfg, FILE *err)
{
    char *end;
    unsigned long m = strtoul(cfg->socket_mode, &end, 8);
    if (cfg->socket_mode[0] < '0' || cfg->socket_mode[0] > '7' ||
        *end != '\0' || m > 0777) {
        fprintf(err, "ringd: bad socket mode '%s' (want octal, e.g. 0660)\n",
                cfg->socket_mode);
        return ST_ECONFIG;
    }
    cfg->socket_mode_bits = (uint32_t)m;
    cfg->socket_gid = (uint32_t)getegid();
    if (cfg->socket_group == NULL)
        return 0;
    const struct group *g = getgrnam(cfg->socket_group);
    unsigned long n = strtoul(cfg->socket_group, &end, 10);
    if (g != NULL) {
        cfg->socket_gid = (uint32_t)g->gr_gid;
    } else if (cfg->socket_group[0] >= '0' && cfg->socket_group[0] <= '9' &&
               *end == '\0' && n < UINT32_MAX) {
        cfg->socket_gid = (uint32_t)n;
    } else {
        fprintf(err, "ringd: unknown socket group '%s'\n", cfg->socket_group);
        return ST_ECONFIG;
    }
    return 0;
}

static int validate(dmn_config_t *cfg, FILE *err)
{
    rd_log_level_t lvl;
    if (rd_log_parse_level(cfg->log_level, &lvl) != 0) {
        fprintf(err, "ringd: bad log level '%s' (want error, warn, info or "
                "debug)\n", cfg->log_level);
        return ST_ECONFIG;
    }
    rd_wire_t wire;
    if (rd_wire_parse(cfg->ring_wire, &wire) != 0) {
        fprintf(err, "ringd: bad ring-wire '%s' (want none, bf16 or f16)\n",
                cfg->ring_wire);
        return ST_ECONFIG;
    }
    if (cfg->liveness_ms != 0 && cfg->liveness_ms < 300) {
        fprintf(err, "ringd: liveness-ms %u is below 300 (heartbeats come "
                "every 100 ms; 0 turns liveness off)\n", cfg->liveness_ms);
        return ST_ECONFIG;
    }
    if (cfg->standalone && cfg->backend == NULL)
        set_str(&cfg->backend, "solo");
    if (validate_unpinned(cfg, err) != 0)
        return ST_ECONFIG;
    if (cfg->backend == NULL) {
        if (cfg->etcd == NULL) {
            fprintf(err, "ringd: --etcd is required unless --standalone is "
                    "given\n");
            return ST_ECONFIG;
        }
        if ((cfg->job != NULL &&
             (strchr(cfg->job, '/') != NULL || cfg->job[0] == '\0')) ||
            strchr(cfg->node_id, '/') != NULL || cfg->node_id[0] == '\0') {
            fprintf(err, "ringd: --job and --node-id must be non-empty and "
                    "contain no '/'\n");
            return ST_ECONFIG;
        }
        set_str(&cfg->backend, "ring");
    }
    if (validate_socket(cfg, err) != 0)
        return ST_ECONFIG;
    return validate_etcd_security(cfg, err);
}

int dmn_config_load(dmn_config_t *cfg, int argc, char **argv, FILE *err)
{
    int rc = parse_flags(cfg, argc, argv, 0, err);
    if (rc != 0 || cfg->want_help || cfg->want_version)
        return rc;
    int explicit = cfg->config_path != NULL;
    rc = load_file(cfg, explicit ? cfg->config_path : DMN_DEFAULT_CONFIG,
                   explicit, err);
    if (rc == 0)
        rc = parse_flags(cfg, argc, argv, 1, err);
    if (rc == 0)
        rc = validate(cfg, err);
    return rc;
}

/* "  --flag ARG   help" with the help wrapped at 79 columns. */
static void print_wrapped(FILE *out, const char *flag, const char *help)
{
    int col = fprintf(out, "  %-26s", flag);
    const char *p = help;
    while (*p != '\0') {
        size_t w = strcspn(p, " ");
        if (col + 1 + (int)w > 79) {
            col = fprintf(out, "\n%28s", "") - 1;
        }
        col += fprintf(out, " %.*s", (int)w, p);
        p += w;
        while (*p == ' ')
            p++;
    }
    fputc('\n', out);
}

void dmn_config_usage(FILE *out)
{
    fprintf(out,
"Usage: ringd [OPTION]...\n"
"\n"
"ringd is the per-node daemon of an elastic data-parallel training job.\n"
"Trainers on the node connect to it through a Unix socket (libringd) and\n"
"share their tensors with it through shared memory; ringd reduces them\n"
"locally, then across nodes, and keeps the job going when nodes or\n"
"trainers come and go.\n"
"\n"
"Options (each also a key of the config file, without the dashes):\n");
    for (size_t i = 0; i < NKEYS; i++) {
        if (keys[i].help == NULL)
            continue;
        char flag[48];
        snprintf(flag, sizeof(flag), "--%s%s%s", keys[i].name,
                 keys[i].arg ? " " : "", keys[i].arg ? keys[i].arg : "");
        print_wrapped(out, flag, keys[i].help);
    }
    fprintf(out,
"  %-26s %s\n  %-26s %s\n  %-26s %s\n"
"\n"
"With --etcd and --job, ringd registers in etcd under /ringd/JOB/ with a\n"
"lease (--lease-ttl), agrees with the other daemons on a sequence of views,\n"
"and runs collectives on a UCX ring in view order (UCX_* variables, or\n"
"--ucx-opt, choose transports and interfaces). When a node dies, hangs or\n"
"leaves, the collective in flight returns RINGD_ERESHAPE to the trainers,\n"
"the survivors re-form the ring, and the member furthest ahead sends its\n"
"state to everyone before the step is redone. With --standalone it runs a\n"
"one-node job without etcd.\n"
"\n"
"Checkpoints (--ckpt-interval N > 0): every N steps, at a step boundary,\n"
"node r of the view writes shard r of the trainers' state region and the\n"
"replica of shard r-1 under --ckpt-dir/JOB (JOB: the pinned job, or the\n"
"one the trainers named; zstd, byte-shuffled, XOR delta\n"
"against the previous one, checksummed, written atomically); the training\n"
"loop only waits for two memory copies. A checkpoint is complete once all\n"
"shards and replicas of the step are in the directory (a directory the\n"
"nodes share). When a node starts, its first step resumes from the newest\n"
"complete checkpoint that verifies.\n"
"\n"
"Config file: 'key = value' lines, '#' starts a comment; flags win over\n"
"the file. Without -c, %s is read if it exists. It must be a\n"
"regular file (or /dev/null) of at most 1 MiB, each line at most 4096\n"
"bytes, with no NUL byte; a string value (here or as a flag) is at most\n"
"4095 bytes, a number within the range its option states.\n"
"\n"
"Signals: SIGTERM or SIGINT drain: the current step finishes, trainers\n"
"get RINGD_ESHUTDOWN at their next step, ringd leaves the job and exits 0.\n"
"A second signal exits at once. SIGUSR2 (systemctl reload) drains for a\n"
"restart: the step finishes, ringd leaves the job and exits 75 without\n"
"telling its trainers, who wait for the next ringd on the socket\n"
"(RINGD_RECONNECT_S, default 30 s) and go on with it.\n"
"\n"
"systemd: Type=notify; READY=1 once the socket listens, STATUS= updates,\n"
"WATCHDOG=1 every WatchdogSec/2, STOPPING=1 on drain.\n"
"\n"
"Metrics: GET /metrics (Prometheus text), GET /healthz.\n"
"\n"
"Exit status: 0 after a drain, 75 after a drain for a restart, 1 on a\n"
"runtime failure, 2 on a bad command line or config file.\n"
"\n"
"Examples:\n"
"  ringd --standalone --socket /tmp/ringd.sock --trainers 2\n"
"  ringd --etcd http://10.0.0.1:2379 --job mnist --trainers 8\n",
            "-c, --config FILE", "read this config file (must exist)",
            "-h, --help", "show this help and exit",
            "-V, --version", "show the version and exit",
            DMN_DEFAULT_CONFIG);
}
