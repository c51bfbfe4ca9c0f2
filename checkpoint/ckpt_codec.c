/*
 * ckpt_codec.c - shard file images: header, shuffles, deltas, zstd.
 *
 * Why shuffle: float weights have nearly random low mantissa bytes but
 * very regular sign/exponent bytes; grouping byte k of every element
 * together gives zstd long runs of similar exponent bytes. Why a delta:
 * between two checkpoints most weights change only in their low bits, so
 * the delta is mostly zero bytes in the high positions, which compress
 * far better than the weights themselves. The first format XORed the
 * bits; the default now subtracts the 32-bit patterns as integers and
 * zigzags the difference: a change that carries across a byte of the
 * mantissa (0x3c7fffff -> 0x3c800001) is 2 ulps, a zero-high-byte word,
 * where its XOR has bits set up to the exponent. Both are integer
 * operations, so decoding is bit-exact whatever the floats hold (NaN
 * payloads, -0.0, denormals). bench/ckpt-cost measures the alternatives
 * (checkpoint/README.md has the table): the arithmetic delta wins by 3-4%
 * on the demo trainer's weights, bit-shuffle does not beat byte-shuffle
 * with zstd behind it, so it is an option, not the default.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <unistd.h>
#include <zstd.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "common/status.h"

#define HDR_SIZE 128
static const char hdr_magic[8] = {'R', 'I', 'N', 'G', 'D', 'C', 'K', '1'};

void ckpt_shard_range(uint64_t total, uint32_t n, uint32_t i, uint32_t elem,
                      uint64_t *offset_p, uint64_t *size_p)
{
    if (elem == 0)
        elem = 1;
    uint64_t elems = total / elem;
    uint64_t per = n ? elems / n : 0, rem = n ? elems % n : 0;
    uint64_t first = (uint64_t)i * per + (i < rem ? i : rem);
    uint64_t count = per + (i < rem ? 1 : 0);
    uint64_t off = first * elem, size = count * elem;
    if (n && i == n - 1)
        size = total - off; /* the last shard takes the odd tail bytes */
    *offset_p = off;
    *size_p = size;
}

void ckpt_shuffle(void *dst, const void *src, size_t n, uint32_t elem)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (elem <= 1) {
        memcpy(d, s, n);
        return;
    }
    size_t m = n / elem;
    if (elem == 4) {
        unsigned char *d0 = d, *d1 = d + m, *d2 = d + 2 * m, *d3 = d + 3 * m;
        for (size_t i = 0; i < m; i++) {
            d0[i] = s[4 * i];
            d1[i] = s[4 * i + 1];
            d2[i] = s[4 * i + 2];
            d3[i] = s[4 * i + 3];
        }
    } else {
        for (size_t i = 0; i < m; i++)
            for (uint32_t b = 0; b < elem; b++)
                d[b * m + i] = s[i * elem + b];
    }
    memcpy(d + m * elem, s + m * elem, n - m * elem);
}

void ckpt_unshuffle(void *dst, const void *src, size_t n, uint32_t elem)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (elem <= 1) {
        memcpy(d, s, n);
        return;
    }
    size_t m = n / elem;
    if (elem == 4) {
        const unsigned char *s0 = s, *s1 = s + m, *s2 = s + 2 * m,
                            *s3 = s + 3 * m;
        for (size_t i = 0; i < m; i++) {
            d[4 * i] = s0[i];
            d[4 * i + 1] = s1[i];
            d[4 * i + 2] = s2[i];
            d[4 * i + 3] = s3[i];
        }
    } else {
        for (size_t i = 0; i < m; i++)
            for (uint32_t b = 0; b < elem; b++)
                d[i * elem + b] = s[b * m + i];
    }
    memcpy(d + m * elem, s + m * elem, n - m * elem);
}

