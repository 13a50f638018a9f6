#!/bin/sh
# Redis for the PCL service: the password is required (REDIS_PASSWORD) and reaches redis-server through a config
# file only the redis user can read, never its command line (visible to every process list on the host); the
# memory cap (REDIS_MAXMEMORY, e.g. 2gb) with noeviction: the work streams must never lose an entry to eviction,
# so a full Redis refuses writes and the run fails with Redis's OOM error instead. Further arguments go to
# redis-server as they are.
set -eu
: "${REDIS_PASSWORD:?REDIS_PASSWORD is required: the password Redis asks for (and REDIS_URL carries)}"
case "$REDIS_PASSWORD" in
  *[!A-Za-z0-9._~-]*)
    echo "redis-entrypoint: REDIS_PASSWORD may hold only letters, digits and . _ ~ - (it travels in REDIS_URL);" \
         "generate one with: openssl rand -hex 24" >&2
    exit 64 ;;
esac
if [ "${#REDIS_PASSWORD}" -lt 16 ]; then
  echo "redis-entrypoint: REDIS_PASSWORD is shorter than 16 characters" >&2
  exit 64
fi
: "${REDIS_MAXMEMORY:?REDIS_MAXMEMORY is required (e.g. 2gb): Redis's memory cap}"
conf=$(mktemp /tmp/redis-pcl.XXXXXX)
chmod 600 "$conf"
printf 'requirepass %s\nmaxmemory %s\nmaxmemory-policy noeviction\n' "$REDIS_PASSWORD" "$REDIS_MAXMEMORY" >"$conf"
unset REDIS_PASSWORD
exec redis-server "$conf" "$@"
