"""The commands: each entry point and its flags, the only code that reads absl ``FLAGS``.

``python -m tfscale.train`` (:mod:`~tfscale.cli.train`), ``tfscale-run``
(:mod:`~tfscale.cli.run`), ``tfscale.sweep``, ``tfscale.predict``, ``tfscale.forecast`` and
the job scripts' ``tfscale.cluster.environment --tf_config``. Only this package assembles a run
from the registries of what it trains (:mod:`tfscale.cli.plugins`: ``models``,
``input_pipelines``); the library below it never imports them. The ``python -m tfscale.NAME``
forms keep their names (:mod:`tfscale`'s module aliases).
"""
