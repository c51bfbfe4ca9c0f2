/*
 * Malformed client messages on a raw SOCK_SEQPACKET socket: each gets an
 * error reply and a log line, and the daemon keeps serving.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/proto.h"
#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

static int raw_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    ASSERT(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    ASSERT_OK(connect(fd, (struct sockaddr *)&a, sizeof(a)));
    return fd;
}

static void raw_send(int fd, const void *msg, size_t len, int pass_fd)
{
    struct iovec iov = {(void *)msg, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    char cbuf[CMSG_SPACE(sizeof(int))] = {0};
    if (pass_fd >= 0) {
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof(cbuf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    ASSERT_EQ(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

static void send_msg(int fd, uint16_t version, uint16_t type, uint32_t seq,
                     const void *body, size_t len, int pass_fd)
{
    char buf[PROTO_MAX_MSG];
    proto_hdr_t h = {PROTO_MAGIC, version, type, (uint32_t)len, seq};
    memcpy(buf, &h, sizeof(h));
    if (len > 0)
        memcpy(buf + sizeof(h), body, len);
    raw_send(fd, buf, sizeof(h) + len, pass_fd);
}

/* Receive one reply; returns its status, fills the text of an ERROR. */
static int recv_reply(int fd, uint32_t *type_p, char *text, size_t tlen)
{
    struct pollfd p = {fd, POLLIN, 0};
    ASSERT_MSG(poll(&p, 1, 10000) == 1, "no reply within 10 s");
    char buf[PROTO_MAX_MSG];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_MSG(n >= (ssize_t)sizeof(proto_hdr_t), "reply of %zd bytes", n);
    proto_hdr_t h;
    memcpy(&h, buf, sizeof(h));
    const char *why = "";
    ASSERT_MSG(proto_check_hdr(&h, (size_t)n, 1, &why) == 0, "%s", why);
    *type_p = h.type & ~PROTO_REPLY;
    int32_t st;
    memcpy(&st, buf + sizeof(h), sizeof(st));
    if (*type_p == PROTO_T_ERROR && text != NULL) {
        proto_error_rep_t e;
        memcpy(&e, buf + sizeof(h), sizeof(e));
        snprintf(text, tlen, "%.*s", PROTO_TEXT, e.text);
    }
    return st;
}

/* Expect an ERROR reply with status and a text containing needle. */
static void expect_error(int fd, int status, const char *needle)
{
    uint32_t type;
    char text[PROTO_TEXT + 1] = "";
    int st = recv_reply(fd, &type, text, sizeof(text));
    ASSERT_EQ(type, PROTO_T_ERROR);
    ASSERT_MSG(st == status, "status %d, want %d (%s)", st, status, text);
    ASSERT_MSG(strstr(text, needle) != NULL, "'%s' lacks '%s'", text,
               needle);
}

static void hello(int fd)
{
    proto_hello_t h = {(uint32_t)getpid(), RINGD_API_VERSION, "raw"};
    send_msg(fd, PROTO_VERSION, PROTO_T_HELLO, 1, &h, sizeof(h), -1);
    uint32_t type;
    ASSERT_EQ(recv_reply(fd, &type, NULL, 0), 0);
    ASSERT_EQ(type, PROTO_T_HELLO);
}

/* Headers that lie, before and instead of a HELLO. */
static void bad_headers(int fd)
{
    /* Before HELLO. */
    send_msg(fd, PROTO_VERSION, PROTO_T_STEP_BEGIN, 7, NULL, 0, -1);
    expect_error(fd, RINGD_ESTATE, "before HELLO");
    /* Wrong magic. */
    proto_hdr_t bad = {0xdeadbeef, PROTO_VERSION, PROTO_T_HELLO, 0, 2};
    raw_send(fd, &bad, sizeof(bad), -1);
    expect_error(fd, RINGD_EPROTO, "bad magic");
    /* Truncated header. */
    raw_send(fd, "RNG", 3, -1);
    expect_error(fd, RINGD_EPROTO, "truncated");
    /* Length field lies. */
    proto_hdr_t lie = {PROTO_MAGIC, PROTO_VERSION, PROTO_T_HELLO, 99, 3};
    raw_send(fd, &lie, sizeof(lie), -1);
    expect_error(fd, RINGD_EPROTO, "length");
    /* Body too short for the type. */
    send_msg(fd, PROTO_VERSION, PROTO_T_HELLO, 4, "abc", 3, -1);
    expect_error(fd, RINGD_EPROTO, "body size");
    /* Unknown type. */
    send_msg(fd, PROTO_VERSION, 77, 5, NULL, 0, -1);
    expect_error(fd, RINGD_EPROTO, "unknown message type");

}