void ckpt_xor(void *dst, const void *a, const void *b, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t p, q;
        memcpy(&p, x + i, 8);
        memcpy(&q, y + i, 8);
        p ^= q;
        memcpy(d + i, &p, 8);
    }
    for (; i < n; i++)
        d[i] = x[i] ^ y[i];
}

/* Native 32-bit words: the state's floats are native, and so is their
 * integer difference (every host we build for is little-endian). */
static uint32_t zigzag(uint32_t d)
{
    return (d << 1) ^ (0u - (d >> 31));
}

static uint32_t unzigzag(uint32_t z)
{
    return (z >> 1) ^ (0u - (z & 1));
}

void ckpt_sub(void *dst, const void *a, const void *b, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t p, q;
        memcpy(&p, x + i, 4);
        memcpy(&q, y + i, 4);
        p = zigzag(p - q);
        memcpy(d + i, &p, 4);
    }
    for (; i < n; i++)
        d[i] = x[i] ^ y[i];
}

void ckpt_sub_undo(void *dst, const void *dd, const void *b, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *x = dd, *y = b;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t p, q;
        memcpy(&p, x + i, 4);
        memcpy(&q, y + i, 4);
        p = q + unzigzag(p);
        memcpy(d + i, &p, 4);
    }
    for (; i < n; i++)
        d[i] = x[i] ^ y[i];
}

/*
 * Transpose an 8x8 bit matrix held as 8 bytes (row r = byte r, column c =
 * bit c): swap the off-diagonal halves of 2x2, then 4x4, then 8x8 blocks
 * (Hacker's Delight, 7-3). Its own inverse.
 */
static uint64_t transpose8(uint64_t x)
{
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00aa00aa00aa00aaull;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000cccc0000ccccull;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000f0f0f0f0ull;
    x ^= t ^ (t << 28);
    return x;
}

/*
 * One block of m elements (m % 8 == 0), planes of m / 8 bytes: for each
 * group of 8 elements and byte position b, the 8 bytes b form a bit
 * matrix whose transpose is byte g of planes 8b..8b+7.
 */
static void bitshuffle_block(unsigned char *d, const unsigned char *s,
                             size_t m)
{
    size_t pl = m / 8;
    for (size_t g = 0; g < pl; g++) {
        const unsigned char *e = s + 32 * g;
        for (int b = 0; b < 4; b++) {
            uint64_t x = 0;
            for (int k = 0; k < 8; k++)
                x |= (uint64_t)e[4 * k + b] << (8 * k);
            x = transpose8(x);
            for (int i = 0; i < 8; i++)
                d[(size_t)(8 * b + i) * pl + g] = (unsigned char)(x >> 8 * i);
        }
    }
}

static void bitunshuffle_block(unsigned char *d, const unsigned char *s,
                               size_t m)
{
    size_t pl = m / 8;
    for (size_t g = 0; g < pl; g++) {
        unsigned char *e = d + 32 * g;
        for (int b = 0; b < 4; b++) {
            uint64_t x = 0;
            for (int i = 0; i < 8; i++)
                x |= (uint64_t)s[(size_t)(8 * b + i) * pl + g] << (8 * i);
            x = transpose8(x);
            for (int k = 0; k < 8; k++)
                e[4 * k + b] = (unsigned char)(x >> 8 * k);
        }
    }
}

static void bitshuffle_any(void *dst, const void *src, size_t n, int undo)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t elems = n / 4, done = 0;
    while (elems - done >= 8) {
        size_t m = elems - done;
        if (m > CKPT_BITSHUFFLE_BLOCK)
            m = CKPT_BITSHUFFLE_BLOCK;
        m &= ~(size_t)7;
        if (undo)
            bitunshuffle_block(d + 4 * done, s + 4 * done, m);
        else
            bitshuffle_block(d + 4 * done, s + 4 * done, m);
        done += m;
    }
    memcpy(d + 4 * done, s + 4 * done, n - 4 * done);
}

void ckpt_bitshuffle(void *dst, const void *src, size_t n)
{
    bitshuffle_any(dst, src, n, 0);
}

