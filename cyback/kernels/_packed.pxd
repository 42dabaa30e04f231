# The packed-weight product's C interface (include/cyback_packed_gemm.h),
# shared by linalg.pyx (Dense products) and conv.pyx (convolutions of few
# output positions).

cdef extern from "cyback_packed_gemm.h" nogil:
    enum:
        CB_PG_NR
        CB_PG_MAX_ROWS
    ctypedef struct cb_pg_args:
        const float* x
        Py_ssize_t ldx, k, n
        const float* packed
        Py_ssize_t P
        const float* b
        const float* res
        Py_ssize_t ldr
        float* y
        Py_ssize_t ldy
        int act
    ctypedef struct cb_pg_plan:
        pass
    void cb_pg_pack(const float* w, Py_ssize_t k, Py_ssize_t n, float* packed)
    int cb_pg_available()
    cb_pg_plan cb_pg_plan_for(Py_ssize_t m, Py_ssize_t P)
    int cb_pg_use_balanced_blocks(int on)
    Py_ssize_t cb_pg_items(const cb_pg_plan* q)
    void cb_pg_item(const cb_pg_args* g, const cb_pg_plan* q, Py_ssize_t i)
