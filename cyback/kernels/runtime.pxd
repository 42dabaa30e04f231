# The thread team's policy (include/cyback_team.h), shared by every kernel
# module: they cimport these instead of reading their own copy of the state.
cdef int threads_for(double work) noexcept nogil
cdef int team_size() noexcept nogil
cdef int team_parts(double work) noexcept nogil
cdef double team_min_work() noexcept nogil
cdef void team_done(int threads) noexcept nogil
cdef double join_seconds() noexcept nogil

# The float32 GEMM the kernels call through _blas.gemm when it is not SciPy's:
# a CBLAS row-major sgemm with 64-bit integers (NumPy's OpenBLAS), or NULL.
from libc.stdint cimport int64_t
ctypedef void (*cblas_sgemm64_t)(int order, int trans_a, int trans_b, int64_t m, int64_t n,
                                 int64_t k, float alpha, const float* a, int64_t lda,
                                 const float* b, int64_t ldb, float beta, float* c,
                                 int64_t ldc) noexcept nogil
cdef cblas_sgemm64_t kernel_sgemm64() noexcept nogil
