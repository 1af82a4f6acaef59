#!/usr/bin/env bash
# Installs the Debian packages rvqlm's corpus, tests and benchmarks need, only if missing.
set -euo pipefail
need=()
for pkg in fillets-ng-data-cs alsa-utils ffmpeg; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${need[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
