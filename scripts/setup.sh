#!/usr/bin/env bash
# Sets up a development environment in .venv on a fresh Linux machine: the CPU build of torch
# (pinned FIRST: an unpinned torch pulls a multi-GB CUDA build) and flight_profiler itself in
# editable mode with its test tools. Safe to run again. On x86-64 attaching needs no gdb (the
# built-in ptrace injector); elsewhere gdb is the fallback and is installed if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -m)" != x86_64 ] && ! command -v gdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq gdb >/dev/null
  else
    echo "gdb is missing: run 'sudo apt-get install -y gdb' (attaching needs it)" >&2
  fi
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0" numpy
.venv/bin/python -m pip install -q -e ".[dev]"
echo "ready: .venv/bin/flight_profiler --help"
