#!/usr/bin/env bash
# Installs what libgdn needs to build and test, from Debian's packages (and PyPI for the Python
# parts). Does nothing when everything is already there. Needs root (or sudo) for apt-get.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libfmt-dev catch2 nlohmann-json3-dev pybind11-dev
  libpcre2-dev libutf8proc-dev zlib1g-dev
)

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
