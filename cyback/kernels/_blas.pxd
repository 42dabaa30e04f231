# Row-major GEMM on top of SciPy's Fortran BLAS (the OpenBLAS SciPy ships), or
# for float32 products NumPy's OpenBLAS when kernels/blas_threads.py chose it.
# Declared inline in a .pxd so that every kernel module gets its own copy and
# calls BLAS with no Python in between.
from scipy.linalg.cython_blas cimport sgemm, dgemm, sgemv, dgemv
from cyback.kernels.runtime cimport cblas_sgemm64_t, kernel_sgemm64

ctypedef fused floating:
    float
    double


cdef inline void gemm(bint trans_a, bint trans_b, int m, int n, int k,
                      floating alpha, const floating* a, int lda,
                      const floating* b, int ldb, floating beta,
                      floating* c, int ldc) noexcept nogil:
    """C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, all row-major.

    A row-major product is the column-major product of the transposes in the
    other order, so B goes first and no data moves.
    """
    cdef char ta = b'T' if trans_a else b'N'
    cdef char tb = b'T' if trans_b else b'N'
    cdef int inc = lda if trans_a else 1, one = 1
    cdef cblas_sgemm64_t sgemm64
    if m <= 0 or n <= 0:
        return
    if m == 1 and k > 0:
        # One row (batch-1 Dense layers): GEMV. OpenBLAS's GEMM would pack
        # all of B first, which costs ten times the product. Row-major B is
        # column-major B^T, so op(B)^T a is GEMV 'N' on it (and 'T' on a
        # stored transpose).
        tb = b'T' if trans_b else b'N'
        if floating is float:
            if trans_b:
                sgemv(&tb, &k, &n, &alpha, <float*>b, &ldb, <float*>a, &inc, &beta, c, &one)
            else:
                sgemv(&tb, &n, &k, &alpha, <float*>b, &ldb, <float*>a, &inc, &beta, c, &one)
        else:
            if trans_b:
                dgemv(&tb, &k, &n, &alpha, <double*>b, &ldb, <double*>a, &inc, &beta, c, &one)
            else:
                dgemv(&tb, &n, &k, &alpha, <double*>b, &ldb, <double*>a, &inc, &beta, c, &one)
        return
    if floating is float:
        sgemm64 = kernel_sgemm64()
        if sgemm64 != NULL:
            # CBLAS row-major (101), no transpose (111) or transpose (112)
            sgemm64(101, 112 if trans_a else 111, 112 if trans_b else 111, m, n, k, alpha,
                    a, lda, b, ldb, beta, c, ldc)
            return
        sgemm(&tb, &ta, &n, &m, &k, &alpha, <float*>b, &ldb, <float*>a, &lda,
              &beta, c, &ldc)
    else:
        dgemm(&tb, &ta, &n, &m, &k, &alpha, <double*>b, &ldb, <double*>a, &lda,
              &beta, c, &ldc)