void ckpt_bitunshuffle(void *dst, const void *src, size_t n)
{
    bitshuffle_any(dst, src, n, 1);
}

/* ---- header (explicit little-endian layout) ---------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/*
 * magic[8] version[4] hdr_size[4] step generation base_step offset
 * raw_size total_size raw_xxh64 comp_size [8 each] shard nshards flags
 * elem_size piece_size [4 each] reserved[20] header_xxh64[8] = 128 bytes
 * (piece_size was reserved, zero, before CKPT_F_PIECES)
 */
static void hdr_write(unsigned char *h, const ckpt_shard_info_t *in)
{
    memset(h, 0, HDR_SIZE);
    memcpy(h, hdr_magic, 8);
    put32(h + 8, CKPT_FORMAT_VERSION);
    put32(h + 12, HDR_SIZE);
    const uint64_t v64[8] = {in->step,       in->generation, in->base_step,
                             in->offset,     in->raw_size,   in->total_size,
                             in->raw_xxh64,  in->comp_size};
    for (int i = 0; i < 8; i++)
        put64(h + 16 + 8 * i, v64[i]);
    put32(h + 80, in->shard);
    put32(h + 84, in->nshards);
    put32(h + 88, in->flags);
    put32(h + 92, in->elem_size);
    put32(h + 96, in->piece_size);
    put64(h + HDR_SIZE - 8, XXH64(h, HDR_SIZE - 8, 0));
}

static int bad(const char *why)
{
    RD_WARN("checkpoint: shard rejected: %s", why);
    return ST_ECORRUPT;
}

int ckpt_shard_peek(const void *file, size_t len, ckpt_shard_info_t *info_p)
{
    const unsigned char *h = file;
    if (len < HDR_SIZE)
        return bad("shorter than its header");
    if (memcmp(h, hdr_magic, 8) != 0)
        return bad("bad magic");
    if (get64(h + HDR_SIZE - 8) != XXH64(h, HDR_SIZE - 8, 0))
        return bad("header checksum mismatch");
    if (get32(h + 8) != CKPT_FORMAT_VERSION || get32(h + 12) != HDR_SIZE)
        return bad("unsupported format version");
    ckpt_shard_info_t in;
    uint64_t *v64[8] = {&in.step,      &in.generation, &in.base_step,
                        &in.offset,    &in.raw_size,   &in.total_size,
                        &in.raw_xxh64, &in.comp_size};
    for (int i = 0; i < 8; i++)
        *v64[i] = get64(h + 16 + 8 * i);
    in.shard = get32(h + 80);
    in.nshards = get32(h + 84);
    in.flags = get32(h + 88);
    in.elem_size = get32(h + 92);
    in.piece_size = (in.flags & CKPT_F_PIECES) ? get32(h + 96) : 0;
    if (in.nshards == 0 || in.shard >= in.nshards)
        return bad("shard index out of range");
    if (in.flags & ~(uint32_t)CKPT_F_ALL)
        return bad("unknown flags");
    if (in.elem_size != 1 && in.elem_size != 2 && in.elem_size != 4 &&
        in.elem_size != 8)
        return bad("bad element size");
    if ((in.flags & CKPT_F_DELTA_SUB) &&
        (!(in.flags & CKPT_F_DELTA) || in.elem_size != 4))
        return bad("arithmetic delta without a delta of 4-byte elements");
    if ((in.flags & CKPT_F_BITSHUFFLE) &&
        ((in.flags & CKPT_F_SHUFFLE) || in.elem_size != 4))
        return bad("bit-shuffle with byte-shuffle or not of 4-byte "
                   "elements");
    if ((in.flags & CKPT_F_PIECES) &&
        (in.piece_size == 0 || in.piece_size % in.elem_size != 0))
        return bad("piece size zero or not a whole number of elements");
    if (in.offset > in.total_size || in.raw_size > in.total_size - in.offset)
        return bad("shard outside the state");
    if (in.comp_size != len - HDR_SIZE)
        return bad("payload size does not match the file (truncated?)");
    if ((in.flags & CKPT_F_DELTA) && in.base_step >= in.step)
        return bad("delta base is not older than the shard");
    *info_p = in;
    return 0;
}

