#!/usr/bin/env bash
# Installs the Debian packages rvqlm's corpus, tests and benchmarks need, only if missing:
# the built-in corpus (fillets-ng-data-cs, and fillets-ng-data for its dialog transcripts), wav prompts (alsa-utils), ffmpeg (reference codecs),
# chromium + chromium-driver (the listening-report test opens the page in a real browser), espeak-ng (the
# synthetic voices of `rvqlm corpus prepare synthetic`).
set -euo pipefail
need=()
pkgs=(fillets-ng-data-cs fillets-ng-data alsa-utils ffmpeg chromium chromium-driver codec2 espeak-ng)
# --bench: opusenc/opusdec too (the quality benchmark uses ffmpeg's libopus; opus-tools for checks).
[ "${1:-}" = "--bench" ] && pkgs+=(opus-tools)
# --voices: the voices corpus (rvqlm/corpora/voices.py): other speakers and languages for the codec
# (asterisk prompts, hedgewars voice packs).
[ "${1:-}" = "--voices" ] && pkgs+=(asterisk-core-sounds-fr-g722 asterisk-core-sounds-it-g722 \
  asterisk-core-sounds-ru-g722 asterisk-core-sounds-en-g722 asterisk-core-sounds-es-g722 hedgewars-data)
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${need[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
