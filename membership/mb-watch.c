/*
 * mb-watch.c - membership: the mirror of the keys this member acts on,
 * one watch (slot) each: its own keys, its ring neighbours' records and,
 * while it leads, the leader's prefixes, started and stopped as
 * leadership and views change.
 */
#include "membership/mb-int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

static void kv_free(mb_kv_t *kv)
{
    free(kv->key);
    free(kv->val);
}

static int slot_covers(const mb_mirror_t *s, const char *key)
{
    if (s->watch == NULL)
        return 0;
    return s->prefix ? strncmp(key, s->key, strlen(s->key)) == 0
                     : strcmp(key, s->key) == 0;
}

static mb_kv_t *slot_find(mb_mirror_t *s, const char *key)
{
    for (size_t i = 0; i < s->n_kvs; i++)
        if (strcmp(s->kvs[i].key, key) == 0)
            return &s->kvs[i];
    return NULL;
}

int mb__mirror_lookup(mb_t *mb, const char *key, mb_kv_t **kv_p)
{
    *kv_p = NULL;
    /* Own keys first, then the leader's records (the ones its views are
     * made of: a neighbour's own watch may lag them), then the rest. */
    for (int j = 0; j < MB_W_N; j++) {
        int i = j < MB_W_PEER ? j : j == MB_W_PEER ? MB_W_NODES
                : j <= MB_W_NODES ? j - 1 : j;
        mb_mirror_t *s = &mb->mirrors[i];
        if (s->synced && slot_covers(s, key)) {
            *kv_p = slot_find(s, key);
            return 1;
        }
    }
    return 0;
}

mb_kv_t *mb__mirror_find(mb_t *mb, const char *key)
{
    mb_kv_t *kv;
    mb__mirror_lookup(mb, key, &kv);
    return kv;
}

size_t mb__watched(const mb_t *mb, const char **keys, int *prefix,
                   size_t max)
{
    size_t n = 0;
    for (int i = 0; i < MB_W_N && n < max; i++) {
        if (mb->mirrors[i].watch == NULL)
            continue;
        keys[n] = mb->mirrors[i].key;
        prefix[n++] = mb->mirrors[i].prefix;
    }
    return n;
}

static void slot_clear(mb_mirror_t *s)
{
    while (s->n_kvs > 0)
        kv_free(&s->kvs[--s->n_kvs]);
}

static void slot_del(mb_mirror_t *s, const char *key)
{
    mb_kv_t *kv = slot_find(s, key);
    if (kv == NULL)
        return;
    kv_free(kv);
    *kv = s->kvs[--s->n_kvs];
}

static int slot_put(mb_mirror_t *s, const etcd_kv_t *src)
{
    mb_kv_t *kv = slot_find(s, src->key);
    if (kv == NULL) {
        if (s->n_kvs == s->cap_kvs) {
            size_t cap = s->cap_kvs ? s->cap_kvs * 2 : 4;
            mb_kv_t *p = realloc(s->kvs, cap * sizeof(*p));
            if (p == NULL)
                return ST_ENOMEM;
            s->kvs = p;
            s->cap_kvs = cap;
        }
        kv = &s->kvs[s->n_kvs++];
        memset(kv, 0, sizeof(*kv));
        kv->key = strdup(src->key);
    }
    free(kv->val);
    kv->val = malloc(src->value_len + 1);
    if (kv->key == NULL || kv->val == NULL) {
        kv_free(kv);
        *kv = s->kvs[--s->n_kvs];
        return ST_ENOMEM;
    }
    memcpy(kv->val, src->value, src->value_len);
    kv->val[src->value_len] = '\0';
    kv->len = src->value_len;
    if (kv->mod != src->mod_revision) /* a report's age: since last said */
        kv->seen_ms = uv_now(s->mb->loop);
    kv->mod = src->mod_revision;
    kv->create = src->create_revision;
    kv->lease = src->lease;
    return 0;
}

static void on_watch(const etcd_watch_update_t *up, void *data)
{
    mb_mirror_t *s = data;
    mb_t *mb = s->mb;
    etcd_watch_t *w = s->watch;
    if (up->reset) {
        slot_clear(s);
        for (size_t i = 0; i < up->n_kvs; i++)
            slot_put(s, &up->kvs[i]);
        s->rev = up->revision;
        s->synced = 1;
    }
    mb->events += up->n_events;
    /* One reconcile per event, not per batch: a batch may hold two
     * writes of the view key, and every generation must be installed.
     * A reconcile may stop this very watch (leadership, neighbours). */
    for (size_t i = 0; i < up->n_events && s->watch == w; i++) {
        const etcd_event_t *ev = &up->events[i];
        if (ev->is_delete)
            slot_del(s, ev->kv.key);
        else
            slot_put(s, &ev->kv);
        s->rev = ev->kv.mod_revision;
        mb__reconcile(mb);
    }
    if (up->reset && s->watch == w)
        mb__reconcile(mb);
}