struct ckpt_encoder {
    ZSTD_CCtx *cc;
    unsigned char *work, *tmp, *out; /* delta, shuffle, file image */
    size_t work_cap, tmp_cap, out_cap;
    unsigned char *bpiece; /* a piece of a base read from its file */
    size_t bpiece_cap;
};

int ckpt_encoder_create(ckpt_encoder_t **enc_p)
{
    ckpt_encoder_t *enc = calloc(1, sizeof(*enc));
    if (enc == NULL)
        return ST_ENOMEM;
    enc->cc = ZSTD_createCCtx();
    if (enc->cc == NULL) {
        free(enc);
        return ST_ENOMEM;
    }
    *enc_p = enc;
    return 0;
}

void ckpt_encoder_destroy(ckpt_encoder_t *enc)
{
    if (enc == NULL)
        return;
    ZSTD_freeCCtx(enc->cc);
    free(enc->work);
    free(enc->tmp);
    free(enc->out);
    free(enc->bpiece);
    free(enc);
}

/* Grow-only: the contents need not survive. */
static int grow(unsigned char **p, size_t *cap, size_t need)
{
    if (need == 0)
        need = 1;
    if (*cap >= need)
        return 0;
    unsigned char *q = malloc(need);
    if (q == NULL)
        return ST_ENOMEM;
    free(*p);
    *p = q;
    *cap = need;
    return 0;
}

/* One parameter; a refusal is logged and returned (ST_EINVAL). */
static int zstd_set(ZSTD_CCtx *cc, ZSTD_cParameter p, int v,
                    const char *name)
{
    size_t r = ZSTD_CCtx_setParameter(cc, p, v);
    if (ZSTD_isError(r)) {
        RD_ERROR("checkpoint: zstd refused %s=%d: %s", name, v,
                 ZSTD_getErrorName(r));
        return ST_EINVAL;
    }
    return 0;
}

/*
 * A fresh session with the codec's parameters. Worker threads are an
 * optimisation: a libzstd built without them refuses nbWorkers, and the
 * shard is then compressed on this thread (the same frame, only slower),
 * with one warning per process.
 */
static int zstd_setup(ZSTD_CCtx *cc, const ckpt_codec_t *codec)
{
    static int warned_mt;
    size_t r = ZSTD_CCtx_reset(cc, ZSTD_reset_session_and_parameters);
    if (ZSTD_isError(r)) {
        RD_ERROR("checkpoint: zstd reset failed: %s", ZSTD_getErrorName(r));
        return ST_EINVAL;
    }
    if (zstd_set(cc, ZSTD_c_compressionLevel,
                 codec->level ? codec->level : 3, "level") != 0 ||
        zstd_set(cc, ZSTD_c_checksumFlag, 1, "checksumFlag") != 0 ||
        zstd_set(cc, ZSTD_c_contentSizeFlag, 1, "contentSizeFlag") != 0)
        return ST_EINVAL;
    if (codec->threads <= 0)
        return 0;
    r = ZSTD_CCtx_setParameter(cc, ZSTD_c_nbWorkers, codec->threads);
    if (ZSTD_isError(r) && !__atomic_exchange_n(&warned_mt, 1,
                                                __ATOMIC_RELAXED))
        RD_WARN("checkpoint: zstd refused %d worker threads (%s); "
                "compressing on the writer thread", codec->threads,
                ZSTD_getErrorName(r));
    return 0;
}

