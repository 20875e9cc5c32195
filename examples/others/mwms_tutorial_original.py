"""Multi-worker training with Keras, in the style of TensorFlow's tutorial (its mnist_setup.py
and main.py in one file): ``tf.distribute.MultiWorkerMirroredStrategy``, the cluster from the
``TF_CONFIG`` that each worker is started with.

Data-source change: MNIST cannot be downloaded here, so scikit-learn's bundled 8x8 digits
stand in, upscaled to 28x28 (``mnist_dataset``), and the run is shortened to 3 epochs of 10
steps. Under Keras 3 this script fails before its first step with two workers ("Attempt to
convert a value (PerReplica...)"); ``mwms_tutorial.py`` is it on tfscale.
"""

import json
import os

import numpy as np
import tensorflow as tf


def mnist_dataset(batch_size):
    # Data-source change (see the docstring): images in [0, 1] and int64 labels, as the
    # tutorial makes them from tf.keras.datasets.mnist.load_data().
    from sklearn.datasets import load_digits

    digits = load_digits()
    x_train = np.pad(np.kron(digits.images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
    x_train = (x_train / np.float32(16)).astype(np.float32)
    y_train = digits.target.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(2000).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=['accuracy'])
    return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=10)
