/*
 * ringd.h - the client API of ringd: what a training process links.
 *
 * A trainer talks only to the ringd daemon of its own node, over a Unix
 * socket. Tensors never travel through that socket: the trainer allocates
 * shared buffers with ringd_buffer() (memfd segments that the daemon maps
 * too) and names them in its requests. The daemon sums the node's trainers
 * locally, runs the cross-node part, and writes the result back into every
 * trainer's buffer.
 *
 * The step protocol (client/README.md and daemon/README.md say more):
 *
 *     ringd_client_t *c;
 *     ringd_connect(&c, NULL, NULL);
 *     float *params = ringd_buffer(c, pbytes);
 *     float *grads = ringd_buffer(c, gbytes);
 *     ringd_state(c, params, pbytes);
 *     for (;;) {
 *         ringd_view_t v;
 *         if (ringd_step_begin(c, &v) != 0) break;
 *         if (v.step >= steps) break;
 *         compute_gradients(grads, shard(v.rank, v.world));
 *         int rc = ringd_allreduce(c, grads, n, RINGD_F32, RINGD_AVG);
 *         if (rc == RINGD_ERESHAPE || rc == RINGD_EDISCONNECTED)
 *             continue;                 // redo this step on the new view
 *         apply_update(params, grads);
 *         ringd_step_end(c);
 *     }
 *     ringd_close(c);
 *
 * Threading: a ringd_client_t is not thread-safe; use it from one thread
 * at a time (one client per trainer process is the intended use). Distinct
 * clients are independent.
 *
 * Errors: every function that can fail returns 0 or a negative RINGD_*
 * code below; ringd_strerror() describes a code, ringd_last_error() gives
 * the detailed message of the client's last failure. The numeric values
 * are part of the ABI and never change.
 */
#ifndef RINGD_H
#define RINGD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RINGD_API_VERSION 1
#define RINGD_DEFAULT_SOCKET "/run/ringd/ringd.sock"

/* Error codes: stable ABI. */
enum {
    RINGD_OK = 0,
    RINGD_EINVAL = -1,        /* bad argument (pointer not in a buffer...) */
    RINGD_ENODAEMON = -2,     /* no daemon listens on the socket path */
    RINGD_EDISCONNECTED = -3, /* the daemon went away (restart, crash) */
    RINGD_EVERSION = -4,      /* client and daemon speak other versions */
    RINGD_EPROTO = -5,        /* malformed message (either direction) */
    RINGD_ERESHAPE = -6,      /* view changed: redo the step */
    RINGD_ENOMEM = -7,        /* allocation or mapping failed */
    RINGD_ENOTSUP = -8,       /* not implemented by this daemon */
    RINGD_ESYS = -9,          /* a system call failed (see last_error) */
    RINGD_ETIMEDOUT = -10,    /* the daemon did not answer in time */
    RINGD_EMISMATCH = -11,    /* trainers posted different collectives */
    RINGD_ESHUTDOWN = -12,    /* the daemon drains: stop training */
    RINGD_EFENCED = -13,      /* the node lost its lease: wait, reconnect */
    RINGD_ESTATE = -14,       /* call out of order (e.g. no step begun) */
    RINGD_EABORTED = -15,     /* the collective failed for another reason */
    RINGD_ELIMIT = -16,       /* too many collectives outstanding */
};

/* The most asynchronous collectives a client may have issued and not yet
 * waited for (ringd_wait/ringd_test), per client. */
#define RINGD_MAX_OUTSTANDING 128

/* Element types and reductions (values match the daemon's kernels). */
typedef enum {
    RINGD_F32 = 0,
    RINGD_F64 = 1,
    RINGD_F16 = 2,
    RINGD_BF16 = 3,
    RINGD_I32 = 4,
    RINGD_I64 = 5,
    RINGD_U8 = 6,
} ringd_dtype_t;

