/* The store's per-tensor statistics in one read of each tensor (nnschemaparser/store/native.py builds
 * this file with the system C compiler on first use and calls it through ctypes).
 *
 * For each of `count` tensors (address ptrs[k], numels[k] elements), out[9k .. 9k+8] gets:
 * the sum, the min, the max, the sum of magnitudes, the least magnitude, the sum of squares, and the
 * counts of NaN, of infinities and of zeros. Sums are float64 whatever the tensor's dtype; min, max and
 * the least magnitude skip NaN (the caller makes them NaN where n_nan > 0, as torch's are).
 *
 * The order of every sum is fixed by this code, not by the machine: element i goes to lane i % LANES,
 * each lane adds in element order, and the lanes are added in lane order at the end. It must be built
 * without -ffast-math and with -ffp-contract=off (no fused multiply-add), so a machine that vectorises
 * it differently (SSE2, AVX2, AVX-512) gives the same figures, bit for bit. The counts are int32 per
 * lane, emptied into float64 every CHUNK elements (exact up to 2^53).
 *
 * A tensor with ndims[k] = 0 is contiguous. One with ndims[k] = d > 0 is a strided view: its d sizes and
 * d strides (in elements) are the next d entries of `sizes` and `strides` (taken in tensor order); its
 * elements are first gathered in row-major order into a scratch buffer, so its figures are those of its
 * contiguous copy, bit for bit. Returns 0, or -1 when the scratch buffer could not be allocated (out is
 * then not filled). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 32
#define CHUNK ((int64_t)LANES << 24)

#define STEP(T, ABS, v)                                                                     \
    {                                                                                       \
        T m = ABS(v);                                                                       \
        double d = (double)(v);                                                             \
        s[j] += d;                                                                          \
        a[j] += (double)m;                                                                  \
        q[j] += d * d;                                                                      \
        lo[j] = (v) < lo[j] ? (v) : lo[j];                                                  \
        hi[j] = (v) > hi[j] ? (v) : hi[j];                                                  \
        la[j] = m < la[j] ? m : la[j];                                                      \
        cn[j] += (v) != (v);                                                                \
        ci[j] += m == (T)INFINITY;                                                          \
        cz[j] += (v) == 0;                                                                  \
    }

#define ONE(NAME, T, ABS)                                                                   \
    static void NAME(const T *x, const int64_t n, double *o) {                              \
        double s[LANES], a[LANES], q[LANES];                                                \
        T lo[LANES], hi[LANES], la[LANES];                                                  \
        int32_t cn[LANES], ci[LANES], cz[LANES];                                            \
        double nans = 0, infs = 0, zeros = 0;                                               \
        for (int j = 0; j < LANES; j++) {                                                   \
            s[j] = a[j] = q[j] = 0.0;                                                       \
            lo[j] = la[j] = (T)INFINITY;                                                    \
            hi[j] = -(T)INFINITY;                                                           \
            cn[j] = ci[j] = cz[j] = 0;                                                      \
        }                                                                                   \
        int64_t i = 0;                                                                      \
        while (i + LANES <= n) {                                                            \
            int64_t stop = n - (n - i) % LANES;                                             \
            if (stop - i > CHUNK) stop = i + CHUNK;                                         \
            for (; i < stop; i += LANES)                                                    \
                for (int j = 0; j < LANES; j++) STEP(T, ABS, x[i + j])                      \
            for (int j = 0; j < LANES; j++) {                                               \
                nans += cn[j]; infs += ci[j]; zeros += cz[j];                               \
                cn[j] = ci[j] = cz[j] = 0;                                                  \
            }                                                                               \
        }                                                                                   \
        for (int j = 0; i < n; i++, j++) STEP(T, ABS, x[i])                                 \
        double S = 0, A = 0, Q = 0;                                                         \
        T LO = (T)INFINITY, HI = -(T)INFINITY, LA = (T)INFINITY;                            \
        for (int j = 0; j < LANES; j++) {                                                   \
            S += s[j]; A += a[j]; Q += q[j];                                                \
            LO = lo[j] < LO ? lo[j] : LO;                                                   \
            HI = hi[j] > HI ? hi[j] : HI;                                                   \
            LA = la[j] < LA ? la[j] : LA;                                                   \
            nans += cn[j]; infs += ci[j]; zeros += cz[j];                                   \
        }                                                                                   \
        o[0] = S; o[1] = (double)LO; o[2] = (double)HI; o[3] = A; o[4] = (double)LA;        \
        o[5] = Q; o[6] = nans; o[7] = infs; o[8] = zeros;                                   \
    }


/* the elements of a view (sizes, strides in elements, d dimensions) in row-major order, into dst */
#define GATHER(NAME, T)                                                                     \
    static void NAME(const T *x, int64_t d, const int64_t *size, const int64_t *stride, T *dst) { \
        int64_t index[64] = {0};                                                            \
        for (int64_t j = 0; j < d; j++)                                                     \
            if (size[j] == 0) return;                                                       \
        const int64_t inner = size[d - 1], step = stride[d - 1];                            \
        for (;;) {                                                                          \
            const T *row = x;                                                               \
            for (int64_t j = 0; j < d - 1; j++) row += index[j] * stride[j];                \
            if (step == 1)                                                                  \
                memcpy(dst, row, (size_t)inner * sizeof(T));                                \
            else                                                                            \
                for (int64_t i = 0; i < inner; i++) dst[i] = row[i * step];                 \
            dst += inner;                                                                   \
            int64_t j = d - 2;                                                              \
            while (j >= 0 && ++index[j] == size[j]) index[j--] = 0;                         \
            if (j < 0) return;                                                              \
        }                                                                                   \
    }

