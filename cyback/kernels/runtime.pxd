# The thread team's policy (include/cyback_team.h), shared by every kernel
# module: they cimport these instead of reading their own copy of the state.
cdef int threads_for(double work) noexcept nogil
cdef void team_done(int threads) noexcept nogil
cdef double join_seconds() noexcept nogil
