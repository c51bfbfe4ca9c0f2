/*
 * ckpt.h - checkpoint shards: encoding, files, manifests, restore.
 *
 * Replicated data-parallel state is identical on every node, so at step S
 * node r encodes only shard r of it. A shard file is a fixed header
 * followed by one zstd frame:
 *
 *   raw shard --(delta against the base checkpoint's shard, if delta)-->
 *             --(byte- or bit-shuffle by element size)--> zstd (checksum)
 *
 * The delta is the zigzag-coded integer difference of the 32-bit words
 * (CKPT_F_DELTA | CKPT_F_DELTA_SUB, elem_size 4, the default) or, in
 * files of the first format and for other element sizes, their XOR
 * (CKPT_F_DELTA alone). Flags name the transforms, so every file written
 * since the first format still decodes; an unknown flag is rejected.
 *
 * The header carries the step, generation, shard index, sizes, the xxh64
 * of the raw (decoded) shard and its own xxh64, so a reader can tell a
 * good shard from a torn, truncated or flipped one without trusting
 * anything it has not checked. Files are written atomically (temp name,
 * fsync, rename, fsync of the directory): a crash leaves either the old
 * state or the complete new file, never a file that looks complete and is
 * not.
 *
 * Everything here is synchronous and thread-safe on distinct objects; the
 * asynchronous pipeline (snapshot, worker threads, back pressure) is
 * ckpt_writer_* below.
 */
#ifndef RINGD_CKPT_H
#define RINGD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_FORMAT_VERSION 1

enum {
    CKPT_F_DELTA = 1u << 0,      /* against the shard of base_step: XOR, */
    CKPT_F_SHUFFLE = 1u << 1,    /* bytes grouped by position in an element */
    CKPT_F_DELTA_SUB = 1u << 2,  /* ... or zigzag(new - base) per u32 word */
    CKPT_F_BITSHUFFLE = 1u << 3, /* bit planes instead of byte-shuffle */
    CKPT_F_PIECES = 1u << 4,     /* shuffled piece by piece (piece_size) */
    CKPT_F_ALL = 0x1f,           /* every flag a reader understands */
};

/*
 * The piece a streaming encoder transforms and compresses at a time: its
 * memory is a few pieces, not a few shards. A multiple of every element
 * size and of a bit-shuffle block, so only the byte-shuffle differs from
 * a whole-shard encoding (it groups bytes within each piece).
 */
#define CKPT_PIECE_BYTES (4u << 20)

/* Elements per bit-shuffle block (CKPT_F_BITSHUFFLE): 32 KiB of f32. */
#define CKPT_BITSHUFFLE_BLOCK 8192

typedef struct {
    int level;           /* zstd level (default 3) */
    int threads;         /* zstd worker threads, 0 = in the caller */
    uint32_t elem_size;  /* shuffle unit: 4 for f32 state, 1 = no shuffle */
    int xor_delta;       /* 1: XOR deltas (the first format); 0: the
                            arithmetic delta where elem_size is 4 */
    int bitshuffle;      /* 1: bit-shuffle where elem_size is 4 (measured
                            worse than byte-shuffle on weights: off) */
} ckpt_codec_t;

/* What a shard file says about itself (all validated on read). */
typedef struct {
    uint64_t step;
    uint64_t generation;
    uint64_t base_step;  /* valid when flags & CKPT_F_DELTA */
    uint64_t offset;     /* of this shard within the whole state */
    uint64_t raw_size;   /* bytes of state in this shard */
    uint64_t total_size; /* bytes of the whole state */
    uint64_t raw_xxh64;  /* of the raw shard bytes */
    uint64_t comp_size;  /* bytes of the zstd frame after the header */
    uint32_t shard;
    uint32_t nshards;
    uint32_t flags;
    uint32_t elem_size;
    uint32_t piece_size; /* with CKPT_F_PIECES, else 0 */
} ckpt_shard_info_t;

/* The byte range of shard i of n over total bytes, aligned to elem. */
void ckpt_shard_range(uint64_t total, uint32_t n, uint32_t i, uint32_t elem,
                      uint64_t *offset_p, uint64_t *size_p);

/*
 * Encode raw (info->raw_size bytes) into a complete shard file image.
 * base is the raw shard of info->base_step when info->flags has
 * CKPT_F_DELTA, else NULL. Fills info->raw_xxh64 and comp_size. On success
 * *file_p is malloc'd (caller frees) and *len_p its length.
 */
