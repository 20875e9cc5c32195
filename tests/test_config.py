"""Config validation, flags, and the CLI's one-line errors."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import TINY, requires_horovod, run_train
from tfscale.config.train_config import TrainConfig


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"precision": "fp8"}, "--precision='fp8' is not valid; choose one of: fp32, "
                               "mixed_float16, mixed_bfloat16, auto"),
        ({"xla": "yes"}, "--xla='yes' is not valid; choose one of: off, jit, auto"),
        ({"batch_size": 0}, "--batch_size=0 is not valid; expected a value >= 1"),
        ({"num_processes": -1}, "--num_processes=-1 is not valid"),
        ({"learning_rate": 0.0}, "--learning_rate=0.0 is not valid; expected > 0"),
        ({"lr_scaling": "sqrt"}, "choose one of: none, linear"),
        ({"steps": 3, "epochs": 5}, "--steps=3 is fewer than --epochs=5"),
        ({"steps": 10, "warmup_steps": 20}, "--warmup_steps=20 exceeds --steps=10"),
        ({"lr_schedule": "step"}, "--lr_schedule=step needs --lr_decay_steps"),
        ({"lr_schedule": "step", "lr_decay_steps": "10,x"}, "expected comma-separated integers"),
        ({"cpu_replicas": 2}, "--cpu_replicas only applies to --strategy=mirrored"),
        ({"ddl_local_size": 2, "strategy": "horovod"},
         "--ddl_local_size only applies to --strategy=ddl"),
        ({"steps": 0}, "needs a finite dataset"),
    ],
)
def test_bad_values_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        TrainConfig(**changes)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_config_is_frozen_and_defaults_model_dir() -> None:
    cfg = TrainConfig(model="tiny_cnn", strategy="horovod")
    assert cfg.model_dir == "runs/tiny_cnn-synthetic-horovod"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 3  # type: ignore[misc]
    assert cfg.replace(batch_size=8).batch_size == 8
    with pytest.raises(ValueError):
        cfg.replace(batch_size=-8)


def test_flags_round_trip_to_config() -> None:
    from absl import flags

    from tfscale.cli.flags import config_from_flags, define_flags

    values = flags.FlagValues()
    define_flags(values)
    cfg = TrainConfig(model="tiny_cnn", batch_size=7, precision="mixed_bfloat16",
                      deterministic=True, learning_rate=0.25, model_dir="/tmp/x")
    values(["prog", *cfg.to_argv()])
    assert config_from_flags(values) == cfg


@pytest.mark.parametrize(("argv", "binding"), [
    ([], False),                                          # one process: nothing to share
    (["--num_processes=2"], True),                        # local workers share the cores
    (["--num_processes=2", "--nocpu_binding"], False),    # the user's choice wins
    (["--num_processes=1", "--cpu_binding"], True),
    (["--num_processes=3"], False),                       # more workers than the 2 cores
])
def test_local_workers_are_bound_unless_told_otherwise(
        argv: list[str], binding: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from absl import flags

    from tfscale.cli.flags import config_from_flags, define_flags

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    values = flags.FlagValues()
    define_flags(values)
    values(["prog", "--strategy=horovod", *argv])
    assert config_from_flags(values).cpu_binding is binding


@pytest.mark.parametrize(("argv", "steps"), [
    ([], 100),                                          # synthetic data: 100 steps
    (["--dataset=imagenet", "--data_dir=/d"], 0),      # files: --epochs passes over them
    (["--dataset=imagenet", "--data_dir=/d", "--epochs=10"], 0),
    (["--dataset=imagenet", "--data_dir=/d", "--steps=40"], 40),  # given: as given
    (["--dataset=imagenet", "--data_dir=/d", "--steps=100"], 100),
])
def test_steps_default_to_whole_epochs_over_files(argv: list[str], steps: int) -> None:
    from absl import flags

    from tfscale.cli.flags import config_from_flags, define_flags

    values = flags.FlagValues()
    define_flags(values)
    values(["prog", *argv])
    assert config_from_flags(values).steps == steps


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model=resnet51"], "error: unknown model 'resnet51'; available: "),
        (["--dataset=imagenet2"], "error: unknown dataset 'imagenet2'; available: "),
        (["--strategy=magic"], "error: unknown strategy 'magic'; available: "),
        (["--batch_size=-2"], "error: --batch_size=-2 is not valid; expected a value >= 1"),
        (["--num_processes=2"], "error: --strategy=default runs in one process"),
        (["--model=deeplabv3plus_tiny"], "error: --model=deeplabv3plus_tiny is a segmentation "
                                         "model but --dataset=synthetic is classification data"),
        (["--class_weights=1,2"], "error: --class_weights='1,2' has 2 weights [1.0, 2.0] but "
                                  "--num_classes=4"),
    ],
)
def test_cli_rejects_bad_flags_with_one_line(flags: list[str], expected: str) -> None:
    proc = run_train(*TINY, *flags, "--steps=1", timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(expected), proc.stderr
    assert "Traceback" not in proc.stderr
    if "unknown model" in expected:
        assert "resnet50" in lines[-1] and "tiny_cnn" in lines[-1]


def test_cli_lists_plugins() -> None:
    proc = run_train("--list", timeout=120)
    assert proc.returncode == 0
    for name in ("resnet50", "tiny_cnn", "synthetic", "default", "horovod"):
        assert name in proc.stdout


@pytest.mark.parametrize(("strategy", "warning"), [
    pytest.param("horovod", "--strategy=horovod is running as a single worker; start it with "
                 "--num_processes N", marks=requires_horovod),
    ("multiworker", "--strategy=multiworker without TF_CONFIG runs as a single worker; use "
                    "--num_processes N"),
])
def test_multi_process_strategy_without_launcher_warns(strategy: str, warning: str,
                                                       tmp_path: object) -> None:
    proc = run_train(*TINY, f"--strategy={strategy}", "--steps=1", f"--model_dir={tmp_path}",
                     timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert warning in proc.stderr


def test_horovod_knobs_under_another_strategy_warn() -> None:
    from tfscale.cli.plugins import validate_names

    with pytest.warns(UserWarning, match=r"--fp16_allreduce, --cycle_time_ms only affect the "
                                         r"strategies that read them \(ddl, horovod\); "
                                         "--strategy=multiworker ignores them"):
        validate_names(TrainConfig(model="tiny_cnn", strategy="multiworker", fp16_allreduce=True,
                                   cycle_time_ms=20.0))
