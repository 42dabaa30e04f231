"""Random ops: normal, uniform, binomial, truncated normal and the dropout mask.

Each op owns a NumPy Generator: seeded ops replay the same sequence in every
process, unseeded ones take their seed from ``np.random`` when built (so
``np.random.seed`` before building a model makes it deterministic). The
generator advances on every run, so a compiled function draws fresh numbers
per call. Generators are not thread-safe, hence one lock per op. Random ops
are impure: never folded, never merged.
"""
import numbers
import threading

import numpy as np

from cyback.graph import limits
from cyback.graph.op import Op
from cyback.graph.tensor import is_float_dtype
from cyback.ops.shape import check_static_shape, shape_arg

_SEED_LIMIT = 2 ** 31 - 1


def make_seed(api, seed):
    """An int seed: ``seed`` checked, or one drawn from NumPy's global state."""
    if seed is None:
        return int(np.random.randint(_SEED_LIMIT))
    if isinstance(seed, bool) or not isinstance(seed, (numbers.Integral, np.integer)):
        raise TypeError("%s: seed must be an int or None, got %r" % (api, seed))
    if seed < 0:
        raise ValueError("%s: seed must be non-negative, got %d" % (api, seed))
    return int(seed)


def generator(seed):
    return np.random.Generator(np.random.PCG64(seed))


def _gen_dtype(dtype):
    # Generators draw float32/float64 natively; float16 goes through float32.
    return np.float64 if dtype == "float64" else np.float32


class RandomOp(Op):
    """Base: ``static`` is the output shape (None where known only at run time,
    then the op's single input is the 1-D int shape tensor)."""

    pure = False

    def __init__(self, static, dtype, seed):
        self.static = static
        self.dtype = dtype
        self.seed = seed
        self._rng = generator(seed)
        self._lock = threading.Lock()

    def infer(self, *shape_tensor):
        return [(self.static, self.dtype)]

    def compute(self, *shape_tensor):
        if shape_tensor:
            shape = tuple(int(d) for d in np.asarray(shape_tensor[0]).reshape(-1))
            if any(d < 0 for d in shape):
                raise ValueError("%s: negative dimension in shape %s" % (self.api, shape))
            limits.check_shape(self.api, shape, self.dtype)
        else:
            shape = self.static
        with self._lock:
            out = self.draw(self._rng, shape)
        return (np.asarray(out, dtype=self.dtype),)


class RandomNormal(RandomOp):
    api = "random_normal"

    def __init__(self, static, dtype, seed, mean, stddev, truncated=False):
        super().__init__(static, dtype, seed)
        self.mean = mean
        self.stddev = stddev
        self.truncated = truncated
        if truncated:
            self.api = "truncated_normal"

    def draw(self, rng, shape):
        z = rng.standard_normal(shape, dtype=_gen_dtype(self.dtype))
        if self.truncated:
            # Redraw whatever falls beyond two standard deviations.
            bad = np.flatnonzero(np.abs(z) > 2)
            flat = z.reshape(-1)
            while bad.size:
                flat[bad] = rng.standard_normal(bad.size, dtype=flat.dtype)
                bad = bad[np.abs(flat[bad]) > 2]
        if self.stddev != 1:
            z *= self.stddev
        if self.mean != 0:
            z += self.mean
        return z


class RandomUniform(RandomOp):
    api = "random_uniform"

    def __init__(self, static, dtype, seed, minval, maxval):
        super().__init__(static, dtype, seed)
        self.minval = minval
        self.maxval = maxval

    def draw(self, rng, shape):
        if not is_float_dtype(self.dtype):
            return rng.integers(self.minval, self.maxval, size=shape, dtype=self.dtype)
        u = rng.random(shape, dtype=_gen_dtype(self.dtype))
        if (self.minval, self.maxval) != (0, 1):
            u *= (self.maxval - self.minval)
            u += self.minval
        return u


class RandomBinomial(RandomOp):
    """1 with probability p, else 0 (``u < p`` for u uniform on [0, 1), so p=0
    never and p=1 always gives 1)."""

    api = "random_binomial"

    def __init__(self, static, dtype, seed, p):
        super().__init__(static, dtype, seed)
        self.p = p

    def draw(self, rng, shape):
        return rng.random(shape, dtype=np.float32 if self.dtype != "float64" else np.float64) \
            < self.p


class DropoutMask(RandomOp):
    """Inverted-dropout mask: ``1/keep`` with probability ``keep``, else 0."""

    api = "dropout"

    def __init__(self, static, dtype, seed, keep):
        super().__init__(static, dtype, seed)
        self.keep = keep

    def draw(self, rng, shape):
        u = rng.random(shape, dtype=_gen_dtype(self.dtype))
        scale = np.asarray(1.0 / self.keep, dtype=u.dtype)
        return np.where(u < self.keep, scale, np.zeros((), u.dtype))


def random_tensor(api, op_class, shape, dtype, seed, **params):
    """Build a random op for a (possibly symbolic) shape argument."""
    static, tensor = shape_arg(api, shape)
    check_static_shape(api, static)
    op = op_class(tuple(static), dtype, make_seed(api, seed), **params)
    return op(tensor) if tensor is not None else op()
