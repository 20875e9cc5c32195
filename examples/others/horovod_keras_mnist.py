"""MNIST with Keras and Horovod, in the style of Horovod's tensorflow2_keras_mnist.py example,
as written for ``horovod.tensorflow.keras``.

Data-source change: MNIST cannot be downloaded here, so scikit-learn's bundled 8x8 digits
stand in, upscaled to 28x28 (``load_digits_as_mnist``), and the run is shortened to 3 epochs
of 10 steps. Horovod 0.28.1's own Keras layer does not run on TF 2.21 with Keras 3; this is
the script on tfscale, 2 changed lines: the import, and ``compile`` without
``experimental_run_tf_function``, which Keras 3 refuses (the ``.h5`` checkpoint stays: Keras 3
writes it with a "legacy format" warning). ``horovod_keras_mnist_original.py`` is the script
before the change::

    tfscale-run --nproc=2 --strategy=horovod examples/others/horovod_keras_mnist.py
"""

import numpy as np
import tensorflow as tf

import tfscale.horovod as hvd


def load_digits_as_mnist():
    # Data-source change (see the docstring): uint8 28x28 images and labels, as
    # tf.keras.datasets.mnist.load_data() returns the training split.
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3))) * (255.0 / 16.0)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))).astype('uint8')
    return (images, digits.target), None


# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

(mnist_images, mnist_labels), _ = load_digits_as_mnist()

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(2000).batch(128)

mnist_model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
    tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation='relu'),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation='softmax')
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(
    opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                    optimizer=opt,
                    metrics=['accuracy'])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
mnist_model.fit(dataset, steps_per_epoch=20 // hvd.size(), callbacks=callbacks, epochs=3,
                verbose=verbose)
