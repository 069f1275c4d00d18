/*
 * cuda_runtime.h (emulated) - CUDA's execution model on CPU threads, just
 * enough of it to run src/cuda/flash.cu's kernels where there is no GPU
 * (test_flash_emu.cc). Not the CUDA toolkit's header: it is found first on
 * that one test's include path.
 *
 * A launch runs its blocks one after another, each as blockDim.x threads
 * that share `smem` (the dynamic shared memory) and meet at real barriers:
 * __syncthreads over the block, __syncwarp over the 32 threads of a warp,
 * __shfl_xor_sync through a per-warp exchange between two warp barriers.
 * A missing barrier therefore shows as a wrong or changing result, as it
 * may on a GPU. What a GPU checks at launch is checked too: the dynamic
 * shared memory a kernel may use (cudaFuncSetAttribute's opt-in, at most
 * 227 KiB), and writes past it (a canary after the requested bytes).
 */
#ifndef FSDP_CUDA_EMU_RUNTIME_H
#define FSDP_CUDA_EMU_RUNTIME_H
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__
#define __align__(n)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
typedef void *cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

namespace emu
{
constexpr size_t SMEM_MAX = 227u << 10; /* sm_90's opt-in limit per block */
constexpr size_t SMEM_DEFAULT = 48u << 10;
struct block_sync {
    std::barrier<> *block;
    std::barrier<> *warp[32];
    float xchg[32][32];
};
inline thread_local dim3 thread_idx, block_idx;
inline thread_local block_sync *sync_here;
inline dim3 block_dim, grid_dim;
inline std::map<void *, size_t> smem_allowed; /* each kernel's opt-in */
inline int failures;
} // namespace emu

#define threadIdx emu::thread_idx
#define blockIdx  emu::block_idx
#define blockDim  emu::block_dim
#define gridDim   emu::grid_dim

/* the dynamic shared memory: blocks run one at a time, so one buffer */
namespace
{
alignas(128) unsigned char smem[emu::SMEM_MAX + 4096];
}

inline void __syncthreads() { emu::sync_here->block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu)
{
    emu::sync_here->warp[emu::thread_idx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int mask)
{
    unsigned w = emu::thread_idx.x / 32, lane = emu::thread_idx.x % 32;
    emu::sync_here->xchg[w][lane] = v;
    __syncwarp();
    float r = emu::sync_here->xchg[w][lane ^ (unsigned)mask];
    __syncwarp();
    return r;
}
inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

template <typename K> cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute, int bytes)
{
    if (bytes < 0 || (size_t)bytes > emu::SMEM_MAX)
        return cudaErrorInvalidValue;
    emu::smem_allowed[reinterpret_cast<void *>(kernel)] = (size_t)bytes;
    return cudaSuccess;
}
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }

namespace emu
{
/* kernel<<<grid, threads, bytes>>>(args...) */
template <typename K, typename... A>
void launch(K kernel, dim3 grid, dim3 threads, size_t bytes, A... args)
{
    auto opt = smem_allowed.find(reinterpret_cast<void *>(kernel));
    size_t allowed = opt == smem_allowed.end() ? SMEM_DEFAULT : opt->second;
    if (bytes > allowed || threads.x % 32 || threads.y != 1 || threads.z != 1) {
        fprintf(stderr,
                "  emu: launch refused: %zu bytes of shared memory (allowed %zu), %u "
                "threads\n",
                bytes, allowed, threads.x);
        failures++;
        return;
    }
    block_dim = threads;
    grid_dim = grid;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            memset(smem + bytes, 0xa5, sizeof smem - bytes);
            std::barrier<> block(threads.x);
            std::vector<std::barrier<> *> warps;
            block_sync bs{&block, {}, {}};
            for (unsigned w = 0; w < threads.x / 32; w++)
                bs.warp[w] = new std::barrier<>(32);
            std::vector<std::thread> t;
            for (unsigned i = 0; i < threads.x; i++)
                t.emplace_back([&, i] {
                    thread_idx = dim3(i);
                    block_idx = dim3(bx, by);
                    sync_here = &bs;
                    kernel(args...);
                });
            for (auto &th : t)
                th.join();
            for (unsigned w = 0; w < threads.x / 32; w++)
                delete bs.warp[w];
            for (size_t i = bytes; i < sizeof smem; i++)
                if (smem[i] != 0xa5) {
                    fprintf(stderr,
                            "  emu: block (%u, %u) wrote shared memory byte %zu, past "
                            "the %zu it was given\n",
                            bx, by, i, bytes);
                    failures++;
                    break;
                }
        }
}
} // namespace emu

#define FLASH_LAUNCH(kernel, grid, threads, bytes, stream, ...)                                    \
    ((void)(stream), emu::launch(kernel, grid, threads, bytes, __VA_ARGS__))
#endif
