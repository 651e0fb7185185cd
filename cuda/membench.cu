// Pointer-chasing LOAD microbenchmarks for the memory-energy model (seed thesis, chapter 5).
//
// One kernel template, `chase<LEVEL, DIV>`, walks a chain of 64-bit pointers with inline-PTX
// loads whose cache operator pins the memory level under test:
//   level 0  shared  ld.shared.u64     (chain built in dynamic shared memory by the block)
//   level 1  L1      ld.global.ca.u64  (cache at all levels; array fits one SM's L1)
//   level 2  L2      ld.global.cg.u64  (bypass L1; all blocks' arrays together fit L2)
//   level 3  DRAM    ld.global.cg.u64  (bypass L1; all blocks' arrays together >> L2)
//
// Layout.  Block b owns `n` elements (array_bytes / 8, rounded down to a multiple of S), where
// S = round_up(threads, 4) elements.  Element j of block b holds the address of element
// (j + S) mod n of the same block.  Thread t starts at element t, so at step k the block reads
// elements k*S .. k*S+threads-1: contiguous, 32-byte aligned, every sector touched exactly once
// per pass and by exactly one warp request.  Each warp of t_w active threads therefore requests
// ceil(t_w / 4) sectors per step (4 uint64 per 32-byte sector), and a block requests
// ceil(threads / 4) sectors per step (full warps add exactly 8).  Hence, per launch,
//
//   sectors = blocks * ceil(threads / 4) * steps,    steps = measured loads per thread
//
// which is Eq. 5.7 of the seed, array * blocks * threads / (stride * granularity), with the
// stride adapted to the block width (S * 8 bytes) and granularity = 4 threads per sector.
// Shared memory counts the same 32-byte sector-equivalents; ncu counts shared *wavefronts*
// (<= 128 bytes each), analytically sum_w ceil(t_w / 16) per step for 8-byte loads.
//
// Each launch runs a warm-up pass (one pass over the array: fills the target cache; for
// shared the block also writes the chain first) and then `steps` measured loads in groups of
// UNROLL dependent loads.  warmup_only launches the same kernel with zero measured steps so
// that its time and energy can be subtracted.  The DIV variant puts one div.u64 (divisor 1,
// a kernel argument the compiler cannot fold) after every load, inside the dependency chain.
//
// Built two ways (see cuda/README.md):
//   nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC cuda/membench.cu -o libmembench.so   (ctypes)
//   nvcc -O3 -arch=sm_90 -DMEMBENCH_MAIN cuda/membench.cu -o membench                  (CLI)

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#ifndef MEMBENCH_UNROLL
#define MEMBENCH_UNROLL 16
#endif

#define MB_API extern "C" __attribute__((visibility("default")))

enum { LEVEL_SHARED = 0, LEVEL_L1 = 1, LEVEL_L2 = 2, LEVEL_DRAM = 3 };

// ------------------------------------------------------------------------------------------
// Device code
// ------------------------------------------------------------------------------------------

template <int LEVEL>
__device__ __forceinline__ uint64_t chase_load(uint64_t addr) {
    uint64_t v;
    if constexpr (LEVEL == LEVEL_SHARED) {
        asm volatile("ld.shared.u64 %0, [%1];" : "=l"(v) : "l"(addr));
    } else if constexpr (LEVEL == LEVEL_L1) {
        asm volatile("ld.global.ca.u64 %0, [%1];" : "=l"(v) : "l"(addr));
    } else {
        asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(addr));
    }
    return v;
}

__device__ __forceinline__ uint64_t div_one(uint64_t v, uint64_t one) {
    uint64_t q;
    asm volatile("div.u64 %0, %1, %2;" : "=l"(q) : "l"(v), "l"(one));
    return q;
}