typedef enum {
    RINGD_SUM = 0,
    RINGD_PROD = 1,
    RINGD_MIN = 2,
    RINGD_MAX = 3,
    RINGD_AVG = 4, /* sum, then divide by the global trainer count */
} ringd_op_t;

/*
 * Compression of one f32 allreduce between nodes (ringd_allreduce_wire):
 * the values travel as 16-bit floats and are accumulated in f32; within
 * a node nothing is rounded. Every replica still ends bitwise identical
 * (each chunk is rounded once, by the node that finishes it, and copied
 * from there). Against the same allreduce in f32, each element of the
 * result is within n * 2^-8 * sum(|x|) (bf16) or n * 2^-11 * sum(|x|)
 * (f16) of it (plus f32's own rounding), n the nodes and the sum over
 * every trainer's element
 * (every hop rounds the partial sum once); f16 also overflows past
 * 65504. Half the bytes on the wire.
 */
typedef enum {
    RINGD_WIRE_DEFAULT = 0, /* the job's (ringd's ring-wire option) */
    RINGD_WIRE_NONE = 1,    /* f32 on the wire, whatever the job's */
    RINGD_WIRE_BF16 = 2,
    RINGD_WIRE_F16 = 3,
} ringd_wire_t;

typedef struct ringd_client ringd_client_t;

typedef struct {
    uint32_t struct_size;  /* sizeof(ringd_opts_t); 0 means defaults */
    /* Bound every wait for the daemon, in ms; 0 waits forever (a step may
     * wait long for slow peers, so the default is forever). A call that
     * times out returns RINGD_ETIMEDOUT and closes the connection (a late
     * reply would desynchronise it); ringd_step_begin() reconnects. */
    uint32_t timeout_ms;
    /* Non-zero: ringd_step_begin() reconnects by itself after
     * RINGD_EDISCONNECTED (default on; see ringd_reconnect()). */
    int auto_reconnect;
    /* With auto_reconnect: how long (s) to wait for a daemon that went
     * away (closed the socket, or nobody listens) to come back, trying
     * to reconnect meanwhile, before giving up with RINGD_ENODAEMON.
     * 0: no wait (reconnect once, at ringd_step_begin(), as before);
     * -1 (ringd_opts_init's): $RINGD_RECONNECT_S, else
     * RINGD_RECONNECT_DEFAULT_S. At most RINGD_RECONNECT_MAX_S; a value
     * outside -1..max (or in $RINGD_RECONNECT_S) makes ringd_connect()
     * fail with RINGD_EINVAL. See ringd_step_begin(). It sits where the
     * struct had padding, so the struct's size and layout are those of
     * before: a caller built against an older ringd.h that zeroed the
     * struct reads as 0 (no wait); one that called ringd_opts_init()
     * gets the default. */
    int32_t reconnect_s;
    const char *name;      /* shown in the daemon's logs; may be NULL */
    /* The job this trainer runs (added at the end: a caller built
     * against an older ringd.h passes a smaller struct_size and reads as
     * NULL). NULL: $RINGD_JOB, else none. A daemon whose config pins no
     * job serves the job its first trainer names; one that runs a job
     * refuses a trainer naming another with RINGD_ESTATE and a message
     * naming both (ringd_last_error()). 1..RINGD_JOB_NAME_MAX characters
     * of [A-Za-z0-9_.-], not starting with '.'; another name makes
     * ringd_connect() fail with RINGD_EINVAL. */
    const char *job;
} ringd_opts_t;

#define RINGD_JOB_NAME_MAX 64

#define RINGD_RECONNECT_DEFAULT_S 30
#define RINGD_RECONNECT_MAX_S 3600

/* What ringd_step_begin() returns. */
typedef struct {
    uint32_t rank;        /* global rank of this trainer, 0..world-1 */
    uint32_t world;       /* global number of trainers in this step */
    uint32_t local_rank;  /* rank among this node's trainers */
    uint32_t local_world; /* trainers of this node in this step */
    uint64_t step;        /* the step to compute (the job's counter) */
    uint64_t generation;  /* view generation; changes on every reshape */
    int restored;         /* 1: the state region was just overwritten by
                           * the job's state (joiner); 0 otherwise */
} ringd_view_t;

