"""Two-operand einsum on cyback's contraction ops.

EinsumDense and MultiHeadAttention are written as einsum equations in tf.keras.
Every such equation is a tensor contraction with, possibly, shared "batch" letters
(in both operands and the output): letters in both operands but not in the output
are contracted (TensorDot), batch letters are merged into one leading axis
(BatchTensorDot), letters in one operand only and not in the output are summed
first. The ops carry their gradients, so the result differentiates.
"""
import math

from cyback.layers._args import static_or_symbolic_shape
from cyback.ops.linalg import BatchTensorDot, TensorDot

__all__ = ['parse_equation', 'einsum']


def _split(equation):
    if not isinstance(equation, str) or equation.count('->') != 1 or \
            equation.split('->')[0].count(',') != 1:
        raise ValueError('einsum: the equation must have the form "IN1,IN2->OUT", got %r'
                         % (equation,))
    lhs, out = equation.replace(' ', '').split('->')
    a, b = lhs.split(',')
    return a, b, out


def parse_equation(equation, ndim_a, ndim_b):
    """The letters of each term, with ``...`` (first operand and output only) expanded to
    fresh upper-case letters for a rank-``ndim_a`` first operand."""
    sa, sb, so = _split(equation)
    if '...' in sb:
        raise ValueError('einsum %r: "..." is supported in the first operand and the output '
                         'only' % equation)
    if ('...' in sa) != ('...' in so):
        raise ValueError('einsum %r: "..." must appear in both the first operand and the '
                         'output, or in neither' % equation)
    for term in (sa, sb, so):
        stripped = term.replace('...', '')
        if not stripped.isalpha() and stripped:
            raise ValueError('einsum %r: terms may hold letters and one "..." only' % equation)
        if len(set(stripped)) != len(stripped):
            raise ValueError('einsum %r: a letter repeats within a term (diagonals are not '
                             'supported)' % equation)
        if term.count('...') > 1:
            raise ValueError('einsum %r: "..." appears twice in a term' % equation)
    if '...' in sa:
        n = ndim_a - (len(sa) - 3)
        if n < 0:
            raise ValueError('einsum %r: the first operand has rank %d, fewer than the '
                             'equation names' % (equation, ndim_a))
        used = set(sa + sb + so)
        fresh = ''.join([c for c in 'ABCDEFGHIJKLMNOPQRSTUVWXYZ' if c not in used][:n])
        sa, so = sa.replace('...', fresh), so.replace('...', fresh)
    if len(sa) != ndim_a or len(sb) != ndim_b:
        raise ValueError('einsum %r: the operands have ranks %d and %d, the equation names '
                         '%d and %d axes' % (equation, ndim_a, ndim_b, len(sa), len(sb)))
    for c in so:
        if c not in sa and c not in sb:
            raise ValueError('einsum %r: output letter %r is in neither operand'
                             % (equation, c))
    return sa, sb, so


def _product(dims):
    out = 1
    symbolic = []
    for d in dims:
        if isinstance(d, int):
            out *= d
        else:
            symbolic.append(d)
    for d in symbolic:
        out = d * out
    return out


def _transpose(K, x, letters, order):
    perm = [letters.index(c) for c in order]
    if perm != list(range(len(perm))):
        x = K.permute_dimensions(x, perm)
    return x, ''.join(order)


def einsum(K, equation, a, b):
    """``einsum(equation, a, b)`` with the contraction ops; ``K`` is the backend."""
    sa, sb, so = parse_equation(equation, K.ndim(a), K.ndim(b))
    sta, stb = K.int_shape(a), K.int_shape(b)
    for c in set(sa) & set(sb):
        da, db = sta[sa.index(c)], stb[sb.index(c)]
        if da is not None and db is not None and da != db:
            raise ValueError('einsum %r: letter %r has size %d in the first operand and %d in '
                             'the second' % (equation, c, da, db))
    if K.dtype(a) != K.dtype(b):
        b = K.cast(b, K.dtype(a))
    # Letters of one operand alone that the output drops are summed out first.
    only_a = [i for i, c in enumerate(sa) if c not in sb and c not in so]
    if only_a:
        a = K.sum(a, axis=only_a)
        sa = ''.join(c for i, c in enumerate(sa) if i not in only_a)
    only_b = [i for i, c in enumerate(sb) if c not in sa and c not in so]
    if only_b:
        b = K.sum(b, axis=only_b)
        sb = ''.join(c for i, c in enumerate(sb) if i not in only_b)
    batch = [c for c in so if c in sa and c in sb]
    contract = [c for c in sa if c in sb and c not in so]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    if not contract:
        # An outer product along the free letters: contract a size-1 axis.
        a, b = K.expand_dims(a, -1), K.expand_dims(b, -1)
        sa, sb = sa + '#', sb + '#'
        contract = ['#']
    if not batch:
        out = TensorDot(tuple(sa.index(c) for c in contract),
                        tuple(sb.index(c) for c in contract))(a, b)
        letters = ''.join(free_a + free_b)
    else:
        a, sa = _transpose(K, a, sa, batch + free_a + contract)
        b, sb = _transpose(K, b, sb, batch + contract + free_b)
        nb = len(batch)
        shape_a = static_or_symbolic_shape(K, a)
        shape_b = static_or_symbolic_shape(K, b)
        batch_dims = [shape_a[i] if isinstance(shape_a[i], int) else shape_b[i]
                      for i in range(nb)]
        if nb > 1:
            merged = _product(batch_dims)
            a = K.reshape(a, tuple([merged] + shape_a[nb:]))
            b = K.reshape(b, tuple([merged] + shape_b[nb:]))
        nfa, nc = len(free_a), len(contract)
        out = BatchTensorDot(tuple(range(1 + nfa, 1 + nfa + nc)),
                             tuple(range(1, 1 + nc)))(a, b)
        if nb > 1:
            free_dims = shape_a[nb:nb + nfa] + shape_b[nb + nc:]
            out = K.reshape(out, tuple(batch_dims + free_dims))
        letters = ''.join(batch + free_a + free_b)
    out, _ = _transpose(K, out, letters, list(so))
    return out


def static_product(dims):
    """The product of known sizes (None if any is unknown)."""
    if any(d is None for d in dims):
        return None
    return math.prod(dims)
