#!/usr/bin/env bash
# Install (or reuse) the real engine's environment: SGLang 0.5.23 on CPU, for the real-engine lane.
#
# Why here and not in the project's venv: the engine is a 7 GB install (torch's CUDA build runs on
# CPU; PyPI has no CPU-only torch) that only its own process imports. It lands in a cache directory
# outside the checkout, named after the pinned requirements, so a fresh clone reuses it and a change
# of pins installs beside it.
#
# Usage: hack/engine-env.sh      # prints the environment's directory on stdout (its python: bin/python)
# Env:   GENRM_CACHE             cache root (default ~/.cache/genrm-operator)
set -euo pipefail

SGLANG_VERSION=0.5.23
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/sglang_engine/requirements.txt"
PINS="$HERE/sglang_engine/constraints.txt"
log() { printf '[engine-env] %s\n' "$*" >&2; }

CACHE="${GENRM_CACHE:-$HOME/.cache/genrm-operator}"
KEY="$( (echo "$SGLANG_VERSION"; cat "$REQS" "$PINS") | sha1sum | cut -c1-10)"
OUT="$CACHE/engine/sglang-$SGLANG_VERSION-$KEY"
mkdir -p "$CACHE/engine"
exec 9>"$CACHE/engine/.install.lock"
flock 9
if [[ -f "$OUT/.installed" ]]; then log "reuse $OUT"; echo "$OUT"; exit 0; fi

rm -rf "$OUT"
start=$SECONDS
log "installing sglang==$SGLANG_VERSION into $OUT (about 7 GB; minutes on a cold package cache)"
python3 -m venv "$OUT"
"$OUT/bin/python" -m pip install -q -U pip
# Binary wheels only: a source build of any of these would take longer than the whole lane.
"$OUT/bin/python" -m pip install -q --only-binary=:all: -r "$REQS" -c "$PINS" \
  || { log "the engine's requirements did not install (above); the real-engine lane cannot run"; exit 1; }
"$OUT/bin/python" -m pip install -q --no-deps "sglang==$SGLANG_VERSION" \
  || { log "sglang==$SGLANG_VERSION did not install (above)"; exit 1; }
touch "$OUT/.installed"
# Environments of other pins are of no further use to this checkout; 7 GB each.
for old in "$CACHE"/engine/sglang-*; do
  [[ "$old" != "$OUT" && -d "$old" ]] && { log "removing $old (other pins)"; rm -rf "$old"; }
done
log "installed in $((SECONDS - start))s ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
