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
 * it differently (SSE2, AVX2, AVX-512) gives the same figures, bit for bit. The zero counts are int32
 * per lane, emptied every CHUNK elements.
 *
 * One pass computes the sums, min, max, least magnitude and zeros; the NaN and infinity counts come
 * from a second pass over the tensors whose magnitude sum is not finite, the only ones that can hold
 * either (a NaN makes it NaN, an infinity +inf; a float64 tensor whose magnitudes overflow is counted
 * too, and has neither): a finite tensor costs the comparisons of one count instead of three.
 *
 * kinds[k] (kinds may be NULL: all 0) says what the float32 kernel reads at ptrs[k]: 0 float32, 1 float16,
 * 2 bfloat16 (widened exactly, so the figures are those of the tensor's float32 copy, bit for bit). A
 * tensor with ndims[k] = 0 is contiguous. One with ndims[k] = d > 0 is a strided view: its d sizes and
 * d strides (in elements) are the next d entries of `sizes` and `strides` (taken in tensor order). A
 * view, or a float16 or bfloat16 tensor, is read BUF elements at a time in row-major order into a
 * buffer (widened there), and each buffer is summed as the next BUF elements of the tensor; BUF is a
 * multiple of LANES, so every element keeps its lane and the figures are those of the contiguous float32
 * copy, bit for bit. Returns 0, or -1 when the buffer could not be allocated (out is then not filled). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 32
#define CHUNK ((int64_t)LANES << 24)
#define BUF 4096 /* elements of a view (or of a narrower float) read at a time: a multiple of LANES */

enum { KIND_SAME = 0, KIND_F16 = 1, KIND_BF16 = 2 };

#include "_nsp_floats.h"

/* One tensor's running figures, lane by lane, between the pieces it is read in. */
#define STATE(NAME, T)                                                                      \
    typedef struct {                                                                        \
        double s[LANES], a[LANES], q[LANES];                                                \
        T lo[LANES], hi[LANES], la[LANES];                                                  \
        int64_t zeros;                                                                      \
    } NAME;

STATE(state_f32, float)
STATE(state_f64, double)

#define START(T, st)                                                                        \
    for (int j = 0; j < LANES; j++) {                                                       \
        (st)->s[j] = (st)->a[j] = (st)->q[j] = 0.0;                                         \
        (st)->lo[j] = (st)->la[j] = (T)INFINITY;                                            \
        (st)->hi[j] = -(T)INFINITY;                                                         \
    }                                                                                       \
    (st)->zeros = 0;

/* (double)|v| is |(double)v|: the magnitude is taken of the widened value (one AND), not widened again */
#define STEP(T, ABS, v)                                                                     \
    {                                                                                       \
        const T x_ = (v);                                                                   \
        const double d = (double)x_;                                                        \
        const T m = ABS(x_);                                                                \
        s[j] += d;                                                                          \
        a[j] += fabs(d);                                                                    \
        q[j] += d * d;                                                                      \
        lo[j] = x_ < lo[j] ? x_ : lo[j];                                                    \
        hi[j] = x_ > hi[j] ? x_ : hi[j];                                                    \
        la[j] = m < la[j] ? m : la[j];                                                      \
        cz[j] += x_ == 0;                                                                   \
    }

/* The next n elements of a tensor into its state: the elements read so far are a multiple of LANES
 * unless this is its last piece, so element i here goes to lane i % LANES (its lane in the tensor). */
#define ADD(NAME, STATE_T, T, ABS)                                                          \
    static void NAME(STATE_T *st, const T *restrict x, const int64_t n) {                   \
        double s[LANES], a[LANES], q[LANES];                                                \
        T lo[LANES], hi[LANES], la[LANES];                                                  \
        int32_t cz[LANES];                                                                  \
        int64_t zeros = 0;                                                                  \
        for (int j = 0; j < LANES; j++) {                                                   \
            s[j] = st->s[j]; a[j] = st->a[j]; q[j] = st->q[j];                              \
            lo[j] = st->lo[j]; hi[j] = st->hi[j]; la[j] = st->la[j];                        \
            cz[j] = 0;                                                                      \
        }                                                                                   \
        int64_t i = 0;                                                                      \
        while (i + LANES <= n) {                                                            \
            int64_t stop = n - (n - i) % LANES;                                             \
            if (stop - i > CHUNK) stop = i + CHUNK;                                         \
            for (; i < stop; i += LANES)                                                    \
                for (int j = 0; j < LANES; j++) STEP(T, ABS, x[i + j])                      \
            for (int j = 0; j < LANES; j++) {                                               \
                zeros += cz[j];                                                             \
                cz[j] = 0;                                                                  \
            }                                                                               \
        }                                                                                   \
        for (int j = 0; i < n; i++, j++) STEP(T, ABS, x[i])                                 \
        for (int j = 0; j < LANES; j++) {                                                   \
            zeros += cz[j];                                                                 \
            st->s[j] = s[j]; st->a[j] = a[j]; st->q[j] = q[j];                              \
            st->lo[j] = lo[j]; st->hi[j] = hi[j]; st->la[j] = la[j];                        \
        }                                                                                   \
        st->zeros += zeros;                                                                 \
    }

ADD(add_f32, state_f32, float, fabsf)
ADD(add_f64, state_f64, double, fabs)

/* the lanes added in lane order; the NaN and infinity counts are the caller's */
#define FINISH(NAME, STATE_T, T)                                                            \
    static void NAME(const STATE_T *st, double *o) {                                        \
        double S = 0, A = 0, Q = 0;                                                         \
        T LO = (T)INFINITY, HI = -(T)INFINITY, LA = (T)INFINITY;                            \
        for (int j = 0; j < LANES; j++) {                                                   \
            S += st->s[j]; A += st->a[j]; Q += st->q[j];                                    \
            LO = st->lo[j] < LO ? st->lo[j] : LO;                                           \
            HI = st->hi[j] > HI ? st->hi[j] : HI;                                           \
            LA = st->la[j] < LA ? st->la[j] : LA;                                           \
        }                                                                                   \
        o[0] = S; o[1] = (double)LO; o[2] = (double)HI; o[3] = A; o[4] = (double)LA;        \
        o[5] = Q; o[6] = 0.0; o[7] = 0.0; o[8] = (double)st->zeros;                          \
    }

FINISH(finish_f32, state_f32, float)
FINISH(finish_f64, state_f64, double)

/* NaN and infinity counts of n elements */
#define COUNT(NAME, T, ABS)                                                                 \
    static void NAME(const T *restrict x, const int64_t n, int64_t *nans, int64_t *infs) {  \
        int64_t cn = 0, ci = 0;                                                             \
        for (int64_t i = 0; i < n; i++) {                                                   \
            cn += x[i] != x[i];                                                             \
            ci += ABS(x[i]) == (T)INFINITY;                                                 \
        }                                                                                   \
        *nans += cn;                                                                        \
        *infs += ci;                                                                        \
    }

COUNT(count_f32, float, fabsf)
COUNT(count_f64, double, fabs)

/* Elements [start, start + n) of a tensor in row-major order (a view: d > 0 sizes and strides in
 * elements; d == 0: contiguous), widened to T, into dst. */
#define READ(NAME, S, T, WIDEN)                                                             \
    static void NAME(const S *x, const int64_t d, const int64_t *size, const int64_t *stride, \
                     int64_t start, int64_t n, T *restrict dst) {                           \
        if (d == 0) {                                                                       \
            const S *from = x + start;                                                      \
            for (int64_t i = 0; i < n; i++) dst[i] = WIDEN(from[i]);                        \
            return;                                                                         \
        }                                                                                   \
        int64_t index[64];                                                                  \
        for (int64_t j = d - 1, rest = start; j >= 0; j--) {                                \
            index[j] = rest % size[j];                                                      \
            rest /= size[j];                                                                \
        }                                                                                   \
        const int64_t inner = size[d - 1], step = stride[d - 1];                            \
        while (n > 0) {                                                                     \
            const S *row = x;                                                               \
            for (int64_t j = 0; j < d - 1; j++) row += index[j] * stride[j];                \
            int64_t take = inner - index[d - 1];                                            \
            if (take > n) take = n;                                                         \
            row += index[d - 1] * step;                                                     \
            if (step == 1)                                                                  \
                for (int64_t i = 0; i < take; i++) dst[i] = WIDEN(row[i]);                  \
            else                                                                            \
                for (int64_t i = 0; i < take; i++) dst[i] = WIDEN(row[i * step]);           \
            dst += take;                                                                    \
            n -= take;                                                                      \
            index[d - 1] += take;                                                           \
            for (int64_t j = d - 1; j > 0 && index[j] == size[j]; j--) {                    \
                index[j] = 0;                                                               \
                index[j - 1]++;                                                             \
            }                                                                               \
        }                                                                                   \
    }

#define SAME(v) (v)
READ(read_f32, float, float, SAME)
READ(read_f64, double, double, SAME)
READ(read_f16, uint16_t, float, from_f16)
READ(read_bf16, uint16_t, float, from_bf16)

/* one tensor: its pieces (the tensor itself where it is contiguous and of T, else BUF elements at a
 * time through buf) summed, then counted where its magnitude sum is not finite */
#define ONE(NAME, STATE_T, T, ADD_OF, FINISH_OF, COUNT_OF, READ_KIND)                       \
    static void NAME(const void *x, int kind, int64_t n, int64_t d, const int64_t *size,    \
                     const int64_t *stride, T *buf, double *o) {                            \
        STATE_T st;                                                                         \
        START(T, &st)                                                                       \
        const int direct = d == 0 && kind == KIND_SAME;                                     \
        if (direct)                                                                         \
            ADD_OF(&st, (const T *)x, n);                                                   \
        else                                                                                \
            for (int64_t at = 0; at < n; at += BUF) {                                       \
                const int64_t take = n - at < BUF ? n - at : BUF;                           \
                READ_KIND(x, kind, d, size, stride, at, take, buf);                         \
                ADD_OF(&st, buf, take);                                                     \
            }                                                                               \
        FINISH_OF(&st, o);                                                                  \
        if (isfinite(o[3])) return;                                                         \
        int64_t nans = 0, infs = 0;                                                         \
        if (direct)                                                                         \
            COUNT_OF((const T *)x, n, &nans, &infs);                                        \
        else                                                                                \
            for (int64_t at = 0; at < n; at += BUF) {                                       \
                const int64_t take = n - at < BUF ? n - at : BUF;                           \
                READ_KIND(x, kind, d, size, stride, at, take, buf);                         \
                COUNT_OF(buf, take, &nans, &infs);                                          \
            }                                                                               \
        o[6] = (double)nans;                                                                \
        o[7] = (double)infs;                                                                \
    }

static void read_kind_f32(const void *x, int kind, int64_t d, const int64_t *size, const int64_t *stride,
                          int64_t start, int64_t n, float *dst) {
    if (kind == KIND_F16)
        read_f16((const uint16_t *)x, d, size, stride, start, n, dst);
    else if (kind == KIND_BF16)
        read_bf16((const uint16_t *)x, d, size, stride, start, n, dst);
    else
        read_f32((const float *)x, d, size, stride, start, n, dst);
}

static void read_kind_f64(const void *x, int kind, int64_t d, const int64_t *size, const int64_t *stride,
                          int64_t start, int64_t n, double *dst) {
    (void)kind;
    read_f64((const double *)x, d, size, stride, start, n, dst);
}

ONE(one_f32, state_f32, float, add_f32, finish_f32, count_f32, read_kind_f32)
ONE(one_f64, state_f64, double, add_f64, finish_f64, count_f64, read_kind_f64)

#define KERNEL(NAME, T, ONE_OF)                                                             \
    int64_t NAME(int64_t count, const int64_t *ptrs, const int64_t *numels, const int64_t *ndims, \
                 const int64_t *sizes, const int64_t *strides, const int64_t *kinds, double *out) { \
        int needs = 0;                                                                      \
        for (int64_t k = 0; k < count; k++)                                                 \
            if (numels[k] > 0 && (ndims[k] > 0 || (kinds && kinds[k] != KIND_SAME))) needs = 1; \
        T *buf = needs ? (T *)malloc((size_t)BUF * sizeof(T)) : NULL;                       \
        if (needs && !buf) return -1;                                                       \
        for (int64_t k = 0, at = 0; k < count; k++) {                                       \
            ONE_OF((const void *)(intptr_t)ptrs[k], kinds ? (int)kinds[k] : KIND_SAME, numels[k], \
                   ndims[k], sizes + at, strides + at, buf, out + 9 * k);                   \
            at += ndims[k];                                                                 \
        }                                                                                   \
        free(buf);                                                                          \
        return 0;                                                                           \
    }

KERNEL(nsp_summary_f32, float, one_f32)
KERNEL(nsp_summary_f64, double, one_f64)

/* The fold of a unit's reductions (reductions.py, `_fold_stacked`): `count` variables, each with k occurrences of
 * `size` elements, occurrence i of variable j contiguous at ptrs[j * k + i]. For each element c of variable j:
 * mean[j * size + c] = (x_0 + x_1 + ... + x_{k-1}) / k and m2[j * size + c] = (x_0 - mean)^2 + ... (in float64,
 * added in occurrence order, from 0.0: the blocks of columns below change which elements are worked on together,
 * never the order of an element's sums). counts[j * (bins + 3) + b] is incremented by the histogram of its values:
 * b = 0 below low, 1..bins the bins, bins + 1 at or above high, bins + 2 NaN. A value's bin is worked out in
 * the precision BT (float for float32 values, double for float64) as reductions.py's `_bin_counts` does it with
 * torch: t = (x - low) * (bins / (high - low)), clamped to [-1, bins], plus 1, truncated.
 *
 * Two passes over each block of columns (a few KiB of each occurrence, in the cache for the second): the sums,
 * V columns at a time with the k occurrences added in registers (one vectorised loop over the V columns inside
 * the loop over the occurrences: no load or store of the running sums per occurrence); then the squared
 * deviations the same way, with each value's bin worked out in the same loop (no branch: the compiler vectorises
 * it) into a buffer of the block's bins, counted at the end of the block into HISTS histograms in turn (so that
 * consecutive elements of one bin do not wait on each other's increment), added together at the end: the counts
 * are integers, the same in any order. The figures are those of the block-per-occurrence passes before (version 2),
 * bit for bit, but for the sign of a NaN where a column meets two NaNs of other signs (or +inf and -inf): which of
 * two NaNs an addition keeps is the compiler's choice of operand order. */
#define FOLD_V 16     /* columns worked on together: the running sums of one float64 vector register pair */
#define FOLD_CELLS 8192 /* values of a block (its columns times k): its bins' buffer, 32 KiB */
#define HISTS 4

/* the next block of an occurrence asked of memory while this one is worked on in the cache (its first pass
 * would otherwise wait on memory): a hint, which changes no figure */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p, n, T)                                                                   \
    for (int64_t f_ = 0; f_ < (n); f_ += 64 / (int64_t)sizeof(T)) __builtin_prefetch((p) + f_, 0, 3)
