#!/bin/bash
# Instruction counts of the hot path, repeatable on a noisy machine: runs redis-server under
# callgrind (counting only inside Redis's call(), i.e. command execution) while N fresh-key
# LOCK.ACQUIRE+LOCK.RELEASE pairs and then N SET+DEL pairs arrive through redis-cli --pipe.
#   make build && N=100000 bash scripts/profile.sh
#   OPTS=EPHEMERAL bash scripts/profile.sh     (options added to every LOCK.ACQUIRE)
#   callgrind_annotate --inclusive=yes <dir printed at the end>/cg.out | less
# (apt-get install valgrind if missing.)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mod=${MOD:-$here/target/release/libredis_lock.so}
d=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
N=${N:-20000}
# The two workloads as RESP, one file each: N fresh-key lock pairs, N fresh-key SET+DEL pairs.
python3 - "$N" "$d" "${OPTS:-}" <<'PY'
import sys
n, out, opts = int(sys.argv[1]), sys.argv[2], sys.argv[3].split()
def resp(*args):
    return "*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)
with open(out + "/lock.txt", "w") as f:
    f.write("".join(resp("LOCK.ACQUIRE", "lk:%d" % i, "owner", "60000", *opts)
                    + resp("LOCK.RELEASE", "lk:%d" % i, "owner") for i in range(n)))
with open(out + "/set.txt", "w") as f:
    f.write("".join(resp("SET", "sk:%d" % i, "v") + resp("DEL", "sk:%d" % i) for i in range(n)))
PY
valgrind --tool=callgrind --callgrind-out-file=$d/cg.out --toggle-collect='call' redis-server --port $port --save "" --dir $d --loadmodule $mod >/dev/null 2>$d/vg.log &
vp=$!
for i in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.2; done
redis-cli -p $port --pipe < $d/lock.txt >/dev/null
redis-cli -p $port --pipe < $d/set.txt >/dev/null
redis-cli -p $port info commandstats | grep -E "lock|cmdstat_set|cmdstat_del"
redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true
wait $vp || true
echo "callgrind output: $d/cg.out"
