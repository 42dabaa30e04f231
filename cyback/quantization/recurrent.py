"""The int8 recurrent layers ``cyback.quantize`` puts in place of Keras's
LSTM, GRU and SimpleRNN.

The input projection of every time step, ``x_t @ W + b``, does not depend on
the state, so it runs before the loop as one int8 product over all
batch x time rows (``cyback.ops.quantized.QuantizedDense`` on the
(batch, time, features) input: one uint8 x int8 GEMM, int32 sums, per-column
weight scales and the float32 input bias in its epilogue). The loop then
runs a cell that takes the projected step ``zx_t`` in place of ``x_t`` and
computes the rest in float32: the recurrent product ``h @ U`` (plus the
GRU's recurrent bias with ``reset_after``), the gates and the state update.
The cells' graphs have the shape of Keras's own cells after their
projection is hoisted, so cyback's loop compiler runs them on its fused
recurrent kernels as it does the float layers.

Everything else is Keras's ``RNN`` layer: ``return_sequences``,
``return_state``, ``go_backwards``, masking, ``stateful`` (states kept in
variables between calls), ``unroll`` and initial states passed as inputs.
Dropout and recurrent dropout do nothing at inference and are not kept.

Weights, in this order (all non-trainable):

- ``kernel``: int8 (input_dim, gates * units), gates 4 (LSTM: i, f, c, o),
  3 (GRU: z, r, h) or 1 (SimpleRNN), Keras's column order;
- ``kernel_scale``: float32 (gates * units,), per column;
- ``recurrent_kernel``: float32 (units, gates * units), the float layer's;
- ``bias``: float32 (gates * units,), or (2, 3 * units) for a GRU with
  ``reset_after`` (input bias, recurrent bias), when ``use_bias``.
"""
from cyback.layers import import_keras
from cyback.ops import quantized as qops
from cyback.quantization.arguments import check_quantization, positive_int

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer
InputSpec = keras.engine.base_layer.InputSpec

__all__ = ['QuantizedLSTM', 'QuantizedGRU', 'QuantizedSimpleRNN', 'RECURRENT_LAYERS']


