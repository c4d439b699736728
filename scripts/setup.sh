#!/usr/bin/env bash
# Installs what libwkv needs to build and test on Debian, and nothing that is already there.
# Idempotent: a second run installs nothing. Run as root (or with sudo available).
set -euo pipefail

packages=(cmake g++ make pkg-config doctest-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