#define KERNEL(NAME, T, ONE_OF, GATHER_OF)                                                  \
    int64_t NAME(int64_t count, const int64_t *ptrs, const int64_t *numels, const int64_t *ndims, \
                 const int64_t *sizes, const int64_t *strides, double *out) {               \
        int64_t most = 0;                                                                   \
        for (int64_t k = 0; k < count; k++)                                                 \
            if (ndims[k] > 0 && numels[k] > most) most = numels[k];                         \
        T *scratch = most ? (T *)malloc((size_t)most * sizeof(T)) : NULL;                   \
        if (most && !scratch) return -1;                                                    \
        for (int64_t k = 0, at = 0; k < count; k++) {                                       \
            const T *x = (const T *)(intptr_t)ptrs[k];                                      \
            if (ndims[k] > 0) {                                                             \
                GATHER_OF(x, ndims[k], sizes + at, strides + at, scratch);                  \
                at += ndims[k];                                                             \
                x = scratch;                                                                \
            }                                                                               \
            ONE_OF(x, numels[k], out + 9 * k);                                              \
        }                                                                                   \
        free(scratch);                                                                      \
        return 0;                                                                           \
    }

ONE(one_f32, float, fabsf)
ONE(one_f64, double, fabs)
GATHER(gather_f32, float)
GATHER(gather_f64, double)
KERNEL(nsp_statistics_f32, float, one_f32, gather_f32)
KERNEL(nsp_statistics_f64, double, one_f64, gather_f64)

/* The fold of a unit's reductions (reductions.py, `_fold_stacked`): `count` variables, each with k occurrences of
 * `size` elements, occurrence i of variable j contiguous at ptrs[j * k + i]. For each element c of variable j:
 * mean[j * size + c] = (x_0 + x_1 + ... + x_{k-1}) / k and m2[j * size + c] = (x_0 - mean)^2 + ... (in float64,
 * added in occurrence order: the blocks of columns below change which elements are worked on together, never
 * the order of an element's sums). counts[j * (bins + 3) + b] is incremented by the histogram of its values:
 * b = 0 below low, 1..bins the bins, bins + 1 at or above high, bins + 2 NaN. A value's bin is worked out in
 * the precision BT (float for float32 values, double for float64) as reductions.py's `_bin_counts` does it with
 * torch: t = (x - low) * (bins / (high - low)), clamped to [-1, bins], plus 1, truncated. */
#define BLOCK 512

#define FOLD(NAME, T, BT)                                                                   \
    int64_t NAME(int64_t count, int64_t k, int64_t size, const int64_t *ptrs, double *mean, double *m2, \
                 int64_t bins, double low, double high, int64_t *counts) {                  \
        const BT lo_t = (BT)low, scale = (BT)((double)bins / (high - low));                 \
        const BT top = (BT)bins, under = (BT)-1, one = (BT)1;                               \
        const double kd = (double)k;                                                        \
        for (int64_t j = 0; j < count; j++) {                                               \
            const int64_t *own = ptrs + j * k;                                              \
            double *mu = mean + j * size, *q = m2 + j * size;                               \
            int64_t *hist = counts + j * (bins + 3);                                        \
            for (int64_t c0 = 0; c0 < size; c0 += BLOCK) {                                  \
                const int64_t w = size - c0 < BLOCK ? size - c0 : BLOCK;                    \
                double s[BLOCK], d2[BLOCK];                                                 \
                for (int64_t c = 0; c < w; c++) s[c] = 0.0, d2[c] = 0.0;                    \
                for (int64_t i = 0; i < k; i++) {                                           \
                    const T *x = (const T *)(intptr_t)own[i] + c0;                          \
                    for (int64_t c = 0; c < w; c++) s[c] += (double)x[c];                   \
                }                                                                           \
                for (int64_t c = 0; c < w; c++) s[c] = s[c] / kd;                           \
                for (int64_t i = 0; i < k; i++) {                                           \
                    const T *x = (const T *)(intptr_t)own[i] + c0;                          \
                    for (int64_t c = 0; c < w; c++) {                                       \
                        double d = (double)x[c] - s[c];                                     \
                        d2[c] += d * d;                                                     \
                    }                                                                       \
                    for (int64_t c = 0; c < w; c++) {                                       \
                        BT t = ((BT)x[c] - lo_t) * scale;                                   \
                        int64_t b;                                                          \
                        if (t != t)                                                         \
                            b = bins + 2;                                                   \
                        else {                                                              \
                            t = t < under ? under : t;                                      \
                            t = t > top ? top : t;                                          \
                            b = (int64_t)(t + one);                                         \
                        }                                                                   \
                        hist[b]++;                                                          \
                    }                                                                       \
                }                                                                           \
                memcpy(mu + c0, s, (size_t)w * sizeof(double));                            \
                memcpy(q + c0, d2, (size_t)w * sizeof(double));                             \
            }                                                                               \
        }                                                                                   \
        return 0;                                                                           \
    }

FOLD(nsp_fold_f32, float, float)
FOLD(nsp_fold_f64, double, double)

/* the version of these figures: native.py refuses a library that says otherwise (2: the fold added) */
int64_t nsp_statistics_version(void) { return 2; }
