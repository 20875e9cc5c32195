# Two entry points for a fresh machine (see README.md): `make demo` and `make test`.
PY := .venv/bin/python
# Learning rate: 0.1 per 256 images (Goyal et al.) is ~0.006 for this 16-image global batch;
# given per worker and scaled linearly by the 2 workers, with a short warmup.
DEMO_FLAGS := --model=resnet50 --strategy=horovod --num_processes=2 --batch_size=8 \
              --steps=10 --log_every=2 --learning_rate=0.003 --lr_scaling=linear \
              --warmup_steps=3

.PHONY: setup demo test lint
setup:
	bash launch/setup.sh

demo: setup
	$(PY) -m tfscale.train $(DEMO_FLAGS) --model_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

# The mini-cluster tests run srun --mpi=pmix and mpirun jobs, which need Horovod built with MPI:
# where they can run (as root, with apt-get), the test set-up installs Open MPI and builds it.
test: export TFSCALE_WITH_MPI ?= $(shell [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
                                   && echo 1 || echo auto)
# Two pytest workers, each taking whole files (module fixtures, one mini-cluster); most tests run
# TensorFlow processes, so more workers than cores only adds waiting.
TEST_WORKERS ?= 2
test: setup lint
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
