"""Write tests/layers/data/reference.npz: small outputs of tf.keras 2.x (tf_keras)
and Keras 3 layers, for the tests to compare cyback.layers with.

Run by hand in an environment with TensorFlow, tf_keras and Keras 3 (not needed by
the tests):

    /work/tfenv/bin/python tests/layers/data/make_reference.py

Each case stores its inputs (``<case>/in<i>``), the layer's weights by tf.keras
weight name (``<case>/w/<name>``) and the outputs (``<case>/out<i>``).
"""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ['TF_USE_LEGACY_KERAS'] = '1'

import keras as keras3  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
rs = np.random.RandomState(1234)
out = {}


def record(case, layer, inputs, call, weights_scale=0.5):
    """Build ``layer`` by calling it, give it random weights, record everything."""
    call(layer, *inputs)
    values = []
    for w in layer.weights:
        values.append((rs.standard_normal(tuple(w.shape)) * weights_scale).astype('float32'))
    layer.set_weights(values)
    results = call(layer, *inputs)
    if not isinstance(results, (list, tuple)):
        results = [results]
    for i, x in enumerate(inputs):
        out['%s/in%d' % (case, i)] = np.asarray(x)
    for w, v in zip(layer.weights, values):
        name = w.path if hasattr(w, 'path') else w.name
        name = name.split(':')[0].split('/', 1)[1]
        out['%s/w/%s' % (case, name)] = v
    for i, r in enumerate(results):
        out['%s/out%d' % (case, i)] = np.asarray(r)


def f32(*shape):
    return rs.standard_normal(shape).astype('float32')


tk = tf_keras.layers

# MultiHeadAttention: self-attention with a query-padding mask and a causal mask.
q = f32(2, 4, 6)
pad = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
record('mha_causal', tk.MultiHeadAttention(num_heads=2, key_dim=3, name='mha'),
       [q, pad],
       lambda layer, x, m: layer(x, x, attention_mask=m[:, None, :] & np.ones((1, 4, 1), bool),
                                 use_causal_mask=True, return_attention_scores=True))
# Cross attention with a key, value_dim, output_shape and no bias.
record('mha_cross', tk.MultiHeadAttention(num_heads=3, key_dim=2, value_dim=4, use_bias=False,
                                          output_shape=(5,), name='mha'),
       [f32(2, 3, 6), f32(2, 5, 7), f32(2, 5, 4)],
       lambda layer, qq, vv, kk: layer(qq, vv, kk))
# Attention over two axes of an image-like query.
record('mha_axes', tk.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(1, 2),
                                         name='mha'),
       [f32(1, 3, 2, 4), f32(1, 3, 2, 5)],
       lambda layer, qq, vv: layer(qq, vv, return_attention_scores=True))
# Keras 3: gated attention with a sliding window.
record('mha_k3_gate', keras3.layers.MultiHeadAttention(num_heads=2, key_dim=2, use_gate=True,
                                                       sliding_window=2, name='mha'),
       [f32(2, 5, 4)],
       lambda layer, x: layer(x, x, return_attention_scores=True))

record('einsum_dense', tk.EinsumDense('abc,cde->abde', output_shape=(None, 3, 2),
                                      bias_axes='de', activation='gelu', name='ed'),
       [f32(2, 4, 5)], lambda layer, x: layer(x))
record('einsum_dense_left', tk.EinsumDense('...b,bc->...c', output_shape=3, bias_axes='c',
                                           name='ed'),
       [f32(2, 3, 4)], lambda layer, x: layer(x))
record('einsum_dense_right', tk.EinsumDense('ab...,bc->ac...', output_shape=3, bias_axes='c',
                                            name='ed'),
       [f32(2, 4, 5)], lambda layer, x: layer(x))

record('layer_norm', tk.LayerNormalization(axis=[1, 2], epsilon=1e-3, name='ln'),
       [f32(2, 3, 4) * 3 + 1], lambda layer, x: layer(x))
record('group_norm', tk.GroupNormalization(groups=2, name='gn'),
       [f32(2, 3, 4) * 2 + 1], lambda layer, x: layer(x))
record('layer_norm_k3_rms', keras3.layers.LayerNormalization(rms_scaling=True, name='ln'),
       [f32(2, 3, 4) * 2 + 1], lambda layer, x: layer(x))