#else
#define PREFETCH(p, n, T) (void)0
#endif

static void count_bins(int64_t *restrict hists, int64_t width, const int32_t *restrict b, int64_t w) {
    int64_t c = 0;
    for (; c + HISTS <= w; c += HISTS)
        for (int h = 0; h < HISTS; h++) hists[h * width + b[c + h]]++;
    for (; c < w; c++) hists[b[c]]++;
}

/* the two passes over columns [c0, c0 + w) of one variable's k occurrences (x[i] + c0); bins into b (k * w) */
#define FOLD_BLOCK(SUFFIX, T, BT)                                                           \
    static void block_##SUFFIX(const T *const *restrict x, int64_t k, int64_t c0, int64_t w, double kd, \
                               double *restrict mu, double *restrict q, int32_t *restrict b, \
                               BT lo_t, BT scale, BT top, int32_t nan_bin) {                \
        const BT under = (BT)-1, one = (BT)1;                                               \
        int64_t c = 0;                                                                      \
        for (; c + FOLD_V <= w; c += FOLD_V) {                                              \
            double s[FOLD_V], d2[FOLD_V];                                                   \
            for (int v = 0; v < FOLD_V; v++) s[v] = 0.0, d2[v] = 0.0;                       \
            for (int64_t i = 0; i < k; i++) {                                               \
                const T *restrict xi = x[i] + c0 + c;                                       \
                for (int v = 0; v < FOLD_V; v++) s[v] += (double)xi[v];                     \
            }                                                                               \
            for (int v = 0; v < FOLD_V; v++) s[v] = s[v] / kd;                              \
            for (int64_t i = 0; i < k; i++) {                                               \
                const T *restrict xi = x[i] + c0 + c;                                       \
                int32_t *restrict bi = b + i * w + c;                                       \
                for (int v = 0; v < FOLD_V; v++) {                                          \
                    const double d = (double)xi[v] - s[v];                                  \
                    d2[v] += d * d;                                                         \
                    const BT t = ((BT)xi[v] - lo_t) * scale;                                \
                    BT u = t > under ? t : under; /* NaN: under, and its bin replaced below */ \
                    u = u < top ? u : top;                                                  \
                    const int32_t bin = (int32_t)(u + one);                                 \
                    bi[v] = t != t ? nan_bin : bin;                                         \
                }                                                                           \
            }                                                                               \
            for (int v = 0; v < FOLD_V; v++) mu[c + v] = s[v], q[c + v] = d2[v];            \
        }                                                                                   \
        for (; c < w; c++) { /* the last columns, one at a time, in the same order */       \
            double s = 0.0, d2 = 0.0;                                                       \
            for (int64_t i = 0; i < k; i++) s += (double)x[i][c0 + c];                      \
            s = s / kd;                                                                     \
            for (int64_t i = 0; i < k; i++) {                                               \
                const T xv = x[i][c0 + c];                                                  \
                const double d = (double)xv - s;                                            \
                d2 += d * d;                                                                \
                const BT t = ((BT)xv - lo_t) * scale;                                       \
                BT u = t > under ? t : under;                                               \
                u = u < top ? u : top;                                                      \
                b[i * w + c] = t != t ? nan_bin : (int32_t)(u + one);                       \
            }                                                                               \
            mu[c] = s, q[c] = d2;                                                           \
        }                                                                                   \
    }

