cdef extern from "cyback_omp.h" nogil:
    int cb_openmp_enabled()
    int cb_get_max_threads()
    void cb_set_num_threads(int n)
    int cb_get_thread_num()
    int cb_get_num_threads()
