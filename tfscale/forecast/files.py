"""The forecast's JSON inputs: a shipped file named by its short name, or any path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def resolve(flag: str, name_or_path: str, folder: Path, prefix: str = "",
            kind: str = "name") -> Path:
    """``--FLAG``'s file: the path given (a ``.json`` name or an existing file), else the
    shipped ``folder/PREFIX<name>.json``.

    Raises:
        ValueError: naming the flag's value, and the shipped names when it is neither.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ValueError(f"--{flag}={name_or_path}: no such file")
        return path
    shipped = folder / f"{prefix}{name_or_path}.json"
    if not shipped.is_file():
        names = sorted(p.stem.removeprefix(prefix) for p in folder.glob(f"{prefix}*.json"))
        raise ValueError(f"--{flag}={name_or_path}: no such file or {kind}; shipped: "
                         f"{', '.join(names) or 'none yet'} (or give a JSON file)")
    return shipped


def read(flag: str, path: Path) -> Any:
    """The JSON document of ``path``.

    Raises:
        ValueError: naming the flag and the file, for an unreadable file or invalid JSON.
    """
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"--{flag}={path}: {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"--{flag}={path}: not valid JSON: {err}") from err
