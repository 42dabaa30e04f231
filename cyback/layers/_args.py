"""Argument checks shared by the layers: each error names the layer class, the
argument and the value received."""
import numbers

__all__ = [
    'check_int', 'check_number', 'check_bool', 'check_choice', 'check_axis_arg',
    'resolve_axes', 'int_tuple', 'static_or_symbolic_shape', 'set_weight_args',
    'weight_args_config', 'KERNEL_BIAS_ARGS',
]


def check_int(cls, name, value, minimum=None, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError('%s: %s must be an integer, got %r' % (cls, name, value))
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError('%s: %s must be >= %d, got %d' % (cls, name, minimum, value))
    return value


def check_number(cls, name, value, minimum=None, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError('%s: %s must be a number, got %r' % (cls, name, value))
    value = float(value)
    if value != value:
        raise ValueError('%s: %s must not be NaN' % (cls, name))
    if minimum is not None and value < minimum:
        raise ValueError('%s: %s must be >= %s, got %s' % (cls, name, minimum, value))
    return value


def check_bool(cls, name, value):
    if not isinstance(value, bool):
        raise TypeError('%s: %s must be True or False, got %r' % (cls, name, value))
    return value


def check_choice(cls, name, value, choices):
    if value not in choices:
        raise ValueError('%s: %s must be one of %s, got %r'
                         % (cls, name, ', '.join(repr(c) for c in choices), value))
    return value


def check_axis_arg(cls, axis, allow_list=True):
    """An int, or (when ``allow_list``) a non-empty list/tuple of distinct ints.
    Returns an int or a list."""
    if isinstance(axis, (list, tuple)) and allow_list:
        if not axis:
            raise ValueError('%s: axis must not be empty' % cls)
        axes = [check_int(cls, 'axis', a) for a in axis]
        if len(set(axes)) != len(axes):
            raise ValueError('%s: axis has repeated entries: %r' % (cls, list(axis)))
        return axes
    what = 'an integer or a list of integers' if allow_list else 'an integer'
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError('%s: axis must be %s, got %r' % (cls, what, axis))
    return int(axis)


def resolve_axes(cls, axis, ndim, allow_batch=False):
    """``axis`` (int or list) as a sorted list of non-negative axes of a rank-``ndim``
    input; the batch axis 0 is refused unless ``allow_batch``."""
    axes = axis if isinstance(axis, list) else [axis]
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError('%s: axis %d is out of range for an input of rank %d'
                             % (cls, a, ndim))
        a = a % ndim
        if a == 0 and not allow_batch:
            raise ValueError('%s: axis %r includes the batch axis 0' % (cls, axis))
        out.append(a)
    if len(set(out)) != len(out):
        raise ValueError('%s: axis %r names an axis twice for rank %d' % (cls, axis, ndim))
    return sorted(out)


def int_tuple(cls, name, value, n):
    """An int or a sequence of ``n`` ints, as a tuple of ``n`` ints."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError('%s: %s must have %d entries, got %r' % (cls, name, n, value))
        return tuple(check_int(cls, name, v, minimum=1) for v in value)
    return (check_int(cls, name, value, minimum=1),) * n


def static_or_symbolic_shape(K, x):
    """x's shape as a list: ints where known, symbolic scalars elsewhere."""
    static = K.int_shape(x)
    dynamic = None
    out = []
    for i, d in enumerate(static):
        if d is None:
            if dynamic is None:
                dynamic = K.shape(x)
            out.append(dynamic[i])
        else:
            out.append(d)
    return out


#: The initializer/regularizer/constraint arguments of a layer with a kernel and a bias.
KERNEL_BIAS_ARGS = ('kernel_initializer', 'bias_initializer', 'kernel_regularizer',
                    'bias_regularizer', 'activity_regularizer', 'kernel_constraint',
                    'bias_constraint')


def _weight_arg_module(name):
    """Keras's module for a ``<weight>_initializer`` / ``_regularizer`` /
    ``_constraint`` argument."""
    from cyback.layers._keras import import_keras
    keras = import_keras()
    kind = name.rsplit('_', 1)[1]
    return {'initializer': keras.initializers, 'regularizer': keras.regularizers,
            'constraint': keras.constraints}[kind]


def set_weight_args(layer, **args):
    """``layer.<name> = keras.<kind>s.get(value)`` for each argument
    ``<weight>_initializer`` / ``_regularizer`` / ``_constraint`` (and
    ``activity_regularizer``)."""
    for name, value in args.items():
        setattr(layer, name, _weight_arg_module(name).get(value))


def weight_args_config(layer, *names):
    """The config entries of the arguments ``set_weight_args`` set."""
    return {name: _weight_arg_module(name).serialize(getattr(layer, name)) for name in names}