template <int LEVEL, bool DIV>
__global__ void chase_kernel(uint64_t* __restrict__ base, long long n, long long stride,
                             long long warm_steps, long long meas_groups, uint64_t one,
                             uint64_t* __restrict__ sink) {
    extern __shared__ uint64_t sh[];
    uint64_t p;
    if constexpr (LEVEL == LEVEL_SHARED) {
        for (long long j = threadIdx.x; j < n; j += blockDim.x) {
            sh[j] = (uint64_t)__cvta_generic_to_shared(&sh[(j + stride) % n]);
        }
        __syncthreads();
        p = (uint64_t)__cvta_generic_to_shared(&sh[threadIdx.x]);
    } else {
        p = (uint64_t)(base + (long long)blockIdx.x * n + threadIdx.x);
    }

    // Warm-up: one pass, same cache operator, brings the block's array into the target level.
#pragma unroll 1
    for (long long k = 0; k < warm_steps; ++k) {
        p = chase_load<LEVEL>(p);
    }
    // Measurement: meas_groups * UNROLL dependent loads (plus one div each for DIV).
#pragma unroll 1
    for (long long g = 0; g < meas_groups; ++g) {
#pragma unroll
        for (int u = 0; u < MEMBENCH_UNROLL; ++u) {
            p = chase_load<LEVEL>(p);
            if constexpr (DIV) p = div_one(p, one);
        }
    }
    // Keep the chain live without memory traffic: p is never equal to `one` (1).
    if (p == one) sink[blockIdx.x] = p;
}

__global__ void init_chain_kernel(uint64_t* base, long long n, long long stride, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long b = i / n, j = i % n;
        base[i] = (uint64_t)(base + b * n + (j + stride) % n);
    }
}

// ------------------------------------------------------------------------------------------
// Host state and C ABI
// ------------------------------------------------------------------------------------------

struct mb_device {
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    long long l2_bytes;
    long long smem_per_sm_bytes;
    long long smem_per_block_bytes;        // default (static) limit, 48 KB
    long long smem_per_block_optin_bytes;  // opt-in dynamic limit (227 KB on H100)
    int max_threads_per_block;
    long long global_mem_bytes;
};

struct mb_result {
    double elapsed_ms;              // cudaEvent time of all launches together
    long long launches;
    long long steps_per_pass;       // loads per thread in one pass (= warm-up loads)
    long long meas_loads_per_thread;
    long long array_bytes_used;     // per block, after rounding to the stride
    long long stride_bytes;         // S * 8
    double sectors_per_launch;      // measured loop only: blocks * ceil(T/4) * steps
    double warm_sectors_per_launch; // warm-up pass
    double wavefronts_per_launch;   // shared only: blocks * sum_w ceil(t_w/16) * steps
    double div_warp_insts_per_launch;
    double loads_per_launch;        // thread-level loads in the measured loop
};

static std::string g_err;
static uint64_t* g_buf = nullptr;
static size_t g_buf_bytes = 0;
static uint64_t* g_sink = nullptr;
static cudaEvent_t g_ev0 = nullptr, g_ev1 = nullptr;
static int g_smem_attr_done[2][2] = {{0, 0}, {0, 0}};
static struct {
    int valid, level, blocks, threads;
    long long array_bytes, n, stride;
} g_prep = {0, 0, 0, 0, 0, 0, 0};

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            g_err = std::string(#call) + " failed: " + cudaGetErrorName(e_) + ": " +       \
                    cudaGetErrorString(e_) + " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")"; \
            return -(int)e_ - 1000;                                                         \
        }                                                                                   \
    } while (0)

static int fail(const std::string& msg) {
    g_err = msg;
    return -1;
}

MB_API const char* mb_last_error(void) { return g_err.c_str(); }

MB_API int mb_unroll(void) { return MEMBENCH_UNROLL; }