/* One page registered as buffer 0 after BUF_ADDs that must be refused. */
static void bad_buffers(int fd)
{
    /* A buffer of one page, then collectives that miss it. */
    int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT(mfd >= 0);
    ASSERT_OK(ftruncate(mfd, 4096));
    proto_buf_add_t ba = {0, 0, 4096};
    /* Unsealed: the client could shrink it under the daemon. */
    send_msg(fd, PROTO_VERSION, PROTO_T_BUF_ADD, 9, &ba, sizeof(ba), mfd);
    expect_error(fd, RINGD_EINVAL, "not sealed");
    ASSERT_OK(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK));
    send_msg(fd, PROTO_VERSION, PROTO_T_BUF_ADD, 10, &ba, sizeof(ba), mfd);
    uint32_t type;
    ASSERT_EQ(recv_reply(fd, &type, NULL, 0), 0);
    /* Same id again, a size beyond the memfd, no descriptor at all. */
    send_msg(fd, PROTO_VERSION, PROTO_T_BUF_ADD, 11, &ba, sizeof(ba), mfd);
    expect_error(fd, RINGD_EINVAL, "already in use");
    proto_buf_add_t big = {1, 0, 1 << 20};
    send_msg(fd, PROTO_VERSION, PROTO_T_BUF_ADD, 12, &big, sizeof(big), mfd);
    expect_error(fd, RINGD_EINVAL, "announced size");
    send_msg(fd, PROTO_VERSION, PROTO_T_BUF_ADD, 13, &big, sizeof(big), -1);
    expect_error(fd, RINGD_EINVAL, "without a file descriptor");
    close(mfd);

}

/* Collectives and a state region that miss buffer 0 or name nonsense. */
static void bad_collectives(int fd, const proto_coll_req_t *okp)
{
    proto_coll_req_t ok = *okp;
    proto_coll_req_t r = ok;
    r.buf_id = 5;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 20, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EINVAL, "unknown buffer id");
    r = ok;
    r.buf_id = PROTO_MAX_BUFFERS;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 21, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "buffer id out of range");
    r = ok;
    r.offset = 4040; /* 4040 + 64 > 4096 */
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 22, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EINVAL, "outside the buffer");
    r = ok;
    r.offset = UINT64_MAX - 8; /* offset + len wraps around */
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 23, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EINVAL, "outside the buffer");
    r = ok;
    r.dtype = 99;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 24, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "unknown dtype");
    r = ok;
    r.op = 42;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 25, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "unknown reduction op");
    r = ok;
    r.count = 1ull << 62;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 26, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "count out of range");
    r = ok;
    r.kind = 9;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 27, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "unknown collective kind");
    r = ok;
    r.wire = RINGD_WIRE_F16 + 1;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 27, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "unknown wire format");
    r = ok;
    r.dtype = RINGD_I32;
    r.wire = RINGD_WIRE_BF16;
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 27, &r, sizeof(r), -1);
    expect_error(fd, RINGD_EPROTO, "other than f32");
    /* A well-formed collective outside a step. */
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 28, &ok, sizeof(ok), -1);
    expect_error(fd, RINGD_ESTATE, "outside a step");
    proto_state_set_t ss = {0, 0, 4000, 200};
    send_msg(fd, PROTO_VERSION, PROTO_T_STATE_SET, 29, &ss, sizeof(ss), -1);
    expect_error(fd, RINGD_EINVAL, "state region");

}

