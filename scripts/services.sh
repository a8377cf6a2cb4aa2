#!/usr/bin/env bash
# Start the local services the tests need (PostgreSQL, Redis) when they are down.
# It only starts what is installed on this machine; it never installs a server.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379 && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null; }

if ! pg_up; then
  echo "services: starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
  fi
  for _ in $(seq 30); do pg_up && break; sleep 1; done
  pg_up || { echo "services: PostgreSQL is not reachable on 127.0.0.1:5432" >&2; exit 1; }
fi

if ! redis_up; then
  echo "services: starting Redis"
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  fi
  for _ in $(seq 20); do redis_up && break; sleep 0.5; done
  redis_up || { echo "services: Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }
fi
echo "services: PostgreSQL and Redis are up"
