"""Find the Python code a model config carries, before anything is built.

Keras can store code in a model file: a ``Lambda`` layer's function as
marshalled bytecode (Keras 2 / tf.keras: ``function_type: "lambda"``;
Keras 3: ``{"class_name": "__lambda__", "config": {"code": ...}}``), the same
for a Lambda's ``output_shape`` or mask, and any function-valued argument
Keras 3 serialized as ``__lambda__``. Loading such a layer runs the code, so
with ``safe_mode=True`` the loader refuses the file (``UnsafeModelError``)
listing every place, and says how to opt in.

What is not code and is allowed: names resolved against a fixed table
(activation names, ``custom_objects`` keys, tf.keras ``TFOpLambda`` op names,
which the loader maps to a whitelist). The loader never imports a module a
file names and never unpickles anything.
"""

__all__ = ['find_code']

_CODE_TYPES = ('lambda',)
# A Lambda layer's arguments that may hold a function.
_LAMBDA_FUNCTIONS = ('function', 'output_shape', 'mask')


def find_code(config, training_config=None):
    """Every place in the configs that holds serialized Python code, as
    human-readable strings (empty if none)."""
    findings = []
    _walk(config, 'model', findings)
    if training_config:
        _walk(training_config, 'training config', findings)
    return findings


def _layer_label(node, where):
    name = node.get('name')
    if name is None and isinstance(node.get('config'), dict):
        name = node['config'].get('name')
    return '%s %r' % (node.get('class_name'), name) if name else where


def _walk(node, where, findings):
    if isinstance(node, dict):
        class_name = node.get('class_name')
        if class_name == '__lambda__':
            findings.append('%s: a serialized Python function (__lambda__, marshalled '
                            'bytecode)' % where)
            return
        if class_name == 'Lambda' and isinstance(node.get('config'), dict):
            where = _layer_label(node, where)
            cfg = node['config']
            for key in _LAMBDA_FUNCTIONS:
                value = cfg.get(key)
                if cfg.get(key + '_type') in _CODE_TYPES or (
                        isinstance(value, dict) and value.get('class_name') == '__lambda__'):
                    findings.append('Lambda layer %r: its %s is marshalled Python bytecode'
                                    % (cfg.get('name'), key))
            for key, value in cfg.items():
                if key not in _LAMBDA_FUNCTIONS and not (
                        key.endswith('_type') and key[:-len('_type')] in _LAMBDA_FUNCTIONS):
                    _walk(value, '%s, %s' % (where, key), findings)
            return
        if class_name is not None and isinstance(node.get('config'), dict):
            where = _layer_label(node, where)
        for key, value in node.items():
            if key.endswith('_type') and value in _CODE_TYPES and class_name != 'Lambda':
                findings.append('%s: %s is marshalled Python bytecode'
                                % (where, key[:-len('_type')]))
            else:
                _walk(value, where, findings)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _walk(value, where, findings)
