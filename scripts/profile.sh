#!/bin/bash
# Instruction counts of the hot path, repeatable on a noisy machine: runs redis-server under
# callgrind (counting only inside Redis's call(), i.e. command execution) while N fresh-key
# pairs of three workloads arrive through redis-cli --pipe, one callgrind dump each:
#   cg.out.1  LOCK.ACQUIRE key owner 60000 [OPTS] + LOCK.RELEASE key owner
#   cg.out.2  SET key token NX PX 60000 + EVALSHA <compare-and-delete> 1 key token
#   cg.out.3  SET key v + DEL key (the floor)
# and prints instructions per call of each command.
#   make build && N=20000 bash scripts/profile.sh
#   WARM=0 bash scripts/profile.sh   (no warm-up pass: see below)
#   OPTS=EPHEMERAL bash scripts/profile.sh     (options added to every LOCK.ACQUIRE)
#   callgrind_annotate --inclusive=yes <dir printed at the end>/cg.out.1 | less
# With WARM=1 (the default) every workload runs once unmeasured first. N fresh keys fall in
# nearly every one of the 16,384 slots, so without it most acquires are the first of their
# slot and reserve its token window (a counter key written and replicated), which a running
# server does about once a second per slot; WARM=0 measures that cold start (the figures the
# issues before #19 quoted).
# (apt-get install valgrind if missing.)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mod=${MOD:-$here/target/release/libredis_lock.so}
d=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
N=${N:-20000}
WARM=${WARM:-1}
python3 - "$N" "$d" "${OPTS:-}" <<'PY'
import hashlib, sys
n, out, opts = int(sys.argv[1]), sys.argv[2], sys.argv[3].split()
cad = "if redis.call('get',KEYS[1]) == ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end"
sha = hashlib.sha1(cad.encode()).hexdigest()
def resp(*args):
    return "*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)
with open(out + "/load.txt", "w") as f:
    f.write(resp("SCRIPT", "LOAD", cad))
with open(out + "/lock.txt", "w") as f:
    f.write("".join(resp("LOCK.ACQUIRE", "lk:%d" % i, "owner", "60000", *opts)
                    + resp("LOCK.RELEASE", "lk:%d" % i, "owner") for i in range(n)))
with open(out + "/cad.txt", "w") as f:
    f.write("".join(resp("SET", "ck:%d" % i, "owner-token", "NX", "PX", "60000")
                    + resp("EVALSHA", sha, "1", "ck:%d" % i, "owner-token") for i in range(n)))
with open(out + "/set.txt", "w") as f:
    f.write("".join(resp("SET", "sk:%d" % i, "v") + resp("DEL", "sk:%d" % i) for i in range(n)))
PY
valgrind --tool=callgrind --callgrind-out-file=$d/cg.out --toggle-collect='call' redis-server --port $port --save "" --dir $d --loadmodule $mod >/dev/null 2>$d/vg.log &
vp=$!
for i in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.2; done
redis-cli -p $port --pipe < $d/load.txt >/dev/null
if [ "$WARM" = 1 ]; then
  for w in lock cad set; do redis-cli -p $port --pipe < $d/$w.txt >/dev/null; done
fi
callgrind_control -z $vp >/dev/null 2>&1
for w in lock cad set; do
  redis-cli -p $port --pipe < $d/$w.txt >/dev/null
  callgrind_control -d $vp >/dev/null 2>&1
done
redis-cli -p $port shutdown nosave >/dev/null 2>&1 || true
wait $vp || true
# Instructions per call: each command's inclusive count in its workload's dump, over N.
per_call() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk -v fn="$2" -v n="$N" '!done && $0 ~ fn { gsub(",", "", $1); printf "%.0f", $1 / n; done = 1 }'
}
acquire=$(per_call $d/cg.out.1 'acquire::acquire \[')
release=$(per_call $d/cg.out.1 'release::release \[')
lock_pair=$(per_call $d/cg.out.1 ':call \[')
set_nx=$(per_call $d/cg.out.2 ':setCommand \[')
cad=$(per_call $d/cg.out.2 ':evalShaCommand \[')
cad_pair=$(per_call $d/cg.out.2 ':call \[')
set_del=$(per_call $d/cg.out.3 ':call \[')
echo "instructions per call (N=$N, WARM=$WARM${OPTS:+, OPTS=$OPTS}):"
echo "  LOCK.ACQUIRE $acquire  LOCK.RELEASE $release  pair (all of call()) $lock_pair"
echo "  SET NX PX $set_nx  EVALSHA compare-and-delete $cad  pair $cad_pair"
echo "  SET+DEL pair $set_del"
python3 -c "print('  lock pair / SET NX PX + CAD pair = %.2f' % ($lock_pair / $cad_pair))"
echo "callgrind output: $d/cg.out.{1,2,3}"
