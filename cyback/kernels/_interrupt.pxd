# Polling for Ctrl-C between the tiles of long kernel calls; see
# include/cyback_interrupt.h.
cdef extern from "cyback_interrupt.h" nogil:
    ctypedef struct cb_intr:
        int stop
    void cb_intr_init(cb_intr* s)
    int cb_intr_poll(cb_intr* s)


cdef inline int check_interrupt(cb_intr* s) except -1:
    # With the GIL, after the kernel: a handler's exception is already set
    # when stop is, and returning -1 makes Cython raise it.
    if s.stop:
        return -1
    return 0
