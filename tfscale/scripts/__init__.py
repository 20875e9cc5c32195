"""What users' own scripts use: ``tfscale.prepare`` and ``tfscale.setup``
(:mod:`~tfscale.scripts.prepare`), Horovod's API over tfscale's exchange
(:mod:`~tfscale.scripts.horovod_api`, whose public face is :mod:`tfscale.horovod`) and
tfscale's own launcher of local workers (:mod:`~tfscale.scripts.launcher`, behind ``tfscale-run``
and ``tfscale.train --num_processes``).
"""
