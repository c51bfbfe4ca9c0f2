/*
 * backend_ring_view.c - the ring backend's own copies of membership views
 * (an mb_view_t is valid only during on_view; the ring thread reads the
 * installed view while it builds the ring).
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/backend_ring-int.h"

void dmn__rb_view_free(rb_view_t *v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < v->n; i++) {
        free(v->m[i].node);
        free(v->m[i].addr);
    }
    free(v->m);
    free(v);
}

rb_view_t *dmn__rb_view_copy(const mb_view_t *mv)
{
    rb_view_t *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return NULL;
    v->m = calloc(mv->n_members ? mv->n_members : 1, sizeof(rb_member_t));
    if (v->m == NULL) {
        free(v);
        return NULL;
    }
    v->generation = mv->generation;
    v->my_index = mv->my_index;
    v->n_joiners = mv->n_joiners;
    for (size_t i = 0; i < mv->n_members; i++, v->n++) {
        const mb_member_t *s = &mv->members[i];
        rb_member_t *d = &v->m[i];
        d->node = strdup(s->node);
        d->addr = malloc(s->addr_len ? s->addr_len : 1);
        if (d->node == NULL || d->addr == NULL) {
            v->n++;
            dmn__rb_view_free(v);
            return NULL;
        }
        memcpy(d->addr, s->addr, s->addr_len);
        d->addr_len = s->addr_len;
        d->slots = s->slots;
        d->lease = s->lease;
        d->joiner = s->joiner;
    }
    return v;
}