int ckpt_shard_encode(const ckpt_codec_t *codec, ckpt_shard_info_t *info,
                      const void *raw, const void *base, void **file_p,
                      size_t *len_p);

/*
 * The same with the zstd context and the work and output buffers kept
 * between calls (grow-only), so a writer does not allocate and fault in
 * about three shards of fresh memory for every checkpoint. *file_p points
 * into enc: valid until the next call or ckpt_encoder_destroy(), not to be
 * freed. One encoder per thread. create: 0 or ST_ENOMEM; destroy accepts
 * NULL.
 */
typedef struct ckpt_encoder ckpt_encoder_t;
int ckpt_encoder_create(ckpt_encoder_t **enc_p);
void ckpt_encoder_destroy(ckpt_encoder_t *enc);
int ckpt_encoder_encode(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                        ckpt_shard_info_t *info, const void *raw,
                        const void *base, const void **file_p,
                        size_t *len_p);

/*
 * The streaming form, for the writer: the shard is delta'd, shuffled and
 * compressed CKPT_PIECE_BYTES at a time into one zstd frame written to f
 * as it is produced (CKPT_F_PIECES), and the header, complete only at the
 * end (sizes, raw xxh64), is written last at offset 0. The encoder holds
 * about three pieces and zstd's window, whatever the shard's size. *len_p:
 * the file's length. The caller commits or aborts f.
 */
typedef struct ckpt_afile ckpt_afile_t;
int ckpt_encoder_write(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                       ckpt_shard_info_t *info, const void *raw,
                       const void *base, ckpt_afile_t *f, size_t *len_p);

/*
 * A full (not delta) CKPT_F_PIECES shard file read back piece by piece,
 * so a delta's base need not be held in memory: open checks the header
 * (*info_p), next decodes the next m raw bytes (m: the next piece's
 * length, min(piece_size, what is left)) into dst, close returns 0 only
 * if every byte was read, the zstd frame ended with its checksum and the
 * decoded bytes match the header's xxh64 (else ST_ECORRUPT: a delta
 * encoded against them is void). close accepts NULL.
 */
typedef struct ckpt_piece_reader ckpt_piece_reader_t;
int ckpt_piece_reader_open(const char *path, ckpt_shard_info_t *info_p,
                           ckpt_piece_reader_t **r_p);
int ckpt_piece_reader_next(ckpt_piece_reader_t *r, void *dst, size_t m);
int ckpt_piece_reader_close(ckpt_piece_reader_t *r);
/* ckpt_encoder_write with the base read piece by piece from r. */
int ckpt_encoder_write_rd(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                          ckpt_shard_info_t *info, const void *raw,
                          ckpt_piece_reader_t *base, ckpt_afile_t *f,
                          size_t *len_p);

/* Validate the header of a file image (not the payload). */
int ckpt_shard_peek(const void *file, size_t len, ckpt_shard_info_t *info_p);
/* The same for a file on disk, reading only its header. */
int ckpt_shard_peek_file(const char *path, ckpt_shard_info_t *info_p);

/*
 * Decode and verify a file image into raw (raw_cap >= info.raw_size).
 * base: the decoded shard of info.base_step for a delta shard, else NULL
 * (ST_EINVAL if a delta shard comes without it). ST_ECORRUPT when any
 * check fails: header checksum, sizes, zstd frame checksum, raw xxh64.
 */
int ckpt_shard_decode(const void *file, size_t len, const void *base,
                      void *raw, size_t raw_cap, ckpt_shard_info_t *info_p);

/* Byte-shuffle / unshuffle n bytes by element size (n % elem may be > 0:
 * the tail is copied as is). dst and src must not overlap. */
void ckpt_shuffle(void *dst, const void *src, size_t n, uint32_t elem);
void ckpt_unshuffle(void *dst, const void *src, size_t n, uint32_t elem);
/* dst[i] = a[i] ^ b[i] (dst may be a or b). */
void ckpt_xor(void *dst, const void *a, const void *b, size_t n);
/*
 * The arithmetic delta of n bytes as native 32-bit words: dst = zigzag(a -
 * b) word by word (a small change has zero high bytes even when it
 * carries across a mantissa boundary, unlike a XOR); the n % 4 tail bytes
 * are XORed. ckpt_sub_undo: dst = b + unzigzag(d). dst may be a (or d).
 */
