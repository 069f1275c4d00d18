/*
 * numeric.h - what the tests that compare two backends' floats share:
 * random vectors and the error measure (test_cuda.c, test_flash.c).
 */
#ifndef FSDP_TEST_NUMERIC_H
#define FSDP_TEST_NUMERIC_H
#include "util.h"

#include <math.h>
#include <stdlib.h>

/* n normal values times scale, a function of (seed, index) only */
static inline float *randv(size_t n, uint64_t seed, float scale)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * fsdp_normal_at(seed, i);
    return v;
}

/* max |got - want| / max |want|: values near zero do not blow it up, and a
 * NaN in got makes it NaN (which fails every "< tolerance") */
static inline double rel_err(const float *got, const float *want, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(want[i]) > m)
            m = fabs(want[i]);
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= d))
            d = e; /* NaN sticks */
    }
    return d / (m > 0 ? m : 1.0);
}

/* ||got - want|| / ||want||: a whole tensor's error (a gradient's) */
static inline double norm_rel_err(const float *got, const float *want, size_t n)
{
    double d2 = 0, w2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        d2 += d * d;
        w2 += (double)want[i] * want[i];
    }
    return sqrt(d2) / (sqrt(w2) + 1e-30);
}

#endif