MB_API int mb_device_info(int device, mb_device* out) {
    cudaDeviceProp p;
    CK(cudaSetDevice(device));
    CK(cudaGetDeviceProperties(&p, device));
    std::memset(out, 0, sizeof(*out));
    std::strncpy(out->name, p.name, sizeof(out->name) - 1);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->l2_bytes = p.l2CacheSize;
    out->smem_per_sm_bytes = (long long)p.sharedMemPerMultiprocessor;
    out->smem_per_block_bytes = (long long)p.sharedMemPerBlock;
    out->smem_per_block_optin_bytes = (long long)p.sharedMemPerBlockOptin;
    out->max_threads_per_block = p.maxThreadsPerBlock;
    out->global_mem_bytes = (long long)p.totalGlobalMem;
    return 0;
}

MB_API void mb_release(void) {
    if (g_buf) cudaFree(g_buf);
    if (g_sink) cudaFree(g_sink);
    if (g_ev0) cudaEventDestroy(g_ev0);
    if (g_ev1) cudaEventDestroy(g_ev1);
    g_buf = nullptr;
    g_sink = nullptr;
    g_ev0 = g_ev1 = nullptr;
    g_buf_bytes = 0;
    g_prep.valid = 0;
}

static long long stride_elems(int threads) { return ((long long)threads + 3) / 4 * 4; }

// Allocates and builds the chain for (level, array_bytes, blocks, threads); outside any
// energy window.  Reuses the buffer when it is large enough.
MB_API int mb_prepare(int level, long long array_bytes, int blocks, int threads) {
    if (level < LEVEL_SHARED || level > LEVEL_DRAM) return fail("level must be 0..3 (shared, l1, l2, dram)");
    if (threads < 1 || threads > 1024) return fail("threads per block must be 1..1024");
    if (blocks < 1) return fail("blocks must be >= 1");
    long long S = stride_elems(threads);
    long long n = array_bytes / 8 / S * S;
    if (n < S) {
        return fail("array_bytes=" + std::to_string(array_bytes) + " is smaller than one step of " +
                    std::to_string(S * 8) + " bytes for " + std::to_string(threads) + " threads");
    }
    if (!g_ev0) {
        CK(cudaEventCreate(&g_ev0));
        CK(cudaEventCreate(&g_ev1));
    }
    if (!g_sink) {
        CK(cudaMalloc(&g_sink, 65536 * sizeof(uint64_t)));
        CK(cudaMemset(g_sink, 0, 65536 * sizeof(uint64_t)));
    }
    if (blocks > 65536) return fail("blocks must be <= 65536");
    if (level == LEVEL_SHARED) {
        int dev;
        cudaDeviceProp p;
        CK(cudaGetDevice(&dev));
        CK(cudaGetDeviceProperties(&p, dev));
        if ((size_t)(n * 8) > p.sharedMemPerBlockOptin) {
            return fail("shared array of " + std::to_string(n * 8) + " bytes exceeds the opt-in limit of " +
                        std::to_string(p.sharedMemPerBlockOptin) + " bytes per block");
        }
    } else {
        size_t need = (size_t)blocks * (size_t)n * sizeof(uint64_t);
        if (need > g_buf_bytes) {
            if (g_buf) CK(cudaFree(g_buf));
            g_buf = nullptr;
            g_buf_bytes = 0;
            CK(cudaMalloc(&g_buf, need));
            g_buf_bytes = need;
        }
        long long total = (long long)blocks * n;
        int grid = (int)((total + 255) / 256 < 65535 ? (total + 255) / 256 : 65535);
        init_chain_kernel<<<grid, 256>>>(g_buf, n, S, total);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    }
    g_prep.valid = 1;
    g_prep.level = level;
    g_prep.blocks = blocks;
    g_prep.threads = threads;
    g_prep.array_bytes = array_bytes;
    g_prep.n = n;
    g_prep.stride = S;
    return 0;
}

typedef void (*kernel_t)(uint64_t*, long long, long long, long long, long long, uint64_t, uint64_t*);