void ckpt_sub(void *dst, const void *a, const void *b, size_t n);
void ckpt_sub_undo(void *dst, const void *d, const void *b, size_t n);
/*
 * Bit-shuffle n bytes of 32-bit elements: in blocks of
 * CKPT_BITSHUFFLE_BLOCK elements (the last one shorter), bit-plane p of
 * the block holds bit p of every element, 8 elements a byte. The elements
 * past the last multiple of 8 and the n % 4 tail bytes are copied as is.
 * dst and src must not overlap.
 */
void ckpt_bitshuffle(void *dst, const void *src, size_t n);
void ckpt_bitunshuffle(void *dst, const void *src, size_t n);

/*
 * A staging buffer of n bytes: anonymous memory, transparent huge pages
 * asked for (MADV_HUGEPAGE), every page faulted in now so a snapshot into
 * it never pays for page faults. NULL if out of memory. Free with
 * ckpt_stage_free(p, n) (NULL is ok).
 */
void *ckpt_stage_alloc(size_t n);
void ckpt_stage_free(void *p, size_t n);
/*
 * The snapshot copy of n bytes into a stage, as the writer makes it:
 * from CKPT_STREAM_MIN bytes with non-temporal stores (kern_copy_stream),
 * since the encoder reads the stage later, after the trainers' next steps
 * have taken the cache, and the stores then skip reading every line
 * first (16 MiB from a shared mapping: 56-60 ms per GiB against glibc
 * memcpy's 78-80 on the development VM); plain memcpy below.
 */
#define CKPT_STREAM_MIN (8u << 20)
void ckpt_stage_copy(void *stage, const void *src, size_t n);

/* ---- files ---------------------------------------------------------- */

/*
 * Write data to dir/name atomically: a temporary dir/.name.tmp.<pid>.XXXXXX
 * of this call alone (several writers of one name may run at once), fsync,
 * rename, fsync(dir). On failure nothing named `name` changes and the temp file
 * is removed. Returns 0 or -errno (-ENOSPC on a full disk).
 */
int ckpt_write_atomic(const char *dir, const char *name, const void *data,
                      size_t len);
/* The same, but only if dir/name does not exist yet: -EEXIST (nothing
 * changed, nothing logged) if it does. */
int ckpt_write_atomic_new(const char *dir, const char *name,
                          const void *data, size_t len);
/*
 * The same, written as it is produced: open creates the temporary file;
 * commit fsyncs, renames it to name and fsyncs dir (and frees f, whatever
 * the result: on failure the temp file is removed); abort removes it.
 * All return 0 or -errno.
 */
int ckpt_afile_open(const char *dir, const char *name, ckpt_afile_t **f_p);
int ckpt_afile_write(ckpt_afile_t *f, const void *data, size_t len);
int ckpt_afile_pwrite(ckpt_afile_t *f, const void *data, size_t len,
                      uint64_t off);
int ckpt_afile_commit(ckpt_afile_t *f);
void ckpt_afile_abort(ckpt_afile_t *f);
/* Read a whole file (at most max bytes, else ST_ECORRUPT); caller frees. */
int ckpt_read_file(const char *path, size_t max, void **data_p,
                   size_t *len_p);
/* mkdir -p with mode 0755. */
int ckpt_mkdirs(const char *path);

/* ---- manifests -------------------------------------------------------- */

typedef struct {
    uint64_t offset, size, raw_xxh64, base_step;
    uint32_t owner;   /* member index that wrote it */
    uint32_t replica; /* member index that holds the copy */
    uint32_t flags;
} ckpt_manifest_shard_t;

/* A complete checkpoint: every shard written and replicated. */
typedef struct {
    uint64_t step;
    uint64_t generation;
    uint64_t total_size;
    uint32_t elem_size;
    uint32_t nshards;
    char **members;      /* node ids by member index, nshards of them */
    ckpt_manifest_shard_t *shards;
} ckpt_manifest_t;

ckpt_manifest_t *ckpt_manifest_new(uint32_t nshards);
void ckpt_manifest_free(ckpt_manifest_t *m);
/* JSON text (malloc'd) for etcd and the local MANIFEST.json. */
int ckpt_manifest_to_json(const ckpt_manifest_t *m, char **json_p);
/* Parse and validate (shards tile [0, total) in order, sizes sane). */
int ckpt_manifest_from_json(const char *json, size_t len,
                            ckpt_manifest_t **m_p);

