"""``python -m tfscale.forecast``: the command is :mod:`tfscale.cli.forecast` (absl's --help
prints its docstring)."""

from tfscale.cli import forecast

__doc__ = forecast.__doc__

if __name__ == "__main__":
    forecast.entry()
