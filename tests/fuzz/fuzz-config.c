/*
 * fuzz-config.c - the config file reader (dmn__config_read,
 * daemon/config.c) on a memory FILE.
 *
 * Whatever the text, the reader either fails or leaves every number
 * inside its key's bounds and every string it set non-empty.
 */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#include "common/status.h"
#include "daemon/dmn-parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *null_err;
    if (null_err == NULL)
        null_err = fopen("/dev/null", "w");
    if (size == 0 || null_err == NULL)
        return 0;
    FILE *f = fmemopen((void *)data, size, "r");
    if (f == NULL)
        return 0;
    dmn_config_t cfg;
    dmn_config_init(&cfg);
    int rc = dmn__config_read(&cfg, f, "fuzz.conf", null_err);
    fclose(f);
    FUZZ_ASSERT(rc == 0 || rc == ST_ECONFIG);
    if (rc == 0) {
        FUZZ_ASSERT(cfg.min_nodes >= 1 && cfg.min_nodes <= 100000);
        FUZZ_ASSERT(cfg.ring_deadline_ms >= 100);
        FUZZ_ASSERT(cfg.lease_ttl >= 1 && cfg.lease_ttl <= 3600);
        FUZZ_ASSERT(cfg.trainers <= 4096);
        FUZZ_ASSERT(cfg.max_clients >= 1 && cfg.max_clients <= 65536);
        FUZZ_ASSERT(cfg.socket_path != NULL && cfg.socket_path[0] != '\0');
        FUZZ_ASSERT(cfg.nucx_opts >= 0 && cfg.nucx_opts <= DMN_MAX_UCX_OPTS);
        for (int i = 0; i < cfg.nucx_opts; i++)
            FUZZ_ASSERT(strchr(cfg.ucx_opts[i], '=') != NULL);
    }
    dmn_config_free(&cfg);
    return 0;
}