TEST_IMPL(dmn_malformed_messages)
{
    td_daemon_t t;
    td_init(&t, "dmn-proto");
    ASSERT_OK(td_start(&t, NULL));
    int fd = raw_connect(t.sock);
    bad_headers(fd);
    hello(fd);
    bad_buffers(fd);
    proto_coll_req_t ok = {.kind = PROTO_COLL_ALLREDUCE, .dtype = RINGD_F32,
                           .count = 16, .op = RINGD_SUM};
    bad_collectives(fd, &ok);
    uint32_t type;

    /* After all that, this connection still works: a full step. */
    send_msg(fd, PROTO_VERSION, PROTO_T_STEP_BEGIN, 30, NULL, 0, -1);
    ASSERT_EQ(recv_reply(fd, &type, NULL, 0), 0);
    ASSERT_EQ(type, PROTO_T_STEP_BEGIN);
    send_msg(fd, PROTO_VERSION, PROTO_T_COLL, 31, &ok, sizeof(ok), -1);
    ASSERT_EQ(recv_reply(fd, &type, NULL, 0), 0);
    ASSERT_EQ(type, PROTO_T_COLL);
    send_msg(fd, PROTO_VERSION, PROTO_T_STEP_END, 32, NULL, 0, -1);
    ASSERT_EQ(recv_reply(fd, &type, NULL, 0), 0);

    /* Another protocol version: told clearly, then disconnected. */
    int fd2 = raw_connect(t.sock);
    proto_hello_t h = {(uint32_t)getpid(), RINGD_API_VERSION, "v9"};
    send_msg(fd2, PROTO_VERSION + 8, PROTO_T_HELLO, 1, &h, sizeof(h), -1);
    expect_error(fd2, RINGD_EVERSION, "version");
    char c;
    struct pollfd p = {fd2, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1);
    ASSERT_EQ(recv(fd2, &c, 1, 0), 0);
    close(fd2);
    close(fd);

    /* Each rejection was logged, and a new client is served. */
    ASSERT_OK(td_wait_file(t.log, "rejected message: bad magic", 5000));
    ASSERT(td_file_has(t.log, "rejected message: unknown dtype"));
    ASSERT(td_file_has(t.log, "rejected message: unknown wire format"));
    ASSERT(td_file_has(t.log, "rejected message: protocol version"));
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL);
    ASSERT(strstr(m, "\nringd_protocol_errors_total 22\n") != NULL);
    free(m);
    ringd_client_t *cl;
    ASSERT_OK(ringd_connect(&cl, t.sock, NULL));
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(cl, &v));
    ASSERT_EQ(v.world, 1);
    ringd_close(cl);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A raw trainer: a socket and one mapped page registered as buffer 0. */
typedef struct {
    int fd;
    float *mem;
} raw_trainer_t;

static void raw_trainer(raw_trainer_t *r, const char *sock)
{
    r->fd = raw_connect(sock);
    hello(r->fd);
    int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT(mfd >= 0);
    ASSERT_OK(ftruncate(mfd, 4096));
    ASSERT_OK(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK));
    r->mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    ASSERT(r->mem != MAP_FAILED);
    proto_buf_add_t ba = {0, 0, 4096};
    send_msg(r->fd, PROTO_VERSION, PROTO_T_BUF_ADD, 2, &ba, sizeof(ba), mfd);
    close(mfd);
    uint32_t type;
    ASSERT_EQ(recv_reply(r->fd, &type, NULL, 0), 0);
}

/* Both post req (differing per trainer when given), both get status. */
static void both_coll(raw_trainer_t r[2], const proto_coll_req_t req[2],
                      int status)
{
    for (int i = 0; i < 2; i++)
        send_msg(r[i].fd, PROTO_VERSION, PROTO_T_COLL, 100, &req[i],
                 sizeof(req[i]), -1);
    for (int i = 0; i < 2; i++) {
        uint32_t type;
        ASSERT_EQ(recv_reply(r[i].fd, &type, NULL, 0), status);
        ASSERT_EQ(type, PROTO_T_COLL);
    }
}

/* Two trainers of one node: local sum, average, broadcast from rank 1,
 * and a mismatch reported to both. */
