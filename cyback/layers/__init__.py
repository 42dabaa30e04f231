"""Keras layers and activations that models saved by tf.keras 2.x and Keras 3
use and Keras 2.3.1 lacks, as Keras 2.3.1 layers written on cyback's ops.

``custom_objects()`` returns them under the names those frameworks write in
configs (class names such as ``"LayerNormalization"``, activation names such
as ``"gelu"``); pass it to Keras's deserialisation, e.g.
``keras.models.load_model(path, custom_objects=cyback.layers.custom_objects())``
for a model that Keras 2.3.1 saved with these layers.

Weight names, shapes and creation order follow tf.keras 2.x (each class's
docstring lists them), so a loader can map a file's weights by name.

Importing this package imports Keras: with the cyback backend if Keras is not
imported yet, and an ImportError if it runs on another backend.
"""
from cyback.layers._keras import import_keras

import_keras()

from cyback.layers import activations  # noqa: E402
from cyback.layers.attention import MultiHeadAttention  # noqa: E402
from cyback.layers.convolutional import (  # noqa: E402
    Conv1D,
    Conv1DTranspose,
    Conv2D,
    DepthwiseConv1D,
)
from cyback.layers.core import (  # noqa: E402
    CustomScaleLayer,
    Identity,
    LayerScale,
    LeakyReLU,
    StochasticDepth,
)
from cyback.layers.dense_attention import AdditiveAttention, Attention  # noqa: E402
from cyback.layers.einsum_dense import EinsumDense  # noqa: E402
from cyback.layers.normalization import (  # noqa: E402
    GroupNormalization,
    LayerNormalization,
    UnitNormalization,
)
from cyback.layers.pooling import (  # noqa: E402
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalAveragePooling3D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    GlobalMaxPooling3D,
)
from cyback.layers.preprocessing import (  # noqa: E402
    CenterCrop,
    Normalization,
    Rescaling,
    Resizing,
)

__all__ = [
    'custom_objects', 'import_keras', 'activations', 'LAYERS',
    'EinsumDense', 'MultiHeadAttention', 'Attention', 'AdditiveAttention',
    'LayerNormalization', 'GroupNormalization', 'UnitNormalization',
    'Rescaling', 'Normalization', 'Resizing', 'CenterCrop',
    'Conv1D', 'Conv2D', 'Conv1DTranspose', 'DepthwiseConv1D',
    'GlobalAveragePooling1D', 'GlobalAveragePooling2D', 'GlobalAveragePooling3D',
    'GlobalMaxPooling1D', 'GlobalMaxPooling2D', 'GlobalMaxPooling3D',
    'Identity', 'LeakyReLU', 'LayerScale', 'StochasticDepth', 'CustomScaleLayer',
]

# Class name as configs write it -> class.
LAYERS = {cls.__name__: cls for cls in (
    EinsumDense, MultiHeadAttention, Attention, AdditiveAttention,
    LayerNormalization, GroupNormalization, UnitNormalization,
    Rescaling, Normalization, Resizing, CenterCrop,
    Conv1D, Conv2D, Conv1DTranspose, DepthwiseConv1D,
    GlobalAveragePooling1D, GlobalAveragePooling2D, GlobalAveragePooling3D,
    GlobalMaxPooling1D, GlobalMaxPooling2D, GlobalMaxPooling3D,
    Identity, LeakyReLU, LayerScale, StochasticDepth, CustomScaleLayer,
)}


def custom_objects(keras3=False):
    """Name -> class or function, for every layer and activation here.

    ``keras3=True`` gives Keras 3's meaning to the names whose meaning changed
    (``"hard_sigmoid"`` is ``relu6(x + 3) / 6`` there, ``clip(0.2x + 0.5)`` in
    Keras 2 and tf.keras 2.x): use it for files Keras 3 wrote. A new dict each
    call, so the caller may add to it.
    """
    objects = dict(LAYERS)
    objects.update(activations.ACTIVATIONS)
    if keras3:
        objects['hard_sigmoid'] = activations.hard_sigmoid_keras3
    return objects
