"""The built-in datasets: one module per registered ``--dataset`` name.

Each module has a ``build`` function, declared under its name in :mod:`input_pipelines.registry`;
the registry imports the module when that builder is fetched.
"""
