"""The helper module of ``train.py``, imported from the script's own folder: synthetic
28×28 "images" whose label is which horizontal band is brightest, and a small model that
learns it.  Our own data: nothing is downloaded."""

import numpy as np
import tensorflow as tf

SIDE, BANDS = 28, 4


def bright_band_images(count: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """``count`` noisy images and their labels (the index of the band made brighter)."""
    rng = np.random.default_rng(seed)
    images = rng.uniform(0.0, 0.5, size=(count, SIDE, SIDE)).astype(np.float32)
    labels = rng.integers(0, BANDS, size=count)
    rows = SIDE // BANDS
    for i, band in enumerate(labels):
        images[i, band * rows:(band + 1) * rows, :] += 0.5
    return images, labels.astype(np.int64)


def training_batches(global_batch: int) -> tf.data.Dataset:
    """An endless, shuffled dataset of ``global_batch``-sized batches (each worker takes its shard)."""
    images, labels = bright_band_images(4096)
    return tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(4096).repeat().batch(global_batch)


def band_classifier() -> tf.keras.Model:
    """A compiled convolutional classifier of the bands (built inside the strategy's scope)."""
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(SIDE, SIDE)),
        tf.keras.layers.Reshape((SIDE, SIDE, 1)),
        tf.keras.layers.Conv2D(8, 5, strides=2, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(BANDS),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
