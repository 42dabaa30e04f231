"""The model suite needs Keras on cyback: Keras reads KERAS_BACKEND once, at its
first import, so it is set here before any test imports keras (KERAS_HOME is
already a temporary folder, set by the top conftest)."""
import os

os.environ.setdefault("KERAS_BACKEND", "cyback")