/* Fill *opts with defaults. */
void ringd_opts_init(ringd_opts_t *opts);

/*
 * Connect to the daemon listening at socket_path (NULL: $RINGD_SOCKET, else
 * RINGD_DEFAULT_SOCKET). opts may be NULL. On success *c_p owns the
 * connection; free it with ringd_close().
 * Errors: RINGD_ENODAEMON (no socket or nobody listening: the message names
 * the path), RINGD_EVERSION, RINGD_ENOMEM, RINGD_ESYS, RINGD_ETIMEDOUT.
 */
int ringd_connect(ringd_client_t **c_p, const char *socket_path,
                  const ringd_opts_t *opts);

/*
 * A shared buffer of `bytes` bytes (rounded up to a page), zero-filled,
 * mapped read-write in this process and in the daemon (a memfd sealed
 * against resizing, so neither side can fault the other). Returns NULL on
 * failure (see ringd_last_error()): RINGD_ENOMEM also when the daemon's
 * per-client limits (--max-client-buffers, --max-client-mib) are reached.
 * The client owns it: it stays valid until ringd_buffer_free() or
 * ringd_close(), across reconnects. Tensors passed to ringd_allreduce and
 * ringd_broadcast must lie inside such a buffer.
 */
void *ringd_buffer(ringd_client_t *c, size_t bytes);

/*
 * Free a buffer: ptr is what ringd_buffer() returned. The daemon unmaps it,
 * then this process does; ptr and every pointer into the buffer are
 * invalid afterwards, and its id is reused by a later ringd_buffer().
 * Allowed inside a step. While disconnected it frees at once (the daemon's
 * mapping went with the connection).
 * Errors (the buffer is then still valid): RINGD_EINVAL (ptr does not
 * start a buffer of c), RINGD_ESTATE (the buffer holds the state region,
 * or a collective on it is outstanding), RINGD_ETIMEDOUT, RINGD_EPROTO.
 */
int ringd_buffer_free(ringd_client_t *c, void *ptr);

/*
 * Declare [ptr, ptr+bytes), inside one ringd buffer, as this trainer's
 * state: what checkpoints hold and what a joining trainer receives before
 * its first step (ringd_view_t.restored). Calling it again replaces the
 * region. Errors: RINGD_EINVAL, RINGD_EDISCONNECTED, RINGD_EPROTO.
 */
int ringd_state(ringd_client_t *c, void *ptr, size_t bytes);

/*
 * Start (or restart, after RINGD_ERESHAPE) a step. Blocks until every
 * trainer of the node that takes part in the step has called it, then
 * fills *view. If the trainer is new to a running job and has a state
 * region, the region holds the job's state when this returns
 * (view->restored = 1).
 * With opts.auto_reconnect (the default), a connection known to be lost
 * is re-opened first (as ringd_reconnect()), and if this request itself
 * finds the daemon gone it reconnects and asks again.
 *
 * A daemon that goes away (restarted: `systemctl reload ringd`, SIGUSR2,
 * a crash that systemd restarts) is waited for up to opts.reconnect_s
 * (default 30 s), with one line on stderr ("ringd: daemon gone, waiting
 * up to 30 s for it to come back"): the client retries the connection,
 * registers the same buffers and state region with the new daemon, and
 * the step goes on from there. Calls inside a step (the collectives,
 * ringd_wait/ringd_test, ringd_group_end, ringd_step_end) that find the
 * daemon gone wait the same way and then return RINGD_ERESHAPE (so do
 * the step's outstanding handles): redo the step; ringd_step_begin()
 * itself waits and returns the new daemon's view (restored = 1 when the
 * job's state was written into the state region, as for any joiner).
 * If the window runs out: RINGD_ENODAEMON, with a message saying so.
 * A daemon that stops (SIGTERM: a drain) still answers RINGD_ESHUTDOWN.
 *
 * Errors: RINGD_EDISCONNECTED (reconnect_s 0 or auto_reconnect off),
 * RINGD_ESHUTDOWN (the daemon drains: stop), RINGD_EFENCED,
 * RINGD_ETIMEDOUT, RINGD_ENODAEMON (reconnect failed, or the window ran
 * out).
 */
