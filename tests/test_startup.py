"""What a training process loads before its first step (tfscale.cli.command.import_tensorflow)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tests.conftest import run_process
from tfscale.cli import command


def test_keras_loads_without_matplotlib_and_still_plots(tmp_path: Path) -> None:
    """TensorFlow and Keras load without matplotlib (0.5-1 s of start-up), and Keras' plots
    import it when they draw: a gallery is written, and the name Keras keeps for
    ``matplotlib.patches`` answers with the real module's classes."""
    script = textwrap.dedent(f"""
        import sys
        from tfscale.cli import command
        command.import_tensorflow()
        import keras, tensorflow
        assert "keras" in sys.modules and "tensorflow" in sys.modules
        print("matplotlib loaded with Keras:", "matplotlib" in sys.modules)
        import numpy as np
        images = np.random.default_rng(0).random((4, 8, 8, 3))
        keras.visualization.plot_image_gallery(images, value_range=(0, 1),
                                               path={str(tmp_path / "gallery.png")!r})
        import matplotlib.patches
        from keras.src.visualization import plot_bounding_box_gallery as boxes
        assert boxes.patches.Patch is matplotlib.patches.Patch
        print("plotted")
        """)
    proc = run_process([sys.executable, "-c", script], env={"MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "matplotlib loaded with Keras: False" in proc.stdout, proc.stdout
    assert "plotted" in proc.stdout
    assert (tmp_path / "gallery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_changes_once_tensorflow_is_loaded() -> None:
    import keras
    import tensorflow as tf

    before = dict(sys.modules)
    command.import_tensorflow()
    assert sys.modules["tensorflow"] is tf and sys.modules["keras"] is keras
    assert sys.modules.get("matplotlib") is before.get("matplotlib")
