# cython: language_level=3
"""A cache of the very large blocks a plan's arrays take, kept between calls.

``kernels/memory.py`` keeps freed memory in the process through glibc's
thresholds, but glibc maps every block above its largest mmap threshold
(32 MiB) afresh and unmaps it on free. The biggest intermediates of a
batch-8 MobileNetV2 or InceptionV3 are that large, so each call
page-faulted them back in: 90-220 faults a call (huge pages, which NumPy asks
for on large arrays, zeroed 2 MiB at a time), 7-20 ms of kernel time.

``enter()`` makes NumPy allocate through this module's handler for the rest
of the calling context (a compiled function does it around its plan and
``leave`` restores the handler it replaced). The handler gives every block a
64-byte header with its capacity; blocks of at least ``min_bytes`` go to a
small cache when freed (at most ``budget_bytes`` in all, the oldest freed
first) and are handed out again, already mapped, to a request of up to their
size that is at least four fifths of it. Everything else is the C library's
malloc and free.
"""
from cpython.pycapsule cimport PyCapsule_New

cimport numpy as cnp

cnp.import_array()

cdef extern from *:
    """
    #include <pthread.h>
    #include <stdlib.h>
    #include <string.h>
    #include <numpy/arrayobject.h>

    #define CB_LB_HEADER 64                 /* the capacity; keeps malloc's alignment */
    #define CB_LB_SLOTS 32

    typedef struct { char *block; size_t capacity; unsigned long long stamp; } cb_lb_slot;

    static pthread_mutex_t cb_lb_lock = PTHREAD_MUTEX_INITIALIZER;
    static cb_lb_slot cb_lb_slots[CB_LB_SLOTS];
    static size_t cb_lb_cached = 0, cb_lb_min = (size_t)-1, cb_lb_budget = 0;
    static unsigned long long cb_lb_clock = 0, cb_lb_hits = 0, cb_lb_misses = 0;

    static void cb_lb_after_fork(void) { pthread_mutex_init(&cb_lb_lock, NULL); }

    /* A cached block for `size` bytes (its data), or NULL. */
    static char *cb_lb_take(size_t size)
    {
        char *block = NULL;
        int best = -1, i;
        pthread_mutex_lock(&cb_lb_lock);
        for (i = 0; i < CB_LB_SLOTS; i++) {
            size_t cap = cb_lb_slots[i].capacity;
            if (cb_lb_slots[i].block != NULL && cap >= size && size >= cap - cap / 5 &&
                    (best < 0 || cap < cb_lb_slots[best].capacity))
                best = i;
        }
        if (best >= 0) {
            block = cb_lb_slots[best].block;
            cb_lb_cached -= cb_lb_slots[best].capacity;
            cb_lb_slots[best].block = NULL;
            cb_lb_slots[best].capacity = 0;
            cb_lb_hits++;
        } else {
            cb_lb_misses++;
        }
        pthread_mutex_unlock(&cb_lb_lock);
        return block == NULL ? NULL : block + CB_LB_HEADER;
    }

    static void *cb_lb_fresh(size_t size, int zeroed)
    {
        char *block = zeroed ? (char *)calloc(1, size + CB_LB_HEADER)
                             : (char *)malloc(size + CB_LB_HEADER);
        if (block == NULL)
            return NULL;
        *(size_t *)block = size;
        return block + CB_LB_HEADER;
    }

    static void *cb_lb_malloc(void *ctx, size_t size)
    {
        char *p;
        (void)ctx;
        if (size >= cb_lb_min && (p = cb_lb_take(size)) != NULL)
            return p;
        return cb_lb_fresh(size ? size : 1, 0);
    }

    static void *cb_lb_calloc(void *ctx, size_t n, size_t item)
    {
        char *p;
        size_t size = n * item;
        (void)ctx;
        if (item != 0 && size / item != n)
            return NULL;
        if (size >= cb_lb_min && (p = cb_lb_take(size)) != NULL) {
            memset(p, 0, size);
            return p;
        }
        return cb_lb_fresh(size ? size : 1, 1);
    }

    static void cb_lb_free(void *ctx, void *ptr, size_t size)
    {
        char *block;
        size_t cap;
        int i, slot = -1;
        (void)ctx; (void)size;
        if (ptr == NULL)
            return;
        block = (char *)ptr - CB_LB_HEADER;
        cap = *(size_t *)block;
        if (cap < cb_lb_min || cap > cb_lb_budget) {
            free(block);
            return;
        }
        pthread_mutex_lock(&cb_lb_lock);
        for (;;) {
            int oldest = -1;
            slot = -1;
            for (i = 0; i < CB_LB_SLOTS; i++) {
                if (cb_lb_slots[i].block == NULL) {
                    if (slot < 0) slot = i;
                } else if (oldest < 0 || cb_lb_slots[i].stamp < cb_lb_slots[oldest].stamp) {
                    oldest = i;
                }
            }
            if (slot >= 0 && cb_lb_cached + cap <= cb_lb_budget)
                break;
            /* oldest >= 0 here: an empty cache has free slots and room for cap */
            free(cb_lb_slots[oldest].block);
            cb_lb_cached -= cb_lb_slots[oldest].capacity;
            cb_lb_slots[oldest].block = NULL;
            cb_lb_slots[oldest].capacity = 0;
        }
        cb_lb_slots[slot].block = block;
        cb_lb_slots[slot].capacity = cap;
        cb_lb_slots[slot].stamp = ++cb_lb_clock;
        cb_lb_cached += cap;
        pthread_mutex_unlock(&cb_lb_lock);
    }

    static void *cb_lb_realloc(void *ctx, void *ptr, size_t size)
    {
        char *fresh;
        size_t cap;
        if (ptr == NULL)
            return cb_lb_malloc(ctx, size);
        cap = *(size_t *)((char *)ptr - CB_LB_HEADER);
        fresh = (char *)cb_lb_malloc(ctx, size);
        if (fresh == NULL)
            return NULL;
        memcpy(fresh, ptr, cap < size ? cap : size);
        cb_lb_free(ctx, ptr, cap);
        return fresh;
    }

    static PyDataMem_Handler cb_lb_handler = {
        "cyback_large_blocks", 1,
        {NULL, cb_lb_malloc, cb_lb_calloc, cb_lb_realloc, cb_lb_free}
    };

    static void cb_lb_configure(size_t min_bytes, size_t budget_bytes)
    {
        int i;
        pthread_mutex_lock(&cb_lb_lock);
        cb_lb_min = min_bytes;
        cb_lb_budget = budget_bytes;
        for (i = 0; i < CB_LB_SLOTS; i++) {       /* what no longer fits goes */
            if (cb_lb_slots[i].block != NULL && (cb_lb_slots[i].capacity < min_bytes ||
                                                 cb_lb_cached > budget_bytes)) {
                free(cb_lb_slots[i].block);
                cb_lb_cached -= cb_lb_slots[i].capacity;
                cb_lb_slots[i].block = NULL;
                cb_lb_slots[i].capacity = 0;
            }
        }
        pthread_mutex_unlock(&cb_lb_lock);
    }
    """
    ctypedef struct PyDataMem_Handler:
        pass
    PyDataMem_Handler cb_lb_handler
    size_t cb_lb_cached, cb_lb_min, cb_lb_budget
    unsigned long long cb_lb_hits, cb_lb_misses
    void cb_lb_configure(size_t min_bytes, size_t budget_bytes) nogil
    void cb_lb_after_fork()
    int pthread_atfork(void (*prepare)(), void (*parent)(), void (*child)())
    object PyDataMem_SetHandler(object handler)


