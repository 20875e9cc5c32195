#!/usr/bin/env bash
# Build (or reuse a cached build of) Horovod 0.28.1 for the venv's TensorFlow.
#
# Horovod 0.28.1 is the last release and its source does not compile against TF 2.21: the XLA
# custom-call op (horovod/tensorflow/xla_mpi_ops.cc) uses XLA headers that TF no longer ships.
# We drop that one file from the CMake source list (and build Release: see below); the remaining
# ops (allreduce, grouped allreduce, broadcast, allgather, process sets) build and work.
# Consequence: Horovod ops cannot run inside an XLA-compiled function (tfscale keeps the
# all-reduce outside jit_compile).
#
# Usage: launch/build_horovod.sh PYTHON     (PYTHON = the venv's interpreter)
#        tfscale-build-horovod [PYTHON]     (installed with tfscale; PYTHON defaults to its own)
# Env:   TFSCALE_WHEEL_CACHE  where built wheels are kept (default ~/.cache/tfscale/wheels)
#        TFSCALE_WITH_MPI=1|0 force MPI support on/off (default: on when mpicxx is found)
set -euo pipefail
PY=${1:?usage: build_horovod.sh PYTHON}
HVD_VERSION=0.28.1
CACHE=${TFSCALE_WHEEL_CACHE:-$HOME/.cache/tfscale/wheels}

with_mpi=${TFSCALE_WITH_MPI:-auto}
if [ "$with_mpi" = auto ]; then
  if command -v mpicxx >/dev/null 2>&1; then with_mpi=1; else with_mpi=0; fi
fi
if [ "$with_mpi" = 1 ] && ! command -v mpicxx >/dev/null 2>&1; then
  echo "[build_horovod] TFSCALE_WITH_MPI=1 but no mpicxx on the PATH (install OpenMPI, or" \
       "module load the site's MPI)" >&2
  exit 1
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "[build_horovod] PYTHON=$PY is not an interpreter; give the environment's python" >&2
  exit 2
fi
tf_version=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) || {
  echo "[build_horovod] $PY cannot import tensorflow; install TensorFlow into that" \
       "environment first (BUILD.md)" >&2
  exit 2
}
py_tag=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
mpi_tag=$([ "$with_mpi" = 1 ] && echo mpi || echo gloo)
# The patch level: 2 since horovodrun's build probe stopped importing TensorFlow (below).
key="horovod-${HVD_VERSION}_tf-${tf_version}_${py_tag}_${mpi_tag}_p2"
dest="$CACHE/$key"

if "$PY" -c "import horovod.common.util as u, horovod.tensorflow as h, sys; sys.exit(0 if hasattr(u, '_extension_for_probe') and h.gloo_built() and (h.mpi_built() or $with_mpi == 0) else 1)" 2>/dev/null; then
  echo "[build_horovod] horovod already installed ($key)"
  exit 0
fi

if ! ls "$dest"/horovod-*.whl >/dev/null 2>&1; then
  echo "[build_horovod] building $key (about 2 minutes on 2 cores)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PY" -m pip download --quiet --no-deps --no-binary=:all: "horovod==${HVD_VERSION}" -d "$work"
  tar -xzf "$work"/horovod-${HVD_VERSION}.tar.gz -C "$work"
  src="$work/horovod-${HVD_VERSION}"
  cml="$src/horovod/tensorflow/CMakeLists.txt"
  grep -q 'xla_mpi_ops.cc' "$cml" || { echo "[build_horovod] expected xla_mpi_ops.cc in $cml" >&2; exit 1; }
  sed -i '/xla_mpi_ops\.cc/d' "$cml"
  # Release, not Horovod's RelWithDebInfo: no debug info, so the build takes 115 s instead of
  # 155 s on 2 cores (Xeon) and the wheel is 1 MB instead of 16 MB.
  grep -q "else 'RelWithDebInfo'" "$src/setup.py" || {
    echo "[build_horovod] expected the RelWithDebInfo build type in $src/setup.py" >&2; exit 1; }
  sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$src/setup.py"
  # horovodrun asks whether Horovod was built with Gloo or MPI by importing horovod.tensorflow,
  # and with it TensorFlow, in a forked process: 3.5 s of CPU per start (Zen 4; 5.5-6.4 s on an
  # AVX2-only EPYC), 0.6 s patched (BUILD.md). Where tfscale is importable (always, beside tfscale-build-horovod) those
  # "built with" probes load the ops library through tfscale.exchange.horovod_runtime's
  # ops_library() instead, without TensorFlow; every other probe imports as before.
  "$PY" - "$src/horovod/common/util.py" <<'PATCH'
import sys
from pathlib import Path

util = Path(sys.argv[1])
text = util.read_text()
probe = "            ext = importlib.import_module('.' + ext_base_name, 'horovod')\n"
if text.count(probe) != 1:
    sys.exit(f"[build_horovod] expected horovodrun's extension probe once in {util}")
util.write_text(text.replace(probe, "            ext = _extension_for_probe(ext_base_name, fn_desc)\n") + """

def _extension_for_probe(ext_base_name, fn_desc):
    # Added by tfscale's launch/build_horovod.sh: see the comment there.
    import importlib
    if ext_base_name == 'tensorflow' and fn_desc.startswith('built with'):
        try:
            from tfscale.exchange.horovod_runtime import ops_library
        except ImportError:
            pass
        else:
            return ops_library()
    return importlib.import_module('.' + ext_base_name, 'horovod')
""")
PATCH
  mpi_env=(HOROVOD_WITHOUT_MPI=1)
  [ "$with_mpi" = 1 ] && mpi_env=(HOROVOD_WITH_MPI=1)
  mkdir -p "$work/wheel"
  # Gloo's CMakeLists asks for CMake 2.8, which CMake 4 refuses to configure; the cmake that
  # set-up installs into the venv (the one an activated venv finds first) is CMake 4.
  # CMAKE_POLICY_VERSION_MINIMUM is CMake 4's way to build it anyway; CMake 3 ignores it.
  env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 "${mpi_env[@]}" \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 \
      "$PY" -m pip wheel --no-deps --no-build-isolation -w "$work/wheel" "$src"
  mkdir -p "$dest"
  cp "$work"/wheel/horovod-*.whl "$dest/"
fi
"$PY" -m pip install --quiet --no-deps --force-reinstall "$dest"/horovod-*.whl
# A wheel with MPI must still have Gloo (horovodrun --gloo, --num_processes use it).
"$PY" -c "import horovod.tensorflow as h, sys; sys.exit(0 if h.gloo_built() and (h.mpi_built() or $with_mpi == 0) else 'installed Horovod lacks Gloo or MPI: delete $dest and rebuild')"
echo "[build_horovod] installed $key"