int ringd_step_begin(ringd_client_t *c, ringd_view_t *view);

/*
 * In-place allreduce of count elements at ptr (inside a ringd buffer) over
 * every trainer of the job. Blocks until the result is in ptr.
 * Returns 0, or RINGD_ERESHAPE when a view change aborted the collective:
 * ptr's content is then undefined and the trainer must redo the step
 * (call ringd_step_begin() again without ringd_step_end()). Other errors:
 * RINGD_EINVAL, RINGD_ESTATE (no step begun), RINGD_EMISMATCH (trainers of
 * the node posted different collectives), RINGD_EDISCONNECTED.
 * The daemon works in the shared buffer itself while the call runs (with
 * one trainer per node the ring sends from and writes into ptr directly):
 * no thread of the trainer may touch [ptr, ptr + count elements) until it
 * returns, or the nodes may end with different results.
 */
int ringd_allreduce(ringd_client_t *c, void *ptr, size_t count,
                    ringd_dtype_t dtype, ringd_op_t op);

/*
 * Broadcast bytes at ptr (inside a ringd buffer) from the trainer of global
 * rank root to all trainers. Errors as ringd_allreduce().
 */
int ringd_broadcast(ringd_client_t *c, void *ptr, size_t bytes,
                    uint32_t root);

/*
 * Asynchronous collectives. A handle names one collective issued with
 * ringd_allreduce_async() or ringd_broadcast_async(); 0 is never a valid
 * handle. Issuing returns at once: the daemon queues the collective and
 * runs the node's queued collectives one after the other, without waiting
 * for the trainer between them. Collectives are matched across the node's
 * trainers and across nodes by their order of issue within the step
 * (blocking and asynchronous ones alike), so every trainer of the job
 * must issue the same sequence; they may be waited for in any order.
 * As for the blocking calls, no thread may touch a collective's elements
 * until its handle has been waited for (or tested done).
 *
 * A view change fails every outstanding handle of the step with
 * RINGD_ERESHAPE (the step is then redone from ringd_step_begin()), and so
 * does every collective issued later in that step. ringd_step_begin()
 * voids the handles of the step it leaves; ringd_step_end() refuses
 * (RINGD_ESTATE) while a handle of the step has not been waited for.
 * The blocking ringd_allreduce()/ringd_broadcast() are an issue plus a
 * wait.
 *
 * Asynchronous allreduces that queue behind a running collective may be
 * fused by the daemons into one ring operation (ringd's ring-fuse-kib,
 * on by default for jobs of several nodes): only ones that do not
 * overlap, each result as if run alone up to the summation order, so
 * the bits may differ from run to run with the timing (replicas stay
 * identical). A job that needs the same bits every run turns it off or
 * issues its own fusion groups (ringd_group_start()), which fuse the
 * same way every time.
 */
typedef uint64_t ringd_handle_t;

/*
 * Issue an allreduce as ringd_allreduce() does, without waiting; *h_p
 * receives its handle. Errors (no handle is then returned): RINGD_EINVAL,
 * RINGD_ESTATE (no step begun), RINGD_ERESHAPE (an earlier collective of
 * this step failed with it: redo the step), RINGD_ELIMIT (already
 * RINGD_MAX_OUTSTANDING handles not waited for: wait for some first),
 * RINGD_EDISCONNECTED.
 */
int ringd_allreduce_async(ringd_client_t *c, void *ptr, size_t count,
                          ringd_dtype_t dtype, ringd_op_t op,
                          ringd_handle_t *h_p);

