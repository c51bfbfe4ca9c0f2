/*
 * mb-int.h - internals of membership shared between its files.
 */
#ifndef RINGD_MB_INT_H
#define RINGD_MB_INT_H

#include "membership/mb.h"

/* An owned view: members' strings and addresses are malloc'ed copies. */
typedef struct {
    uint64_t generation;
    uint64_t step;
    mb_member_t *members;
    size_t n_members;
    int source_index;
    size_t n_joiners;
} mb__view_t;

void mb__member_free(mb_member_t *m);
int mb__member_copy(mb_member_t *dst, const mb_member_t *src);
void mb__view_free(mb__view_t *v);

/* Node record <-> JSON (DESIGN.md: host, addr base64, pid, lease, slots,
 * version). parse fills an owned member; node is the key's last part. */
char *mb__node_json(const mb_member_t *m, int pid);
int mb__node_parse(const char *node, const char *json, size_t len,
                   mb_member_t *m);

char *mb__view_json(const mb__view_t *v);
int mb__view_parse(const char *json, size_t len, mb__view_t *v);

/*
 * The view that follows old (generation 0 when none) given the live
 * nodes: survivors keep their order, newcomers are placed after the last
 * member on their host (else at the end), sorted by (host, node).
 * Returns 1 with *next filled when the member list changed, 0 when it
 * did not, or ST_ENOMEM.
 */
int mb__view_next(const mb__view_t *old, const mb_member_t *alive,
                  size_t n_alive, uint64_t step, mb__view_t *next);

#endif
