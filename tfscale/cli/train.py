"""Train a registered model on a registered dataset under a distribution strategy.

Examples::

    python -m tfscale.train --model resnet50 --strategy horovod --num_processes 2 --steps 20
    horovodrun --gloo -np 2 python -m tfscale.train --model resnet50 --strategy horovod
    python -m tfscale.train --flagfile=run.flags
    python -m tfscale.train --list          # registered models, datasets and strategies

Exit codes are listed in :mod:`tfscale.config.errors`. When the reader of the output goes away
(``| head``), the run goes on: its output is appended to ``MODEL_DIR/train.log`` from there
(:mod:`tfscale.cli.output`).

TensorFlow is imported only by the process that trains: help, ``--list``, a bad flag or name,
and the ``--num_processes`` launcher answer without it (model and dataset modules are imported
when their builders are fetched, Horovod and Keras by the strategy that trains).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags as absl_flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from tfscale.cli import command  # noqa: E402

# Before plugins imports models: python -m puts the user's directory, which may have its
# own models/ or launch/ package, first on sys.path.
command.own_top_level_packages()

import input_pipelines  # noqa: E402
from tfscale.cli import output, plugins  # noqa: E402
from tfscale.cli.command import parse_flags  # noqa: E402
from tfscale.cli.flags import config_from_flags, define_flags  # noqa: E402
from tfscale.cluster import environment as cluster_env  # noqa: E402
from tfscale.cluster import preemption, rank_zero  # noqa: E402
from tfscale.config.errors import (  # noqa: E402
    EXIT_PEER_LOST,
    EXIT_USAGE,
    TrainingStopped,
    describe_peer_failure,
    describe_wrapped_usage_error,
)
from tfscale.training import resume as config_change  # noqa: E402

FLAGS = absl_flags.FLAGS
LOG = "train.log"  # under the model_dir: the output that its reader left behind


def main(argv: list[str]) -> int:
    if not FLAGS["verbosity"].present:
        # absl turns Python logging up to INFO after parsing; TF then logs every collective.
        absl_logging.set_verbosity(absl_logging.WARNING)
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; all options are --flags "
              "(see --helpfull)", file=sys.stderr)
        return EXIT_USAGE
    if FLAGS.list:
        return _list()
    # Building the config may print (what the data holds); the run's folder is known after.
    output.hold_when_reader_leaves("tfscale.train")
    try:
        config = config_from_flags(FLAGS, plugins.choose_dataset, input_pipelines.shapes_from_data)
        output.divert_when_reader_leaves(Path(config.model_dir) / LOG, "tfscale.train")
        plugins.validate_names(config)
        plugins.check_launcher(config)
        launching = config.num_processes > 1 and not cluster_env.launched()
        # A launcher refuses a changed configuration before any worker starts; the chief
        # worker then logs the allowed changes, once.
        config_change.check_resume(config, (lambda _: None) if launching else rank_zero.log)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if launching:
        from tfscale.scripts.launcher import launch_workers

        return launch_workers(config)
    # Slurm's time-limit warning may come while TensorFlow loads: keep it for the guard.
    preemption.catch_warning()
    command.import_tensorflow()  # here, once the run is known to be valid
    from tfscale.training import trainer

    try:
        trainer.run(config, plugins.parts(config))
    except TrainingStopped as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as err:
        usage = describe_wrapped_usage_error(err)
        if usage is not None:
            print(f"error: {usage}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        peer = describe_peer_failure(err)
        if peer is None:
            raise
        print(f"error: {peer}", file=sys.stderr, flush=True)
        return EXIT_PEER_LOST
    finally:
        command.skip_the_last_collection()
    return 0


@output.ends_quietly
def _list() -> int:
    print(plugins.describe_all())
    return 0


def entry() -> None:
    define_flags()
    command.absl_help("tfscale.train", __doc__ or "", define_flags.__module__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
