/*
 * mb-blame.c - who is to blame for a failure the members report
 * (membership/README.md, "Blame").
 *
 * Every member writes its own report on a suspect, suspect/<node>/<by>,
 * so the leader sees who accuses whom. A broken link looks the same from
 * both of its ends: the node on the lossy side finds its healthy
 * neighbours silent or slow just as they find it. What tells them apart
 * is the count: both ring neighbours of a failed node accuse it, while a
 * node whose own link fails accuses healthy nodes one each. So a
 * suspect is convicted (its lease revoked, left out of the next view) on
 *   - one hard report: its endpoint failed (the process is gone), or
 *   - reports by two members that are not themselves discredited
 *     (accused by two, or by a hard report), or
 *   - one silence report once it is MB_BLAME_GRACE_MS old and its
 *     reporter is accused by nobody, or MB_BLAME_GRACE_MS * 2 old
 *     whatever (a link cut one way is seen from one end only), or
 *   - any one report when the view has two members: nobody else could
 *     report, so the reporter checks its own path to etcd first and
 *     withholds the report when that is slow (mb-suspect.c, self_probe).
 * Otherwise a lossy-link report alone never convicts, and counts only
 * while it is at most MB_BLAME_FRESH_MS old.
 *
 * The leader applies this to its mirror of suspect/. A member that
 * suspects the leader applies it to a range read of suspect/ and revokes
 * the leader's lease itself when the leader stands convicted.
 */
#include "membership/mb-int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/status.h"

static const char *const kind_names[] = {"lossy", "silent", "hard"};

const char *mb__blame_name(mb_blame_t kind)
{
    return (unsigned)kind < 3 ? kind_names[kind] : "?";
}

static int kind_parse(const char *s, mb_blame_t *kind)
{
    for (int i = 0; s != NULL && i < 3; i++) {
        if (strcmp(s, kind_names[i]) == 0) {
            *kind = (mb_blame_t)i;
            return 0;
        }
    }
    return ST_EINVAL;
}

int mb__suspect_key(const mb_t *mb, const char *node, const char *by,
                    char key[MB_KEY_MAX])
{
    char pre[MB_KEY_MAX];
    if (mb_key(pre, sizeof(pre), mb->job, MB_KEY_SUSPECT, node, 0, 0) != 0)
        return ST_EINVAL;
    int n = snprintf(key, MB_KEY_MAX, "%s%s", pre, by);
    return n > 0 && n < MB_KEY_MAX ? 0 : ST_EINVAL;
}

int mb__suspect_sign(const mb_t *mb, const char *key, const char *lease,
                     const char *by, const char *by_lease, const char *kind,
                     char sig[MB_SIG_HEX])
{
    const char *f[] = {"suspect", key, lease, by, by_lease, kind};
    return mb__sign(mb, f, 6, sig);
}

