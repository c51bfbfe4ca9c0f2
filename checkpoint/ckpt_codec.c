/*
 * ckpt_codec.c - shard file images: header, byte-shuffle, XOR delta, zstd.
 *
 * Why shuffle: float weights have nearly random low mantissa bytes but
 * very regular sign/exponent bytes; grouping byte k of every element
 * together gives zstd long runs of similar exponent bytes. Why XOR delta:
 * between two checkpoints a few hundred steps apart most weights change
 * only in their low bits, so the XOR is mostly zero bytes in the high
 * positions, which compress far better than the weights themselves; and
 * XOR is exact (no float arithmetic), so decoding is bit-exact.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
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
 * elem_size [4 each] reserved[24] header_xxh64[8]  = 128 bytes
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
    if (in.nshards == 0 || in.shard >= in.nshards)
        return bad("shard index out of range");
    if (in.flags & ~(uint32_t)(CKPT_F_DELTA | CKPT_F_SHUFFLE))
        return bad("unknown flags");
    if (in.elem_size != 1 && in.elem_size != 2 && in.elem_size != 4 &&
        in.elem_size != 8)
        return bad("bad element size");
    if (in.offset > in.total_size || in.raw_size > in.total_size - in.offset)
        return bad("shard outside the state");
    if (in.comp_size != len - HDR_SIZE)
        return bad("payload size does not match the file (truncated?)");
    if ((in.flags & CKPT_F_DELTA) && in.base_step >= in.step)
        return bad("delta base is not older than the shard");
    *info_p = in;
    return 0;
}

int ckpt_shard_encode(const ckpt_codec_t *codec, ckpt_shard_info_t *info,
                      const void *raw, const void *base, void **file_p,
                      size_t *len_p)
{
    int rc = ST_ENOMEM;
    size_t n = info->raw_size;
    if ((info->flags & CKPT_F_DELTA) && base == NULL)
        return ST_EINVAL;
    info->elem_size = codec->elem_size ? codec->elem_size : 1;
    if (info->elem_size > 1)
        info->flags |= CKPT_F_SHUFFLE;
    info->raw_xxh64 = XXH64(raw, n, 0);

    unsigned char *work = malloc(n ? n : 1), *tmp = NULL, *out = NULL;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    if (work == NULL || cc == NULL)
        goto err;
    const void *src = raw;
    if (info->flags & CKPT_F_DELTA) {
        ckpt_xor(work, raw, base, n);
        src = work;
    }
    if (info->flags & CKPT_F_SHUFFLE) {
        tmp = malloc(n ? n : 1);
        if (tmp == NULL)
            goto err;
        ckpt_shuffle(tmp, src, n, info->elem_size);
        src = tmp;
    }
    size_t bound = ZSTD_compressBound(n);
    out = malloc(HDR_SIZE + bound);
    if (out == NULL)
        goto err;
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel,
                           codec->level ? codec->level : 3);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
    if (codec->threads > 0)
        ZSTD_CCtx_setParameter(cc, ZSTD_c_nbWorkers, codec->threads);
    size_t z = ZSTD_compress2(cc, out + HDR_SIZE, bound, src, n);
    if (ZSTD_isError(z)) {
        RD_ERROR("checkpoint: zstd compression failed: %s",
                 ZSTD_getErrorName(z));
        rc = ST_EINVAL;
        goto err;
    }
    info->comp_size = z;
    hdr_write(out, info);
    free(work);
    free(tmp);
    ZSTD_freeCCtx(cc);
    *file_p = out;
    *len_p = HDR_SIZE + z;
    return 0;

err:
    free(out);
    free(tmp);
    free(work);
    ZSTD_freeCCtx(cc);
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
    if (in.flags & CKPT_F_SHUFFLE)
        ckpt_unshuffle(raw, work, n, in.elem_size);
    else
        memcpy(raw, work, n);
    free(work);
    if (in.flags & CKPT_F_DELTA)
        ckpt_xor(raw, raw, base, n);
    if (XXH64(raw, n, 0) != in.raw_xxh64)
        return bad("decoded shard fails its xxh64");
    if (info_p)
        *info_p = in;
    return 0;
}