/* The transforms follow from the codec; the caller says only delta. */
static void set_flags(const ckpt_codec_t *codec, ckpt_shard_info_t *info)
{
    info->elem_size = codec->elem_size ? codec->elem_size : 1;
    info->flags &= CKPT_F_DELTA;
    if ((info->flags & CKPT_F_DELTA) && info->elem_size == 4 &&
        !codec->xor_delta)
        info->flags |= CKPT_F_DELTA_SUB;
    if (info->elem_size == 4 && codec->bitshuffle)
        info->flags |= CKPT_F_BITSHUFFLE;
    else if (info->elem_size > 1)
        info->flags |= CKPT_F_SHUFFLE;
}

int ckpt_encoder_encode(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                        ckpt_shard_info_t *info, const void *raw,
                        const void *base, const void **file_p,
                        size_t *len_p)
{
    size_t n = info->raw_size;
    if ((info->flags & CKPT_F_DELTA) && base == NULL)
        return ST_EINVAL;
    set_flags(codec, info);
    info->piece_size = 0;
    info->raw_xxh64 = XXH64(raw, n, 0);

    const void *src = raw;
    if (info->flags & CKPT_F_DELTA) {
        if (grow(&enc->work, &enc->work_cap, n) != 0)
            return ST_ENOMEM;
        if (info->flags & CKPT_F_DELTA_SUB)
            ckpt_sub(enc->work, raw, base, n);
        else
            ckpt_xor(enc->work, raw, base, n);
        src = enc->work;
    }
    if (info->flags & (CKPT_F_SHUFFLE | CKPT_F_BITSHUFFLE)) {
        if (grow(&enc->tmp, &enc->tmp_cap, n) != 0)
            return ST_ENOMEM;
        if (info->flags & CKPT_F_BITSHUFFLE)
            ckpt_bitshuffle(enc->tmp, src, n);
        else
            ckpt_shuffle(enc->tmp, src, n, info->elem_size);
        src = enc->tmp;
    }
    size_t bound = ZSTD_compressBound(n);
    if (grow(&enc->out, &enc->out_cap, HDR_SIZE + bound) != 0)
        return ST_ENOMEM;
    ZSTD_CCtx *cc = enc->cc;
    if (zstd_setup(cc, codec) != 0)
        return ST_EINVAL;
    size_t z = ZSTD_compress2(cc, enc->out + HDR_SIZE, bound, src, n);
    if (ZSTD_isError(z)) {
        RD_ERROR("checkpoint: zstd compression failed: %s",
                 ZSTD_getErrorName(z));
        return ST_EINVAL;
    }
    info->comp_size = z;
    hdr_write(enc->out, info);
    *file_p = enc->out;
    *len_p = HDR_SIZE + z;
    return 0;
}

int ckpt_shard_encode(const ckpt_codec_t *codec, ckpt_shard_info_t *info,
                      const void *raw, const void *base, void **file_p,
                      size_t *len_p)
{
    ckpt_encoder_t *enc;
    const void *file;
    int rc = ckpt_encoder_create(&enc);
    if (rc != 0)
        return rc;
    rc = ckpt_encoder_encode(enc, codec, info, raw, base, &file, len_p);
    if (rc == 0) {
        *file_p = enc->out; /* handed over to the caller */
        enc->out = NULL;
    }
    ckpt_encoder_destroy(enc);
    return rc;
}

static void unshuffle_piece(unsigned char *dst, const unsigned char *src,
                            size_t n, const ckpt_shard_info_t *in)
{
    if (in->flags & CKPT_F_BITSHUFFLE)
        ckpt_bitunshuffle(dst, src, n);
    else if (in->flags & CKPT_F_SHUFFLE)
        ckpt_unshuffle(dst, src, n, in->elem_size);
    else
        memcpy(dst, src, n);
}

