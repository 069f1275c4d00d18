/*
 * mma.h (emulated): nvcuda::wmma's 16x16x16 bf16 fragments (see
 * cuda_runtime.h here). A fragment's elements are opaque on a GPU; here
 * lane 0 of the warp holds them all and does the work, and every operation
 * ends at a warp barrier, as the warp-wide instruction does. The rules the
 * CUDA guide sets are checked: pointers 256-bit aligned, ldm a multiple of
 * 8 elements (16-bit types) or 4 (float).
 */
#ifndef FSDP_CUDA_EMU_MMA_H
#define FSDP_CUDA_EMU_MMA_H
#include "cuda_bf16.h"
#include <type_traits>
namespace nvcuda
{
namespace wmma
{
struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    float v[16][16]; /* (row, column) of the 16 x 16 operand or result */
};

inline bool lane0() { return emu::thread_idx.x % 32 == 0; }
inline void check(const void *p, unsigned ldm, unsigned mult, const char *what)
{
    if ((uintptr_t)p % 32 || ldm % mult) {
        fprintf(stderr,
                "  emu: %s: pointer %p (needs 32-byte alignment) or ldm %u (needs a "
                "multiple of %u)\n",
                what, p, ldm, mult);
        emu::failures++;
    }
}

template <typename U, typename T, typename L>
inline void fill_fragment(fragment<U, 16, 16, 16, T, L> &f, float x)
{
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            f.v[i][j] = x;
}

/* element (i, j) of the operand: row-major p[i * ldm + j], column-major
 * p[i + j * ldm] (i the row: M for matrix_a, K for matrix_b) */
template <typename U, typename L>
inline void load_matrix_sync(fragment<U, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p,
                             unsigned ldm)
{
    if (lane0()) {
        check(p, ldm, 8, "load_matrix_sync");
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                size_t at = std::is_same<L, row_major>::value ? (size_t)i * ldm + j
                                                              : (size_t)i + (size_t)j * ldm;
                f.v[i][j] = __bfloat162float(p[at]);
            }
    }
    __syncwarp();
}

template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    if (lane0()) {
        float r[16][16];
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                float s = c.v[i][j];
                for (int k = 0; k < 16; k++)
                    s += a.v[i][k] * b.v[k][j];
                r[i][j] = s;
            }
        memcpy(d.v, r, sizeof r);
    }
    __syncwarp();
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout)
{
    if (lane0()) {
        check(p, ldm, 4, "store_matrix_sync");
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++)
                p[layout == mem_row_major ? (size_t)i * ldm + j : (size_t)i + (size_t)j * ldm] =
                    f.v[i][j];
    }
    __syncwarp();
}
} // namespace wmma
} // namespace nvcuda
#endif