/* ---- the on-disk store --------------------------------------------------
 *
 * root/step-<020 step>/shard-<05 i>.rckp     written by the shard's owner
 * root/step-<020 step>/replica-<05 i>.rckp   stored by its ring successor
 * root/step-<020 step>/MANIFEST.json         written last: "complete"
 *
 * A step directory without MANIFEST.json is incomplete and never used for
 * a restore; retention deletes it like any older step.
 */
int ckpt_store_step_dir(const char *root, uint64_t step, char *buf,
                        size_t len);
/* Write a shard or replica file image for (step, shard). */
int ckpt_store_put(const char *root, uint64_t step, uint32_t shard,
                   int replica, const void *file, size_t len);
/* The path of that file (0, or -ENAMETOOLONG). */
int ckpt_store_shard_path(const char *root, uint64_t step, uint32_t shard,
                          int replica, char *buf, size_t len);
/* Open the same file for a streaming write (ckpt_encoder_write). */
int ckpt_store_open(const char *root, uint64_t step, uint32_t shard,
                    int replica, ckpt_afile_t **f_p);
/* Write m as its step's MANIFEST.json, unless the step already has one
 * that describes the same checkpoint (every field but the member names,
 * which the directory's record and the job's give differently): that one
 * stays byte for byte, so a complete checkpoint never changes under a
 * reader. A different or unreadable one is replaced. */
int ckpt_store_put_manifest(const char *root, const ckpt_manifest_t *m);
/* Steps with a MANIFEST.json, newest first (caller frees *steps_p). */
int ckpt_store_list(const char *root, uint64_t **steps_p, size_t *n_p);
int ckpt_store_load_manifest(const char *root, uint64_t step,
                             ckpt_manifest_t **m_p);
/* Keep the newest `keep` complete steps; delete older and incomplete
 * steps older than the newest complete one. Returns how many removed. */
int ckpt_store_retain(const char *root, unsigned keep);

/*
 * Restore the whole state of the newest usable checkpoint into state
 * (cap bytes): for each shard, the primary file, else the replica; a delta
 * shard first restores its base. Falls back to older checkpoints when a
 * shard is unreadable in both copies. *step_p gets the step restored,
 * *repaired_p how many shards came from a replica. ST_ECORRUPT (logged,
 * with the reason per checkpoint) if none is usable; -ENOENT if there is
 * no complete checkpoint at all.
 */
int ckpt_store_restore(const char *root, void *state, size_t cap,
                       uint64_t *step_p, unsigned *repaired_p);
/*
 * Decode shard i of m into dst (m->shards[i].size bytes) from this store:
 * the primary file, else the replica (*from_replica_p = 1; may be NULL);
 * a delta shard first decodes its base. -ENOENT-like failures are normal
 * for a node that holds only some shards (per-node directories).
 */
int ckpt_store_read_shard(const char *root, const ckpt_manifest_t *m,
                          uint32_t i, void *dst, int *from_replica_p);
/* What ckpt_store_check found for one shard. */
typedef enum {
    CKPT_COPY_OK = 0,          /* primary and replica both good */
    CKPT_COPY_REPLICA_BAD,     /* primary good, replica not */
    CKPT_COPY_REPAIRED,        /* primary bad: a restore reads the replica */
    CKPT_COPY_BAD,             /* neither copy: not restorable */
} ckpt_copy_state_t;

/*
 * Check both copies of every shard of m (a manifest from etcd or the
 * store) against it, decoding fully (delta shards through their bases,
 * whose manifests come from the store). states[m->nshards] gets one
 * verdict per shard. Returns 0 if the checkpoint is restorable (no shard
 * CKPT_COPY_BAD), else ST_ECORRUPT.
 */
int ckpt_store_check(const char *root, const ckpt_manifest_t *m,
                     ckpt_copy_state_t *states);
/* Verify every shard of one step (both copies); 0 if all good. */
int ckpt_store_verify(const char *root, uint64_t step, unsigned *bad_p);

/* ---- the asynchronous writer ---------------------------------------------
 *
 * At a step boundary the daemon hands the writer this node's shard of the
 * state; ckpt_writer_submit() copies it into a staging buffer on the
 * calling thread and returns, ckpt_writer_submit_live() leaves the copy to
 * the worker and tells the caller when it is done (until then the bytes
 * must not change). The worker then encodes the stage piece by piece
 * (ckpt_encoder_write: as a delta against the last full shard it wrote,
 * read back from its file piece by piece, when the layout is the same and
 * fewer than full_every deltas followed it) straight into the shard's
 * file, and calls done().
 *
 * Back pressure: at most one checkpoint is in flight. A submit while one is
 * still being written is skipped (ST_AGAIN, counted): training never waits
 * for a checkpoint and memory stays bounded at one shard (the stage) and
 * a few pieces, held from the first checkpoint on so later ones fault in
 * no new memory.
 */
