#!/usr/bin/env bash
# Builds the images docker-compose.yml runs, from the repository root, and prints each one's build time and size.
#
#   deploy/build.sh                   # pcl:cpu, pcl-redis:bookworm, pcl-prometheus:bookworm
#   deploy/build.sh gpu               # pcl:gpu (vLLM's CUDA build: ~10 GB)
#   deploy/build.sh cpu redis         # any of: cpu gpu redis prometheus
#
# Environment:
#   PCL_CA_BUNDLE   a CA bundle (PEM) that pip and apt must trust, behind a TLS-intercepting proxy; handed to
#                   the build as the secret `ca_bundle`, never stored in an image layer. Unset: the bundle this
#                   host's pip is configured to trust (PIP_CERT, or pip's `global.cert`), if any
#   TORCH_WHEEL_DIR a directory holding torch-2.13.0+cpu's wheel; copied into deploy/wheels/ (git-ignored) for
#                   the cpu image. Unset: the wheel where this host's pip finds it without an index (its
#                   find-links), else torch from TORCH_INDEX (PyTorch's CPU index by default)
#   TORCH_INDEX     the index for torch in the cpu image
#   BUILD_NETWORK   the network of the build's RUN steps (default: host, which reaches the package mirrors
#                   wherever the host does)
#
# The base, debian:bookworm-slim, is pulled or, where no registry can be reached, built from Debian's packages
# first (deploy/base-images.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(redis prometheus cpu)
declare -A TAGS=([cpu]=pcl:cpu [gpu]=pcl:gpu [redis]=pcl-redis:bookworm [prometheus]=pcl-prometheus:bookworm)
for t in "${targets[@]}"; do
  [ -n "${TAGS[$t]:-}" ] || { echo "build: unknown image '$t' (cpu, gpu, redis, prometheus)" >&2; exit 64; }
done

deploy/base-images.sh

args=(--network "${BUILD_NETWORK:-host}")
pip=(python3 -m pip)
PCL_CA_BUNDLE=${PCL_CA_BUNDLE:-${PIP_CERT:-$("${pip[@]}" config get global.cert 2>/dev/null || true)}}
if [ -n "${PCL_CA_BUNDLE:-}" ]; then
  [ -r "$PCL_CA_BUNDLE" ] || { echo "build: PCL_CA_BUNDLE=$PCL_CA_BUNDLE is not a readable file" >&2; exit 64; }
  args+=(--secret "id=ca_bundle,src=$PCL_CA_BUNDLE")
fi
[ -z "${TORCH_INDEX:-}" ] || args+=(--build-arg "TORCH_INDEX=$TORCH_INDEX")
if [[ " ${targets[*]} " == *" cpu "* ]]; then
  if [ -n "${TORCH_WHEEL_DIR:-}" ]; then
    wheel=$(ls "$TORCH_WHEEL_DIR"/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] || { echo "build: no torch-2.13.0+cpu wheel in TORCH_WHEEL_DIR=$TORCH_WHEEL_DIR" >&2; exit 64; }
    mkdir -p deploy/wheels
    cp -u "$wheel" deploy/wheels/
  elif [ -z "${TORCH_INDEX:-}" ]; then  # no index is asked: only this host's own wheel directories
    "${pip[@]}" download --quiet --no-index --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 -d deploy/wheels "torch==2.13.0+cpu" >/dev/null 2>&1 || true
  fi
  if ls deploy/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    args+=(--build-arg "TORCH_SOURCE=wheels")
    echo "build: torch from $(ls deploy/wheels/torch-2.13.0+cpu-*.whl | head -1)" >&2
  fi
fi

export DOCKER_BUILDKIT=1
for t in "${targets[@]}"; do
  start=$(date +%s)
  docker build -f deploy/Dockerfile --target "$t" -t "${TAGS[$t]}" "${args[@]}" . >&2
  seconds=$(( $(date +%s) - start ))
  size=$(docker image inspect -f '{{.Size}}' "${TAGS[$t]}")
  printf 'build: %-24s %5d s  %7.0f MB\n' "${TAGS[$t]}" "$seconds" "$(awk "BEGIN{print $size/1e6}")"
done
