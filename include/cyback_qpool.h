/* The element-wise max of two rows of uint8 codes, for the max pool of
 * codes (cyback/kernels/qpool.pxi): restrict and a branch-free select, so the
 * compiler makes it vpmaxub over whole vectors. */
#ifndef CYBACK_QPOOL_H
#define CYBACK_QPOOL_H

#include <stddef.h>
#include <stdint.h>

static inline void cb_qp_max(uint8_t *restrict d, const uint8_t *restrict s, ptrdiff_t c) {
    ptrdiff_t i;
    for (i = 0; i < c; i++) d[i] = s[i] > d[i] ? s[i] : d[i];
}

#endif