static void slot_stop(mb_mirror_t *s)
{
    etcd_watch_stop(s->watch);
    s->watch = NULL;
    s->synced = 0;
    s->rev = 0;
    s->key[0] = '\0';
    slot_clear(s);
}

static void slot_start(mb_t *mb, int i, const char *key, int prefix)
{
    mb_mirror_t *s = &mb->mirrors[i];
    slot_stop(s);
    s->mb = mb;
    s->prefix = prefix;
    snprintf(s->key, sizeof(s->key), "%s", key);
    int rc = prefix ? etcd_watch_start(mb->etcd, key, on_watch, s, &s->watch)
                    : etcd_watch_key(mb->etcd, key, on_watch, s, &s->watch);
    if (rc != 0) {
        s->watch = NULL;
        RD_ERROR("mb %s: cannot watch %s", mb->me.node, key);
    }
}

void mb__stop_watches(mb_t *mb)
{
    for (int i = 0; i < MB_W_N; i++)
        slot_stop(&mb->mirrors[i]);
}

/* At the end: the slots' copies and arrays, after the watches stopped. */
void mb__mirrors_free(mb_t *mb)
{
    for (int i = 0; i < MB_W_N; i++) {
        slot_clear(&mb->mirrors[i]);
        free(mb->mirrors[i].kvs);
    }
}

/* What every member acts on; the rest follows leadership and views. */
void mb__restart_watch(mb_t *mb)
{
    mb__stop_watches(mb);
    mb->pending_gen = 0;
    for (int i = 0; i < 2; i++) {
        free(mb->nbrs[i]);
        mb->nbrs[i] = NULL;
    }
    slot_start(mb, MB_W_SELF, mb->my_key, 0);
    slot_start(mb, MB_W_VIEW, mb->view_key, 0);
    slot_start(mb, MB_W_LEADER, mb->leader_key, 0);
    slot_start(mb, MB_W_DRAIN, mb->drain_key, 0);
}

/* The leader's watches, started on election and stopped when it no
 * longer leads: node records, suspects and reshape requests reach only
 * the one member that acts on them. Returns 1 once all have synced. */
int mb__leader_watches(mb_t *mb, int on)
{
    const char *keys[] = {mb->nodes_prefix, mb->suspect_prefix,
                          mb->reshape_prefix};
    int synced = 1;
    for (int i = 0; i < 3; i++) {
        mb_mirror_t *s = &mb->mirrors[MB_W_NODES + i];
        if (on && s->watch == NULL)
            slot_start(mb, MB_W_NODES + i, keys[i], 1);
        else if (!on && s->watch != NULL)
            slot_stop(s);
        synced &= s->synced;
    }
    return on && synced;
}

int mb__leader_synced(mb_t *mb)
{
    for (int i = MB_W_NODES; i <= MB_W_RESHAPES; i++)
        if (!mb->mirrors[i].synced)
            return 0;
    return 1;
}

/* Watch the records of exactly the nodes named (at most MB_PEERS_MAX). */
void mb__watch_peers(mb_t *mb, const char *const *nodes, size_t n)
{
    char keys[MB_PEERS_MAX][MB_KEY_MAX];
    for (size_t j = 0; j < n; j++)
        mb_key(keys[j], MB_KEY_MAX, mb->job, MB_KEY_NODE, nodes[j], 0, 0);
    for (int i = MB_W_PEER; i < MB_W_PEER + MB_PEERS_MAX; i++) {
        mb_mirror_t *s = &mb->mirrors[i];
        int wanted = 0;
        for (size_t j = 0; j < n && s->watch != NULL; j++)
            wanted |= strcmp(s->key, keys[j]) == 0;
        if (s->watch != NULL && !wanted)
            slot_stop(s);
    }
    for (size_t j = 0; j < n; j++) {
        int have = 0, free_slot = -1;
        for (int i = MB_W_PEER; i < MB_W_PEER + MB_PEERS_MAX; i++) {
            mb_mirror_t *s = &mb->mirrors[i];
            have |= s->watch != NULL && strcmp(s->key, keys[j]) == 0;
            if (s->watch == NULL && free_slot < 0)
                free_slot = i;
        }
        if (!have && free_slot >= 0)
            slot_start(mb, free_slot, keys[j], 0);
    }
}
