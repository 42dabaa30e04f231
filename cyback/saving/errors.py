"""The errors ``cyback.load_model`` and ``load_weights`` raise.

All are ``ValueError`` subclasses, so callers that catch what Keras raises for
a bad file keep working; each names the file and what is wrong with it.
"""

__all__ = ['ModelFileError', 'UnsafeModelError', 'UnsupportedLayersError',
           'WeightMismatchError']


class ModelFileError(ValueError):
    """The file is not a model file this loader knows, or is damaged
    (truncated, corrupted, missing a part)."""


class UnsafeModelError(ValueError):
    """The file holds Python code (a ``Lambda`` layer's bytecode, a
    serialized function) and ``safe_mode`` is on."""

    def __init__(self, source, findings):
        self.findings = list(findings)
        lines = ['%s holds Python code, which loading would run:' % source]
        lines += ['  - %s' % f for f in self.findings]
        lines.append(
            'A model file is data: by default no code from it runs. If you trust '
            'this file (you wrote it, or it comes from a source you trust) and '
            'it was written by this Python version (%s), load it with '
            'cyback.load_model(..., safe_mode=False).' % _python_version())
        super().__init__('\n'.join(lines))


class UnsupportedLayersError(ValueError):
    """Layers of the file that cannot run on cyback, all of them at once.

    ``layers`` lists ``(class_name, layer_name, reason)``."""

    def __init__(self, source, layers):
        self.layers = list(layers)
        lines = ['%s: %d layer%s cannot be loaded on cyback:'
                 % (source, len(self.layers), '' if len(self.layers) == 1 else 's')]
        lines += ['  - %s %r: %s' % entry for entry in self.layers]
        lines.append(
            'Layers cyback does not provide can be passed as Keras 2.3.1 layer '
            'classes in custom_objects={class_name: cls}.')
        super().__init__('\n'.join(lines))


class WeightMismatchError(ValueError):
    """The file's weights do not fit the model: a missing or extra weight, or
    a shape that differs. ``problems`` lists one line per weight."""

    def __init__(self, source, problems):
        self.problems = list(problems)
        lines = ['%s: the weights do not fit the model:' % source]
        lines += ['  - %s' % p for p in self.problems]
        super().__init__('\n'.join(lines))


def _python_version():
    import sys
    return '%d.%d' % sys.version_info[:2]