/*
 * An allreduce with the wire format of this call (ringd_wire_t), next to
 * others of the same step in any format: ringd_allreduce_async() and
 * ringd_allreduce() are these with RINGD_WIRE_DEFAULT, the job's format
 * (ringd's ring-wire, none unless configured). The format is part of the
 * collective: every trainer of the job must issue the same one
 * (RINGD_EMISMATCH within a node otherwise), and in a fusion group only
 * consecutive allreduces of one dtype, op and format fuse. Errors as
 * ringd_allreduce_async(), and RINGD_EINVAL for a format outside
 * ringd_wire_t or RINGD_WIRE_BF16/F16 with a dtype other than RINGD_F32.
 * A one-node job reduces in f32 whatever the format (nothing crosses a
 * wire).
 */
int ringd_allreduce_wire_async(ringd_client_t *c, void *ptr, size_t count,
                               ringd_dtype_t dtype, ringd_op_t op,
                               ringd_wire_t wire, ringd_handle_t *h_p);
int ringd_allreduce_wire(ringd_client_t *c, void *ptr, size_t count,
                         ringd_dtype_t dtype, ringd_op_t op,
                         ringd_wire_t wire);

/* Issue a broadcast as ringd_broadcast() does, without waiting. Errors as
 * ringd_allreduce_async(). */
int ringd_broadcast_async(ringd_client_t *c, void *ptr, size_t bytes,
                          uint32_t root, ringd_handle_t *h_p);

/*
 * Wait until the collective of handle h completes and release the handle.
 * Returns its outcome: 0, or the errors of ringd_allreduce() (among them
 * RINGD_ERESHAPE, RINGD_EMISMATCH, RINGD_EDISCONNECTED, RINGD_ETIMEDOUT
 * with opts.timeout_ms). RINGD_EINVAL: h is not an outstanding handle of c
 * (never issued, already waited for, or voided by ringd_step_begin()), or
 * the trainer unmapped (munmap) the collective's memory while it was
 * outstanding: the collective ran (the daemon maps the buffer itself, so
 * it and the job carry on) but its result cannot reach this process; the
 * buffer is still to be freed with ringd_buffer_free(). Freeing a buffer
 * with ringd_buffer_free() while a collective on it is outstanding is
 * refused (RINGD_ESTATE, the buffer stays valid).
 */
int ringd_wait(ringd_client_t *c, ringd_handle_t h);

/*
 * Whether the collective of handle h is complete, without blocking (but
 * for the wait for a daemon that went away: ringd_step_begin()). Not
 * complete: *done_p = 0 and 0 is returned, the handle stays outstanding.
 * Complete: *done_p = 1, the handle is released, and its outcome is
 * returned as by ringd_wait(). RINGD_EINVAL (with *done_p = 1): h is not
 * an outstanding handle of c.
 */
int ringd_test(ringd_client_t *c, ringd_handle_t h, int *done_p);

/*
 * Fusion groups. Between ringd_group_start() and ringd_group_end() the
 * asynchronous calls only queue in the library (their handles are
 * valid, but ringd_wait/ringd_test answer RINGD_ESTATE until the end);
 * ringd_group_end() sends the group, and the daemon runs each run of
 * consecutive allreduces of the group with the same dtype and op as ONE
 * ring operation: it gathers their tensors into a fused buffer on its
 * ring thread and scatters the result back (no copy in the trainer, one
 * ring round trip for the run instead of one per tensor). Results are the
 * same as unfused up to the summation order (bitwise the same as one
 * allreduce over the tensors laid end to end). Each handle is waited for
 * as usual; a failure fails them all alike. Every trainer of the job must
 * group alike (a different grouping is RINGD_EMISMATCH). Blocking calls
 * inside a group fail with RINGD_ESTATE, as do step_end and a second
 * ringd_group_start(); ringd_step_begin() discards an open group. Errors:
 * RINGD_EINVAL, RINGD_ESTATE (no step begun), RINGD_ERESHAPE as for
 * ringd_allreduce_async(); ringd_group_end() also RINGD_EDISCONNECTED
 * (its handles then fail with it).
 */
