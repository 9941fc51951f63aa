#!/usr/bin/env bash
# Create (or reuse) the project's main virtual environment in .venv: idist editable with its
# dev tools. torch is pinned to the CPU build first, so that nothing pulls a multi-GB CUDA
# build. The packages live in a venv shared by every clone of idist on this machine and
# built once (~/.cache/idist/venvs, scripts/layered_venv.py); .venv reads them and holds this
# clone's idist. Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
# idist's dependencies and its dev extra, from pyproject.toml (idist itself goes into .venv only)
deps=$("$PY" -c '
import shlex, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(shlex.join([*project["dependencies"], *project["optional-dependencies"]["dev"]]))
')
"$PY" scripts/layered_venv.py "${IDIST_VENV:-.venv}" main --pip "torch==2.13.0" --pip "$deps" >/dev/null
