"""Tensor operations that model files store as graph nodes, as a Keras 2.3.1
layer.

tf.keras records a TensorFlow function applied to a Keras tensor as a
``TFOpLambda`` layer naming the function (``"__operators__.add"``,
``"math.multiply"``...), Keras 3 records ``keras.ops`` calls as operation
nodes (``Add``, ``Multiply``, ``NotEqual``...). Both are data: a name from a
fixed table plus constant arguments. ``op_from_tf_keras`` and
``op_from_keras3`` map them to one ``TensorOp`` layer (operation name,
operands: model tensors or constants, and reduction arguments); anything not
in the table is unsupported. MobileNetV3's hard-sigmoid (``x + 3``,
``* 1/6``) and the masks Keras 3 writes as nodes are the common cases.
"""
import numbers

import numpy as np

from cyback.layers import import_keras
from cyback.saving.layer_configs import Unsupported
from cyback.saving.spec import TensorRef

# Multi-backend Keras on the cyback backend (or an ImportError saying why not).
keras = import_keras()
K = keras.backend

__all__ = ['TensorOp', 'ZeroMaskedSteps', 'op_from_tf_keras', 'op_from_keras3', 'OPS']


def _binary(fn):
    return ('binary', fn)


def _unary(fn):
    return ('unary', fn)


def _reduce(fn):
    return ('reduce', fn)


OPS = {
    'add': _binary(lambda a, b: a + b),
    'subtract': _binary(lambda a, b: a - b),
    'multiply': _binary(lambda a, b: a * b),
    'divide': _binary(lambda a, b: a / b),
    'maximum': _binary(lambda a, b: K.maximum(a, b)),
    'minimum': _binary(lambda a, b: K.minimum(a, b)),
    'not_equal': _binary(lambda a, b: K.not_equal(a, b)),
    'equal': _binary(lambda a, b: K.equal(a, b)),
    'negative': _unary(lambda a: -a),
    'sqrt': _unary(K.sqrt),
    'square': _unary(K.square),
    'abs': _unary(K.abs),
    'exp': _unary(K.exp),
    'log': _unary(K.log),
    'sigmoid': _unary(K.sigmoid),
    'tanh': _unary(K.tanh),
    'relu': _unary(K.relu),
    'relu6': _unary(lambda a: K.relu(a, max_value=6.0)),
    'mean': _reduce(K.mean),
    'sum': _reduce(K.sum),
    'max': _reduce(K.max),
    'min': _reduce(K.min),
    'any': _reduce(K.any),
    'all': _reduce(K.all),
}

_BOOL_RESULT = ('not_equal', 'equal', 'any', 'all')

# tf.keras TFOpLambda function names -> operation.
_TF_FUNCTIONS = {
    '__operators__.add': 'add', 'math.add': 'add', 'math.add_n': None,
    'math.subtract': 'subtract', '__operators__.sub': 'subtract',
    'math.multiply': 'multiply', '__operators__.mul': 'multiply',
    'math.truediv': 'divide', 'math.divide': 'divide', '__operators__.truediv': 'divide',
    'math.maximum': 'maximum', 'math.minimum': 'minimum',
    'math.not_equal': 'not_equal', 'math.equal': 'equal',
    'math.negative': 'negative', '__operators__.neg': 'negative',
    'math.sqrt': 'sqrt', 'math.square': 'square', 'math.abs': 'abs',
    'math.exp': 'exp', 'math.log': 'log', 'math.sigmoid': 'sigmoid',
    'math.tanh': 'tanh', 'nn.relu': 'relu', 'nn.relu6': 'relu6',
    'math.reduce_mean': 'mean', 'math.reduce_sum': 'sum', 'math.reduce_max': 'max',
    'math.reduce_min': 'min', 'math.reduce_any': 'any', 'math.reduce_all': 'all',
}
# tf.keras keyword names of the second operand and the reduction arguments.
_TF_SECOND = ('y',)

