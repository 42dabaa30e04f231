"""Multi-backend Keras, imported with the cyback backend.

Keras chooses its backend once, when ``keras`` is first imported, from
``KERAS_BACKEND``. The layers here subclass Keras 2.3.1's ``Layer`` and build
their graphs with cyback's ops, so Keras must run on cyback: if it is not
imported yet, the backend is selected first; if it was imported with another
backend (or is not multi-backend Keras 2 at all), the import fails with an
error that says what to do.
"""
import os
import sys

__all__ = ['import_keras']


def import_keras():
    """Return the ``keras`` module, running on cyback."""
    if 'keras' not in sys.modules:
        os.environ['KERAS_BACKEND'] = 'cyback'
    try:
        import keras
    except ImportError as e:
        raise ImportError(
            'cyback.layers needs multi-backend Keras 2.3.1 (pip install "keras==2.3.1" h5py): %s'
            % e) from e
    version = getattr(keras, '__version__', '')
    if not version.startswith('2.'):
        raise ImportError(
            'cyback.layers extends multi-backend Keras 2 (2.2/2.3.1), but the imported keras is '
            'version %r; run cyback in an environment whose keras is 2.3.1' % version)
    backend = keras.backend.backend()
    if backend != 'cyback':
        raise ImportError(
            'keras was imported with the %r backend before cyback.layers; set '
            'KERAS_BACKEND=cyback (or import cyback.layers before keras) in a fresh process'
            % backend)
    return keras