x = np.linspace(-7, 7, 29).astype('float32')
xt = tf.constant(x)
out['activations/x'] = x
for name in ['gelu', 'swish', 'mish', 'hard_sigmoid', 'elu', 'selu', 'softplus']:
    out['activations/tf_keras/%s' % name] = np.asarray(tf_keras.activations.get(name)(xt))
out['activations/tf_keras/gelu_approximate'] = np.asarray(
    tf_keras.activations.gelu(xt, approximate=True))
for name in ['gelu', 'silu', 'mish', 'hard_sigmoid', 'hard_silu', 'relu6', 'leaky_relu',
             'celu', 'hard_tanh', 'log_sigmoid']:
    out['activations/keras3/%s' % name] = np.asarray(keras3.activations.get(name)(x))

# Preprocessing: resizing (TensorFlow 2 half-pixel centres), crops, normalization.
img = (rs.rand(2, 5, 7, 3) * 255).astype('float32')
for case, layer in [
        ('resize_bilinear_up', tk.Resizing(8, 11)),
        ('resize_bilinear_down', tk.Resizing(3, 4)),
        ('resize_nearest', tk.Resizing(8, 3, interpolation='nearest')),
        ('resize_crop', tk.Resizing(4, 4, crop_to_aspect_ratio=True)),
        ('resize_k3_pad', keras3.layers.Resizing(4, 4, pad_to_aspect_ratio=True,
                                                 fill_value=7.0)),
        ('center_crop', tk.CenterCrop(3, 4)),
        ('center_crop_upsize', tk.CenterCrop(6, 6)),
        ('rescaling_k3', keras3.layers.Rescaling([0.5, 1.0, 2.0], offset=-1.0))]:
    out[case + '/in0'] = img
    out[case + '/out0'] = np.asarray(layer(img))
norm = tk.Normalization(axis=-1, name='norm')
norm.adapt(img.reshape(-1, 3))
out['normalization/in0'] = img[0]
out['normalization/out0'] = np.asarray(norm(img[0]))
for w in norm.weights:
    out['normalization/w/%s' % w.name.split(':')[0].split('/')[-1]] = w.numpy()

# Convolutions tf.keras has and Keras 2.3.1 lacks.
seq = f32(2, 9, 6)
conv_cases = [
    ('conv2d_groups', tk.Conv2D(4, 3, groups=2, padding='same', name='c'), f32(2, 5, 6, 4)),
    ('conv2d_depthwise_groups', tk.Conv2D(8, (3, 2), groups=4, strides=(2, 1), name='c'),
     f32(2, 5, 6, 4)),
    ('conv1d_groups', tk.Conv1D(6, 3, groups=3, padding='causal', dilation_rate=2, name='c'),
     seq),
    ('conv1d_transpose', tk.Conv1DTranspose(4, 3, strides=2, padding='same', name='c'), seq),
    ('conv1d_transpose_valid', tk.Conv1DTranspose(3, 4, strides=3, output_padding=1,
                                                  name='c'), seq),
    ('conv1d_transpose_dilated', tk.Conv1DTranspose(2, 3, dilation_rate=2, name='c'), seq),
    ('depthwise_conv1d', tk.DepthwiseConv1D(3, depth_multiplier=2, padding='same',
                                            name='c'), seq),
    ('depthwise_conv1d_strided', tk.DepthwiseConv1D(4, strides=2, name='c'), seq),
]
for case, layer, x_in in conv_cases:
    record(case, layer, [x_in], lambda layer, x: layer(x))

# Dense attention with masks.
qa, va = f32(2, 3, 4), f32(2, 5, 4)
q_mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
v_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
record('attention_concat', tk.Attention(use_scale=True, score_mode='concat', name='att'),
       [qa, va, q_mask, v_mask],
       lambda layer, q, v, qm, vm: layer([q, v], mask=[qm, vm], return_attention_scores=True))
record('attention_causal', tk.Attention(use_scale=True, name='att'), [qa, va],
       lambda layer, q, v: layer([q, v, v], use_causal_mask=True))
record('additive_attention', tk.AdditiveAttention(name='att'), [qa, va, q_mask, v_mask],
       lambda layer, q, v, qm, vm: layer([q, v], mask=[qm, vm]))

np.savez_compressed(os.path.join(HERE, 'reference.npz'), **out)
print('wrote %d arrays; tf_keras %s, keras %s' % (len(out), tf_keras.__version__,
                                                  keras3.__version__))