typedef struct ckpt_writer ckpt_writer_t;

typedef struct {
    const char *root;     /* checkpoint directory (copied) */
    ckpt_codec_t codec;
    uint32_t full_every;  /* a full shard after this many deltas; 0: never
                             delta */
    int replica;          /* write replica-<i> files instead of shard-<i> */
    int background;       /* > 0: encode at SCHED_BATCH, this nice */
} ckpt_writer_opts_t;

/*
 * Called on the worker thread when a shard is written (status 0) or not
 * (status < 0: -ENOSPC, ...), with ckpt_writer_stats() already counting
 * it. The file was streamed to disk, so file is always NULL; len is the
 * file's length (0 on failure).
 */
typedef void (*ckpt_writer_done_fn)(void *arg, int status,
                                    const ckpt_shard_info_t *info,
                                    const void *file, size_t len);
/* Called on the worker thread once a live submit's bytes are copied. */
typedef void (*ckpt_writer_copied_fn)(void *arg,
                                      const ckpt_shard_info_t *info);

/*
 * The copy's and the encoder's times, wall and on-CPU, tell a slow copy
 * that waited for a core (wall >> cpu) from one that faulted pages in
 * (minor faults) or ran at memory speed.
 */
typedef struct {
    uint64_t submitted, skipped, written, failed;
    uint64_t raw_bytes, file_bytes; /* of written shards */
    uint64_t last_stall_ns;         /* the last snapshot copy, wall */
    uint64_t last_copy_cpu_ns;      /* ... on its thread's CPU clock */
    uint64_t last_copy_faults;      /* ... minor page faults during it */
    uint64_t last_write_ns;         /* the last encode + write, wall */
    uint64_t last_write_cpu_ns;     /* ... on the worker's CPU clock */
    uint64_t copy_ns, copy_cpu_ns, copy_faults; /* sums over copies */
    uint64_t write_ns, write_cpu_ns;            /* sums over shards */
    uint64_t last_step;             /* of the last written shard */
} ckpt_writer_stats_t;

int ckpt_writer_create(const ckpt_writer_opts_t *opts, ckpt_writer_t **w_p);
/* Waits for the checkpoint in flight, then stops the worker. NULL is ok. */
void ckpt_writer_destroy(ckpt_writer_t *w);
/*
 * info: step, generation, shard, nshards, offset, raw_size, total_size
 * (flags/base_step/sizes are filled by the writer). bytes: the shard's
 * raw_size bytes, copied on the calling thread before returning (the
 * writer's lock is not held over the copy: busy() and stats() answer
 * meanwhile). Returns 0 (queued), ST_AGAIN
 * (skipped: one is in flight) or an error (ST_ENOMEM, ST_EINVAL).
 */
int ckpt_writer_submit(ckpt_writer_t *w, const ckpt_shard_info_t *info,
                       const void *bytes, ckpt_writer_done_fn done,
                       void *arg);
/*
 * The same, but the worker copies bytes (it must stay mapped and
 * unchanged until copied() is called on the worker), so the caller's
 * thread copies nothing and can go on with its work meanwhile.
 */
int ckpt_writer_submit_live(ckpt_writer_t *w, const ckpt_shard_info_t *info,
                            const void *bytes, ckpt_writer_copied_fn copied,
                            void *copied_arg, ckpt_writer_done_fn done,
                            void *arg);
/*
 * Size the staging buffer for shards up to bytes now (allocated and
 * faulted in), so the first snapshot does not pay for page faults: call
 * it when the state size is known, before the first submit, off any
 * thread that must stay responsive. 0 or ST_ENOMEM; with one in flight
 * it waits for it; while it faults the new stage in, busy() is 1.
 */
int ckpt_writer_reserve(ckpt_writer_t *w, size_t bytes);
/* 1 while a shard is queued or being written (a submit would skip). Only
 * the submitting thread makes it busy, so 0 stays true for it. */
int ckpt_writer_busy(ckpt_writer_t *w);
/* Block until nothing is in flight (tests, drain, shutdown). */
void ckpt_writer_flush(ckpt_writer_t *w);
void ckpt_writer_stats(ckpt_writer_t *w, ckpt_writer_stats_t *stats_p);

#endif /* RINGD_CKPT_H */
