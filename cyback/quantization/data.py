"""Batches of a model's inputs from what a user passes as calibration data,
and a function that runs a model's graph up to chosen tensors.

Data may be:

- a NumPy array (a model with one input) or a list/tuple of arrays, one per
  input, with the same number of samples: cut into batches of
  ``batch_size``;
- any other iterable of batches (a generator, a list of batches, a
  ``keras.utils.Sequence``): each batch is the input array (or the list of
  input arrays), or an ``(inputs, targets[, sample_weights])`` tuple as
  Keras generators yield; only the inputs are read.

A one-shot iterator is kept in memory as it is read, for the methods that
read the data twice.
"""
import collections.abc

import numpy as np


class Batches(object):
    """Re-iterable batches of input lists for a model with ``n_inputs``."""

    def __init__(self, data, n_inputs, batch_size=32, what='calibration_data'):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError('quantize: batch_size must be a positive integer, got %r'
                             % (batch_size,))
        self.n_inputs = n_inputs
        self.what = what
        self._arrays = self._whole(data)
        self._batch_size = batch_size
        self._source = None
        self._seen = None
        if self._arrays is None:
            if not isinstance(data, collections.abc.Iterable) or isinstance(data, (str, bytes)):
                raise TypeError('%s: expected NumPy arrays or an iterable of batches, got %s'
                                % (what, type(data).__name__))
            self._source = data
            one_shot = iter(data) is data if hasattr(data, '__next__') else False
            self._seen = [] if one_shot else None

    def _whole(self, data):
        if isinstance(data, np.ndarray):
            arrays = [data]
        elif isinstance(data, (list, tuple)) and len(data) == self.n_inputs and \
                self.n_inputs > 1 and all(isinstance(a, np.ndarray) for a in data) and \
                len({a.shape[0] if a.ndim else None for a in data}) == 1:
            arrays = list(data)
        else:
            return None
        if len(arrays) != self.n_inputs:
            raise ValueError('%s: the model has %d inputs, got one array'
                             % (self.what, self.n_inputs))
        if arrays[0].ndim == 0:
            raise ValueError('%s: expected a batch axis, got a scalar array' % self.what)
        return arrays

    def __iter__(self):
        count = 0
        for batch in self._batches():
            if batch[0].shape[0]:
                count += 1
                yield batch
        if count == 0:
            raise ValueError('%s holds no samples' % self.what)

    def _batches(self):
        if self._arrays is not None:
            total = self._arrays[0].shape[0]
            for start in range(0, total, self._batch_size):
                yield [a[start:start + self._batch_size] for a in self._arrays]
            return
        if self._seen is not None and self._source is None:
            yield from self._seen
            return
        for item in self._source:
            batch = self._inputs_of(item)
            if self._seen is not None:
                self._seen.append(batch)
            yield batch
        if self._seen is not None:
            self._source = None

    def _inputs_of(self, item):
        if isinstance(item, np.ndarray):
            inputs = [item]
        elif isinstance(item, tuple) and 2 <= len(item) <= 3 and \
                (isinstance(item[0], list) or (self.n_inputs == 1 and
                                               isinstance(item[0], np.ndarray))):
            inputs = item[0] if isinstance(item[0], list) else [item[0]]
        elif isinstance(item, (list, tuple)):
            inputs = list(item)
        else:
            raise TypeError('%s: a batch must be an array, a list of arrays or an '
                            '(inputs, targets) tuple, got %s' % (self.what, type(item).__name__))
        inputs = [np.asarray(a) for a in inputs]
        if len(inputs) != self.n_inputs:
            raise ValueError('%s: the model has %d inputs, a batch has %d arrays'
                             % (self.what, self.n_inputs, len(inputs)))
        if any(a.ndim == 0 for a in inputs):
            raise ValueError('%s: a batch array has no batch axis' % self.what)
        return inputs


def graph_function(keras, inputs, tensors):
    """A function of the model's input arrays returning ``tensors`` at
    inference (learning phase 0)."""
    K = keras.backend
    phase = K.learning_phase()
    feeds = list(inputs)
    fixed = isinstance(phase, int)
    if not fixed:
        feeds.append(phase)
    f = K.function(feeds, list(tensors))

    def run(arrays):
        return f(list(arrays) + ([] if fixed else [0]))
    return run