pthread_atfork(NULL, NULL, cb_lb_after_fork)

# NumPy keeps a reference to the handler in every array it allocates
cdef object _handler = PyCapsule_New(&cb_lb_handler, "mem_handler", NULL)


def configure(size_t min_bytes, size_t budget_bytes):
    """Cache freed blocks of at least ``min_bytes``, at most ``budget_bytes``
    of them in all (0: none); cached blocks that no longer qualify are freed."""
    cb_lb_configure(min_bytes, budget_bytes)


def clear():
    """Free every cached block (the settings stay)."""
    cdef size_t lo = cb_lb_min, budget = cb_lb_budget
    cb_lb_configure(lo, 0)
    cb_lb_configure(lo, budget)


def min_bytes():
    """The smallest block cached, or None while the cache has no budget."""
    return cb_lb_min if cb_lb_budget else None


def stats():
    """{"cached_bytes", "min_bytes", "budget_bytes", "hits", "misses"}."""
    return {"cached_bytes": cb_lb_cached, "min_bytes": cb_lb_min, "budget_bytes": cb_lb_budget,
            "hits": cb_lb_hits, "misses": cb_lb_misses}


def enter():
    """Make NumPy allocate through the cache in the calling context; returns
    the handler it replaced, for ``leave`` (None, and nothing changed, while
    the cache has no budget)."""
    if cb_lb_budget == 0:
        return None
    return PyDataMem_SetHandler(_handler)


def leave(previous):
    """Restore the handler ``enter`` returned."""
    if previous is not None:
        PyDataMem_SetHandler(previous)
