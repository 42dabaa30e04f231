"""EinsumDense: a dense layer whose product with the kernel is an einsum equation
(tf.keras 2.x / Keras 3 semantics), as a Keras 2.3.1 layer."""
from cyback.layers import _args
from cyback.layers._einsum import einsum, parse_equation
from cyback.layers._keras import import_keras

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer
activations = keras.activations

__all__ = ['EinsumDense', 'analyze_equation']


def _ellipsis_position(equation):
    """'left' for "...X,Y->...Z", 'right' for "X...,Y->Z...", None without "..."."""
    lhs = equation.replace(' ', '').split('->')[0].split(',')[0]
    if '...' not in lhs:
        return None
    return 'left' if lhs.startswith('...') else 'right'


def analyze_equation(cls, equation, bias_axes, input_shape, partial_output_shape):
    """(kernel shape, bias shape or None, full output shape) of an EinsumDense layer.

    ``partial_output_shape`` gives the output's sizes except the batch axis and the
    axes that "..." stands for (None: the size of the same letter in the input).
    """
    input_shape = tuple(input_shape)
    kernel_term = equation.replace(' ', '').split('->')[0].split(',')[1]
    try:
        sa, sb, so = parse_equation(equation, len(input_shape), len(kernel_term))
    except ValueError as e:
        raise ValueError('%s: %s' % (cls, e)) from None
    position = _ellipsis_position(equation)
    out_terms = equation.replace(' ', '').split('->')[1]
    explicit = out_terms.replace('...', '')
    elided = [c for c in so if c not in explicit]
    if position == 'left':
        named = list(explicit)
    else:
        if not explicit:
            raise ValueError('%s: equation %r has no output letter for the batch axis'
                             % (cls, equation))
        named = list(explicit[1:])
    partial = list(partial_output_shape)
    if len(partial) != len(named):
        raise ValueError('%s: output_shape %r must give %d sizes (the output axes %s of %r, '
                         'after the batch axis), got %d'
                         % (cls, tuple(partial_output_shape), len(named), ''.join(named),
                            equation, len(partial)))
    sizes = {}
    for c, d in zip(sa, input_shape):
        sizes[c] = d
    full = []
    for c in so:
        if c in named:
            d = partial[named.index(c)]
            if d is not None:
                d = _args.check_int(cls, 'output_shape', d, minimum=1)
            if c in sizes and d is not None and sizes[c] is not None and sizes[c] != d:
                raise ValueError('%s: the input and output_shape differ at the shared axis %r: '
                                 '%d and %d' % (cls, c, sizes[c], d))
            if d is None:
                d = sizes.get(c)
                if d is None and c not in sa:
                    raise ValueError('%s: output_shape must give the size of the output axis %r '
                                     '(it is not an input axis)' % (cls, c))
            elif c not in sizes:
                sizes[c] = d
        else:
            d = sizes.get(c)
        full.append(d)
    kernel_shape = []
    for c in sb:
        if c not in sizes or sizes[c] is None:
            if c not in sa and c not in so:
                raise ValueError('%s: kernel axis %r of %r is in neither the input nor the '
                                 'output' % (cls, c, equation))
            raise ValueError('%s: the size of kernel axis %r of %r must be known (input shape '
                             '%s, output_shape %r)' % (cls, c, equation, input_shape,
                                                       tuple(partial_output_shape)))
        kernel_shape.append(sizes[c])
    bias_shape = None
    if bias_axes:
        if not isinstance(bias_axes, str):
            raise TypeError('%s: bias_axes must be a string of output letters, got %r'
                            % (cls, bias_axes))
        for c in bias_axes:
            if c not in explicit:
                raise ValueError('%s: bias axis %r is not in the output %r of %r'
                                 % (cls, c, explicit, equation))
        first = min(explicit.index(c) for c in bias_axes)
        bias_shape = []
        for c in explicit[first:]:
            if c in bias_axes:
                d = full[so.index(c)]
                if d is None:
                    raise ValueError('%s: the size of bias axis %r must be known' % (cls, c))
                bias_shape.append(d)
            else:
                bias_shape.append(1)
        if position == 'right':
            bias_shape += [1] * len(elided)
    return tuple(kernel_shape), None if bias_shape is None else tuple(bias_shape), tuple(full)



