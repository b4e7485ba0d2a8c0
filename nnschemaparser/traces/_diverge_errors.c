/* diverge's per-row error, its common case, in two passes (traces/diverge_native.py; the rule in
 * traces/diverge_bounds.py):
 *
 *   biggest = max |ref_i|                                  (pass 1)
 *   gap     = max |((float)x_i - ref_i) / (|ref_i| + biggest)|   (pass 2)
 *
 * ref float32, x float32, bfloat16 or float16, n elements each, both contiguous or views whose last
 * dimension is contiguous in both (each row of it a chunk). Every operation is one
 * float32 IEEE operation rounded to nearest (built with -ffp-contract=off -fno-fast-math: no fused
 * multiply-add, no reassociation), as torch's elementwise float32 sub, abs, add and div are; the
 * casts of x are exact; a max is the same in any order. So `gap` is the very float the torch path
 * gives, element for element.
 *
 * Returns NSP_OK with *out = gap (> 0), NSP_ZERO_POS / NSP_ZERO_NEG where every quotient is +0 / -0
 * (the caller gives the sign the torch path gives), or NSP_OTHER where the torch path must decide: a
 * NaN or infinity in ref, biggest not below `limit`, a NaN or infinity among the quotients, or
 * zeros of both signs. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define NSP_OK 0
#define NSP_OTHER 1
#define NSP_ZERO_POS 2
#define NSP_ZERO_NEG 3

int64_t nsp_diverge_errors_version(void) { return 2; }

#include "_nsp_floats.h"

/* pass 2 over one chunk, for one x dtype: the largest |quotient| as bits. For a float >= +0 the order
 * of its bits is the order of the floats, and an infinity or NaN is above every finite one: an integer
 * max, which the compiler vectorises (a float max that must keep NaN out is not), finds both the
 * answer and whether one was infinite or NaN. */
#define GAP_LOOP(LOAD)                                                        \
    for (int64_t i = 0; i < m; i++) {                                         \
        float r = rc[i];                                                      \
        uint32_t q = bits_of(fabsf((LOAD - r) / (fabsf(r) + biggest)));       \
        best = q > best ? q : best;                                           \
    }

/* the signs of the (zero) quotients: `signs` has the sign bit where one is -0, `all` keeps it where all are */
#define SIGN_LOOP(LOAD)                                                       \
    for (int64_t i = 0; i < m; i++) {                                         \
        float r = rc[i];                                                      \
        uint32_t q = bits_of((LOAD - r) / (fabsf(r) + biggest));              \
        signs |= q & 0x80000000u;                                             \
        all &= q;                                                             \
    }

/* LOOP(LOAD) over x's dtype, on the chunk at rc (ref) and x + xo */
#define BY_KIND(LOOP)                                                         \
    if (kind == 0) {                                                          \
        const float *v = (const float *)x + xo;                               \
        LOOP(v[i])                                                            \
    } else if (kind == 1) {                                                   \
        const uint16_t *v = (const uint16_t *)x + xo;                         \
        LOOP(from_bf16(v[i]))                                                 \
    } else {                                                                  \
        const uint16_t *v = (const uint16_t *)x + xo;                         \
        LOOP(from_f16(v[i]))                                                  \
    }

/* BODY once per chunk: rc (ref's), xo (x's offset in elements) and m (its length). ndim 0: one chunk of
 * n (both contiguous); otherwise the rows of the last dimension, which is contiguous in both (stride 1
 * or size 1), the others walked by their strides (in elements) like an odometer. */
#define FOR_CHUNKS(BODY)                                                      \
    if (ndim == 0) {                                                          \
        const float *rc = ref;                                                \
        int64_t xo = 0, m = n;                                                \
        BODY                                                                  \
    } else {                                                                  \
        int64_t idx[MAX_DIMS] = {0}, ro = 0, xo = 0, m = sizes[ndim - 1];     \
        for (int64_t c = 0, rows = n / m; c < rows; c++) {                    \
            const float *rc = ref + ro;                                       \
            BODY                                                              \
            for (int64_t d = ndim - 2; d >= 0; d--) {                         \
                ro += sref[d];                                                \
                xo += sx[d];                                                  \
                if (++idx[d] < sizes[d])                                      \
                    break;                                                    \
                ro -= sref[d] * sizes[d];                                     \
                xo -= sx[d] * sizes[d];                                       \
                idx[d] = 0;                                                   \
            }                                                                 \
        }                                                                     \
    }

#define INF_BITS 0x7f800000u
#define MAX_DIMS 16

/* kind: 0 float32, 1 bfloat16, 2 float16; n elements (> 0); ndim 0 (both contiguous) or up to MAX_DIMS
 * sizes with ref's and x's strides */
int64_t nsp_diverge_error(const float *ref, const void *x, int64_t kind, int64_t n, int64_t ndim,
                          const int64_t *sizes, const int64_t *sref, const int64_t *sx, double limit, float *out) {
    if (kind < 0 || kind > 2 || n <= 0 || ndim < 0 || ndim > MAX_DIMS || (ndim > 0 && sizes[ndim - 1] <= 0))
        return NSP_OTHER;
    uint32_t top = 0;
    FOR_CHUNKS((void)xo; for (int64_t i = 0; i < m; i++) {
        uint32_t a = bits_of(fabsf(rc[i]));
        top = a > top ? a : top;
    })
    if (top >= INF_BITS) /* a NaN or an infinity in ref */
        return NSP_OTHER;
    float biggest;
    memcpy(&biggest, &top, sizeof biggest);
    if (!((double)biggest < limit))
        return NSP_OTHER;
    uint32_t best = 0;
    FOR_CHUNKS(BY_KIND(GAP_LOOP))
    if (best >= INF_BITS)
        return NSP_OTHER;
    if (best > 0) {
        memcpy(out, &best, sizeof best);
        return NSP_OK;
    }
    /* every quotient is zero: their signs (the sign of x_i - ref_i), which the torch path's answer shows.
     * All -0 cannot happen (it needs ref all zero, and then 0 / 0 was sent back above), but is answered. */
    uint32_t signs = 0, all = 0x80000000u;
    FOR_CHUNKS(BY_KIND(SIGN_LOOP))
    *out = 0.0f;
    return !signs ? NSP_ZERO_POS : all ? NSP_ZERO_NEG : NSP_OTHER; /* zeros of both signs: torch's choice */
}
