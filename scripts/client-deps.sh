#!/usr/bin/env bash
# Installs what `make test-clients` needs, only when missing: Debian's packages of the client
# libraries that docs/clients.md covers beyond redis-py and the Node ones (Go with redigo and
# go-redis v5, Ruby with redis-rb, PHP with predis and phpredis, Perl's Redis), and python3's
# venv for valkey-glide (pip installs it into tests/clients/python/.venv: see tests/clients/run.sh).
set -euo pipefail

packages=(golang-go golang-github-gomodule-redigo-dev golang-gopkg-redis.v5-dev ruby ruby-redis
  php-cli php-predis php-redis libredis-perl)
need=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)

if ((${#need[@]})); then
  echo "client-deps: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
