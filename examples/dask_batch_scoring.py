"""Batch scoring with Dask: a model scores images stored as .npy files.

    python examples/dask_batch_scoring.py

Everything is made here, in a temporary folder removed at the end: a small
CNN trained for a few seconds to tell which colour a random 16x16 image is
tinted with, saved to HDF5, and 1,200 such images in six .npy files. A
LocalCluster in this process (``processes=False``: its workers are threads,
which starts in a second) scores them with ``cyback.dask.predict``; the
predictions are checked against the model run directly, then written with
``cyback.dask.save`` (one .npy per chunk) and read back. The same code runs
on a real cluster by changing the Client (docs/dask.md).

Needs dask[array] and distributed, Keras 2.3.1 and h5py
(pip install ".[dask,keras]").
"""
import glob
import os
import shutil
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "cyback")

import numpy as np  # noqa: E402


def colour_images(rng, n):
    """Random 16x16 RGB images, each tinted towards one colour: its label."""
    labels = rng.integers(0, 3, size=n)
    tint = np.full((n, 1, 1, 3), 0.4, np.float32)
    tint[np.arange(n), 0, 0, labels] = 1.0
    return rng.random((n, 16, 16, 3), dtype=np.float32) * tint, labels


def make_model(keras, path):
    """A small CNN that tells the images' colour, trained for a few seconds."""
    model = keras.models.Sequential([
        keras.layers.Conv2D(8, 3, activation="relu", input_shape=(16, 16, 3)),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = colour_images(np.random.default_rng(3), 600)
    model.fit(x, y, epochs=4, batch_size=32, verbose=0)
    model.save(path)
    return model


def make_images(folder, files=6, per_file=200):
    """The images to score, one .npy file per 200; returns the paths and labels."""
    rng = np.random.default_rng(4)
    paths, labels = [], []
    for i in range(files):
        x, y = colour_images(rng, per_file)
        path = os.path.join(folder, "images-%02d.npy" % i)
        np.save(path, x)
        paths.append(path)
        labels.append(y)
    return paths, np.concatenate(labels)


def main():
    import dask
    import keras
    from dask.distributed import Client, LocalCluster

    import cyback.dask

    folder = tempfile.mkdtemp(prefix="cyback-example-")
    try:
        model = make_model(keras, os.path.join(folder, "classifier.h5"))
        paths, truth = make_images(folder)
        with dask.config.set(cyback.dask.SCORING_CONFIG):
            cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                   dashboard_address=None)
        with cluster, Client(cluster):
            images = cyback.dask.from_npy_files(sorted(glob.glob(os.path.join(folder,
                                                                              "images-*.npy"))))
            # one task per file here ("keep"); by default predict sizes the tasks
            # itself from a timing of the model (docs/dask.md)
            pred = cyback.dask.predict(os.path.join(folder, "classifier.h5"), images,
                                       batch_size=64, chunk_rows="keep")
            print("scoring %d images in %d tasks" % (images.shape[0], pred.npartitions))
            labels = pred.argmax(axis=1).compute()
            counts = np.bincount(labels, minlength=3)
            print("predicted red %d, green %d, blue %d; %.1f%% right"
                  % (counts[0], counts[1], counts[2], 100.0 * np.mean(labels == truth)))

            direct = model.predict(np.concatenate([np.load(p) for p in paths]), batch_size=64)
            scored = pred.compute()
            # Dense layers' products may round differently at another thread count
            # (docs/threads.md): equal to rounding, and the same classes.
            if not (np.allclose(scored, direct, rtol=1e-5, atol=1e-6)
                    and np.array_equal(labels, direct.argmax(axis=1))):
                sys.exit("the cluster's predictions differ from the model's (max difference %g)"
                         % np.abs(scored - direct).max())
            print("the cluster's predictions match the model run directly")

            written = cyback.dask.save(pred, os.path.join(folder, "predictions"))
            again = cyback.dask.from_npy_files(written).compute()
            if not np.array_equal(again, scored):
                sys.exit("the saved predictions do not read back the same")
            print("wrote %d files (%s ... %s) and read them back"
                  % (len(written), os.path.basename(written[0]), os.path.basename(written[-1])))
    finally:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
