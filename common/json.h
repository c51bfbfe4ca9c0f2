/*
 * json.h - the field readers and writers every module shares for the JSON
 * that crosses a trust boundary (etcd replies and records, manifests).
 *
 * 64-bit integers travel as decimal strings, as etcd's gateway writes
 * them, because a JSON number is a double and loses bits above 2^53.
 * Readers never trust the input: a missing field, a wrong type, a
 * fraction or a value out of range is ST_EPROTO and leaves *out alone
 * (except rd_json_i64, see there). Nothing here logs: the caller knows
 * what the field means and says so.
 */
#ifndef RINGD_JSON_H
#define RINGD_JSON_H

#include <stdint.h>

#include <cjson/cJSON.h>

/* obj[name] as an int64 from a number or a decimal string. A missing
 * field is 0 with *out = 0, because etcd leaves out fields at their
 * default value. */
int rd_json_i64(const cJSON *obj, const char *name, int64_t *out);

/* obj[name] as a uint64 from a decimal string without sign: required. */
int rd_json_u64(const cJSON *obj, const char *name, uint64_t *out);

/* obj[name] as an integral number within [0, max]: required. */
int rd_json_u32(const cJSON *obj, const char *name, uint32_t max,
                uint32_t *out);

/* j itself as an integral number within [lo, hi] (bounds within
 * +-2^53, where doubles still hold every integer). */
int rd_json_int(const cJSON *j, double lo, double hi, long long *out);

/* j itself as a count >= 0 from a number or a decimal string. */
int rd_json_count(const cJSON *j, long long *out);

/* Add name: "<decimal v>"; 0 or ST_ENOMEM. */
int rd_json_add_u64(cJSON *obj, const char *name, uint64_t v);

#endif /* RINGD_JSON_H */
