"""Attention (Luong dot-product) and AdditiveAttention (Bahdanau), tf.keras 2.x /
Keras 3 semantics, as Keras 2.3.1 layers."""
from cyback.layers import _args
from cyback.layers._keras import import_keras

keras = import_keras()
K = keras.backend
Layer = keras.engine.base_layer.Layer

__all__ = ['Attention', 'AdditiveAttention']


class _DenseAttention(Layer):
    """Called on ``[query, value]`` or ``[query, value, key]`` (key defaults to value):
    query (batch, Tq, dim), value (batch, Tv, dim_v), key (batch, Tv, dim). Keyword
    arguments: ``return_attention_scores``, ``training``, ``use_causal_mask``.

    Scores (batch, Tq, Tv) have -1e9 added where the value's Keras mask or the causal
    mask hides a step, then a softmax over Tv, dropout in training only, and the
    result ``scores @ value`` is zeroed at masked query steps; it carries the query's
    mask.
    """

    def __init__(self, dropout=0.0, causal=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.dropout = _args.check_number(cls, 'dropout', dropout, minimum=0.0)
        if self.dropout >= 1.0:
            raise ValueError('%s: dropout must be in [0, 1), got %s' % (cls, dropout))
        # tf.keras's deprecated constructor argument; use_causal_mask= in the call is
        # the same.
        self.causal = _args.check_bool(cls, 'causal', causal)
        self.seed = seed
        self.supports_masking = True
        self._returns_scores = False

    def _split(self, inputs):
        if not isinstance(inputs, (list, tuple)) or not 2 <= len(inputs) <= 3:
            raise ValueError('%s: call it on a list [query, value] or [query, value, key], '
                             'got %r' % (type(self).__name__, inputs))
        query, value = inputs[0], inputs[1]
        key = inputs[2] if len(inputs) == 3 else value
        return query, value, key

    def _check_shapes(self, input_shape):
        cls = type(self).__name__
        shapes = [tuple(s) for s in input_shape] if isinstance(input_shape, list) else None
        if shapes is None or not 2 <= len(shapes) <= 3:
            raise ValueError('%s: expected the shapes of [query, value(, key)], got %r'
                             % (cls, input_shape))
        for s in shapes:
            if len(s) != 3:
                raise ValueError('%s: query, value and key must have rank 3 (batch, steps, '
                                 'features), got shapes %s' % (cls, shapes))
        return shapes

    def call(self, inputs, mask=None, training=None, return_attention_scores=False,
             use_causal_mask=False):
        cls = type(self).__name__
        query, value, key = self._split(inputs)
        _args.check_bool(cls, 'return_attention_scores', return_attention_scores)
        _args.check_bool(cls, 'use_causal_mask', use_causal_mask)
        masks = list(mask) if isinstance(mask, (list, tuple)) else [mask]
        q_mask = masks[0]
        v_mask = masks[1] if len(masks) > 1 else None
        scores = self._scores(query, key)
        hidden = None
        if v_mask is not None:
            hidden = 1.0 - K.expand_dims(K.cast(v_mask, K.dtype(scores)), -2)
        if self.causal or use_causal_mask:
            rows = K.cumsum(K.ones_like(query[:1, :, :1]), axis=1)             # (1, Tq, 1)
            cols = K.cumsum(K.ones_like(K.permute_dimensions(key[:1, :, :1], (0, 2, 1))),
                            axis=2)                                             # (1, 1, Tv)
            future = K.cast(K.less(rows, cols), K.dtype(scores))
            hidden = future if hidden is None else K.maximum(hidden, future)
        if hidden is not None:
            scores = scores - 1e9 * hidden
        weights = K.softmax(scores, axis=-1)
        used = weights
        if self.dropout > 0.0:
            rate = self.dropout
            used = K.in_train_phase(lambda: K.dropout(weights, rate), weights,
                                    training=training)
        result = K.batch_dot(used, value, axes=(2, 1))
        if q_mask is not None:
            result = result * K.expand_dims(K.cast(q_mask, K.dtype(result)), -1)
        self._returns_scores = return_attention_scores
        if return_attention_scores:
            return [result, weights]
        return result

    def compute_output_shape(self, input_shape):
        shapes = self._check_shapes(input_shape)
        q, v = shapes[0], shapes[1]
        out = q[:-1] + v[-1:]
        if self._returns_scores:
            return [out, (q[0], q[1], v[1])]
        return out

    def compute_mask(self, inputs, mask=None):
        q_mask = mask[0] if isinstance(mask, (list, tuple)) else None
        if self._returns_scores:
            return [q_mask, None]
        return q_mask

    def get_config(self):
        config = {'dropout': self.dropout, 'causal': self.causal, 'seed': self.seed}
        base = super().get_config()
        return dict(list(base.items()) + list(config.items()))


class Attention(_DenseAttention):
    """Dot-product attention, as tf.keras 2.x's / Keras 3's ``Attention``.

    ``score_mode='dot'``: scores ``query @ key^T`` (times ``scale`` if ``use_scale``);
    ``'concat'``: ``concat_score_weight * sum(tanh(scale * (query + key)), -1)``.
    Weights, in creation order (as tf.keras 2.x): ``scale`` (shape (), if
    ``use_scale``), ``concat_score_weight`` (shape (), if score_mode='concat'); both
    start at 1. See _DenseAttention for the call.
    """

    def __init__(self, use_scale=False, score_mode='dot', **kwargs):
        super().__init__(**kwargs)
        cls = type(self).__name__
        self.use_scale = _args.check_bool(cls, 'use_scale', use_scale)
        self.score_mode = _args.check_choice(cls, 'score_mode', score_mode, ('dot', 'concat'))

    def build(self, input_shape):
        self._check_shapes(input_shape)
        self.scale = self.add_weight(name='scale', shape=(), initializer='ones') \
            if self.use_scale else None
        self.concat_score_weight = self.add_weight(
            name='concat_score_weight', shape=(), initializer='ones',
        ) if self.score_mode == 'concat' else None
        self.built = True

    def _scores(self, query, key):
        if self.score_mode == 'dot':
            scores = K.batch_dot(query, key, axes=(2, 2))
            return scores * self.scale if self.scale is not None else scores
        summed = K.expand_dims(query, 2) + K.expand_dims(key, 1)
        if self.scale is not None:
            summed = summed * self.scale
        return self.concat_score_weight * K.sum(K.tanh(summed), axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update({'use_scale': self.use_scale, 'score_mode': self.score_mode})
        return config


class AdditiveAttention(_DenseAttention):
    """Additive (Bahdanau) attention, as tf.keras 2.x's / Keras 3's:
    scores ``sum(scale * tanh(query + key), -1)``.

    Weights (as tf.keras 2.x): ``scale`` (dim,), glorot-uniform initialised, if
    ``use_scale`` (the default). See _DenseAttention for the call.
    """

    def __init__(self, use_scale=True, **kwargs):
        super().__init__(**kwargs)
        self.use_scale = _args.check_bool(type(self).__name__, 'use_scale', use_scale)

    def build(self, input_shape):
        shapes = self._check_shapes(input_shape)
        dim = shapes[1][-1]
        if self.use_scale and dim is None:
            raise ValueError('%s: the last axis of the value (shape %s) must be known'
                             % (type(self).__name__, shapes[1]))
        self.scale = self.add_weight(name='scale', shape=(dim,),
                                     initializer='glorot_uniform') if self.use_scale else None
        self.built = True

    def _scores(self, query, key):
        t = K.tanh(K.expand_dims(query, 2) + K.expand_dims(key, 1))
        if self.scale is not None:
            t = t * self.scale
        return K.sum(t, axis=-1)

    def get_config(self):
        config = super().get_config()
        config['use_scale'] = self.use_scale
        return config
