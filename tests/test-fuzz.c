/*
 * test-fuzz.c - a short run of every fuzz harness (tests/fuzz/), and the
 * inputs the fuzzers found to break a parser, fed through the same
 * functions as regression tests.
 */
#include "tests/task.h"

#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/json.h"
#include "membership/etcd-int.h"
#include "membership/mb-int.h"
#include "tests/helpers.h"

static const char *const fuzz_targets[] = {"proto", "etcd", "view", "ckpt",
                                           "config"};
#define N_TARGETS (sizeof(fuzz_targets) / sizeof(fuzz_targets[0]))

/* The seed corpora, found from build/ or build/<sub>/. */
static int corpus_dir(char *buf, size_t len)
{
    const char *ups[] = {"..", "../.."};
    for (size_t i = 0; i < 2; i++) {
        snprintf(buf, len, "%s/%s/tests/fuzz/corpus", th_bindir(), ups[i]);
        if (access(buf, R_OK) == 0)
            return 0;
    }
    return -1;
}

static int read_log(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

/*
 * Each harness runs a fixed number of inputs from its seed corpus and
 * their mutations (seed 1, so a failure replays); new inputs go to a
 * temp dir, never into the tree. A crash, a sanitizer report or a broken
 * harness assertion is a non-zero exit.
 */
TEST_IMPL(fuzz_short)
{
    char fdir[PATH_MAX], corpus[PATH_MAX], bin[PATH_MAX + 32];
    snprintf(fdir, sizeof(fdir), "%s/fuzz", th_bindir());
    size_t present = 0;
    for (size_t i = 0; i < N_TARGETS; i++) {
        snprintf(bin, sizeof(bin), "%s/fuzz-%s", fdir, fuzz_targets[i]);
        present += access(bin, X_OK) == 0;
    }
    if (present == 0) {
        TEST_SKIP_WHY("no harness in %s (clang cannot link libFuzzer "
                      "here, or 'make fuzz-build' was not run)", fdir);
    }
    ASSERT_MSG(present == N_TARGETS, "only %zu of %zu harnesses in %s",
               present, N_TARGETS, fdir);
    ASSERT_MSG(corpus_dir(corpus, sizeof(corpus)) == 0,
               "tests/fuzz/corpus not found");
    char *tmp = th_mkdtemp("fuzz");
    ASSERT(tmp != NULL);
    for (size_t i = 0; i < N_TARGETS; i++) {
        const char *t = fuzz_targets[i];
        char work[PATH_MAX], seeds[PATH_MAX + 16], log[PATH_MAX + 16];
        char prefix[PATH_MAX + 32];
        snprintf(bin, sizeof(bin), "%s/fuzz-%s", fdir, t);
        snprintf(work, sizeof(work), "%s/%s", tmp, t);
        snprintf(seeds, sizeof(seeds), "%s/%s", corpus, t);
        snprintf(log, sizeof(log), "%s/%s.log", tmp, t);
        snprintf(prefix, sizeof(prefix), "-artifact_prefix=%s/crash-", work);
        ASSERT_EQ(mkdir(work, 0755), 0);
        char *argv[] = {bin, "-runs=20000", "-seed=1", "-max_len=4096",
                        prefix, work, seeds, NULL};
        pid_t pid = th_spawn(argv, log);
        ASSERT_GT(pid, 0);
        int status = 0;
        ASSERT_OK(th_wait(pid, 120000, &status));
        static char out[1 << 16];
        ASSERT_EQ(read_log(log, out, sizeof(out)), 0);
        ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                   "fuzz-%s failed (status 0x%x):\n%s", t, status, out);
        ASSERT_MSG(strstr(out, "Done 20000 runs") != NULL,
                   "fuzz-%s did not run its inputs:\n%s", t, out);
        printf("fuzz-%s: 20000 runs, no crash\n", t);
    }
    th_rmtree(tmp);
    free(tmp);
    return 0;
}

/*
 * A copy of s that ends exactly where readable memory ends, with no NUL
 * after it: a parser that reads past the length it was given faults here
 * even without a sanitizer.
 */
static char *at_page_end(const char *s, size_t n, void **map_p)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (n + (size_t)page - 1) / (size_t)page + 1;
    char *m = mmap(NULL, pages * (size_t)page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT(m != MAP_FAILED);
    ASSERT_EQ(mprotect(m + (pages - 1) * (size_t)page, (size_t)page,
                       PROT_NONE), 0);
    char *p = m + (pages - 1) * (size_t)page - n;
    memcpy(p, s, n);
    *map_p = m;
    return p;
}

