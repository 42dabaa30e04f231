"""MultiHeadAttention (tf.keras 2.x / Keras 3 semantics) as a Keras 2.3.1 layer."""
import math
import string

from cyback.layers import _args
from cyback.layers._einsum import einsum
from cyback.layers._keras import import_keras
from cyback.layers.einsum_dense import EinsumDense
from cyback.ops.attention import Attention

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer

__all__ = ['MultiHeadAttention', 'masked_softmax']

_LETTERS = string.ascii_lowercase

# What tf.keras adds to the scores of masked positions before the softmax.
_MASKED_SCORE = -1e9


def _projection_equation(free, bound, out):
    """Einsum equation and bias letters of a projection: ``free`` axes kept, ``bound``
    contracted with the kernel, ``out`` new kernel axes."""
    letters = iter(_LETTERS)
    f = ''.join(next(letters) for _ in range(free))
    b = ''.join(next(letters) for _ in range(bound))
    o = ''.join(next(letters) for _ in range(out))
    return '%s%s,%s%s->%s%s' % (f, b, b, o, f, o), o


def _attention_equations(rank, attention_axes):
    """The scores and combination equations for projected tensors of ``rank`` axes
    (batch, ..., heads, channels) attending over ``attention_axes``.

    Scores: ``(key, query) -> (batch axes, query attention axes, key attention axes)``,
    where the batch axes are every axis but the attention axes and the channels (so
    the heads axis is one); combination: ``(scores, value) -> query layout``."""
    target = _LETTERS[:rank]
    fresh = iter(_LETTERS[rank:])
    batch = [i for i in range(rank) if i not in attention_axes and i != rank - 1]
    source = ''.join(target[i] if i in batch or i == rank - 1 else next(fresh)
                     for i in range(rank))
    product = ''.join([target[i] for i in batch] + [target[i] for i in attention_axes] +
                      [source[i] for i in attention_axes])
    return ('%s,%s->%s' % (source, target, product),
            '%s,%s->%s' % (product, source, target), len(product))


def masked_softmax(scores, mask, axes):
    """Softmax of ``scores`` over ``axes`` (the last ones), with masked positions (``mask``
    False or 0, broadcast against the scores) pushed to -1e9 first, as tf.keras does: a
    row with every position masked comes out uniform."""
    if mask is not None:
        scores = scores + (1.0 - K.cast(mask, K.dtype(scores))) * _MASKED_SCORE
    if len(axes) == 1:
        return K.softmax(scores, axis=axes[0])
    return K.exp(scores - K.logsumexp(scores, axis=list(axes), keepdims=True))



