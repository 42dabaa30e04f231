"""Model files written by tf.keras 2.x, Keras 3 and Keras 2.2/2.3, loaded on cyback.

``load_model`` returns a multi-backend Keras 2.3.1 model; ``load_weights`` fills
a model built in code from a tf.keras or Keras 3 weight file. See
docs/model-files.md. Importing this package imports Keras with the cyback
backend (see cyback.layers).
"""
from cyback.saving.errors import (
    ModelFileError,
    UnsafeModelError,
    UnsupportedLayersError,
    WeightMismatchError,
)
from cyback.saving.loader import load_model, load_weights

__all__ = ['load_model', 'load_weights', 'ModelFileError', 'UnsafeModelError',
           'UnsupportedLayersError', 'WeightMismatchError']