TEST_IMPL(dmn_local_collectives)
{
    td_daemon_t t;
    td_init(&t, "dmn-local");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    for (int i = 0; i < 2; i++)
        send_msg(r[i].fd, PROTO_VERSION, PROTO_T_STEP_BEGIN, 3, NULL, 0,
                 -1);
    for (int i = 0; i < 2; i++) {
        char buf[PROTO_MAX_MSG];
        struct pollfd p = {r[i].fd, POLLIN, 0};
        ASSERT_EQ(poll(&p, 1, 10000), 1);
        ssize_t n = recv(r[i].fd, buf, sizeof(buf), 0);
        ASSERT_EQ(n, sizeof(proto_hdr_t) + sizeof(proto_step_rep_t));
        proto_step_rep_t v;
        memcpy(&v, buf + sizeof(proto_hdr_t), sizeof(v));
        ASSERT_EQ(v.status, 0);
        ASSERT_EQ(v.rank, (uint32_t)i); /* connection order */
        ASSERT_EQ(v.world, 2);
    }
    for (int k = 0; k < 16; k++) {
        r[0].mem[k] = (float)k;
        r[1].mem[k] = 100.0f * (float)k;
    }
    proto_coll_req_t sum = {.kind = PROTO_COLL_ALLREDUCE, .dtype = RINGD_F32,
                            .count = 16, .op = RINGD_SUM};
    proto_coll_req_t two[2] = {sum, sum};
    both_coll(r, two, 0);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 16; k++)
            ASSERT(r[i].mem[k] == 101.0f * (float)k);
    two[0].op = two[1].op = RINGD_AVG;
    two[0].coll_seq = two[1].coll_seq = 1;
    r[0].mem[0] = 3.0f;
    r[1].mem[0] = 4.0f;
    both_coll(r, two, 0);
    ASSERT(r[0].mem[0] == 3.5f && r[1].mem[0] == 3.5f);
    proto_coll_req_t bc = {.kind = PROTO_COLL_BROADCAST, .coll_seq = 2,
                           .dtype = RINGD_U8, .offset = 64, .count = 8,
                           .root = 1};
    memcpy((char *)r[1].mem + 64, "rank one", 8);
    two[0] = two[1] = bc;
    both_coll(r, two, 0);
    ASSERT(memcmp((char *)r[0].mem + 64, "rank one", 8) == 0);
    /* Different counts: an error to both, logged. */
    two[0] = two[1] = sum;
    two[0].coll_seq = two[1].coll_seq = 3;
    two[1].count = 8;
    both_coll(r, two, RINGD_EMISMATCH);
    ASSERT_OK(td_wait_file(t.log, "does not match", 5000));
    close(r[0].fd);
    close(r[1].fd);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

static void raw_step_begin(raw_trainer_t *r, uint32_t seq)
{
    send_msg(r->fd, PROTO_VERSION, PROTO_T_STEP_BEGIN, seq, NULL, 0, -1);
}

static proto_step_rep_t raw_step_reply(raw_trainer_t *r)
{
    char buf[PROTO_MAX_MSG];
    struct pollfd p = {r->fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1);
    ssize_t n = recv(r->fd, buf, sizeof(buf), 0);
    ASSERT_EQ(n, sizeof(proto_hdr_t) + sizeof(proto_step_rep_t));
    proto_step_rep_t v;
    memcpy(&v, buf + sizeof(proto_hdr_t), sizeof(v));
    return v;
}

/* A trainer dies while the other waits in a collective: the survivor gets
 * RINGD_ERESHAPE, redoes the step alone, in a new view. */