# Keras 3 operation classes -> operation.
_KERAS3_CLASSES = {
    'Add': 'add', 'Subtract': 'subtract', 'Multiply': 'multiply', 'Divide': 'divide',
    'TrueDivide': 'divide', 'Maximum': 'maximum', 'Minimum': 'minimum',
    'NotEqual': 'not_equal', 'Equal': 'equal', 'Negative': 'negative', 'Sqrt': 'sqrt',
    'Square': 'square', 'Absolute': 'abs', 'Abs': 'abs', 'Exp': 'exp', 'Log': 'log',
    'Sigmoid': 'sigmoid', 'Tanh': 'tanh', 'Relu': 'relu', 'Relu6': 'relu6',
    'Mean': 'mean', 'Sum': 'sum', 'Max': 'max', 'Min': 'min', 'Any': 'any', 'All': 'all',
}


class TensorOp(keras.engine.Layer):
    """An element-wise or reducing tensor operation with constant operands.

    ``op``: a key of ``OPS``; ``operands``: for each operand either
    ``{"input": i}`` (the layer's i-th input tensor) or ``{"constant": v}``;
    ``axis`` / ``keepdims`` for reductions. Not trainable; passes no mask.
    """

    def __init__(self, op, operands, axis=None, keepdims=False, **kwargs):
        if op not in OPS:
            raise ValueError('TensorOp: unknown operation %r (known: %s)'
                             % (op, ', '.join(sorted(OPS))))
        kind = OPS[op][0]
        arity = {'binary': 2, 'unary': 1, 'reduce': 1}[kind]
        if len(operands) != arity:
            raise ValueError('TensorOp %r takes %d operand(s), got %d'
                             % (op, arity, len(operands)))
        for operand in operands:
            if not (isinstance(operand, dict) and len(operand) == 1
                    and ('input' in operand or 'constant' in operand)):
                raise ValueError('TensorOp: an operand is {"input": i} or '
                                 '{"constant": value}, got %r' % (operand,))
        if not any('input' in operand for operand in operands):
            raise ValueError('TensorOp %r has no tensor operand' % op)
        kwargs.setdefault('trainable', False)
        super(TensorOp, self).__init__(**kwargs)
        self.op = op
        self.operands = [dict(o) for o in operands]
        self.axis = axis
        self.keepdims = bool(keepdims)

    def _values(self, inputs):
        tensors = inputs if isinstance(inputs, list) else [inputs]
        values = []
        for operand in self.operands:
            if 'input' in operand:
                values.append(tensors[operand['input']])
            else:
                constant = operand['constant']
                values.append(constant if isinstance(constant, numbers.Number)
                              else np.asarray(constant, dtype=K.floatx()))
        return values

    def call(self, inputs):
        kind, fn = OPS[self.op]
        values = self._values(inputs)
        if kind == 'reduce':
            return fn(values[0], axis=self.axis, keepdims=self.keepdims)
        return fn(*values)

    def compute_output_shape(self, input_shape):
        shapes = input_shape if isinstance(input_shape, list) else [input_shape]
        operand_shapes = [tuple(shapes[o['input']]) if 'input' in o
                          else np.shape(o['constant']) for o in self.operands]
        if OPS[self.op][0] == 'reduce':
            return _reduced_shape(operand_shapes[0], self.axis, self.keepdims)
        return _broadcast_shape(operand_shapes)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = {'op': self.op, 'operands': self.operands, 'axis': self.axis,
                  'keepdims': self.keepdims}
        base = super(TensorOp, self).get_config()
        return dict(list(base.items()) + list(config.items()))