class EinsumDense(Layer):
    """``activation(einsum(equation, inputs, kernel) + bias)``.

    ``equation``: "IN,KERNEL->OUT" in letters, "..." allowed at the start or the end of
    IN and OUT (as tf.keras); ``output_shape``: the sizes of OUT's axes other than the
    batch axis and those "..." stands for (an int for one axis; None entries take the
    input's size); ``bias_axes``: the output letters the bias varies along.

    Weights, in creation order (as tf.keras 2.x): ``kernel``, of the shape the equation
    gives it (each kernel letter sized by the input or the output), and ``bias`` (when
    ``bias_axes``), of shape: from the first bias letter of OUT to its end, the size of
    each bias letter and 1 for the others (then 1 per right-hand "..." axis).

    Keras 3's ``lora_rank``/``lora_alpha`` are accepted and kept in the config: Keras 3
    saves the kernel with the low-rank update merged in, which is what is loaded here.
    Quantized kernels (``quantization_config``) are refused.
    """

    def __init__(self, equation, output_shape, activation=None, bias_axes=None,
                 kernel_initializer='glorot_uniform', bias_initializer='zeros',
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, lora_rank=None, lora_alpha=None,
                 quantization_config=None, gptq_unpacked_column_size=None, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        if not isinstance(equation, str):
            raise TypeError('%s: equation must be a string, got %r' % (cls, equation))
        try:
            parse_equation(equation, *self._operand_ranks(equation))
        except ValueError as e:
            raise ValueError('%s: %s' % (cls, e)) from None
        self.equation = equation
        if isinstance(output_shape, (list, tuple)):
            self.partial_output_shape = tuple(
                None if d is None else _args.check_int(cls, 'output_shape', d, minimum=1)
                for d in output_shape)
        else:
            self.partial_output_shape = (_args.check_int(cls, 'output_shape', output_shape,
                                                         minimum=1),)
        if bias_axes is not None and not isinstance(bias_axes, str):
            raise TypeError('%s: bias_axes must be a string of output letters or None, got %r'
                            % (cls, bias_axes))
        self.bias_axes = bias_axes or None
        if quantization_config is not None or gptq_unpacked_column_size is not None:
            raise ValueError('%s: quantized kernels (quantization_config) are not supported'
                             % cls)
        self.lora_rank = _args.check_int(cls, 'lora_rank', lora_rank, minimum=1,
                                         allow_none=True)
        self.lora_alpha = _args.check_number(cls, 'lora_alpha', lora_alpha, allow_none=True)
        self.activation = activations.get(activation)
        _args.set_weight_args(
            self, kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer, kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint)

    @staticmethod
    def _operand_ranks(equation):
        # The input rank "..." stands for is not known before build: count it as none.
        try:
            a, b = equation.replace(' ', '').split('->')[0].split(',')
        except ValueError:
            return 0, 0
        return len(a.replace('...', '')), len(b)

    def build(self, input_shape):
        cls = type(self).__name__
        kernel_shape, bias_shape, full = analyze_equation(
            cls, self.equation, self.bias_axes, input_shape, self.partial_output_shape)
        self.full_output_shape = full
        self.kernel = self.add_weight(
            name='kernel', shape=kernel_shape, initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer, constraint=self.kernel_constraint)
        self.bias = self.add_weight(
            name='bias', shape=bias_shape, initializer=self.bias_initializer,
            regularizer=self.bias_regularizer, constraint=self.bias_constraint,
        ) if bias_shape is not None else None
        self.built = True

    def call(self, inputs):
        out = einsum(K, self.equation, inputs, self.kernel)
        if self.bias is not None:
            out = out + self.bias
        if self.activation is not None:
            out = self.activation(out)
        return out

    def compute_output_shape(self, input_shape):
        _, _, full = analyze_equation(type(self).__name__, self.equation, self.bias_axes,
                                      input_shape, self.partial_output_shape)
        return full

    def get_config(self):
        config = {
            'equation': self.equation,
            'output_shape': list(self.partial_output_shape),
            'bias_axes': self.bias_axes,
            'activation': activations.serialize(self.activation),
            **_args.weight_args_config(self, *_args.KERNEL_BIAS_ARGS),
        }
        if self.lora_rank is not None:
            config['lora_rank'] = self.lora_rank
            config['lora_alpha'] = self.lora_alpha
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))
