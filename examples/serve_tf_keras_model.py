"""Train a model with Keras 3 or tf.keras, save it, serve it with cyback.

The two halves run in two environments: training where TensorFlow and Keras
3 (or tf_keras) are installed, serving in cyback's, without TensorFlow.

    # both halves; the training half runs with the given interpreter
    python examples/serve_tf_keras_model.py --tf-python /path/to/tfenv/bin/python

    # or by hand
    /path/to/tfenv/bin/python examples/serve_tf_keras_model.py --train DIR [--tf-keras]
    python examples/serve_tf_keras_model.py --serve DIR

The training half writes ``DIR/classifier.keras`` (Keras 3) or
``DIR/classifier.h5`` (tf.keras) and ``DIR/reference.npz`` (a batch and the
framework's predictions); the serving half loads the model with
``cyback.load_model``, predicts the batch and checks the predictions.
"""
import argparse
import os
import subprocess
import sys
import tempfile


def train(outdir, use_tf_keras):
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    import numpy as np
    if use_tf_keras:
        import tf_keras as keras
        filename = 'classifier.h5'
    else:
        import keras
        filename = 'classifier.keras'
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((512, 8)).astype('float32')
    y = (x.sum(axis=1) > 4).astype('int32')
    model = keras.Sequential([
        keras.layers.Input((8,)),
        keras.layers.Dense(32, activation='gelu'),
        keras.layers.LayerNormalization(),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(2, activation='softmax'),
    ])
    model.compile('adam', 'sparse_categorical_crossentropy', metrics=['accuracy'])
    model.fit(x, y, epochs=5, batch_size=32, verbose=0)
    batch = rng.random((16, 8)).astype('float32')
    model.save(os.path.join(outdir, filename))
    np.savez(os.path.join(outdir, 'reference.npz'), x=batch,
             y=np.asarray(model(batch, training=False)))
    print('trained with %s %s, saved %s' % (keras.__name__, keras.__version__, filename))


def serve(outdir):
    import numpy as np

    import cyback
    filename = next(f for f in ('classifier.keras', 'classifier.h5')
                    if os.path.exists(os.path.join(outdir, f)))
    model = cyback.load_model(os.path.join(outdir, filename))
    reference = np.load(os.path.join(outdir, 'reference.npz'))
    predictions = model.predict(reference['x'])
    np.testing.assert_allclose(predictions, reference['y'], rtol=1e-4, atol=1e-5)
    print('served %s with cyback: classes %s; predictions match the training '
          'framework\'s within 1e-4' % (filename, predictions.argmax(axis=1).tolist()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--train', metavar='DIR', help='the training half (TensorFlow env)')
    parser.add_argument('--tf-keras', action='store_true', help='train with tf_keras 2.x')
    parser.add_argument('--serve', metavar='DIR', help='the serving half (cyback env)')
    parser.add_argument('--tf-python',
                        help='interpreter of the TensorFlow environment (for both halves)')
    args = parser.parse_args()
    if not (args.train or args.serve or args.tf_python):
        parser.error('give --tf-python (a Python with TensorFlow and Keras 3 or tf_keras), '
                     'or run the halves by hand with --train and --serve')
    if args.train:
        train(args.train, args.tf_keras)
    elif args.serve:
        serve(args.serve)
    else:
        with tempfile.TemporaryDirectory() as outdir:
            command = [args.tf_python, os.path.abspath(__file__), '--train', outdir]
            # Keras 3 there must not take cyback's backend setting from this process
            env = dict(os.environ, KERAS_BACKEND='tensorflow')
            subprocess.run(command + (['--tf-keras'] if args.tf_keras else []), check=True,
                           env=env)
            serve(outdir)


if __name__ == '__main__':
    sys.exit(main())
