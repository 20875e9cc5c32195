"""bench.digits reads scikit-learn's digits from the package's data file, with scikit-learn off
the import path (Keras would import it in every TensorFlow process)."""

from __future__ import annotations

import importlib.util

import numpy as np

from bench.digits import DATA_PACKAGES, digits_file, load_digits


def test_digits_come_from_the_data_file_without_importing_scikit_learn() -> None:
    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.min() == 0 and images.max() == 16  # 16 grey levels, as load_digits() has them
    assert np.bincount(labels).tolist()[:3] == [178, 182, 177] and set(labels) == set(range(10))
    assert digits_file().is_relative_to(DATA_PACKAGES)
    assert importlib.util.find_spec("sklearn") is None  # setup.sh keeps it off the path
