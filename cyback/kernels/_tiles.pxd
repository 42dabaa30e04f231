# Work items handed out one at a time and the region's join with a bounded
# spin (include/cyback_tiles.h).
cdef extern from "cyback_tiles.h" nogil:
    ctypedef struct cb_tiles:
        pass
    double CB_TILES_JOIN_SECONDS
    void cb_tiles_init(cb_tiles* t)
    long cb_tiles_take(cb_tiles* t)
    void cb_tiles_finish(cb_tiles* t)
    void cb_tiles_wait_done(cb_tiles* t, long total)
    void cb_tiles_join(cb_tiles* t, int nth, double seconds)
    void cb_tiles_wait_all(cb_tiles* t, int nth)
