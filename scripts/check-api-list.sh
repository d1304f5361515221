#!/usr/bin/env bash
# `make lint`: the Redis API functions the module calls through `api!(...)` and the list that
# `ffi::required_api_present` checks at load must be the same set, so that a server missing one
# is refused at load instead of failing a call later, and no missing function refuses it for
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
used=$(grep -rhoE 'api!\(RedisModule_[A-Za-z0-9_]+\)' src | sed 's/api!(//; s/)//' | sort -u)
listed=$(grep -oE 'raw::RedisModule_[A-Za-z0-9_]+ \}\.is_some' src/ffi/mod.rs | sed 's/raw:://; s/ }\.is_some//' | sort -u)
missing=$(comm -23 <(echo "$used") <(echo "$listed"))
unused=$(comm -13 <(echo "$used") <(echo "$listed"))
if [ -n "$missing$unused" ]; then
  [ -z "$missing" ] || echo "check-api-list: called but not checked at load: $missing" >&2
  [ -z "$unused" ] || echo "check-api-list: checked at load but never called: $unused" >&2
  exit 1
fi
echo "check-api-list: $(echo "$used" | wc -l) API functions, each called and checked at load"
