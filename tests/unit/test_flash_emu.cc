/*
 * test_flash_emu.cc - src/cuda/flash.cu's kernels run on CPU threads
 * (cuda_emu/: CUDA's blocks, warps, barriers, shuffles and WMMA fragments,
 * emulated) against flash_ref.c, where there is no GPU.
 *
 * This checks what can go wrong in the kernels' own logic: tile and
 * fragment indexing, the WMMA row- and column-major addressing, masking of
 * the causal triangle, ragged tiles and padded heads, the barriers (a
 * missing one shows as a wrong or run-to-run different result), the
 * shared-memory carving (alignment, writes past the launch's bytes, the
 * 48 KiB opt-in). It cannot check the hardware's speed or its tensor cores'
 * summation order; test_cuda.c does that on a GPU.
 *
 * The emulated products sum in fp32 in k order and the reference in
 * another order, so the tolerance is the GPU's against the reference.
 */
#include "flash.cu"

extern "C" {
#include "check.h"
#include "flash_ref.h"
}

#include <vector>

static std::vector<float> randv(size_t n, uint64_t seed)
{
    std::vector<float> v(n);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) { /* uniform in [-2, 2): any distribution will do */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = (float)((double)(x >> 11) / (double)(1ull << 53) * 4.0 - 2.0);
    }
    return v;
}

static double rel_err(const std::vector<float> &got, const std::vector<float> &want)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < want.size(); i++) {
        m = fabs(want[i]) > m ? fabs(want[i]) : m;
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= d))
            d = e; /* NaN sticks */
    }
    return d / (m > 0 ? m : 1.0);
}

static uint16_t to_bf16(float f) { return __float2bfloat16_rn(f).x; }

struct shape {
    int B, T, C, NH;
};

/* forward and backward of the kernels and of the reference on one shape */
static void check_shape(shape s, uint64_t seed)
{
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    std::vector<float> qkv = randv(nq, seed), dout = randv(no, seed + 1);
    std::vector<float> lse(nl), d(nl), dqkv(nq);
    std::vector<uint16_t> out16(no), qkv16(nq);
    for (size_t i = 0; i < nq; i++) /* as the qkv product writes it */
        qkv16[i] = to_bf16(qkv[i]);
    flash_ref_forward(out16.data(), lse.data(), qkv16.data(), B, T, C, NH);
    flash_ref_backward(dqkv.data(), d.data(), dout.data(), out16.data(), qkv16.data(), lse.data(),
                       B, T, C, NH);
    std::vector<uint16_t> eout[2];
    std::vector<float> lsex[2], edqkv[2];
    for (int run = 0; run < 2; run++) {
        eout[run].assign(no, 0x7fc0), lsex[run].assign(nl, NAN), edqkv[run].assign(nq, NAN);
        std::vector<float> ed(nl, NAN);
        int f =
            flash_forward(nullptr, eout[run].data(), lsex[run].data(), qkv16.data(), B, T, C, NH);
        int b = flash_backward(nullptr, edqkv[run].data(), ed.data(), dout.data(), out16.data(),
                               qkv16.data(), lsex[run].data(), B, T, C, NH);
        CHECK(f == 0 && b == 0, "launch refused (forward %d, backward %d)", f, b);
    }
    /* out is bf16 on both sides: the same bits but where the two fp32 sums
     * (1e-7 apart) straddle a rounding tie, and then one bf16 step apart */
    size_t differ = 0, far = 0;
    for (size_t i = 0; i < no; i++) {
        float g = __bfloat162float(__nv_bfloat16{eout[0][i]});
        float h = __bfloat162float(__nv_bfloat16{out16[i]});
        differ += eout[0][i] != out16[i];
        far += !(fabsf(g - h) <= fmaxf(fabsf(g), fabsf(h)) * 0x1p-7f);
    }
    double el = rel_err(lsex[0], lse), eg = rel_err(edqkv[0], dqkv);
    printf("  B %d T %d C %d NH %d: out %zu of %zu one bf16 step off; lse %.2g dqkv %.2g\n", B, T,
           C, NH, differ, no, el, eg);
    CHECK(far == 0 && differ <= no / 100, "out: %zu of %zu differ, %zu more than one bf16 step",
          differ, no, far);
    CHECK(el < 1e-4, "lse: relative error %.3g (tolerance 1e-4)", el);
    CHECK(eg < 5e-3, "dqkv: relative error %.3g (tolerance 5e-3)", eg);
    CHECK(memcmp(eout[0].data(), eout[1].data(), no * 2) == 0 &&
              memcmp(edqkv[0].data(), edqkv[1].data(), nq * 4) == 0,
          "two runs differ: a missing barrier?");
}

/* Heads 8 and 24 wide (padded to 16 and 32), 18 (not a multiple of 4:
 * every tile loads a value at a time) and 20 (Q, K, V a value at a time,
 * dO four), one tile, a single row, two tiles with a ragged second. The
 * TSan build runs this one (tsan-flash-emu). */
static void narrow_heads_match_the_reference(void)
{
    const shape shapes[] = {
        {2, 64, 96, 4}, {2, 1, 16, 2}, {1, 77, 32, 4}, {1, 70, 36, 2}, {1, 65, 40, 2}};
    uint64_t seed = 100;
    for (const shape &s : shapes)
        check_shape(s, seed += 2);
    CHECK(emu::failures == 0, "%d launch or shared-memory faults (above)", emu::failures);
}

/* Heads 64, 96 (padded to 128) and 128 wide; three tiles, ragged. */
static void wide_heads_match_the_reference(void)
{
    const shape shapes[] = {{1, 150, 128, 2}, {1, 70, 256, 2}, {1, 66, 192, 2}};
    uint64_t seed = 200;
    for (const shape &s : shapes)
        check_shape(s, seed += 2);
    CHECK(emu::failures == 0, "%d launch or shared-memory faults (above)", emu::failures);
}

/* What a GPU's shared memory allows: every head on sm_80 (163 KiB) and
 * sm_90 (227 KiB), up to 64 on sm_86 and sm_89 (99 KiB), and the byte
 * counts the file's comment states. */
static void head_widths_fit_the_gpus_shared_memory(void)
{
    CHECK(flash_max_hs(163u << 10) == 128, "sm_80: %d", flash_max_hs(163u << 10));
    CHECK(flash_max_hs(227u << 10) == 128, "sm_90: %d", flash_max_hs(227u << 10));
    CHECK(flash_max_hs(99u << 10) == 64, "sm_86: %d", flash_max_hs(99u << 10));
    CHECK(flash_max_hs(48u << 10) == 16, "48 KiB: %d", flash_max_hs(48u << 10));
    CHECK(flash_max_hs(16u << 10) == 0, "16 KiB: %d", flash_max_hs(16u << 10));
    CHECK(dims<64>::fwd_bytes == 53 * 1024 && dims<64>::kv_bytes == 73216 &&
              dims<64>::q_bytes == 62 * 1024,
          "HSP 64: %zu, %zu, %zu bytes", dims<64>::fwd_bytes, dims<64>::kv_bytes,
          dims<64>::q_bytes);
}

CHECK_MAIN(TEST(narrow_heads_match_the_reference), TEST(wide_heads_match_the_reference),
           TEST(head_widths_fit_the_gpus_shared_memory))
