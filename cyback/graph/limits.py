"""The sizes a graph accepts, and the values it computes while being built.

- A tensor of more than ``MAX_RANK`` axes (64, NumPy's limit), or needing
  more elements than an array index can count (2**63 - 1), or more than half
  the bytes this process can have (the machine's physical memory, or what
  the address-space limit ``RLIMIT_AS`` leaves when that is less: half,
  because a value is copied whole at times, a variable from the array it is
  made of, a function's output from a value the plan keeps), cannot be
  computed. Building an op whose static output shape is that large, or a
  constant, a variable or a fill of such a shape, raises a ValueError naming
  the function and the shape before anything is allocated; ops whose size
  comes from their arguments check the sizes they get when they run too.
- An op whose inputs are all constants is computed at once while the graph
  is built, and again when a function is compiled (constant folding), only
  if its result takes at most ``FOLD_BYTES`` (see ``foldable``). A larger
  result is computed when the function runs: building a graph never
  allocates a huge array, so ``K.one_hot(indices, 10**9)`` costs nothing
  until it is run.
"""
import os

import numpy as np

from cyback.graph.shapes import format_shape

#: the largest result (in bytes) computed while a graph is built or compiled
FOLD_BYTES = 1 << 28

#: the most elements any array may have
MAX_ELEMENTS = 2 ** 63 - 1

#: the most axes an array may have (NumPy's limit)
MAX_RANK = 64

_itemsize = {}


def itemsize(dtype):
    size = _itemsize.get(dtype)
    if size is None:
        size = _itemsize[dtype] = np.dtype(dtype).itemsize
    return size


def elements(shape):
    """The element count of a static shape (a Python int, never overflowing),
    or None when a size is unknown."""
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= int(d)
    return n


def memory_bytes():
    """The most bytes one more array may take in this process: the machine's
    physical memory, or what the address-space limit leaves beyond the
    process's present size when that is less (None when neither is known)."""
    limit = None
    try:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        pass
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, AttributeError, ValueError, OSError):
        soft = None
    if soft is not None and soft != resource.RLIM_INFINITY:
        left = soft - _address_space_size()
        if limit is None or left < limit:
            limit = max(left, 0)
    return limit


def _address_space_size():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def check_shape(api, shape, dtype, what="the result"):
    """Raise ValueError when an array of static ``shape`` and ``dtype`` could
    not exist (see the module docstring); unknown sizes pass."""
    if len(shape) > MAX_RANK:
        raise ValueError("%s: %s would have %d axes, more than the %d an array can have"
                         % (api, what, len(shape), MAX_RANK))
    n = elements(shape)
    if n is None:
        return
    nbytes = n * itemsize(dtype)
    if nbytes <= FOLD_BYTES:
        return
    if n > MAX_ELEMENTS:
        raise ValueError("%s: %s would have shape %s, %d elements, more than an array can "
                         "hold (%d)" % (api, what, format_shape(shape), n, MAX_ELEMENTS))
    memory = memory_bytes()
    if memory is not None and nbytes > memory // 2:
        raise ValueError("%s: %s would have shape %s and dtype %s, %s, more than half the %s "
                         "this process can use" % (api, what, format_shape(shape), dtype,
                                                   _bytes_str(nbytes), _bytes_str(memory)))


def foldable(shape, dtype):
    """Whether a result of static ``shape`` may be computed while building or
    compiling: at most ``FOLD_BYTES``, or of a size only its values decide (a
    decoded sequence: such ops bound their results by their inputs' sizes;
    ops whose size comes from arguments give it statically for constant
    arguments)."""
    n = elements(shape)
    return n is None or n * itemsize(dtype) <= FOLD_BYTES


def _bytes_str(n):
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= size:
            return "%.3g %s" % (n / size, unit)
    return "%d bytes" % n
