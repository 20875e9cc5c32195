"""Plugins' own options (tfscale/config/options.py): declarations, flags, configs, a dataset's
option.

The strategy plugin's option, from an installed package, is tested in test_registry.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from absl import flags

import input_pipelines  # registers the datasets' options
from tfscale.cli.flags import config_from_flags, define_flags
from tfscale.config.options import Option, merge
from tfscale.config.train_config import TrainConfig


def parse(*argv: str) -> TrainConfig:
    values = flags.FlagValues()
    define_flags(values)
    values(["train", *argv])
    return config_from_flags(values)


def test_strategy_options_live_in_config_options_by_name() -> None:
    cfg = TrainConfig(strategy="horovod", fusion_threshold_mb=8, steps=5)
    assert cfg.options["fusion_threshold_mb"] == 8.0 and cfg.options["node_exchange"] == "auto"
    assert "cpu_replicas" not in cfg.options  # mirrored's, at its default
    flat = cfg.to_dict()
    assert flat["fusion_threshold_mb"] == 8.0 and "options" not in flat
    assert TrainConfig(**flat) == cfg and hash(TrainConfig(**flat)) == hash(cfg)
    moved = cfg.replace(strategy="ddl", ddl_local_size=2)
    assert moved.options["ddl_local_size"] == 2 and moved.options["fusion_threshold_mb"] == 8.0
    assert parse("--strategy=horovod", "--fusion_threshold_mb=8", "--steps=5") == cfg
    with pytest.raises(ValueError, match=r"--ddl_local_size only applies to --strategy=ddl"):
        cfg.replace(ddl_local_size=2)
    with pytest.raises(ValueError, match=r"--ddl_local_size=-1 is not valid; expected a value "
                                         r">= 0"):
        TrainConfig(strategy="ddl", ddl_local_size=-1)
    with pytest.raises(ValueError, match=r"--collective='mpi' is not valid; choose one of: "
                                         r"auto, ring, nccl"):
        TrainConfig(strategy="multiworker", collective="mpi")
    with pytest.raises(ValueError, match=r"unknown option 'fusion_mb'"):
        TrainConfig(fusion_mb=8)


def test_one_name_declared_twice_differently_is_refused() -> None:
    first = Option("knob", 1, "a knob")
    assert merge([first, Option("knob", 1, "a knob")]) == {"knob": first}
    with pytest.raises(ValueError, match=r"option --knob is declared twice, differently"):
        merge([first, Option("knob", 2, "a knob")])


def test_dataset_option_is_a_flag_refused_with_another_dataset(tmp_path: object) -> None:
    cfg = parse("--synthetic_batches=2")
    assert cfg.options["synthetic_batches"] == 2
    assert "--synthetic_batches=2" in cfg.to_argv()
    values = flags.FlagValues()
    define_flags(values)
    assert ("options of --dataset=synthetic:\n  --synthetic_batches: synthetic: distinct "
            "batches") in values.get_help()
    with pytest.raises(ValueError, match=r"--synthetic_batches only applies to "
                                         r"--dataset=synthetic"):
        parse("--dataset=imagenet", f"--data_dir={tmp_path}", "--synthetic_batches=2")
    with pytest.raises(ValueError, match=r"--synthetic_batches=0 is not valid; expected a value "
                                         r">= 1"):
        parse("--synthetic_batches=0")


def test_synthetic_batches_reach_the_pipeline() -> None:
    from tfscale.cluster.shard import Shard

    build = input_pipelines.PIPELINES.get("synthetic")

    def first_batches(**options: int) -> list[np.ndarray]:
        cfg = TrainConfig(image_size=4, num_classes=3, **options)
        batches = build(cfg, Shard(0, 1, 0, 1), "train", 2).dataset
        return [images.numpy() for images, _ in batches.take(3)]

    two = first_batches(synthetic_batches=2)
    assert np.array_equal(two[0], two[2]) and not np.array_equal(two[0], two[1])
    four = first_batches()
    assert not np.array_equal(four[0], four[2])
