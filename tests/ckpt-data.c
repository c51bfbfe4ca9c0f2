#include "tests/ckpt-data.h"

const ckpt_codec_t tc_codec = {.level = 3, .threads = 0, .elem_size = 4};

static uint64_t rs = 88172645463325252ull;

uint32_t tc_rnd32(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}

void tc_fill_weights(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int k = 0; k < 4; k++)
            s += (float)(tc_rnd32() % 10000) / 10000.0f - 0.5f;
        w[i] = s * 0.05f;
    }
}

void tc_perturb(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] -= 1e-4f * ((float)(tc_rnd32() % 2000) / 1000.0f - 1.0f);
}