TEST_IMPL(dmn_lost_trainer_reshapes)
{
    td_daemon_t t;
    td_init(&t, "dmn-lost");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    for (int i = 0; i < 2; i++)
        raw_step_begin(&r[i], 3);
    proto_step_rep_t v0 = raw_step_reply(&r[0]);
    (void)raw_step_reply(&r[1]);
    ASSERT_EQ(v0.world, 2);
    proto_coll_req_t sum = {.kind = PROTO_COLL_ALLREDUCE, .dtype = RINGD_F32,
                            .count = 16, .op = RINGD_SUM};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 4, &sum, sizeof(sum),
             -1);
    close(r[1].fd); /* as a SIGKILL would: no BYE */
    uint32_t type;
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), RINGD_ERESHAPE);
    ASSERT_EQ(type, PROTO_T_COLL);
    raw_step_begin(&r[0], 5);
    proto_step_rep_t v1 = raw_step_reply(&r[0]);
    ASSERT_EQ(v1.status, 0);
    ASSERT_EQ(v1.world, 1);
    ASSERT_EQ(v1.step, v0.step); /* the same step, redone */
    ASSERT_GT(v1.generation, v0.generation);
    r[0].mem[0] = 2.0f;
    sum.coll_seq = 0;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 6, &sum, sizeof(sum),
             -1);
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), 0);
    ASSERT(r[0].mem[0] == 2.0f);
    ASSERT(td_file_has(t.log, "lost at step 0"));
    char *m = td_http_get(t.metrics_port, "/metrics");
    ASSERT(m != NULL && strstr(m, "\nringd_aborted_steps_total 1\n") &&
           strstr(m, "\nringd_trainers_lost_total 1\n"));
    free(m);
    close(r[0].fd);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A trainer stuck mid-step cannot hold a drain forever: ringd gives up
 * after its drain timeout (10 s) and still exits 0. */
TEST_IMPL(dmn_drain_timeout)
{
    td_daemon_t t;
    td_init(&t, "dmn-drainto");
    ASSERT_OK(td_start(&t, NULL));
    raw_trainer_t r;
    raw_trainer(&r, t.sock);
    raw_step_begin(&r, 3);
    ASSERT_EQ(raw_step_reply(&r).status, 0);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    ASSERT(td_file_has(t.log, "did not come back"));
    close(r.fd);
    return 0;
}

/* GET path answers with `status` ("200 OK") and a body holding needle. */
static void expect_http(int port, const char *path, const char *status,
                        const char *needle)
{
    char *r = td_http_get(port, path);
    ASSERT_MSG(r != NULL, "no answer to GET %s", path);
    char *body = strstr(r, "\r\n\r\n");
    ASSERT_MSG(strstr(r, status) != NULL && body != NULL &&
                   strstr(body, needle) != NULL,
               "GET %s: want %s with '%s', got:\n%s", path, status, needle,
               r);
    free(r);
}

/*
 * /healthz and ringd_up through a drain. Two trainers are in a step when
 * SIGTERM arrives: from the request on /healthz says 503 draining (a
 * balancer must stop sending work), while ringd_up stays 1 until the step
 * closes. The first trainer to ask for the next step gets ESHUTDOWN; the
 * daemon, drained, still waits for the second: ringd_up 0, 503. Then the
 * second is told and ringd exits 0.
 */
TEST_IMPL(dmn_drain_healthz)
{
    td_daemon_t t;
    td_init(&t, "dmn-drainhz");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    uint32_t type;
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    for (int i = 0; i < 2; i++)
        raw_step_begin(&r[i], 3);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(raw_step_reply(&r[i]).status, 0);
    expect_http(t.metrics_port, "/healthz", "200 OK", "ok\n");
    expect_http(t.metrics_port, "/metrics", "200 OK", "\nringd_up 1\n");

    ASSERT_OK(kill(t.pid, SIGTERM));
    ASSERT_OK(td_wait_file(t.log, "drain requested", 10000));
    expect_http(t.metrics_port, "/healthz", "503", "draining\n");
    expect_http(t.metrics_port, "/metrics", "200 OK", "\nringd_up 1\n");

    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_STEP_END, 4, NULL, 0, -1);
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), 0);
    raw_step_begin(&r[0], 5);
    send_msg(r[1].fd, PROTO_VERSION, PROTO_T_STEP_END, 4, NULL, 0, -1);
    ASSERT_EQ(recv_reply(r[1].fd, &type, NULL, 0), 0);
    ASSERT_EQ(raw_step_reply(&r[0]).status, RINGD_ESHUTDOWN);
    ASSERT(td_file_has(t.log, "drained at step"));
    expect_http(t.metrics_port, "/healthz", "503", "draining\n");
    expect_http(t.metrics_port, "/metrics", "200 OK", "\nringd_up 0\n");

    raw_step_begin(&r[1], 5);
    ASSERT_EQ(raw_step_reply(&r[1]).status, RINGD_ESHUTDOWN);
    ASSERT_EQ(td_exit_code(t.pid, 30000), 0);
    t.pid = 0;
    for (int i = 0; i < 2; i++)
        close(r[i].fd);
    return 0;
}

