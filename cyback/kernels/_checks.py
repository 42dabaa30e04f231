"""Argument checks shared by the kernels' Python entries, and the warning for
a setting read at import that cannot be used."""
import warnings

import numpy as np


class ConfigWarning(UserWarning):
    """A setting read at import (keras.json, an environment variable) that
    cyback could not use; the warning names it and the value used instead."""


def setting_warning(message):
    """Warn that a setting read at import is bad: one policy for all of them
    (cyback/config.py says why)."""
    warnings.warn("cyback: " + message, ConfigWarning, stacklevel=3)


def check_float(name, *arrays):
    """All arrays float32, or all float64; else a TypeError naming ``name``."""
    dt = arrays[0].dtype
    if dt not in (np.float32, np.float64):
        raise TypeError("%s: expected float32 or float64 arrays, got %s" % (name, dt))
    for a in arrays[1:]:
        if a.dtype != dt:
            raise TypeError("%s: dtype mismatch: %s and %s" % (name, dt, a.dtype))


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
