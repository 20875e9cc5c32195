#!/usr/bin/env bash
# Idempotent set-up: .venv with the pinned stack, the dev tools, Horovod built from source, and
# tfscale itself installed editable (an activated .venv runs tfscale from any directory).
# Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ "${TFSCALE_WITH_MPI:-0}" = 1 ] && ! command -v mpicxx >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    echo "[setup] TFSCALE_WITH_MPI=1 needs an MPI compiler wrapper (mpicxx); load or install" \
         "one first (e.g. module load openmpi)" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "[setup] installing OpenMPI from Debian's packages"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(cat requirements.txt requirements-dev.txt requirements-data.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing requirements (TensorFlow is ~250 MB, first time only)"
  .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel cmake
  # Not --quiet: pip's download lines and progress bars show where the minutes go.
  .venv/bin/python -m pip install -r requirements.txt -r requirements-dev.txt
  # Data packages off the import path (why: requirements-data.txt).
  .venv/bin/python -m pip install --quiet --no-deps --upgrade --target .venv/data-packages \
    -r requirements-data.txt
  echo "$want" > "$stamp"
fi
launch/build_horovod.sh "$PWD/.venv/bin/python"
# tfscale itself, editable: its packages and commands (tfscale-train, ...) from this checkout.
# Again when pyproject.toml changes (new commands) or .venv imports tfscale from elsewhere.
project_stamp=.venv/.project.sha
project_want=$(sha256sum pyproject.toml | cut -d' ' -f1)
here=$(pwd -P)
imported_from=$(cd / && "$here/.venv/bin/python" -c \
  'import os, tfscale; print(os.path.dirname(os.path.dirname(os.path.realpath(tfscale.__file__))))' \
  2>/dev/null || true)
if [ "$(cat "$project_stamp" 2>/dev/null)" != "$project_want" ] || [ "$imported_from" != "$here" ]; then
  echo "[setup] installing tfscale into .venv (pip install --editable .)"
  .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation --editable .
  echo "$project_want" > "$project_stamp"
fi
# The shared-memory exchange's TensorFlow op, compiled once per TensorFlow and source into
# ~/.cache/tfscale/native (tfscale.exchange.native; it would otherwise build on first use).
# Without it the exchange runs in tf.numpy_function, slower but the same sums.
if ! .venv/bin/python -m tfscale.exchange.native 2>/dev/null >/dev/null; then
  echo "[setup] the shared-memory exchange's op did not build: it runs in tf.numpy_function" \
       "(python -m tfscale.exchange.native says why)"
fi