int ringd_group_start(ringd_client_t *c);
int ringd_group_end(ringd_client_t *c);

/*
 * Allgather: ptr (inside a ringd buffer) holds world * bytes, world being
 * the step's (ringd_view_t.world); this trainer's contribution is at
 * ptr + rank * bytes. On completion every trainer's ptr holds every
 * trainer's chunk in rank order. The library zeroes the other chunks
 * before issuing it, so they need not be written. Implemented as an
 * allreduce (u8 SUM) of the whole region: exact for any bytes, at twice
 * the ring traffic of a dedicated allgather. Issue, matching and errors
 * as ringd_allreduce_async(); RINGD_EINVAL also when world * bytes does
 * not fit in the buffer. ringd_allgather() is the issue plus ringd_wait()
 * (RINGD_ESTATE inside a fusion group), with the errors of both.
 */
int ringd_allgather_async(ringd_client_t *c, void *ptr, size_t bytes,
                          ringd_handle_t *h_p);
int ringd_allgather(ringd_client_t *c, void *ptr, size_t bytes);

/*
 * Barrier: completes once every trainer of the job has issued it (in the
 * same place of its sequence of collectives). The first one allocates a
 * one-page buffer of the library's (one of the client's buffers, toward
 * the daemon's per-client limits: RINGD_ENOMEM past them). Errors as
 * ringd_allreduce_async(); ringd_barrier() is the issue plus ringd_wait()
 * (RINGD_ESTATE inside a fusion group), with the errors of both.
 */
int ringd_barrier_async(ringd_client_t *c, ringd_handle_t *h_p);
int ringd_barrier(ringd_client_t *c);

/* End the step: the update has been applied. In a job of several nodes
 * it returns once every node finished the step (the commit round: one
 * small message around the ring), so a step it answers RINGD_OK for is
 * a step of the job on every node. Errors: RINGD_ERESHAPE or
 * RINGD_EFENCED: the step did not count (this node was dropped from the
 * job before every node finished it, or the trainer was timed out of
 * it); call ringd_step_begin() again, which restores the job's state
 * into the state region (restored = 1) before the step is redone.
 * RINGD_ESTATE (no step begun, or a handle of the step not yet waited
 * for), RINGD_EDISCONNECTED. */
int ringd_step_end(ringd_client_t *c);

/*
 * Ask for a checkpoint of the state region. Returns at once: RINGD_OK
 * (taken, on every node of the job, at the end of the next step that
 * starts), RINGD_ENOTSUP when the daemon runs with checkpoints off
 * (--ckpt-interval 0). A checkpoint still being written makes it skipped
 * (counted in ringd_checkpoints_skipped_total), like a periodic one.
 */
int ringd_checkpoint(ringd_client_t *c);

/*
 * Reconnect after RINGD_EDISCONNECTED: open a new connection to the same
 * path and register the same buffers (same addresses, same content; the
 * client kept their memfds) and state region again. The interrupted step is
 * lost: the next call must be ringd_step_begin(). Returns 0 or the errors
 * of ringd_connect().
 */
int ringd_reconnect(ringd_client_t *c);

/* A static description of a RINGD_* code. Never NULL. */
const char *ringd_strerror(int rc);

/* The detailed message of the last failed call on c ("" if none). Valid
 * until the next call on c. With c NULL: the message of the calling
 * thread's last failed ringd_connect() ("" if none), e.g. the daemon's
 * refusal of opts.job. */
const char *ringd_last_error(const ringd_client_t *c);

/* Disconnect, unmap and free every buffer. Accepts NULL. */
void ringd_close(ringd_client_t *c);

#ifdef __cplusplus
}
#endif

#endif /* RINGD_H */