/* BUF_FREE is answered at once, even with a collective pending, and
 * refused for the buffer that collective (or the state region) is in; the
 * pending collective then completes normally. */
TEST_IMPL(dmn_buf_free_refusals)
{
    td_daemon_t t;
    td_init(&t, "dmn-buffree");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    /* A second buffer (id 1) for trainer 0, and its state in id 0. */
    int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT(mfd >= 0);
    ASSERT_OK(ftruncate(mfd, 4096));
    ASSERT_OK(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK));
    proto_buf_add_t ba = {1, 0, 4096};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_BUF_ADD, 3, &ba, sizeof(ba),
             mfd);
    close(mfd);
    uint32_t type;
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), 0);
    for (int i = 0; i < 2; i++)
        raw_step_begin(&r[i], 4);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(raw_step_reply(&r[i]).status, 0);

    /* Trainer 0 posts on buffer 1 and waits for trainer 1. */
    proto_coll_req_t sum = {.kind = PROTO_COLL_ALLREDUCE, .buf_id = 1,
                            .dtype = RINGD_F32, .count = 4, .op = RINGD_SUM};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 5, &sum, sizeof(sum),
             -1);
    proto_buf_free_t f = {1, 0};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_BUF_FREE, 6, &f, sizeof(f),
             -1);
    expect_error(r[0].fd, RINGD_ESTATE, "collective outstanding");
    f.buf_id = 9;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_BUF_FREE, 7, &f, sizeof(f),
             -1);
    expect_error(r[0].fd, RINGD_EINVAL, "unknown buffer id");
    sum.buf_id = 0;
    r[1].mem[0] = 5.0f;
    send_msg(r[1].fd, PROTO_VERSION, PROTO_T_COLL, 5, &sum, sizeof(sum),
             -1);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(recv_reply(r[i].fd, &type, NULL, 0), 0);
        ASSERT_EQ(type, PROTO_T_COLL);
    }
    ASSERT(r[1].mem[0] == 5.0f); /* trainer 0's buffer 1 held zeros */

    /* Done: buffer 1 goes; collectives naming it are refused after. */
    f.buf_id = 1;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_BUF_FREE, 8, &f, sizeof(f),
             -1);
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), 0);
    ASSERT_EQ(type, PROTO_T_BUF_FREE);
    sum.buf_id = 1;
    sum.coll_seq = 1;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 9, &sum, sizeof(sum),
             -1);
    expect_error(r[0].fd, RINGD_EINVAL, "unknown buffer id");
    /* The state region's buffer cannot go. */
    proto_state_set_t ss = {0, 0, 0, 64};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_STATE_SET, 10, &ss, sizeof(ss),
             -1);
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), 0);
    f.buf_id = 0;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_BUF_FREE, 11, &f, sizeof(f),
             -1);
    expect_error(r[0].fd, RINGD_ESTATE, "state region");
    close(r[0].fd);
    close(r[1].fd);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/* A trainer lost after the step's last collective (before its step_end)
 * does not void the step: the survivor applied the result and ends it, so
 * the next step is the next one, not the same again (which would apply
 * that update twice). */