static kernel_t pick_kernel(int level, int div) {
    switch (level * 2 + (div ? 1 : 0)) {
        case 0: return chase_kernel<LEVEL_SHARED, false>;
        case 1: return chase_kernel<LEVEL_SHARED, true>;
        case 2: return chase_kernel<LEVEL_L1, false>;
        case 3: return chase_kernel<LEVEL_L1, true>;
        case 4: return chase_kernel<LEVEL_L2, false>;
        case 5: return chase_kernel<LEVEL_L2, true>;
        case 6: return chase_kernel<LEVEL_DRAM, false>;
        default: return chase_kernel<LEVEL_DRAM, true>;
    }
}

// Runs `launches` back-to-back launches of one configuration and reports the cudaEvent time
// and the analytic access counts.  `iters` = measured passes over the block's array; the
// measured loads per thread are iters * steps_per_pass rounded up to a multiple of UNROLL.
MB_API int mb_run(int level, long long array_bytes, long long iters, int blocks, int threads,
                  int warmup_only, int div, long long launches, mb_result* out) {
    if (launches < 1) return fail("launches must be >= 1");
    if (iters < 0) return fail("iters must be >= 0");
    if (!(g_prep.valid && g_prep.level == level && g_prep.blocks == blocks &&
          g_prep.threads == threads && g_prep.array_bytes == array_bytes)) {
        int rc = mb_prepare(level, array_bytes, blocks, threads);
        if (rc != 0) return rc;
    }
    const long long n = g_prep.n, S = g_prep.stride;
    const long long steps_per_pass = n / S;
    long long meas_steps = warmup_only ? 0 : iters * steps_per_pass;
    long long groups = (meas_steps + MEMBENCH_UNROLL - 1) / MEMBENCH_UNROLL;
    meas_steps = groups * MEMBENCH_UNROLL;

    kernel_t k = pick_kernel(level, div);
    size_t smem = 0;
    if (level == LEVEL_SHARED) {
        smem = (size_t)(n * 8);
        if (!g_smem_attr_done[div ? 1 : 0][0]) {
            int dev;
            cudaDeviceProp p;
            CK(cudaGetDevice(&dev));
            CK(cudaGetDeviceProperties(&p, dev));
            CK(cudaFuncSetAttribute((const void*)k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)p.sharedMemPerBlockOptin));
            CK(cudaFuncSetAttribute((const void*)k, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
            g_smem_attr_done[div ? 1 : 0][0] = 1;
        }
    } else if (level == LEVEL_L1 && !g_smem_attr_done[div ? 1 : 0][1]) {
        // Ask for the largest L1 (smallest shared carveout); a hint, the driver may round it.
        CK(cudaFuncSetAttribute((const void*)k, cudaFuncAttributePreferredSharedMemoryCarveout, 0));
        g_smem_attr_done[div ? 1 : 0][1] = 1;
    }

    CK(cudaEventRecord(g_ev0));
    for (long long i = 0; i < launches; ++i) {
        k<<<blocks, threads, smem>>>(g_buf, n, S, steps_per_pass, groups, (uint64_t)1, g_sink);
        CK(cudaGetLastError());
    }
    CK(cudaEventRecord(g_ev1));
    CK(cudaEventSynchronize(g_ev1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, g_ev0, g_ev1));

    const double sectors_per_step = (double)blocks * (double)((threads + 3) / 4);
    double wf_per_step = 0.0;
    if (level == LEVEL_SHARED) {
        for (int w = 0; w < threads; w += 32) {
            int tw = threads - w < 32 ? threads - w : 32;
            wf_per_step += (tw + 15) / 16;
        }
        wf_per_step *= blocks;
    }
    const double warps = (double)blocks * (double)((threads + 31) / 32);
    std::memset(out, 0, sizeof(*out));
    out->elapsed_ms = ms;
    out->launches = launches;
    out->steps_per_pass = steps_per_pass;
    out->meas_loads_per_thread = meas_steps;
    out->array_bytes_used = n * 8;
    out->stride_bytes = S * 8;
    out->sectors_per_launch = sectors_per_step * (double)meas_steps;
    out->warm_sectors_per_launch = sectors_per_step * (double)steps_per_pass;
    out->wavefronts_per_launch = wf_per_step * (double)meas_steps;
    out->div_warp_insts_per_launch = div ? warps * (double)meas_steps : 0.0;
    out->loads_per_launch = (double)blocks * threads * (double)meas_steps;
    return 0;
}

// ------------------------------------------------------------------------------------------
// Optional CLI: one JSON line per configuration.
//   membench LEVEL ARRAY_BYTES ITERS BLOCKS THREADS [REPEAT_SECONDS [WARMUP_ONLY [DIV]]]
//   membench -   (same fields, one configuration per stdin line)
// LEVEL is shared|l1|l2|dram or 0..3.  Launches repeat until REPEAT_SECONDS have passed.
// ------------------------------------------------------------------------------------------
#ifdef MEMBENCH_MAIN
static int parse_level(const char* s) {
    if (!std::strcmp(s, "shared")) return 0;
    if (!std::strcmp(s, "l1")) return 1;
    if (!std::strcmp(s, "l2")) return 2;
    if (!std::strcmp(s, "dram")) return 3;
    return std::atoi(s);
}

static int run_one(int level, long long bytes, long long iters, int blocks, int threads,
                   double seconds, int warm, int div) {
    mb_result r;
    int rc = mb_run(level, bytes, iters, blocks, threads, warm, div, 1, &r);
    if (rc == 0 && seconds > 0 && r.elapsed_ms > 0) {
        long long n = (long long)(seconds * 1000.0 / r.elapsed_ms) + 1;
        rc = mb_run(level, bytes, iters, blocks, threads, warm, div, n, &r);
    }
    if (rc != 0) {
        std::printf("{\"error\": \"%s\"}\n", mb_last_error());
        return 1;
    }
    std::printf(
        "{\"level\": %d, \"array_bytes\": %lld, \"iters\": %lld, \"blocks\": %d, \"threads\": %d, "
        "\"warmup_only\": %d, \"div\": %d, \"launches\": %lld, \"elapsed_ms\": %.6f, "
        "\"ms_per_launch\": %.6f, \"sectors_per_launch\": %.1f, \"meas_loads_per_thread\": %lld}\n",
        level, r.array_bytes_used, iters, blocks, threads, warm, div, r.launches, r.elapsed_ms,
        r.elapsed_ms / (double)r.launches, r.sectors_per_launch, r.meas_loads_per_thread);
    std::fflush(stdout);
    return 0;
}

int main(int argc, char** argv) {
    int status = 0;
    if (argc >= 6) {
        status = run_one(parse_level(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), std::atoi(argv[4]),
                         std::atoi(argv[5]), argc > 6 ? std::atof(argv[6]) : 0.0, argc > 7 ? std::atoi(argv[7]) : 0,
                         argc > 8 ? std::atoi(argv[8]) : 0);
    } else if (argc == 2 && !std::strcmp(argv[1], "-")) {
        char lv[32];
        long long bytes, iters;
        int blocks, threads, warm, div;
        double seconds;
        char line[512];
        while (std::fgets(line, sizeof line, stdin)) {
            warm = div = 0;
            seconds = 0;
            int got = std::sscanf(line, "%31s %lld %lld %d %d %lf %d %d", lv, &bytes, &iters, &blocks, &threads,
                                  &seconds, &warm, &div);
            if (got < 5) continue;
            status |= run_one(parse_level(lv), bytes, iters, blocks, threads, seconds, warm, div);
        }
    } else {
        std::fprintf(stderr,
                     "usage: %s LEVEL ARRAY_BYTES ITERS BLOCKS THREADS [REPEAT_SECONDS [WARMUP_ONLY [DIV]]]\n"
                     "       %s -   (configurations on stdin)\n",
                     argv[0], argv[0]);
        return 2;
    }
    mb_release();
    return status;
}
#endif
