#!/usr/bin/env bash
# Set up rltrain from a checkout in one command: a virtual environment, the CPU build of torch, then rltrain
# (editable) with every extra, the test tools and the documentation tools.
#
#   bash scripts/install.sh            # into .venv (made if absent), then: . .venv/bin/activate
#   bash scripts/install.sh DIR        # into the virtual environment DIR (CI: .ci-venv)
#
# torch is installed first and pinned, so that resolving the extras can never pull a multi-GB CUDA build;
# on a GPU machine install the CUDA wheel of the same version into the venv instead (pip's own index).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q torch==2.13.0
"$venv/bin/python" -m pip install -q -e ".[all,dev,docs]"
echo "rltrain installed in $venv: activate it with '. $venv/bin/activate', then run 'rltrain'"
