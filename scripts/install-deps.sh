#!/usr/bin/env bash
# Installs what libgdn needs to build and test, from Debian's packages (and PyPI for the Python
# parts; cpp-httplib, curl and openai are for gdn serve and its tests). Does nothing when everything
# is already there. Needs root (or sudo) for apt-get.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libfmt-dev catch2 nlohmann-json3-dev pybind11-dev
  libpcre2-dev libutf8proc-dev zlib1g-dev
  libcpp-httplib-dev curl
)

# The Python tests build the module with the python3 on PATH: it needs venv and its C headers.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then packages+=(python3-venv); fi
if ! python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
    >/dev/null 2>&1; then packages+=(python3-dev); fi

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python packages for the module's build and the Python tests, from PyPI, in the project's own
# virtual environment .venv (tests/interfaces.cmake uses its interpreter; GDN_PYTHON overrides).
cd "$(dirname "$0")/.."
# openai: the official client, which gdn serve's tests (tests/serve/test_server.py) talk to the server with.
python_packages=("numpy>=1.21" "pytest>=7" "scikit-build-core>=0.10" "pybind11>=2.10" "openai>=1.0")
if ! .venv/bin/python -c 'import numpy, pytest, scikit_build_core, pybind11, openai' >/dev/null 2>&1; then
  echo "install-deps: setting up .venv with ${python_packages[*]}"
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${python_packages[@]}"
fi
