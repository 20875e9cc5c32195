"""Which strategy a user's own script runs under, read from how it was started.

``tfscale-run --strategy=NAME`` tells its workers with ``TFSCALE_STRATEGY``. A script started
by another launcher gets the strategy that launcher starts: a TF_CONFIG cluster is
``multiworker``'s, several ranks of Horovod, MPI or a cluster launcher are ``horovod``'s, and a
plain ``python script.py`` is the default strategy's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tfscale.cluster import environment as cluster_env
from tfscale.strategies.default import DEFAULT_STRATEGY

STRATEGY_VARIABLE = "TFSCALE_STRATEGY"


def launched_strategy(environ: Mapping[str, str] = os.environ) -> str:
    """The name of the strategy this process was started for (see the module docstring).

    Raises:
        ValueError: when a launcher's variables are malformed (naming them).
    """
    named = environ.get(STRATEGY_VARIABLE, "").strip()
    if named:
        return named
    if "TF_CONFIG" in environ:
        return "multiworker"
    if cluster_env.detect(environ).size > 1:
        return "horovod"
    return DEFAULT_STRATEGY