TEST_IMPL(dmn_lost_after_collectives_keeps_step)
{
    td_daemon_t t;
    td_init(&t, "dmn-lostafter");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    for (int i = 0; i < 2; i++)
        raw_step_begin(&r[i], 3);
    proto_step_rep_t v0 = raw_step_reply(&r[0]);
    (void)raw_step_reply(&r[1]);
    proto_coll_req_t sum = {.kind = PROTO_COLL_ALLREDUCE, .dtype = RINGD_F32,
                            .count = 16, .op = RINGD_SUM};
    proto_coll_req_t two[2] = {sum, sum};
    both_coll(r, two, 0);
    close(r[1].fd); /* as a SIGKILL would, before its step_end */
    ASSERT_OK(td_wait_file(t.log, "lost at step", 10000));
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_STEP_END, 4, NULL, 0, -1);
    uint32_t type;
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), 0);
    raw_step_begin(&r[0], 5);
    proto_step_rep_t v1 = raw_step_reply(&r[0]);
    ASSERT_EQ(v1.status, 0);
    ASSERT_EQ(v1.world, 1);
    ASSERT_EQ(v1.step, v0.step + 1);
    close(r[0].fd);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * Asynchronous collectives from a hostile client: trainer 0 queues more
 * collectives than the bound without reading a reply, while trainer 1
 * posts nothing. The ones past PROTO_MAX_OUTSTANDING get RINGD_ELIMIT,
 * freeing a queued buffer and ending the step are refused, and once
 * trainer 1 issues the same sequence every queued one completes, in
 * order, with the sums of both.
 */
TEST_IMPL(dmn_async_queue_bound)
{
    td_daemon_t t;
    td_init(&t, "dmn-asyncq");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    for (int i = 0; i < 2; i++)
        raw_step_begin(&r[i], 3);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(raw_step_reply(&r[i]).status, 0);
    enum { N = PROTO_MAX_OUTSTANDING, EXTRA = 3 };
    /* Collective k sums element k: 1024 floats fit one page. */
    for (int k = 0; k < N; k++) {
        r[0].mem[k] = (float)k;
        r[1].mem[k] = 1000.0f;
    }
    for (int k = 0; k < N + EXTRA; k++) {
        proto_coll_req_t q = {.kind = PROTO_COLL_ALLREDUCE,
                              .coll_seq = (uint32_t)k, .dtype = RINGD_F32,
                              .offset = (uint64_t)(k % N) * 4, .count = 1,
                              .op = RINGD_SUM};
        send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 1000 + (uint32_t)k,
                 &q, sizeof(q), -1);
    }
    for (int k = 0; k < EXTRA; k++)
        expect_error(r[0].fd, RINGD_ELIMIT, "too many collectives");
    proto_buf_free_t f = {0, 0};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_BUF_FREE, 5000, &f, sizeof(f),
             -1);
    expect_error(r[0].fd, RINGD_ESTATE, "collective outstanding");
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_STEP_END, 5001, NULL, 0, -1);
    expect_error(r[0].fd, RINGD_ESTATE, "collectives outstanding");
    /* Trainer 1 issues the same sequence; both see every reply in
     * order, trainer 1 reading each before sending the next. */
    for (int k = 0; k < N; k++) {
        proto_coll_req_t q = {.kind = PROTO_COLL_ALLREDUCE,
                              .coll_seq = (uint32_t)k, .dtype = RINGD_F32,
                              .offset = (uint64_t)k * 4, .count = 1,
                              .op = RINGD_SUM};
        send_msg(r[1].fd, PROTO_VERSION, PROTO_T_COLL, 1000 + (uint32_t)k,
                 &q, sizeof(q), -1);
        uint32_t type;
        ASSERT_EQ(recv_reply(r[1].fd, &type, NULL, 0), 0);
        ASSERT_EQ(type, PROTO_T_COLL);
    }
    for (int k = 0; k < N; k++) {
        char buf[PROTO_MAX_MSG];
        struct pollfd p = {r[0].fd, POLLIN, 0};
        ASSERT_EQ(poll(&p, 1, 10000), 1);
        ssize_t n = recv(r[0].fd, buf, sizeof(buf), 0);
        ASSERT_EQ(n, (ssize_t)(sizeof(proto_hdr_t) +
                               sizeof(proto_status_rep_t)));
        proto_hdr_t h;
        memcpy(&h, buf, sizeof(h));
        ASSERT_EQ(h.type, PROTO_T_COLL | PROTO_REPLY);
        ASSERT_EQ(h.seq, 1000 + (uint32_t)k);
        ASSERT(r[0].mem[k] == (float)k + 1000.0f);
        ASSERT(r[1].mem[k] == (float)k + 1000.0f);
    }
    for (int i = 0; i < 2; i++) {
        send_msg(r[i].fd, PROTO_VERSION, PROTO_T_STEP_END, 6000, NULL, 0,
                 -1);
        uint32_t type;
        ASSERT_EQ(recv_reply(r[i].fd, &type, NULL, 0), 0);
        ASSERT_EQ(type, PROTO_T_STEP_END);
    }
    close(r[0].fd);
    close(r[1].fd);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