/* Delta and shuffle one piece into enc->tmp; returns what zstd reads. */
static const void *transform_piece(ckpt_encoder_t *enc,
                                   const ckpt_shard_info_t *in,
                                   const unsigned char *raw,
                                   const unsigned char *base, size_t m)
{
    const void *src = raw;
    if (in->flags & CKPT_F_DELTA_SUB)
        ckpt_sub(enc->work, raw, base, m);
    else if (in->flags & CKPT_F_DELTA)
        ckpt_xor(enc->work, raw, base, m);
    if (in->flags & CKPT_F_DELTA)
        src = enc->work;
    if (in->flags & CKPT_F_BITSHUFFLE)
        ckpt_bitshuffle(enc->tmp, src, m);
    else if (in->flags & CKPT_F_SHUFFLE)
        ckpt_shuffle(enc->tmp, src, m, in->elem_size);
    else
        return src;
    return enc->tmp;
}

/* Feed one piece (end: the last) to zstd, writing out what it emits. */
static int stream_piece(ckpt_encoder_t *enc, ckpt_afile_t *f,
                        const void *src, size_t m, int end, size_t *out_p)
{
    ZSTD_inBuffer zin = {src, m, 0};
    ZSTD_EndDirective mode = end ? ZSTD_e_end : ZSTD_e_continue;
    for (;;) {
        ZSTD_outBuffer zout = {enc->out, enc->out_cap, 0};
        size_t left = ZSTD_compressStream2(enc->cc, &zout, &zin, mode);
        if (ZSTD_isError(left)) {
            RD_ERROR("checkpoint: zstd compression failed: %s",
                     ZSTD_getErrorName(left));
            return ST_EINVAL;
        }
        int rc = ckpt_afile_write(f, enc->out, zout.pos);
        if (rc != 0)
            return rc;
        *out_p += zout.pos;
        if (end ? left == 0 : zin.pos == zin.size)
            return 0;
    }
}

static int stream_setup(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                        size_t n)
{
    size_t piece = n < CKPT_PIECE_BYTES ? n : CKPT_PIECE_BYTES;
    if (grow(&enc->work, &enc->work_cap, piece) != 0 ||
        grow(&enc->tmp, &enc->tmp_cap, piece) != 0 ||
        grow(&enc->out, &enc->out_cap, ZSTD_CStreamOutSize()) != 0)
        return ST_ENOMEM;
    if (zstd_setup(enc->cc, codec) != 0)
        return ST_EINVAL;
    size_t r = ZSTD_CCtx_setPledgedSrcSize(enc->cc, n);
    if (ZSTD_isError(r)) {
        RD_ERROR("checkpoint: zstd refused the shard size: %s",
                 ZSTD_getErrorName(r));
        return ST_EINVAL;
    }
    return 0;
}

/* The base's piece at `at`: in memory, or the next one of its file. */
static int base_piece(ckpt_encoder_t *enc, const unsigned char *base,
                      ckpt_piece_reader_t *rd, size_t at, size_t m,
                      const unsigned char **p)
{
    *p = NULL;
    if (base != NULL) {
        *p = base + at;
        return 0;
    }
    if (rd == NULL)
        return 0;
    if (grow(&enc->bpiece, &enc->bpiece_cap, CKPT_PIECE_BYTES) != 0)
        return ST_ENOMEM;
    *p = enc->bpiece;
    return ckpt_piece_reader_next(rd, enc->bpiece, m);
}