static void unmap(void *m, size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    munmap(m, ((n + (size_t)page - 1) / (size_t)page + 1) * (size_t)page);
}

/* fuzz-view, first minute: a rejected record was logged with "%.200s",
 * reading on past the length to the next NUL. */
TEST_IMPL(fuzz_view_reject_log_within_len)
{
    static const char node[] =
        "{\"host\": \"h1\", \"addr\": \"A===\", \"lease\": \"1\", "
        "\"slots\": 1}";
    static const char view[] = "{\"generation\": 0, \"members\": []}";
    void *m1, *m2;
    char *p = at_page_end(node, strlen(node), &m1);
    mb_member_t mem;
    ASSERT_EQ(mb__node_parse("n1", p, strlen(node), &mem), ST_EPROTO);
    char *q = at_page_end(view, strlen(view), &m2);
    mb__view_t v;
    ASSERT_EQ(mb__view_parse(q, strlen(view), &v), ST_EPROTO);
    unmap(m1, strlen(node));
    unmap(m2, strlen(view));
    return 0;
}

/* fuzz-view: "step": -1 was converted to uint64_t (undefined; UBSan
 * stops there) and accepted. Out-of-range and fractional numbers are
 * rejected; the largest exact ones still parse. */
TEST_IMPL(fuzz_view_numbers_out_of_range)
{
    static const char *const bad[] = {
        "{\"generation\":1,\"step\":-1,\"hosts\":[],\"members\":[],\"joiners\":[]}",
        "{\"generation\":1e30,\"step\":0,\"hosts\":[],\"members\":[],\"joiners\":[]}",
        "{\"generation\":1,\"step\":1e300,\"hosts\":[],\"members\":[],\"joiners\":[]}",
        "{\"generation\":0.5,\"step\":0,\"hosts\":[],\"members\":[],\"joiners\":[]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mb__view_t v;
        ASSERT_MSG(mb__view_parse(bad[i], strlen(bad[i]), &v) == ST_EPROTO,
                   "accepted %s", bad[i]);
    }
    static const char ok[] =
        "{\"generation\":9007199254740992,\"step\":7,\"hosts\":[],\"members\":[],"
        "\"joiners\":[]}";
    mb__view_t v;
    ASSERT_OK(mb__view_parse(ok, strlen(ok), &v));
    ASSERT_EQ(v.generation, 9007199254740992ull);
    ASSERT_EQ(v.step, 7);
    mb__view_free(&v);
    return 0;
}

/* The same conversion in the etcd reply fields, where numbers are
 * accepted besides etcd's strings: a revision of 1e30 or -1e300 is an
 * error, not an undefined conversion. */
TEST_IMPL(fuzz_etcd_number_out_of_range)
{
    static const char *const bad[] = {
        "{\"header\":{\"revision\":1e30}}",
        "{\"header\":{\"revision\":-1e300}}",
        "{\"header\":{\"revision\":9223372036854775808}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *j = cJSON_Parse(bad[i]);
        ASSERT(j != NULL);
        etcd_arena_t a = {0};
        etcd_result_t res;
        ASSERT_MSG(etcd__parse_reply(ETCD_K_RANGE, j, &a, &res) == ST_EPROTO,
                   "accepted %s", bad[i]);
        etcd__arena_free(&a);
        cJSON_Delete(j);
    }
    cJSON *j = cJSON_Parse("{\"header\":{\"revision\":-9.2e18}}");
    int64_t v;
    ASSERT_OK(rd_json_i64(cJSON_GetObjectItem(j, "header"), "revision", &v));
    ASSERT_EQ(v, -9200000000000000000ll);
    cJSON_Delete(j);
    return 0;
}

/* The fuzz-view harness's consistency check (n_joiners is the number of
 * members flagged as joiners), on a view naming a joiner twice: it was
 * counted twice, so a view could have more joiners than members. */
TEST_IMPL(fuzz_view_joiner_listed_twice)
{
    static const char json[] =
        "{\"generation\":1,\"step\":0,\"hosts\":[\"h\"],"
        "\"members\":[[\"a\",0,\"1\",1]],\"joiners\":[0,0]}";
    mb__view_t v;
    ASSERT_OK(mb__view_parse(json, strlen(json), &v));
    ASSERT_EQ(v.n_members, 1);
    ASSERT_EQ(v.members[0].joiner, 1);
    ASSERT_EQ(v.n_joiners, 1);
    mb__view_free(&v);
    return 0;
}
