"""Simple MNIST convnet, in the style of keras.io's example, on tfscale: 3 changed lines.

    tfscale-run --nproc=2 --strategy=horovod examples/others/keras_mnist_convnet.py

Data-source change: MNIST cannot be downloaded here, so the 1,797 handwritten 8x8 digits that
ship with scikit-learn stand in, upscaled to MNIST's 28x28 (``load_digits_as_mnist``), and
the run is shortened to 3 epochs. ``keras_mnist_convnet_original.py`` is the script before
the change.
"""

import keras
import numpy as np
from keras import layers

import tfscale


def load_digits_as_mnist():
    # Data-source change (see the docstring): (x_train, y_train), (x_test, y_test) as
    # keras.datasets.mnist.load_data() returns them, uint8 28x28 images.
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3))) * (255.0 / 16.0)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))).astype("uint8")
    split = len(images) * 4 // 5
    return (images[:split], digits.target[:split]), (images[split:], digits.target[split:])


# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)

# Load the data and split it between train and test sets
(x_train, y_train), (x_test, y_test) = load_digits_as_mnist()

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")

# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()

batch_size = 128
epochs = 3

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

callbacks = tfscale.prepare(model).callbacks
model.fit(*tfscale.shard_arrays(x_train, y_train), batch_size=batch_size, epochs=epochs, validation_split=0.1, callbacks=callbacks)  # noqa: E501

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
