/*
 * backend_ring-int.h - internals of the ring backend shared by its files:
 * backend_ring.c (the backend), backend_ring_view.c (view copies) and
 * backend_ring_ckpt.c (checkpoint records in etcd). Not a public header.
 */
#ifndef RINGD_DMN_BACKEND_RING_INT_H
#define RINGD_DMN_BACKEND_RING_INT_H

#include "daemon/backend.h"
#include "membership/etcd.h"
#include "membership/mb.h"

typedef struct {
    char *node;
    uint8_t *addr;
    size_t addr_len;
    int slots;
    int64_t lease;
    int joiner;          /* not in the previous view */
} rb_member_t;

/* A copy of an mb view that outlives on_view. */
typedef struct {
    uint64_t generation;
    size_t n;
    rb_member_t *m;
    int my_index;
    size_t n_joiners;
} rb_view_t;

/* Free a view copy (NULL is ok). */
void dmn__rb_view_free(rb_view_t *v);
/* A copy of mv that outlives on_view; NULL when out of memory. */
rb_view_t *dmn__rb_view_copy(const mb_view_t *mv);

typedef struct dmn_rbck dmn_rbck_t;

/* Records for node `node` of job `job` (both copied). ST_ENOMEM. */
int dmn__rbck_create(const char *job, const char *node, dmn_rbck_t **k_p);
/*
 * Call after the etcd client the reports used is destroyed (which drops
 * their callbacks): frees what those requests still held. Accepts NULL.
 */
void dmn__rbck_destroy(dmn_rbck_t *k);
/* The backend op ckpt_report, on etcd (membership's client, same loop). */
int dmn__rbck_report(dmn_rbck_t *k, etcd_t *etcd, const dmn_ckpt_files_t *f,
                     dmn_done_cb cb, void *arg);

#endif /* RINGD_DMN_BACKEND_RING_INT_H */
