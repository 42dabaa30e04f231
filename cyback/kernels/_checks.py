"""Argument checks shared by the kernels' Python entries (float dtypes,
int-or-tuple arguments, explicit pads, remembered geometries), and the warning
for a setting read at import that cannot be used."""
import warnings

import numpy as np


class ConfigWarning(UserWarning):
    """A setting read at import (keras.json, an environment variable) that
    cyback could not use; the warning names it and the value used instead."""


def setting_warning(message):
    """Warn that a setting read at import is bad: one policy for all of them
    (cyback/config.py says why)."""
    warnings.warn("cyback: " + message, ConfigWarning, stacklevel=3)


_FLOATS = (np.float32, np.float64)
_FLOATS_AND_HALF = (np.float16, np.float32, np.float64)


def float_dtype(name, dtype, half=False):
    """``dtype`` as a NumPy dtype if it is float32 or float64 (or, with
    ``half``, float16, which the convolution computes in float32); else a
    TypeError naming ``name``. Prepared calls check their dtype here."""
    dt = np.dtype(dtype)
    if dt not in (_FLOATS_AND_HALF if half else _FLOATS):
        raise TypeError("%s: expected %s arrays, got %s"
                        % (name, "float16, float32 or float64" if half else "float32 or float64",
                           dt))
    return dt


def check_float(name, *arrays, half=False):
    """The one dtype of ``arrays``: all float32 or all float64 (or, with
    ``half``, all float16); else a TypeError naming ``name``."""
    dt = float_dtype(name, arrays[0].dtype, half)
    for a in arrays[1:]:
        if a.dtype != dt:
            raise TypeError("%s: dtype mismatch: %s and %s" % (name, dt, a.dtype))
    return dt


def int_tuple(name, what, value, n, scalar=True):
    """``value`` as a tuple of ``n`` positive ints: a sequence of n ints, or
    with ``scalar`` also one int for all n axes (the pooling and locally
    connected kernels take either; the convolution kernels, one int per
    axis). Otherwise a TypeError or ValueError naming ``name`` and ``what``
    (strides, dilation, pool_size ...)."""
    if scalar and isinstance(value, (int, np.integer)):
        value = (int(value),) * n
    try:
        t = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be %s, got %r"
                        % (name, what, "an int or a tuple of ints" if scalar
                           else "a sequence of %d ints" % n, value))
    if len(t) != n or any(v < 1 for v in t):
        raise ValueError("%s: %s must be %d positive ints, got %r" % (name, what, n, value))
    return t


def pad_pairs(name, pads, n):
    """``pads`` as a tuple of ``n`` (before, after) pairs of non-negative
    ints; else a TypeError or ValueError naming ``name``."""
    try:
        t = tuple((int(a), int(b)) for a, b in pads)
    except (TypeError, ValueError):
        raise TypeError("%s: pads must be %d (before, after) pairs, got %r" % (name, n, pads))
    if len(t) != n or any(a < 0 or b < 0 for a, b in t):
        raise ValueError("%s: pads must be %d non-negative (before, after) pairs, got %r"
                         % (name, n, pads))
    return t


def remembered(table, key, compute, *args):
    """``compute(*args)``, remembered in ``table`` under ``key``.

    Validating a geometry takes as long as a batch-1 kernel, and a model calls
    the same few over and over. A key that cannot be hashed (lists among the
    arguments) is not remembered, nor is an error; the table keeps at most 512
    entries. Results are shared: callers must not modify them."""
    try:
        return table[key]
    except TypeError:
        return compute(*args)
    except KeyError:
        pass
    result = compute(*args)
    if len(table) >= 512:
        table.clear()
    table[key] = result
    return result
