#!/usr/bin/env bash
# The base image of every PCL image, debian:bookworm-slim, pulled from its registry; where the registry cannot
# be reached, built from Debian's own packages instead (debootstrap, minbase variant, bookworm) and tagged the
# same, so that `docker build` and `docker compose build` find it. The stand-in holds what the official image
# holds: a minimal Debian bookworm with apt and dpkg; all else (Python, Redis, Prometheus) comes from Debian's
# packages in the image builds.
#
#   deploy/base-images.sh                 # pull, else build the stand-in (as root: debootstrap needs it)
#   DEBIAN_MIRROR=http://mirror/debian deploy/base-images.sh
#
# Nothing is done when the image is already present.
set -euo pipefail

IMAGE=${BASE_IMAGE:-debian:bookworm-slim}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base-images: $IMAGE present"
  exit 0
fi
if docker pull "$IMAGE" >/dev/null 2>&1; then
  echo "base-images: $IMAGE pulled"
  exit 0
fi
echo "base-images: $IMAGE cannot be pulled; building it from Debian $SUITE packages ($MIRROR)"
command -v debootstrap >/dev/null || { echo "base-images: debootstrap is needed (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "base-images: debootstrap needs root" >&2; exit 1; }

root=$(mktemp -d /tmp/pcl-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What the slim image leaves out: package lists, caches, documentation and locales (dpkg excludes them from
# later installs too, as in the official image).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
  "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SUITE" >"$root/etc/apt/sources.list"
tar -C "$root" -c . | docker import \
  --change 'CMD ["bash"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --message "Debian $SUITE minbase, built by deploy/base-images.sh" - "$IMAGE" >/dev/null
echo "base-images: $IMAGE built from Debian packages in $(( $(date +%s) - start )) s"
