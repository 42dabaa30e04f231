/* The element-wise max of two rows of uint8 codes, for the max pool of
 * codes (cyback/kernels/qpool.pxi): restrict and a branch-free select, so the
 * compiler makes it vpmaxub over whole vectors. */
#ifndef CYBACK_QPOOL_H
#define CYBACK_QPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void cb_qp_max(uint8_t *restrict d, const uint8_t *restrict s, ptrdiff_t c) {
    ptrdiff_t i;
    for (i = 0; i < c; i++) d[i] = s[i] > d[i] ? s[i] : d[i];
}

/* d (inner bytes) = the max over n rows of src (row r at src + r * inner),
 * n >= 1. The AVX2 and AVX-512BW sets keep a chunk's running max in
 * registers down all the rows (the plain loop loads and stores d per row);
 * a max is exact, so every set gives the same bytes. */
static void cb_qp_max_rows_plain(uint8_t *restrict d, const uint8_t *restrict src,
                                 ptrdiff_t n, ptrdiff_t inner) {
    ptrdiff_t r;
    memcpy(d, src, (size_t)inner);
    for (r = 1; r < n; r++) cb_qp_max(d, src + r * inner, inner);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define CB_QP_HAVE_SIMD 1

__attribute__((target("avx512f,avx512bw"))) static ptrdiff_t cb_qp_max_rows_512(
    uint8_t *d, const uint8_t *src, ptrdiff_t n, ptrdiff_t inner) {
    ptrdiff_t j = 0, r;
    for (; j + 256 <= inner; j += 256) {
        __m512i m0 = _mm512_loadu_si512(src + j), m1 = _mm512_loadu_si512(src + j + 64);
        __m512i m2 = _mm512_loadu_si512(src + j + 128), m3 = _mm512_loadu_si512(src + j + 192);
        for (r = 1; r < n; r++) {
            const uint8_t *p = src + r * inner + j;
            m0 = _mm512_max_epu8(m0, _mm512_loadu_si512(p));
            m1 = _mm512_max_epu8(m1, _mm512_loadu_si512(p + 64));
            m2 = _mm512_max_epu8(m2, _mm512_loadu_si512(p + 128));
            m3 = _mm512_max_epu8(m3, _mm512_loadu_si512(p + 192));
        }
        _mm512_storeu_si512(d + j, m0);
        _mm512_storeu_si512(d + j + 64, m1);
        _mm512_storeu_si512(d + j + 128, m2);
        _mm512_storeu_si512(d + j + 192, m3);
    }
    for (; j < inner; j += 64) {
        const __mmask64 k = inner - j >= 64 ? ~(__mmask64)0
                                            : (((__mmask64)1 << (inner - j)) - 1);
        __m512i m = _mm512_maskz_loadu_epi8(k, src + j);
        for (r = 1; r < n; r++)
            m = _mm512_max_epu8(m, _mm512_maskz_loadu_epi8(k, src + r * inner + j));
        _mm512_mask_storeu_epi8(d + j, k, m);
    }
    return inner;
}

__attribute__((target("avx2"))) static ptrdiff_t cb_qp_max_rows_256(
    uint8_t *d, const uint8_t *src, ptrdiff_t n, ptrdiff_t inner) {
    ptrdiff_t j = 0, r;
    for (; j + 128 <= inner; j += 128) {
        __m256i m0 = _mm256_loadu_si256((const __m256i *)(src + j));
        __m256i m1 = _mm256_loadu_si256((const __m256i *)(src + j + 32));
        __m256i m2 = _mm256_loadu_si256((const __m256i *)(src + j + 64));
        __m256i m3 = _mm256_loadu_si256((const __m256i *)(src + j + 96));
        for (r = 1; r < n; r++) {
            const uint8_t *p = src + r * inner + j;
            m0 = _mm256_max_epu8(m0, _mm256_loadu_si256((const __m256i *)p));
            m1 = _mm256_max_epu8(m1, _mm256_loadu_si256((const __m256i *)(p + 32)));
            m2 = _mm256_max_epu8(m2, _mm256_loadu_si256((const __m256i *)(p + 64)));
            m3 = _mm256_max_epu8(m3, _mm256_loadu_si256((const __m256i *)(p + 96)));
        }
        _mm256_storeu_si256((__m256i *)(d + j), m0);
        _mm256_storeu_si256((__m256i *)(d + j + 32), m1);
        _mm256_storeu_si256((__m256i *)(d + j + 64), m2);
        _mm256_storeu_si256((__m256i *)(d + j + 96), m3);
    }
    return j;   /* the rest of the columns: the plain loop */
}
#else
#define CB_QP_HAVE_SIMD 0
#endif

/* level: cyback_qgemm.h's instruction set (3: AVX-512 VNNI, which has BW;
 * 1 or 2: AVX2). */
static void cb_qp_max_rows(int level, uint8_t *d, const uint8_t *src, ptrdiff_t n,
                           ptrdiff_t inner) {
    ptrdiff_t done = 0;
#if CB_QP_HAVE_SIMD
    if (level >= 3)
        done = cb_qp_max_rows_512(d, src, n, inner);
    else if (level >= 1)
        done = cb_qp_max_rows_256(d, src, n, inner);
#endif
    (void)level;
    if (done < inner) {
        /* the columns from done on, as rows of their own width */
        ptrdiff_t r, c;
        for (c = done; c < inner; c++) d[c] = src[c];
        for (r = 1; r < n; r++) cb_qp_max(d + done, src + r * inner + done, inner - done);
    }
}

#endif
