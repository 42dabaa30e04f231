"""What every part of ``cyback.dask`` uses: the name its errors start with,
importing dask (only when called), the shape text of its messages, and the
base of the values a task carries that dask's graph walk must not look
into."""

_API = "cyback.dask.predict"


def _dask():
    try:
        import dask
        import dask.array  # noqa: F401
    except ImportError as e:
        raise ImportError("cyback.dask needs dask; install it with "
                          "pip install 'cyback[dask]' (%s)" % e) from None
    return dask


def _shape_str(tail):
    return "(%s)" % ", ".join(["n"] + ["None" if d is None else str(d) for d in tail])


class _Opaque(object):
    """A value dask's graph walk must not look into (its tuples could pass for
    tasks or keys): the settings of one predict call, or rows of a file."""

    __slots__ = ()

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def __dask_tokenize__(self):
        return (type(self).__name__,) + self.__getstate__()