class _ProjectedCell(Layer):
    """A recurrent cell whose step input is already projected (``zx_t``,
    gates * units wide) and that holds the layer's weights."""

    gates = None

    def __init__(self, units, activation='tanh', recurrent_activation='sigmoid',
                 use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.activation = keras.activations.get(activation)
        self.recurrent_activation = keras.activations.get(recurrent_activation)
        self.use_bias = bool(use_bias)

    @property
    def state_size(self):
        return self.units

    def _bias_shape(self):
        return (self.gates * self.units,)

    def build(self, input_shape):
        input_dim = input_shape[-1]
        width = self.gates * self.units
        self.kernel = self.add_weight(name='kernel', shape=(input_dim, width), dtype='int8',
                                      initializer='zeros', trainable=False)
        self.kernel_scale = self.add_weight(name='kernel_scale', shape=(width,),
                                            dtype='float32', initializer='ones',
                                            trainable=False)
        self.recurrent_kernel = self.add_weight(name='recurrent_kernel',
                                                shape=(self.units, width), dtype='float32',
                                                initializer='zeros', trainable=False)
        self.bias = self.add_weight(name='bias', shape=self._bias_shape(), dtype='float32',
                                    initializer='zeros', trainable=False) \
            if self.use_bias else None
        self.built = True

    def input_bias(self):
        """The bias the projection's epilogue adds, or None."""
        return self.bias

    def get_config(self):
        config = super().get_config()
        config.update({
            'units': self.units,
            'activation': keras.activations.serialize(self.activation),
            'recurrent_activation': keras.activations.serialize(self.recurrent_activation),
            'use_bias': self.use_bias,
        })
        return config


class _ProjectedLSTMCell(_ProjectedCell):
    gates = 4

    @property
    def state_size(self):
        return (self.units, self.units)

    def call(self, inputs, states, training=None):
        h, c = states[0], states[1]
        u = self.units
        z = inputs + K.dot(h, self.recurrent_kernel)
        i = self.recurrent_activation(z[:, :u])
        f = self.recurrent_activation(z[:, u:2 * u])
        g = self.activation(z[:, 2 * u:3 * u])
        o = self.recurrent_activation(z[:, 3 * u:])
        c_new = f * c + i * g
        h_new = o * self.activation(c_new)
        return h_new, [h_new, c_new]


class _ProjectedGRUCell(_ProjectedCell):
    gates = 3

    def __init__(self, units, activation='tanh', recurrent_activation='sigmoid',
                 use_bias=True, reset_after=False, **kwargs):
        super().__init__(units, activation, recurrent_activation, use_bias, **kwargs)
        self.reset_after = bool(reset_after)

    def _bias_shape(self):
        return (2, 3 * self.units) if self.reset_after else (3 * self.units,)

    def input_bias(self):
        if self.bias is not None and self.reset_after:
            return self.bias[0]
        return self.bias

    def call(self, inputs, states, training=None):
        h = states[0]
        u = self.units
        x_z, x_r, x_h = inputs[:, :u], inputs[:, u:2 * u], inputs[:, 2 * u:]
        if self.reset_after:
            # the candidate's recurrent term (with its own bias) is gated by r
            rec = K.dot(h, self.recurrent_kernel)
            if self.bias is not None:
                rec = rec + self.bias[1]
            z = self.recurrent_activation(x_z + rec[:, :u])
            r = self.recurrent_activation(x_r + rec[:, u:2 * u])
            hh = self.activation(x_h + r * rec[:, 2 * u:])
        else:
            # the candidate's recurrent product reads the reset state r * h
            rec = K.dot(h, self.recurrent_kernel[:, :2 * u])
            z = self.recurrent_activation(x_z + rec[:, :u])
            r = self.recurrent_activation(x_r + rec[:, u:])
            hh = self.activation(x_h + K.dot(r * h, self.recurrent_kernel[:, 2 * u:]))
        h_new = z * h + (1 - z) * hh
        return h_new, [h_new]

    def get_config(self):
        config = super().get_config()
        config['reset_after'] = self.reset_after
        return config


class _ProjectedSimpleRNNCell(_ProjectedCell):
    gates = 1

    def call(self, inputs, states, training=None):
        h_new = self.activation(inputs + K.dot(states[0], self.recurrent_kernel))
        return h_new, [h_new]


class _QuantizedRecurrent(keras.layers.RNN):
    """Keras's RNN layer around a projected cell, the projection in int8."""

    cell_class = None

    def __init__(self, units, activation='tanh', recurrent_activation='sigmoid', use_bias=True,
                 input_scale=1.0, input_zero_point=0, return_sequences=False,
                 return_state=False, go_backwards=False, stateful=False, unroll=False,
                 **kwargs):
        cls = type(self).__name__
        check_quantization(cls, input_scale, input_zero_point)
        units = positive_int(cls, 'units', units)
        cell_args = self._cell_args(kwargs)
        cell = self.cell_class(units, activation, recurrent_activation, use_bias,
                               dtype=kwargs.get('dtype'), **cell_args)
        super().__init__(cell, return_sequences=return_sequences, return_state=return_state,
                         go_backwards=go_backwards, stateful=stateful, unroll=unroll, **kwargs)
        self.input_scale = float(input_scale)
        self.input_zero_point = int(input_zero_point)
        self.input_spec = [InputSpec(ndim=3)]

    def _cell_args(self, kwargs):
        return {}

    @property
    def units(self):
        return self.cell.units

    def _projection(self, x):
        cell = self.cell
        width = cell.gates * cell.units
        packed = qops.PackInt8()(cell.kernel)
        bias = cell.input_bias()
        vectors = qops.EpilogueVectors(self.input_scale)(
            *((cell.kernel_scale,) if bias is None else (cell.kernel_scale, bias)))
        op = qops.QuantizedDense(width, self.input_scale, self.input_zero_point, 'linear')
        return op(x, packed, vectors)

    def call(self, inputs, mask=None, training=None, initial_state=None):
        if isinstance(inputs, list):
            inputs = [self._projection(inputs[0])] + list(inputs[1:])
        else:
            inputs = self._projection(inputs)
        return super().call(inputs, mask=mask, training=training, initial_state=initial_state)

    def get_config(self):
        config = super().get_config()
        del config['cell']
        cell = self.cell.get_config()
        for key in ('name', 'trainable', 'dtype'):
            cell.pop(key, None)
        config.update(cell)
        config['input_scale'] = self.input_scale
        config['input_zero_point'] = self.input_zero_point
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


class QuantizedLSTM(_QuantizedRecurrent):
    """``LSTM(units)`` with its input projection in int8. Weights: ``kernel``
    int8 (input_dim, 4 units), ``kernel_scale`` float32 (4 units,),
    ``recurrent_kernel`` float32 (units, 4 units), ``bias`` float32
    (4 units,)."""

    cell_class = _ProjectedLSTMCell


class QuantizedGRU(_QuantizedRecurrent):
    """``GRU(units)`` with its input projection in int8 (``reset_after``
    either way). Weights: ``kernel`` int8 (input_dim, 3 units),
    ``kernel_scale`` float32 (3 units,), ``recurrent_kernel`` float32
    (units, 3 units), ``bias`` float32 (3 units,) or (2, 3 units) with
    ``reset_after``."""

    cell_class = _ProjectedGRUCell

    def _cell_args(self, kwargs):
        return {'reset_after': kwargs.pop('reset_after', False)}


class QuantizedSimpleRNN(_QuantizedRecurrent):
    """``SimpleRNN(units)`` with its input projection in int8. Weights:
    ``kernel`` int8 (input_dim, units), ``kernel_scale`` float32 (units,),
    ``recurrent_kernel`` float32 (units, units), ``bias`` float32 (units,)."""

    cell_class = _ProjectedSimpleRNNCell


RECURRENT_LAYERS = {cls.__name__: cls for cls in (QuantizedLSTM, QuantizedGRU,
                                                   QuantizedSimpleRNN)}