static int encode_stream(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                         ckpt_shard_info_t *info, const void *raw,
                         const void *base, ckpt_piece_reader_t *rd,
                         ckpt_afile_t *f, size_t *len_p)
{
    size_t n = info->raw_size;
    if ((info->flags & CKPT_F_DELTA) && base == NULL && rd == NULL)
        return ST_EINVAL;
    set_flags(codec, info);
    info->flags |= CKPT_F_PIECES;
    info->piece_size = CKPT_PIECE_BYTES;
    unsigned char hdr[HDR_SIZE] = {0};
    XXH64_state_t *xs = XXH64_createState();
    if (xs == NULL)
        return ST_ENOMEM;
    XXH64_reset(xs, 0);
    int rc = stream_setup(enc, codec, n);
    if (rc == 0) /* a placeholder until the sizes are known */
        rc = ckpt_afile_write(f, hdr, HDR_SIZE);
    size_t z = 0, at = 0;
    const unsigned char *r = raw, *b = base;
    do {
        size_t m = n - at < CKPT_PIECE_BYTES ? n - at : CKPT_PIECE_BYTES;
        const unsigned char *bp = NULL;
        if (rc == 0 && (info->flags & CKPT_F_DELTA))
            rc = base_piece(enc, b, rd, at, m, &bp);
        if (rc != 0)
            break;
        XXH64_update(xs, r + at, m);
        const void *src = transform_piece(enc, info, r + at, bp, m);
        rc = stream_piece(enc, f, src, m, at + m == n, &z);
        at += m;
    } while (at < n);
    info->raw_xxh64 = XXH64_digest(xs);
    XXH64_freeState(xs);
    if (rc != 0)
        return rc;
    info->comp_size = z;
    hdr_write(hdr, info);
    rc = ckpt_afile_pwrite(f, hdr, HDR_SIZE, 0);
    if (rc == 0)
        *len_p = HDR_SIZE + z;
    return rc;
}

int ckpt_encoder_write(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                       ckpt_shard_info_t *info, const void *raw,
                       const void *base, ckpt_afile_t *f, size_t *len_p)
{
    return encode_stream(enc, codec, info, raw, base, NULL, f, len_p);
}

int ckpt_encoder_write_rd(ckpt_encoder_t *enc, const ckpt_codec_t *codec,
                          ckpt_shard_info_t *info, const void *raw,
                          ckpt_piece_reader_t *base, ckpt_afile_t *f,
                          size_t *len_p)
{
    return encode_stream(enc, codec, info, raw, NULL, base, f, len_p);
}

/* ---- a full shard file read back piece by piece ------------------------ */

struct ckpt_piece_reader {
    int fd;
    ckpt_shard_info_t info;
    ZSTD_DCtx *dc;
    XXH64_state_t *xs;
    unsigned char *in, *work; /* compressed input, one shuffled piece */
    size_t in_cap;
    ZSTD_inBuffer zin;
    uint64_t done;            /* raw bytes handed out */
    size_t last;              /* ZSTD_decompressStream's last hint */
};

int ckpt_piece_reader_close(ckpt_piece_reader_t *r)
{
    if (r == NULL)
        return 0;
    int ok = r->done == r->info.raw_size && r->last == 0 &&
             XXH64_digest(r->xs) == r->info.raw_xxh64;
    close(r->fd);
    ZSTD_freeDCtx(r->dc);
    XXH64_freeState(r->xs);
    free(r->in);
    free(r->work);
    free(r);
    return ok ? 0 : bad("delta base fails its checks read back");
}