/*
 * Fusion groups from a hostile client: a group that mixes dtypes or
 * kinds is refused entry by entry (RINGD_EINVAL), a group left open
 * is answered RINGD_ERESHAPE when its trainer begins the step again, and
 * a well-formed group of two allreduces completes with both sums.
 */
TEST_IMPL(dmn_async_fused_hostile)
{
    td_daemon_t t;
    td_init(&t, "dmn-asyncfh");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    raw_trainer_t r[2];
    for (int i = 0; i < 2; i++)
        raw_trainer(&r[i], t.sock);
    for (int i = 0; i < 2; i++)
        raw_step_begin(&r[i], 3);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(raw_step_reply(&r[i]).status, 0);
    proto_coll_req_t more = {.kind = PROTO_COLL_ALLREDUCE_MORE,
                             .dtype = RINGD_F32, .count = 4, .op = RINGD_SUM};
    proto_coll_req_t last = {.kind = PROTO_COLL_ALLREDUCE, .coll_seq = 1,
                             .dtype = RINGD_F32, .offset = 16, .count = 4,
                             .op = RINGD_SUM};
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 10, &more, sizeof(more),
             -1);
    proto_coll_req_t bad = last;
    bad.dtype = RINGD_I32;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 11, &bad, sizeof(bad),
             -1);
    expect_error(r[0].fd, RINGD_EINVAL, "fused group");
    bad = last;
    bad.kind = PROTO_COLL_BROADCAST;
    bad.dtype = RINGD_U8;
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 12, &bad, sizeof(bad),
             -1);
    expect_error(r[0].fd, RINGD_EINVAL, "fused group");
    /* Trainer 1 posts the whole group; trainer 0 ends its own: both
     * sums arrive, two replies each. */
    for (int j = 0; j < 8; j++) {
        r[0].mem[j] = (float)j;
        r[1].mem[j] = 100.0f;
    }
    send_msg(r[1].fd, PROTO_VERSION, PROTO_T_COLL, 10, &more, sizeof(more),
             -1);
    send_msg(r[1].fd, PROTO_VERSION, PROTO_T_COLL, 11, &last, sizeof(last),
             -1);
    send_msg(r[0].fd, PROTO_VERSION, PROTO_T_COLL, 13, &last, sizeof(last),
             -1);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            uint32_t type;
            ASSERT_EQ(recv_reply(r[i].fd, &type, NULL, 0), 0);
            ASSERT_EQ(type, PROTO_T_COLL);
        }
    for (int j = 0; j < 8; j++)
        ASSERT(r[0].mem[j] == (float)j + 100.0f &&
               r[1].mem[j] == (float)j + 100.0f);
    /* A group never ended: nothing runs; a new step_begin answers it. */
    more.coll_seq = 2;
    for (int i = 0; i < 2; i++)
        send_msg(r[i].fd, PROTO_VERSION, PROTO_T_COLL, 20, &more,
                 sizeof(more), -1);
    raw_step_begin(&r[0], 21);
    uint32_t type;
    ASSERT_EQ(recv_reply(r[0].fd, &type, NULL, 0), RINGD_ERESHAPE);
    ASSERT_EQ(type, PROTO_T_COLL);
    ASSERT_EQ(recv_reply(r[1].fd, &type, NULL, 0), RINGD_ERESHAPE);
    ASSERT_EQ(type, PROTO_T_COLL);
    raw_step_begin(&r[1], 22);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(raw_step_reply(&r[i]).status, 0);
    close(r[0].fd);
    close(r[1].fd);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
