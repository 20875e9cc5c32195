"""What a tfscale command does before it reads its flags, however it was started.

A command starts two ways: ``python -m tfscale.sweep`` and the installed script
``tfscale-sweep`` (``[project.scripts]`` in pyproject.toml). Both must behave alike:

- ``--help``: absl prints ``__main__``'s docstring and the key flags of the module named
  ``sys.argv[0]``. Under ``python -m`` that is the command's own module; an installed script's
  ``__main__`` is pip's wrapper, which has neither, so absl printed only ``USAGE: ... Try
  --helpfull``. :func:`absl_help` gives the wrapper the command's docstring and key flags.
- Imports: besides ``tfscale``, the project ships three top-level packages, ``models``,
  ``input_pipelines`` and ``launch`` (the repository's folders, and the names plugins import
  to register themselves, docs/EXTENDING.md). Users' projects often have their own ``models``
  or ``launch``, and ``python -m`` puts the working directory first on ``sys.path``, so theirs
  shadowed tfscale's (``module 'models' has no attribute 'MODELS'``). Each command calls
  :func:`own_top_level_packages` first: in its process, those three names are tfscale's.
  A user's own script is not a tfscale command: its ``models`` stays its own, and tfscale's
  library (callbacks, strategies, the Horovod API, ...) imports none of the three
  (tests/test_structure.py keeps them to the assembling entry points).
"""

from __future__ import annotations

import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from absl import flags
from absl import flags as absl_flags

from tfscale.cli.output import silence_stdout
from tfscale.config.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE

# What Keras' plotting functions (keras.visualization) import from matplotlib as Keras loads:
# (the Keras module, the name it keeps, the matplotlib module).
_KERAS_PLOTS = (
    ("keras.src.visualization.plot_image_gallery", "plt", "matplotlib.pyplot"),
    ("keras.src.visualization.plot_bounding_box_gallery", "patches", "matplotlib.patches"),
)

TOP_LEVEL_PACKAGES = ("models", "input_pipelines", "launch")
# Where tfscale's top-level packages are: beside tfscale itself (the checkout, site-packages,
# or the source folder of an editable install).
_HOME = Path(__file__).resolve().parents[2]


class _OwnTopLevelPackages(importlib.abc.MetaPathFinder):
    """Finds ``models``, ``input_pipelines`` and ``launch`` beside tfscale, before sys.path;
    their submodules then follow the package's own ``__path__``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in TOP_LEVEL_PACKAGES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(_HOME)])


def skip_the_last_collection() -> None:
    """Leaves the objects alive now out of the interpreter's last garbage collection at exit.

    That collection walks TensorFlow's and Keras' whole heap: 0.9 s of a core for each process
    that trained (Intel Xeon, 2 cores; 0.07 s after this). Exit handlers still run, standard
    streams are still flushed, and objects freed by reference counting are still finalised;
    only garbage held in reference cycles is left to the operating system, as Python permits
    at exit. Call it when the process has nothing left to do but exit.
    """
    gc.freeze()


class _OnFirstUse:
    """Stands for a module that is imported when one of its attributes is first asked for."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> object:
        return getattr(importlib.import_module(self._name), attribute)


def import_tensorflow() -> None:
    """Imports TensorFlow and Keras, with matplotlib left for Keras' plots to import when they
    are first drawn.

    Keras imports matplotlib's ``pyplot`` and ``patches`` as it loads (for
    ``keras.visualization``; TensorFlow's own import loads Keras), when matplotlib is
    installed, as it is with tfscale's requirements. That was 0.5-1 s of every training
    process's start-up (AMD EPYC Zen 5: 4.9-5.7 s against 4.0-4.5 s for ``import tensorflow,
    keras``), for plots that a training process does not draw. Here Keras loads while
    matplotlib cannot be imported, and the names it then holds as missing stand for the
    modules, imported on first use: ``keras.visualization`` draws as before, and any other
    ``import matplotlib`` is untouched. Nothing is changed when TensorFlow, Keras or
    matplotlib is already imported, or matplotlib is not installed.
    """
    defer = not ("tensorflow" in sys.modules or "keras" in sys.modules
                 or "matplotlib" in sys.modules or importlib.util.find_spec("matplotlib") is None)
    if defer:
        sys.modules["matplotlib"] = None  # type: ignore[assignment]  # import: ImportError
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        if defer and sys.modules.get("matplotlib", "") is None:
            del sys.modules["matplotlib"]
    if not defer:
        return
    for module, name, target in _KERAS_PLOTS:
        holder = sys.modules.get(module)
        if holder is not None and getattr(holder, name, "") is None:
            setattr(holder, name, _OnFirstUse(target))


def own_top_level_packages() -> None:
    """Makes ``import models`` (``input_pipelines``, ``launch``) import tfscale's packages in
    this process, whatever is on ``sys.path``; call it before anything imports them."""
    if not any(isinstance(finder, _OwnTopLevelPackages) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OwnTopLevelPackages())


def program_name(module: str) -> str:
    """How the user started this command: ``python -m MODULE``, or the installed script's
    name (``tfscale-sweep``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name in (module, f"{module}.__main__"):
        return f"python -m {module}"
    return Path(sys.argv[0]).name


def absl_help(module: str, doc: str, flags_module: str) -> None:
    """Makes absl's ``--help`` of the command ``python -m MODULE`` the same when it runs as an
    installed script, under the script's name.

    Args:
        module: the command's module (``tfscale.sweep``).
        doc: the help text, the command module's docstring.
        flags_module: the module that defines the command's flags; they are listed as the
            key flags of the program absl was started as.
    """
    program = program_name(module)
    # absl %-formats the docstring with sys.argv[0]; the text is final, so escape it.
    text = doc.replace(f"python -m {module}", program).replace("%", "%%")
    main = sys.modules.get("__main__")
    if main is not None:
        main.__doc__ = text
    for flag in flags.FLAGS.get_key_flags_for_module(flags_module):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def parse_flags(argv: list[str],
                flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> list[str]:
    """absl's ``app.run(main, flags_parser=parse_flags)``: parses ``argv`` into
    ``flag_values`` and returns the arguments that are not flags. absl itself exits 1 both
    for help and for a flag error, the latter with a two-line ``FATAL Flags parsing error``.

    Raises:
        SystemExit: 0 after absl printed the help (also when the help's reader went away
            before the end: ``--helpfull | head``); 2 after one ``error: ...`` line for a flag
            error (absl's suggestion, ``Did you mean: model, model_dir?``, kept).
    """
    try:
        return flag_values(argv)
    except absl_flags.Error as err:
        print(f"error: {flag_error(err)}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE) from None
    except SystemExit as stop:
        # absl's help flags print the help and exit 1; asking for help is not an error.
        code = EXIT_OK if stop.code == EXIT_ERROR else stop.code
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            silence_stdout()
        raise SystemExit(code) from None
    except BrokenPipeError:
        silence_stdout()
        raise SystemExit(EXIT_OK) from None


def flag_error(err: absl_flags.Error) -> str:
    """absl's message for a flag error on one line, without its ``ERROR::`` prefix."""
    return " ".join(str(err).removeprefix("ERROR:: ").split()).replace(" ?", "?")