FOLD_BLOCK(f32, float, float)
FOLD_BLOCK(f64, double, double)

#define FOLD(NAME, T, BT, SUFFIX)                                                           \
    int64_t NAME(int64_t count, int64_t k, int64_t size, const int64_t *ptrs, double *mean, double *m2, \
                 int64_t bins, double low, double high, int64_t *counts) {                  \
        const BT lo_t = (BT)low, scale = (BT)((double)bins / (high - low)), top = (BT)bins; \
        const int32_t nan_bin = (int32_t)bins + 2;                                          \
        const int64_t width = bins + 3;                                                     \
        const double kd = (double)k;                                                        \
        /* a block's columns: FOLD_CELLS values in all, at least FOLD_V columns */          \
        int64_t block = FOLD_CELLS / k / FOLD_V * FOLD_V;                                   \
        if (block < FOLD_V) block = FOLD_V;                                                 \
        int64_t *hists = (int64_t *)calloc((size_t)(HISTS * width), sizeof(int64_t));       \
        int32_t *b = (int32_t *)malloc((size_t)(block * k) * sizeof(int32_t));              \
        const T **x = (const T **)malloc((size_t)k * sizeof(T *));                          \
        if (!hists || !b || !x) {                                                           \
            free(hists), free(b), free(x);                                                  \
            return -1;                                                                      \
        }                                                                                   \
        for (int64_t j = 0; j < count; j++) {                                               \
            for (int64_t i = 0; i < k; i++) x[i] = (const T *)(intptr_t)ptrs[j * k + i];    \
            double *mu = mean + j * size, *q = m2 + j * size;                               \
            for (int64_t c0 = 0; c0 < size; c0 += block) {                                  \
                const int64_t w = size - c0 < block ? size - c0 : block;                    \
                const int64_t next = size - c0 - w < block ? size - c0 - w : block;        \
                for (int64_t i = 0; i < k; i++) PREFETCH(x[i] + c0 + w, next, T);           \
                block_##SUFFIX(x, k, c0, w, kd, mu + c0, q + c0, b, lo_t, scale, top, nan_bin); \
                count_bins(hists, width, b, w * k);                                         \
            }                                                                               \
            int64_t *hist = counts + j * width;                                             \
            for (int h = 0; h < HISTS; h++)                                                 \
                for (int64_t c = 0; c < width; c++) {                                       \
                    hist[c] += hists[h * width + c];                                        \
                    hists[h * width + c] = 0;                                               \
                }                                                                           \
        }                                                                                   \
        free(hists), free(b), free(x);                                                      \
        return 0;                                                                           \
    }

