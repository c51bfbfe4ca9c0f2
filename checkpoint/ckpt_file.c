/*
 * ckpt_file.c - crash-safe file writes and bounded reads.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "common/status.h"

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/*
 * A temporary file of its own for one write of dir/name: several writers
 * of one name may run at once (two records of a step's manifest, threads
 * of one process, nodes sharing a directory), and a name shared by two
 * of them lets one's O_TRUNC cut the other's file and one rename fail.
 * mkostemp makes the name unique and the file exclusively ours.
 */
static int tmp_open(const char *dir, const char *name, char *tmp,
                    size_t cap)
{
    if (snprintf(tmp, cap, "%s/.%s.tmp.%d.XXXXXX", dir, name,
                 (int)getpid()) >= (int)cap)
        return -ENAMETOOLONG;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        RD_ERROR("checkpoint: cannot create %s: %s", tmp, strerror(-rc));
        return rc;
    }
    if (fchmod(fd, 0644) < 0) {
        int rc = -errno;
        RD_ERROR("checkpoint: chmod of %s: %s", tmp, strerror(-rc));
        close(fd);
        unlink(tmp);
        return rc;
    }
    return fd;
}

/* The data in a temporary file of dir's, synced and closed: its name in
 * tmp. 0 or -errno (nothing left behind then). */
static int tmp_write(const char *dir, const char *name, const void *data,
                     size_t len, char *tmp, size_t cap)
{
    int fd = tmp_open(dir, name, tmp, cap);
    if (fd < 0)
        return fd;
    int rc = write_all(fd, data, len);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc != 0)
        unlink(tmp);
    return rc;
}

/* Put the written temporary file in place: replacing dst, or (excl) only
 * if there is none, -EEXIST else. link() is the atomic create-if-absent;
 * a file system without hard links gets a check and a rename, which two
 * writers at once can still race. */
static int tmp_place(const char *tmp, const char *dst, int excl)
{
    if (!excl)
        return rename(tmp, dst) < 0 ? -errno : 0;
    if (link(tmp, dst) == 0) {
        unlink(tmp);
        return 0;
    }
    int rc = -errno;
    if (rc == -EPERM || rc == -ENOTSUP || rc == -EOPNOTSUPP) {
        if (access(dst, F_OK) == 0)
            rc = -EEXIST;
        else
            rc = rename(tmp, dst) < 0 ? -errno : 0;
    }
    if (rc != 0)
        unlink(tmp);
    return rc;
}

static int write_atomic(const char *dir, const char *name, const void *data,
                        size_t len, int excl)
{
    char tmp[PATH_MAX], dst[PATH_MAX];
    if (snprintf(dst, sizeof(dst), "%s/%s", dir, name) >= (int)sizeof(dst))
        return -ENAMETOOLONG;
    int rc = tmp_write(dir, name, data, len, tmp, sizeof(tmp));
    if (rc == 0)
        rc = tmp_place(tmp, dst, excl);
    if (rc == -EEXIST)
        return rc; /* not an error of the write: the caller decides */
    if (rc != 0) { /* tmp_write and tmp_place removed their file */
        RD_ERROR("checkpoint: cannot write %s: %s", dst, strerror(-rc));
        return rc;
    }
    rc = fsync_dir(dir);
    if (rc != 0)
        RD_ERROR("checkpoint: fsync of %s failed: %s", dir, strerror(-rc));
    return rc;
}

int ckpt_write_atomic(const char *dir, const char *name, const void *data,
                      size_t len)
{
    return write_atomic(dir, name, data, len, 0);
}

int ckpt_write_atomic_new(const char *dir, const char *name,
                          const void *data, size_t len)
{
    return write_atomic(dir, name, data, len, 1);
}

struct ckpt_afile {
    int fd;
    char dir[PATH_MAX], tmp[PATH_MAX], dst[PATH_MAX];
};

int ckpt_afile_open(const char *dir, const char *name, ckpt_afile_t **f_p)
{
    ckpt_afile_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return ST_ENOMEM;
    if (snprintf(f->dir, sizeof(f->dir), "%s", dir) >= (int)sizeof(f->dir) ||
        snprintf(f->dst, sizeof(f->dst), "%s/%s", dir, name) >=
            (int)sizeof(f->dst)) {
        free(f);
        return -ENAMETOOLONG;
    }
    f->fd = tmp_open(dir, name, f->tmp, sizeof(f->tmp));
    if (f->fd < 0) {
        int rc = f->fd;
        free(f);
        return rc;
    }
    *f_p = f;
    return 0;
}

int ckpt_afile_write(ckpt_afile_t *f, const void *data, size_t len)
{
    return write_all(f->fd, data, len);
}

int ckpt_afile_pwrite(ckpt_afile_t *f, const void *data, size_t len,
                      uint64_t off)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = pwrite(f->fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return 0;
}

void ckpt_afile_abort(ckpt_afile_t *f)
{
    if (f == NULL)
        return;
    close(f->fd);
    unlink(f->tmp);
    free(f);
}

int ckpt_afile_commit(ckpt_afile_t *f)
{
    int rc = fsync(f->fd) < 0 ? -errno : 0;
    if (close(f->fd) < 0 && rc == 0)
        rc = -errno;
    f->fd = -1;
    if (rc == 0 && rename(f->tmp, f->dst) < 0)
        rc = -errno;
    if (rc != 0) {
        RD_ERROR("checkpoint: cannot write %s: %s", f->dst, strerror(-rc));
        unlink(f->tmp);
        free(f);
        return rc;
    }
    rc = fsync_dir(f->dir);
    if (rc != 0)
        RD_ERROR("checkpoint: fsync of %s failed: %s", f->dir,
                 strerror(-rc));
    free(f);
    return rc;
}

int ckpt_read_file(const char *path, size_t max, void **data_p,
                   size_t *len_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        close(fd);
        RD_WARN("checkpoint: %s is not a regular file of at most %zu bytes",
                path, max);
        return ST_ECORRUPT;
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len ? len : 1);
    if (buf == NULL) {
        close(fd);
        return ST_ENOMEM;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != len) {
        free(buf);
        return ST_ECORRUPT;
    }
    *data_p = buf;
    *len_p = len;
    return 0;
}

int ckpt_mkdirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int ckpt_shard_peek_file(const char *path, ckpt_shard_info_t *info_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    unsigned char hdr[128];
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : 0;
    if (rc == 0 && pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
        rc = ST_ECORRUPT;
    close(fd);
    /* peek reads the header bytes only; the length is the file's. */
    if (rc == 0)
        rc = ckpt_shard_peek(hdr, (size_t)st.st_size, info_p);
    return rc;
}