class MultiHeadAttention(Layer):
    """Multi-head scaled dot-product attention, as tf.keras 2.x's and Keras 3's.

    Call it as tf.keras does, ``mha(query, value)``, ``mha(query, value, key)``,
    ``mha(query=q, value=v, key=k, attention_mask=m)``, or with a list, as Keras 2.3.1
    layers take several inputs: ``mha([query, value])``, ``mha([query, value, key])``,
    ``mha([query, value, key, attention_mask])``. Keyword arguments:
    ``attention_mask`` (boolean, (batch, query attention dims..., key attention dims...);
    a Keras tensor given here joins the input list, so that a saved model keeps it),
    ``return_attention_scores``, ``training``, ``use_causal_mask``.

    Keras masks of the inputs (from ``Embedding(mask_zero=True)`` and the like) combine
    with the attention mask as in tf.keras: the query's mask masks rows, the value's and
    the key's mask columns. The output carries the query's mask. Dropout applies to the
    attention probabilities in training only.

    Weights, in creation order and with their names as tf.keras 2.x writes them (d: the
    query's feature size; dv, dk: the value's and key's; N: num_heads; the query
    of rank r)::

        query/kernel (d, N, key_dim)            query/bias (N, key_dim)
        key/kernel (dk, N, key_dim)             key/bias (N, key_dim)
        [gate/kernel (d, N, value_dim)           gate/bias (N, value_dim)]  Keras 3 use_gate
        value/kernel (dv, N, value_dim)         value/bias (N, value_dim)
        attention_output/kernel (N, value_dim, *output_shape)
        attention_output/bias (*output_shape)

    (no biases when ``use_bias=False``; output_shape defaults to (d,)). Keras 3's
    ``use_gate`` and ``sliding_window`` are supported; ``flash_attention`` and ``seed``
    are accepted (the result does not depend on them).

    A query position whose every key is masked gets uniform attention probabilities (as
    tf.keras computes them); Keras 3 gives such rows zeros in some code paths.
    """

    def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True,
                 output_shape=None, attention_axes=None,
                 kernel_initializer='glorot_uniform', bias_initializer='zeros',
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, use_gate=False,
                 sliding_window=None, flash_attention=None, seed=None,
                 softmax_robust_masking=False, query_shape=None, key_shape=None,
                 value_shape=None, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.num_heads = _args.check_int(cls, 'num_heads', num_heads, minimum=1)
        self.key_dim = _args.check_int(cls, 'key_dim', key_dim, minimum=1)
        self.value_dim = _args.check_int(cls, 'value_dim', value_dim, minimum=1,
                                         allow_none=True) or self.key_dim
        self._value_dim_arg = value_dim
        self.dropout = _args.check_number(cls, 'dropout', dropout, minimum=0.0)
        if self.dropout >= 1.0:
            raise ValueError('%s: dropout must be in [0, 1), got %s' % (cls, dropout))
        self.use_bias = _args.check_bool(cls, 'use_bias', use_bias)
        if output_shape is None or output_shape == [] or output_shape == ():
            self.output_shape_arg = None
        elif isinstance(output_shape, (list, tuple)):
            self.output_shape_arg = tuple(_args.check_int(cls, 'output_shape', d, minimum=1)
                                          for d in output_shape)
        else:
            self.output_shape_arg = (_args.check_int(cls, 'output_shape', output_shape,
                                                     minimum=1),)
        if attention_axes is None:
            self.attention_axes = None
        elif isinstance(attention_axes, (list, tuple)):
            self.attention_axes = tuple(_args.check_int(cls, 'attention_axes', a)
                                        for a in attention_axes)
            if not self.attention_axes:
                raise ValueError('%s: attention_axes must not be empty' % cls)
        else:
            self.attention_axes = (_args.check_int(cls, 'attention_axes', attention_axes),)
        self.use_gate = _args.check_bool(cls, 'use_gate', use_gate)
        self.sliding_window = _args.check_int(cls, 'sliding_window', sliding_window,
                                              minimum=1, allow_none=True)
        self.flash_attention = flash_attention
        self.seed = seed
        # tf.keras's robust masking replaces masked scores instead of adding -1e9 to
        # them; in float32 both give the same probabilities.
        self.softmax_robust_masking = _args.check_bool(cls, 'softmax_robust_masking',
                                                       softmax_robust_masking)
        self.query_shape, self.key_shape, self.value_shape = query_shape, key_shape, value_shape
        _args.set_weight_args(
            self, kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer, kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint)
        self.supports_masking = True
        self._returns_scores = False

    # -- calling --------------------------------------------------------------

    def __call__(self, query, value=None, key=None, **kwargs):
        if value is None:
            if not isinstance(query, (list, tuple)) or not 2 <= len(query) <= 4:
                raise ValueError('%s: call it with a query and a value: layer(query, value), '
                                 'layer([query, value]), layer([query, value, key]) or '
                                 'layer([query, value, key, attention_mask]); got %r'
                                 % (type(self).__name__, query))
            inputs = list(query)
        else:
            inputs = [query, value] + ([key] if key is not None else [])
        mask = kwargs.get('attention_mask')
        if mask is not None and hasattr(mask, '_keras_history') and len(inputs) < 4:
            # A Keras tensor as attention_mask becomes an input of the node, which is what
            # Keras 2.3.1 saves; as a keyword it would be dropped from the saved config.
            if len(inputs) == 2:
                inputs.append(inputs[1])
            inputs.append(kwargs.pop('attention_mask'))
        return super().__call__(inputs, **kwargs)

    def _split(self, inputs):
        if not isinstance(inputs, (list, tuple)) or not 2 <= len(inputs) <= 4:
            raise ValueError('%s: expected [query, value], [query, value, key] or [query, '
                             'value, key, attention_mask], got %r' % (type(self).__name__,
                                                                      inputs))
        query, value = inputs[0], inputs[1]
        key = inputs[2] if len(inputs) > 2 else None
        mask = inputs[3] if len(inputs) > 3 else None
        return query, value, key, mask

    # -- building -------------------------------------------------------------

    def _common(self):
        return dict(kernel_initializer=self.kernel_initializer,
                    bias_initializer=self.bias_initializer,
                    kernel_regularizer=self.kernel_regularizer,
                    bias_regularizer=self.bias_regularizer,
                    activity_regularizer=self.activity_regularizer,
                    kernel_constraint=self.kernel_constraint,
                    bias_constraint=self.bias_constraint, dtype=self.dtype)

    def _projection(self, name, rank, heads_dim, activation=None):
        equation, bias = _projection_equation(rank - 1, 1, 2)
        return EinsumDense(equation, output_shape=[None] * (rank - 2) + [self.num_heads,
                                                                          heads_dim],
                           bias_axes=bias if self.use_bias else None, activation=activation,
                           name=name, **self._common())

    def _build_sublayer(self, layer, shape):
        with K.name_scope(layer.name):
            layer.build(shape)
        return layer

    def build(self, input_shape):
        cls = type(self).__name__
        if not isinstance(input_shape, list) or not 2 <= len(input_shape) <= 4:
            raise ValueError('%s: expected the shapes of [query, value(, key(, '
                             'attention_mask))], got %r' % (cls, input_shape))
        q_shape, v_shape = tuple(input_shape[0]), tuple(input_shape[1])
        k_shape = tuple(input_shape[2]) if len(input_shape) > 2 else v_shape
        rank = len(q_shape)
        if rank < 3:
            raise ValueError('%s: the query must have rank >= 3 (batch, positions..., '
                             'features), got shape %s' % (cls, q_shape))
        if len(v_shape) != rank or len(k_shape) != rank:
            raise ValueError('%s: query, value and key must have the same rank, got shapes '
                             '%s, %s and %s' % (cls, q_shape, v_shape, k_shape))
        for s, what in ((q_shape, 'query'), (v_shape, 'value'), (k_shape, 'key')):
            if s[-1] is None:
                raise ValueError('%s: the last axis of the %s (shape %s) must be known'
                                 % (cls, what, s))
        for a, b in zip(v_shape[1:-1], k_shape[1:-1]):
            if a is not None and b is not None and a != b:
                raise ValueError('%s: value and key must agree on every axis but the last, '
                                 'got shapes %s and %s' % (cls, v_shape, k_shape))
        projected = rank + 1
        if self.attention_axes is None:
            axes = tuple(range(1, projected - 2))
        else:
            axes = []
            for a in self.attention_axes:
                b = a + rank - 1 if a < 0 else a
                if not 1 <= b <= rank - 2:
                    raise ValueError('%s: attention_axes %r must name axes of the query other '
                                     'than the batch and the feature axis (1..%d for rank %d)'
                                     % (cls, self.attention_axes, rank - 2, rank))
                axes.append(b)
            if len(set(axes)) != len(axes):
                raise ValueError('%s: attention_axes %r repeat an axis' % (cls,
                                                                          self.attention_axes))
            axes = tuple(sorted(axes))
        self._axes = axes
        self._dot_equation, self._combine_equation, scores_rank = \
            _attention_equations(projected, axes)
        self._norm_axes = tuple(range(scores_rank - len(axes), scores_rank))
        self._rank = rank
        self.query_shape, self.value_shape, self.key_shape = \
            list(q_shape), list(v_shape), list(k_shape)
        self._query_dense = self._build_sublayer(
            self._projection('query', rank, self.key_dim), q_shape)
        self._key_dense = self._build_sublayer(
            self._projection('key', rank, self.key_dim), k_shape)
        if self.use_gate:
            self._gate_dense = self._build_sublayer(
                self._projection('gate', rank, self.value_dim, activation='sigmoid'), q_shape)
        self._value_dense = self._build_sublayer(
            self._projection('value', rank, self.value_dim), v_shape)
        out_shape = self.output_shape_arg or (q_shape[-1],)
        equation, bias = _projection_equation(rank - 1, 2, len(out_shape))
        self._output_dense = self._build_sublayer(EinsumDense(
            equation, output_shape=[None] * (rank - 2) + list(out_shape),
            bias_axes=bias if self.use_bias else None, name='attention_output',
            **self._common()), q_shape[:-1] + (self.num_heads, self.value_dim))
        self.built = True

    # -- masks ----------------------------------------------------------------

    def _positions_mask(self, query, value, band):
        """(1, T, S) boolean mask over the query's and the value's positions (axis 1):
        ``band(i, j)`` of the 1-based position indices."""
        def positions(x):
            # (1, length) ones, summed up along the positions: 1, 2, ..., length.
            first = K.sum(x[:1], axis=list(range(2, self._rank)))
            return K.cumsum(K.ones_like(first), axis=1)
        return band(K.expand_dims(positions(query), -1), K.expand_dims(positions(value), 1))

    def _attention_mask(self, query, value, masks, attention_mask, use_causal_mask):
        q_mask, v_mask, k_mask = masks
        auto = None

        def both(a, b):
            return b if a is None else a * b

        if q_mask is not None:
            auto = K.expand_dims(K.cast(q_mask, K.floatx()), -1)
        if v_mask is not None:
            auto = both(auto, K.expand_dims(K.cast(v_mask, K.floatx()), -2))
        if k_mask is not None:
            auto = both(auto, K.expand_dims(K.cast(k_mask, K.floatx()), -2))
        if (use_causal_mask or self.sliding_window is not None) and self._rank != 3:
            raise ValueError('%s: use_causal_mask and sliding_window need a query of rank 3 '
                             '(batch, positions, features), got rank %d'
                             % (type(self).__name__, self._rank))
        if use_causal_mask:
            auto = both(auto, K.cast(self._positions_mask(
                query, value, lambda i, j: K.greater_equal(i, j)), K.floatx()))
        if self.sliding_window is not None:
            window = float(self.sliding_window)
            auto = both(auto, K.cast(self._positions_mask(
                query, value, lambda i, j: K.less(K.abs(i - j), window)), K.floatx()))
        if attention_mask is not None:
            attention_mask = K.cast(attention_mask, K.floatx())
            auto = attention_mask if auto is None else attention_mask * auto
        return auto

    def _self_projections(self, x):
        """The scaled query, the key and the value of self-attention (one input for
        all three) from one product: the three kernels (the query's times the score
        scale) side by side along the head channels, and their biases likewise. In
        an inference plan the joined weights are computed once, and one wider
        product replaces three narrow ones with their three bias passes."""
        scale = 1.0 / math.sqrt(float(self.key_dim))
        layers = (self._query_dense, self._key_dense, self._value_dense)
        kernel = K.concatenate([layers[0].kernel * scale, layers[1].kernel, layers[2].kernel],
                               axis=-1)
        out = einsum(K, layers[0].equation, x, kernel)
        if self.use_bias:
            out = out + K.concatenate([layers[0].bias * scale, layers[1].bias, layers[2].bias],
                                      axis=-1)
        d = self.key_dim
        return out[..., :d], out[..., d:2 * d], out[..., 2 * d:]

    def _attend(self, q, k, v, attention_mask, training):
        """(output, probabilities) from the scaled query, the key and the value,
        as separate ops: the scores, the masked softmax, the dropout, the sum."""
        scores = einsum(K, self._dot_equation, k, q)
        probabilities = masked_softmax(scores, attention_mask, self._norm_axes)
        dropped = probabilities
        if self.dropout > 0.0:
            rate = self.dropout
            dropped = K.in_train_phase(lambda: K.dropout(probabilities, rate),
                                       probabilities, training=training)
        return einsum(K, self._combine_equation, dropped, v), probabilities

    def _fused(self, q, k, v, attention_mask):
        """The output of one attention axis (rank-4 (B, T, H, D) heads) as one op."""
        if attention_mask is None:
            return Attention()(q, k, v)
        bias = (1.0 - K.cast(attention_mask, K.dtype(q))) * _MASKED_SCORE
        return Attention(biased=True)(q, k, v, bias)

    def call(self, inputs, mask=None, attention_mask=None, return_attention_scores=False,
             training=None, use_causal_mask=False):
        cls = type(self).__name__
        query, value, key, list_mask = self._split(inputs)
        if list_mask is not None:
            if attention_mask is not None:
                raise ValueError('%s: attention_mask given twice (in the inputs and as a '
                                 'keyword)' % cls)
            attention_mask = list_mask
        _args.check_bool(cls, 'return_attention_scores', return_attention_scores)
        _args.check_bool(cls, 'use_causal_mask', use_causal_mask)
        if key is None:
            key = value
        masks = list(mask) if isinstance(mask, (list, tuple)) else [mask]
        masks = (masks + [None, None, None])[:3]
        if len(inputs) < 3:
            masks[2] = None
        attention_mask = self._attention_mask(query, value, masks, attention_mask,
                                              use_causal_mask)
        gate = self._gate_dense.call(query) if self.use_gate else None
        if query is value and key is value and self.key_dim == self.value_dim:
            q, k, v = self._self_projections(query)
        else:
            q = self._query_dense.call(query)
            k = self._key_dense.call(key)
            v = self._value_dense.call(value)
            q = q * (1.0 / math.sqrt(float(self.key_dim)))
        if attention_mask is not None:
            # (batch, T, S) -> (batch, 1, T, S): one axis per axis of the scores the mask
            # lacks, before the query's attention axes.
            at = -2 * len(self._axes) - 1
            while K.ndim(attention_mask) < self._norm_axes[-1] + 1:   # the scores' rank
                attention_mask = K.expand_dims(attention_mask, at)
        if return_attention_scores or self._rank != 3:
            out, probabilities = self._attend(q, k, v, attention_mask, training)
        else:
            # At inference one fused op (ops/attention.py); in training the separate
            # ops, which have the dropout and every order of derivative.
            out = K.in_train_phase(
                lambda: self._attend(q, k, v, attention_mask, training)[0],
                lambda: self._fused(q, k, v, attention_mask), training=training)
        if gate is not None:
            out = out * gate
        out = self._output_dense.call(out)
        self._returns_scores = return_attention_scores
        if return_attention_scores:
            return [out, probabilities]
        return out

    def compute_output_shape(self, input_shape):
        q_shape = tuple(input_shape[0])
        k_shape = tuple(input_shape[2]) if len(input_shape) > 2 else tuple(input_shape[1])
        out_shape = self.output_shape_arg or (q_shape[-1],)
        out = q_shape[:-1] + tuple(out_shape)
        if not self._returns_scores:
            return out
        axes = self._axes
        batch = [q_shape[i] for i in range(len(q_shape) - 1) if i not in axes]
        scores = tuple(batch + [self.num_heads] + [q_shape[i] for i in axes] +
                       [k_shape[i] for i in axes])
        return [out, scores]

    def compute_mask(self, inputs, mask=None):
        query_mask = mask[0] if isinstance(mask, (list, tuple)) else mask
        if self._returns_scores:
            return [query_mask, None]
        return query_mask

    def get_config(self):
        config = {
            'num_heads': self.num_heads,
            'key_dim': self.key_dim,
            'value_dim': self._value_dim_arg,
            'dropout': self.dropout,
            'use_bias': self.use_bias,
            'output_shape': None if self.output_shape_arg is None else list(
                self.output_shape_arg),
            'attention_axes': None if self.attention_axes is None else list(
                self.attention_axes),
            **_args.weight_args_config(self, *_args.KERNEL_BIAS_ARGS),
            'use_gate': self.use_gate,
            'sliding_window': self.sliding_window,
            'softmax_robust_masking': self.softmax_robust_masking,
            'query_shape': self.query_shape,
            'key_shape': self.key_shape,
            'value_shape': self.value_shape,
        }
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))
