"""The built-in datasets: one module per registered ``--dataset`` name.

Each module registers one pipeline builder with :func:`input_pipelines.register`; the registry
imports them on its first lookup.
"""
