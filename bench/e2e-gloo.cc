/*
 * e2e-gloo.cc - Gloo's ring allreduce for bench/e2e, one rank per process.
 *
 *   e2e-gloo ALGO RANK N DIR ITERS BYTES...
 *
 * ALGO is ring (AllreduceRing), chunked (AllreduceRingChunked) or new
 * (gloo::allreduce with the RING algorithm). Rendezvous is a FileStore in
 * DIR; TCP on 127.0.0.1. For each size: one warm-up, then ITERS f32 sum
 * allreduces; prints "BYTES USEC CPU": the median of this rank and the
 * CPU seconds this process (every thread: Gloo's transport loop too)
 * spent over the timed iterations, as e2e's ring ranks report theirs.
 *
 * Mixing the legacy classes and gloo::allreduce in one context hangs
 * (ENVIRONMENT.md), so e2e launches one set of processes per algorithm.
 * Built only for the benchmark: ringd never links Gloo.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ctime>
#include <unistd.h>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

static double now_us()
{
    using namespace std::chrono;
    return duration<double, std::micro>(
               steady_clock::now().time_since_epoch()).count();
}

static double cpu_s()
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void run_once(const std::string &algo,
                     const std::shared_ptr<gloo::Context> &ctx, float *buf,
                     size_t count, std::unique_ptr<gloo::Algorithm> &legacy)
{
    if (algo == "new") {
        gloo::AllreduceOptions o(ctx);
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        o.setOutput(buf, count);
        o.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *,
                                 size_t)>(&gloo::sum<float>));
        gloo::allreduce(o);
        return;
    }
    legacy->run();
}

/*
 * The legacy classes return before their last sends have left (Gloo's
 * loop thread writes them), so a rank that exits at once can cut its
 * successor off its last chunk ("Connection closed by peer"). Each rank
 * therefore leaves a file in dir and exits only when every rank's is
 * there: by then every rank has its result.
 */
static int done_barrier(const char *dir, int rank, int n)
{
    std::string mine = std::string(dir) + "/done." + std::to_string(rank);
    FILE *f = fopen(mine.c_str(), "w");
    if (f == nullptr || fclose(f) != 0) {
        fprintf(stderr, "e2e-gloo: %s: cannot create\n", mine.c_str());
        return 1;
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int r = 0; r < n; r++) {
        std::string p = std::string(dir) + "/done." + std::to_string(r);
        while (access(p.c_str(), F_OK) != 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                fprintf(stderr, "e2e-gloo: rank %d never finished\n", r);
                return 1;
            }
            /* Nothing signals a peer's file but the file itself. */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, nullptr);
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: e2e-gloo ALGO RANK N DIR ITERS BYTES...\n");
        return 2;
    }
    std::string algo = argv[1];
    int rank = atoi(argv[2]), n = atoi(argv[3]);
    const char *dir = argv[4];
    int iters = atoi(argv[5]);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, dev);

    for (int a = 6; a < argc; a++) {
        size_t bytes = strtoull(argv[a], nullptr, 10);
        size_t count = bytes / sizeof(float);
        std::vector<float> buf(count, 1.0f);
        float *p = buf.data();
        std::unique_ptr<gloo::Algorithm> legacy;
        if (algo == "ring")
            legacy.reset(new gloo::AllreduceRing<float>(
                ctx, std::vector<float *>{p}, (int)count));
        else if (algo == "chunked")
            legacy.reset(new gloo::AllreduceRingChunked<float>(
                ctx, std::vector<float *>{p}, (int)count));
        else if (algo != "new") {
            fprintf(stderr, "e2e-gloo: unknown algorithm %s\n",
                    algo.c_str());
            return 2;
        }
        std::vector<double> t;
        double cpu0 = 0;
        for (int i = 0; i <= iters; i++) {
            if (i == 1)
                cpu0 = cpu_s();
            double t0 = now_us();
            run_once(algo, ctx, p, count, legacy);
            if (i > 0)
                t.push_back(now_us() - t0);
        }
        std::sort(t.begin(), t.end());
        double cpu = cpu_s() - cpu0;
        printf("%zu %.1f %.6f\n", bytes, t[t.size() / 2], cpu);
        fflush(stdout);
    }
    return done_barrier(dir, rank, n);
}
