"""Placeholder; absl's --help prints the command's own docstring (tfscale.forecast.cli)."""

from tfscale.forecast import cli

__doc__ = cli.__doc__

if __name__ == "__main__":
    cli.entry()
