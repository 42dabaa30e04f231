"""``load_model(..., compile=True)``: the saved optimizer, loss and metrics
as Keras 2.3.1 ``compile`` arguments.

tf.keras writes a ``training_config`` (``optimizer_config``, ``loss``,
``metrics`` as MeanMetricWrapper objects naming their function); Keras 3 a
``compile_config`` (``optimizer`` as a serialized object, losses and metrics
as names or serialized classes). The optimizers Keras 2.3.1 has (SGD,
RMSprop, Adagrad, Adadelta, Adam, Adamax, Nadam) are rebuilt with the saved
learning rate and arguments; a setting Keras 2.3.1 cannot honour (weight
decay, EMA, a learning-rate schedule, an unknown loss) raises ValueError
saying so, rather than compiling a different training setup.
"""
from cyback.saving.layer_configs import init_arguments

__all__ = ['compile_model']

_OPTIMIZERS = ('SGD', 'RMSprop', 'Adagrad', 'Adadelta', 'Adam', 'Adamax', 'Nadam')

# Optimizer keys without a Keras 2.3.1 counterpart, ignorable at these values.
_IGNORABLE = {
    'name': lambda v, c: True,
    'weight_decay': lambda v, c: not v,
    'global_clipnorm': lambda v, c: v is None,
    'use_ema': lambda v, c: v is False,
    'ema_momentum': lambda v, c: not c.get('use_ema'),
    'ema_overwrite_frequency': lambda v, c: not c.get('use_ema'),
    'jit_compile': lambda v, c: True,
    'is_legacy_optimizer': lambda v, c: True,
    'loss_scale_factor': lambda v, c: v is None,
    'gradient_accumulation_steps': lambda v, c: v is None,
    'decay': lambda v, c: not v,
    'amsgrad': lambda v, c: v is False,
    'centered': lambda v, c: v is False,
    'momentum': lambda v, c: not v,
    'initial_accumulator_value': lambda v, c: True,
}


def compile_model(model, config, writer, objects, label):
    if not config:
        raise ValueError('%s: compile=True, but the file has no training config (the model '
                         'was saved uncompiled)' % label)
    import keras
    try:
        optimizer = _optimizer(keras, config.get('optimizer_config', config.get('optimizer')))
        loss = _loss(keras, config.get('loss'), objects)
        metrics = _metrics(config.get('metrics'))
        weighted = _metrics(config.get('weighted_metrics'))
    except ValueError as e:
        raise ValueError('%s: cannot compile with the saved training config: %s (load with '
                         'compile=False and compile in code)' % (label, e)) from e
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics,
                  loss_weights=config.get('loss_weights'), weighted_metrics=weighted)


def _optimizer(keras, entry):
    if entry is None:
        raise ValueError('no optimizer is saved')
    if isinstance(entry, str):
        return entry
    name = str(entry.get('class_name', '')).split('>')[-1]
    match = {n.lower(): n for n in _OPTIMIZERS}.get(name.lower())
    if match is None:
        raise ValueError('optimizer %s has no Keras 2.3.1 counterpart' % name)
    cls = getattr(keras.optimizers, match)
    cfg = dict(entry.get('config') or {})
    rate = cfg.pop('learning_rate', cfg.pop('lr', None))
    if rate is not None and not isinstance(rate, (int, float)):
        raise ValueError('the learning rate is a schedule (%s), which Keras 2.3.1 '
                         'optimizers do not take' % (rate.get('class_name')
                                                     if isinstance(rate, dict) else rate,))
    # Keras 2.3.1's optimizers take these through **kwargs.
    accepted = init_arguments(cls, object) | {'clipnorm', 'clipvalue'}
    accepted |= {'schedule_decay'} if match == 'Nadam' else {'decay'}
    if match != 'SGD':
        accepted.add('epsilon')
    args = {}
    for key, value in cfg.items():
        if key in accepted:
            if value is not None:
                args[key] = value
            continue
        test = _IGNORABLE.get(key)
        if test is None or not test(value, cfg):
            raise ValueError('optimizer %s with %s=%r' % (match, key, value))
    if rate is not None:
        args['learning_rate'] = float(rate)
    return cls(**args)


def _loss(keras, entry, objects):
    if entry is None:
        raise ValueError('no loss is saved')
    if isinstance(entry, str):
        if entry in objects or callable(getattr(keras.losses, entry, None)):
            return entry
        raise ValueError('loss %r is not a Keras 2.3.1 loss' % entry)
    if isinstance(entry, list):
        return [_loss(keras, e, objects) for e in entry]
    if isinstance(entry, dict) and 'class_name' not in entry:
        return {k: _loss(keras, v, objects) for k, v in entry.items()}
    name = entry.get('class_name')
    if name == 'function' and isinstance(entry.get('config'), str):
        return _loss(keras, entry['config'], objects)
    cls = objects.get(name) or getattr(keras.losses, name or '', None)
    if not isinstance(cls, type):
        raise ValueError('loss %s is not a Keras 2.3.1 loss' % name)
    cfg = dict(entry.get('config') or {})
    accepted = init_arguments(cls, object)
    extra = {k: v for k, v in cfg.items() if k not in accepted and k != 'dtype'}
    if extra:
        raise ValueError('loss %s with %s' % (name, sorted(extra)))
    return cls(**{k: v for k, v in cfg.items() if k in accepted})


def _metric(entry):
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        cfg = entry.get('config') or {}
        if entry.get('class_name') == 'MeanMetricWrapper':
            name = cfg.get('name')
            # tf.keras resolves 'accuracy' to a function; keep the user's name,
            # which Keras 2.3.1 resolves from the loss the same way.
            return name if name in ('accuracy', 'acc') else cfg.get('fn', name)
        if entry.get('class_name') == 'function' and isinstance(cfg, str):
            return cfg
    raise ValueError('metric %.80r has no Keras 2.3.1 counterpart' % (entry,))


def _metrics(entry):
    if entry is None:
        return None
    if isinstance(entry, dict) and 'class_name' not in entry:
        return {k: _metrics(v) for k, v in entry.items()}
    if isinstance(entry, list):
        # tf.keras nests one list per output.
        if len(entry) == 1 and isinstance(entry[0], list):
            return [_metric(e) for e in entry[0]]
        if all(isinstance(e, list) for e in entry):
            return [[_metric(x) for x in e] for e in entry]
        return [_metric(e) for e in entry]
    return [_metric(entry)]