FOLD(nsp_fold_f32, float, float, f32)
FOLD(nsp_fold_f64, double, double, f64)

/* Chan's merge of a batch's per-element figures (n_b occurrences: mean_b, m2_b) into a state's (n_a: mean_a,
 * m2_a), in place, each element with the float64 operations reductions.py's `_merge` makes with torch, in its
 * order and each rounded alone: d = mean_b - mean_a; mean_a = mean_a + d * wb; m2_a = (m2_a + m2_b) + (d * d) * wab,
 * where wb = n_b / n and wab = n_a * n_b / n are the caller's (rounded as Python rounds them). One pass over
 * the four arrays instead of torch's seven, and no new array. */
int64_t nsp_merge(int64_t size, double *restrict mean_a, double *restrict m2_a, const double *restrict mean_b,
                  const double *restrict m2_b, double wb, double wab) {
    for (int64_t c = 0; c < size; c++) {
        const double d = mean_b[c] - mean_a[c];
        const double m2 = m2_a[c] + m2_b[c];
        const double dd = d * d;
        mean_a[c] = mean_a[c] + d * wb;
        m2_a[c] = m2 + dd * wab;
    }
    return 0;
}

/* the version of these figures: native.py refuses a library that says otherwise (2: the fold added; the
 * same figures since, read in pieces) */
int64_t nsp_statistics_version(void) { return 2; }