static const char *json_str(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int64_t mb__view_lease(const mb_t *mb, const char *node)
{
    for (size_t i = 0; i < mb->view.n_members; i++)
        if (strcmp(mb->view.members[i].node, node) == 0)
            return mb->view.members[i].lease;
    return 0;
}

/* The key is suspect/<node>/<by> and the value names by, signed with the
 * job secret (when there is one) by a member of the view under the
 * lease it holds there. */
static int report_check(const mb_t *mb, const char *key, const cJSON *j,
                        mb__report_t *r)
{
    size_t plen = strlen(mb->suspect_prefix);
    const char *rest = key + plen, *slash = strchr(rest, '/');
    const char *by = json_str(j, "by"), *lease = json_str(j, "lease");
    const char *kind = json_str(j, "kind");
    if (strncmp(key, mb->suspect_prefix, plen) != 0 || slash == NULL ||
        slash == rest || (size_t)(slash - rest) >= sizeof(r->node) ||
        by == NULL || strcmp(slash + 1, by) != 0 || lease == NULL ||
        strlen(by) >= sizeof(r->by) || kind_parse(kind, &r->kind) != 0)
        return ST_EINVAL;
    memcpy(r->node, rest, (size_t)(slash - rest));
    r->node[slash - rest] = '\0';
    snprintf(r->by, sizeof(r->by), "%s", by);
    r->lease = strtoll(lease, NULL, 10);
    int64_t by_view = mb__view_lease(mb, by);
    if (by_view == 0 || r->lease == 0)
        return ST_EINVAL;
    if (mb->secret_len == 0)
        return 0;
    const char *by_lease = json_str(j, "by_lease"), *sig = json_str(j, "sig");
    if (by_lease == NULL || strtoll(by_lease, NULL, 10) != by_view)
        return ST_EINVAL;
    const char *f[] = {"suspect", key, lease, by, by_lease, kind};
    return mb__sig_ok(mb, f, 6, sig) ? 0 : ST_EINVAL;
}

int mb__report_parse(const mb_t *mb, const char *key, const char *val,
                     size_t len, uint64_t age_ms, mb__report_t *r)
{
    memset(r, 0, sizeof(*r));
    cJSON *j = cJSON_ParseWithLength(val, len);
    int rc = j != NULL ? report_check(mb, key, j, r) : ST_EINVAL;
    cJSON_Delete(j);
    r->age_ms = age_ms;
    r->valid = rc == 0;
    return rc;
}

/* A report that still counts: valid, and a lossy one only while fresh. */
static int counts(const mb__report_t *r)
{
    return r->valid &&
           (r->kind != MB_BLAME_LOSSY || r->age_ms <= MB_BLAME_FRESH_MS);
}

/* Accusers of node's incarnation in the view, and whether any is hard. */
static int accusers(const mb_t *mb, const mb__report_t *rs, size_t n,
                    const char *node, int *hard)
{
    int64_t lease = mb__view_lease(mb, node);
    int count = 0;
    *hard = 0;
    for (size_t i = 0; lease != 0 && i < n; i++) {
        if (!counts(&rs[i]) || rs[i].lease != lease ||
            strcmp(rs[i].node, node) != 0)
            continue;
        count++;
        *hard |= rs[i].kind == MB_BLAME_HARD;
    }
    return count;
}

/* A reporter whose own word no longer counts: it stands accused by two
 * members or by a hard report (its link is the failing one). */
static int discredited(const mb_t *mb, const mb__report_t *rs, size_t n,
                       const char *by)
{
    int hard;
    int count = accusers(mb, rs, n, by, &hard);
    return hard || count >= 2;
}

int mb__convicted(const mb_t *mb, const mb__report_t *rs, size_t n,
                  const char *node, int64_t lease, uint64_t *wake_ms)
{
    const mb__report_t *lone = NULL;
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        const mb__report_t *r = &rs[i];
        if (!counts(r) || r->lease != lease || strcmp(r->node, node) != 0 ||
            discredited(mb, rs, n, r->by))
            continue;
        if (r->kind == MB_BLAME_HARD)
            return 1;
        count++;
        lone = r;
    }
    if (count >= 2)
        return 1;
    if (count == 0)
        return 0;
    /* Nobody else could report: the reporter checked its own path
     * before it did (mb-suspect.c, self_probe). */
    if (mb->view.n_members <= 2)
        return 1;
    if (lone->kind == MB_BLAME_LOSSY)
        return 0;
    if (lone->age_ms >= 2 * MB_BLAME_GRACE_MS)
        return 1;
    int hard;
    if (lone->age_ms >= MB_BLAME_GRACE_MS &&
        accusers(mb, rs, n, lone->by, &hard) == 0)
        return 1;
    uint64_t at = lone->age_ms < MB_BLAME_GRACE_MS
                      ? MB_BLAME_GRACE_MS - lone->age_ms
                      : 2 * MB_BLAME_GRACE_MS - lone->age_ms;
    if (wake_ms != NULL && (*wake_ms == 0 || at < *wake_ms))
        *wake_ms = at;
    return 0;
}

size_t mb__reports_mirror(mb_t *mb, mb__report_t **out)
{
    const mb_mirror_t *s = &mb->mirrors[MB_W_SUSPECTS];
    size_t plen = strlen(mb->suspect_prefix), n = 0;
    uint64_t now = uv_now(mb->loop);
    mb__report_t *rs = calloc(s->n_kvs + 1, sizeof(*rs));
    for (size_t i = 0; rs != NULL && i < s->n_kvs; i++) {
        const mb_kv_t *kv = &s->kvs[i];
        if (strncmp(kv->key, mb->suspect_prefix, plen) != 0)
            continue;
        uint64_t age = now > kv->seen_ms ? now - kv->seen_ms : 0;
        mb__report_parse(mb, kv->key, kv->val, kv->len, age, &rs[n]);
        rs[n++].kv = kv;
    }
    *out = rs;
    return rs != NULL ? n : 0;
}

void mb__blame_describe(const mb__report_t *rs, size_t n, const char *node,
                        int64_t lease, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && at < len; i++) {
        const mb__report_t *r = &rs[i];
        if (!r->valid || r->lease != lease || strcmp(r->node, node) != 0)
            continue;
        int w = snprintf(buf + at, len - at, "%s%s (%s, %llu ms)",
                         at ? ", " : "", r->by, mb__blame_name(r->kind),
                         (unsigned long long)r->age_ms);
        at = w > 0 ? at + (size_t)w : len;
    }
}