int ckpt_piece_reader_open(const char *path, ckpt_shard_info_t *info_p,
                           ckpt_piece_reader_t **r_p)
{
    ckpt_piece_reader_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return ST_ENOMEM;
    r->fd = -1;
    r->last = 1;
    int rc = ckpt_shard_peek_file(path, &r->info);
    if (rc == 0 && (!(r->info.flags & CKPT_F_PIECES) ||
                    (r->info.flags & CKPT_F_DELTA)))
        rc = ST_EINVAL; /* only a full file of pieces streams back */
    if (rc == 0 && (r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        rc = -errno;
    r->in_cap = ZSTD_DStreamInSize();
    if (rc == 0 &&
        ((r->dc = ZSTD_createDCtx()) == NULL ||
         (r->xs = XXH64_createState()) == NULL ||
         (r->in = malloc(r->in_cap)) == NULL ||
         (r->work = malloc(r->info.piece_size)) == NULL))
        rc = ST_ENOMEM;
    if (rc == 0 && lseek(r->fd, HDR_SIZE, SEEK_SET) != HDR_SIZE)
        rc = -errno;
    if (rc != 0) {
        r->info.raw_size = 1; /* close must not call it good */
        ckpt_piece_reader_close(r);
        return rc;
    }
    XXH64_reset(r->xs, 0);
    r->zin = (ZSTD_inBuffer){r->in, 0, 0};
    *info_p = r->info;
    *r_p = r;
    return 0;
}

/* Decompress until out is full or the frame ends (out may be empty). */
static int piece_fill(ckpt_piece_reader_t *r, ZSTD_outBuffer *out)
{
    while (out->pos < out->size || (out->size == 0 && r->last != 0)) {
        if (r->zin.pos == r->zin.size) {
            ssize_t got = read(r->fd, r->in, r->in_cap);
            if (got <= 0)
                return bad("delta base file ends early");
            r->zin = (ZSTD_inBuffer){r->in, (size_t)got, 0};
        }
        size_t before = out->pos;
        r->last = ZSTD_decompressStream(r->dc, out, &r->zin);
        if (ZSTD_isError(r->last))
            return bad("delta base: zstd frame does not decode");
        if (r->last == 0 && out->pos == before && out->pos < out->size)
            return bad("delta base: zstd frame ends early");
        if (out->size == 0 && r->last == 0)
            break;
    }
    return 0;
}

int ckpt_piece_reader_next(ckpt_piece_reader_t *r, void *dst, size_t m)
{
    uint64_t left = r->info.raw_size - r->done;
    size_t want = left < r->info.piece_size ? (size_t)left
                                             : r->info.piece_size;
    if (m != want)
        return ST_EINVAL;
    ZSTD_outBuffer out = {r->work, m, 0};
    int rc = piece_fill(r, &out);
    if (rc != 0)
        return rc;
    unshuffle_piece(dst, r->work, m, &r->info);
    XXH64_update(r->xs, dst, m);
    r->done += m;
    if (r->done == r->info.raw_size && r->last != 0) {
        ZSTD_outBuffer end = {r->work, 0, 0}; /* the frame's checksum */
        rc = piece_fill(r, &end);
    }
    return rc;
}

int ckpt_shard_decode(const void *file, size_t len, const void *base,
                      void *raw, size_t raw_cap, ckpt_shard_info_t *info_p)
{
    ckpt_shard_info_t in;
    int rc = ckpt_shard_peek(file, len, &in);
    if (rc != 0)
        return rc;
    if (in.raw_size > raw_cap)
        return bad("shard larger than the destination");
    if ((in.flags & CKPT_F_DELTA) && base == NULL)
        return ST_EINVAL;
    const unsigned char *payload = (const unsigned char *)file + HDR_SIZE;
    unsigned long long csize =
        ZSTD_getFrameContentSize(payload, in.comp_size);
    if (csize == ZSTD_CONTENTSIZE_ERROR || csize != in.raw_size)
        return bad("zstd frame size does not match the header");

    size_t n = in.raw_size;
    unsigned char *work = malloc(n ? n : 1);
    if (work == NULL)
        return ST_ENOMEM;
    size_t z = ZSTD_decompress(work, n, payload, in.comp_size);
    if (ZSTD_isError(z) || z != n) {
        free(work);
        RD_WARN("checkpoint: zstd: %s",
                ZSTD_isError(z) ? ZSTD_getErrorName(z) : "short frame");
        return ST_ECORRUPT;
    }
    size_t piece = in.piece_size ? in.piece_size : (n ? n : 1);
    for (size_t at = 0; at < n; at += piece) {
        size_t m = n - at < piece ? n - at : piece;
        unshuffle_piece((unsigned char *)raw + at, work + at, m, &in);
    }
    free(work);
    if (in.flags & CKPT_F_DELTA_SUB)
        ckpt_sub_undo(raw, raw, base, n);
    else if (in.flags & CKPT_F_DELTA)
        ckpt_xor(raw, raw, base, n);
    if (XXH64(raw, n, 0) != in.raw_xxh64)
        return bad("decoded shard fails its xxh64");
    if (info_p)
        *info_p = in;
    return 0;
}