class ZeroMaskedSteps(keras.engine.Layer):
    """Zeros at the masked time steps of a sequence ``(batch, time, ...)``,
    the mask passed on.

    tf.keras and Keras 3 RNNs with ``zero_output_for_mask=True`` (forced on
    both directions of a Bidirectional that returns sequences) write zeros
    at masked steps; Keras 2.3.1's repeat the last output. The loader puts
    this layer after such an RNN when its input is masked.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault('trainable', False)
        super(ZeroMaskedSteps, self).__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return inputs
        keep = K.cast(mask, K.dtype(inputs))
        for _ in range(K.ndim(inputs) - K.ndim(keep)):
            keep = K.expand_dims(keep, -1)
        return inputs * keep

    def compute_mask(self, inputs, mask=None):
        return mask


def _broadcast_shape(shapes):
    rank = max(len(s) for s in shapes)
    result = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = [d for d in dims if d is not None and d != 1]
        if known:
            result.append(known[0])
        elif any(d is None for d in dims):
            result.append(None)
        else:
            result.append(1)
    return tuple(result)


def _reduced_shape(shape, axis, keepdims):
    rank = len(shape)
    if axis is None:
        axes = set(range(rank))
    else:
        axes = {a % rank for a in (axis if isinstance(axis, (list, tuple)) else [axis])}
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# -- from the files' records ------------------------------------------------

def _operand(value, tensors):
    """A node argument as an operand; TensorRefs are appended to tensors."""
    if isinstance(value, TensorRef):
        tensors.append(value)
        return {'input': len(tensors) - 1}
    if isinstance(value, bool):
        raise Unsupported('a boolean operand is not supported')
    if isinstance(value, numbers.Number):
        return {'constant': value}
    array = np.asarray(value)
    if array.dtype.kind in 'fiu' and array.size:
        return {'constant': array.tolist()}
    raise Unsupported('operand %.80r is neither a tensor nor a number' % (value,))


def _axis(value):
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(a, int) for a in value):
        return list(value)
    raise Unsupported('axis %r is not an int or a list of ints' % (value,))


def op_from_tf_keras(config, node):
    """(TensorOp config, input TensorRefs) of a tf.keras TFOpLambda call."""
    function = config.get('function')
    op = _TF_FUNCTIONS.get(function)
    if op is None:
        raise Unsupported('tf.%s is not one of the TensorFlow operations cyback maps (%s)'
                          % (function, ', '.join(sorted(k for k, v in _TF_FUNCTIONS.items()
                                                        if v))))
    kwargs = dict(node.kwargs)
    kwargs.pop('name', None)
    args = list(node.args)
    kind = OPS[op][0]
    tensors = []
    if kind == 'binary':
        second = kwargs.pop('y', args[1] if len(args) > 1 else None)
        operands = [_operand(args[0], tensors), _operand(second, tensors)]
        reduce_args = {}
    else:
        operands = [_operand(args[0], tensors)]
        reduce_args = {}
        if kind == 'reduce':
            reduce_args = {'axis': _axis(kwargs.pop('axis', None)),
                           'keepdims': bool(kwargs.pop('keepdims', False))}
    if kwargs:
        raise Unsupported('tf.%s with arguments %s' % (function, sorted(kwargs)))
    return dict(op=op, operands=operands, **reduce_args), tensors


def op_from_keras3(class_name, config, node):
    """(TensorOp config, input TensorRefs) of a Keras 3 operation node."""
    op = _KERAS3_CLASSES.get(class_name)
    if op is None:
        raise Unsupported('the Keras 3 operation %s is not one cyback maps (%s)'
                          % (class_name, ', '.join(sorted(_KERAS3_CLASSES))))
    args = list(node.args)
    kwargs = dict(node.kwargs)
    kind = OPS[op][0]
    tensors = []
    reduce_args = {}
    if kind == 'binary':
        if len(args) < 2:
            args += [kwargs.pop(k) for k in ('x2',) if k in kwargs]
        operands = [_operand(args[0], tensors), _operand(args[1], tensors)]
    else:
        operands = [_operand(args[0], tensors)]
        if kind == 'reduce':
            reduce_args = {'axis': _axis(config.get('axis', kwargs.pop('axis', None))),
                           'keepdims': bool(config.get('keepdims',
                                                       kwargs.pop('keepdims', False)))}
    if kwargs:
        raise Unsupported('%s with arguments %s' % (class_name, sorted(kwargs)))
    return dict(op=op, operands=operands, **reduce_args), tensors
