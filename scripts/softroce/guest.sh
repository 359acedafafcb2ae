#!/bin/bash
# Runs INSIDE the Soft-RoCE VM as root (started by run.sh through vng --exec):
# sets up rxe on the VM's NIC with four IP aliases, then runs the job.
#   guest.sh <run folder> <single|0|1>
# Every process start costs 50-80 ms under emulation: bash builtins where
# they are easy.
set -u
OUT=$1
ROLE=$2
IDX=${ROLE/single/0}
date +%s.%N >"$OUT/timing.start.$IDX"
say() { echo "softroce[vm$IDX]: $*"; }
setup_failed() { say "setup failed: $*"; echo 125 >"$OUT/rc.$IDX"; exit 125; }

case $ROLE in
  single|0) ALIASES=(192.168.50.1 192.168.50.2 192.168.50.3 192.168.50.4)
            PEER_ALIASES=(192.168.50.11 192.168.50.12 192.168.50.13 192.168.50.14) ;;
  1)        ALIASES=(192.168.50.11 192.168.50.12 192.168.50.13 192.168.50.14)
            PEER_ALIASES=(192.168.50.1 192.168.50.2 192.168.50.3 192.168.50.4) ;;
esac

ulimit -l unlimited || setup_failed "ulimit -l unlimited"
modprobe rdma_rxe && modprobe ib_uverbs && modprobe rdma_ucm || setup_failed "modprobe rdma_rxe ib_uverbs rdma_ucm"

NIC=
for n in /sys/class/net/*; do n=${n##*/}; [ "$n" != lo ] && { NIC=$n; break; }; done
[ -n "$NIC" ] || setup_failed "the VM has no NIC"
ip link set "$NIC" up || setup_failed "ip link set $NIC up"
for a in "${ALIASES[@]}"; do ip addr add "$a/24" dev "$NIC" || setup_failed "ip addr add $a"; done
rdma link add rxe0 type rxe netdev "$NIC" || setup_failed "rdma link add rxe0 type rxe netdev $NIC"

# rxe fills its GID table from the netdev's addresses asynchronously: wait
# until every alias has its RoCEv2 GID (::ffff:a.b.c.d).
P=/sys/class/infiniband/rxe0/ports/1
gid_of() { local a b c d; IFS=. read -r a b c d <<<"$1"; printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"; }
have_gids() {
  local want g v t i found
  for want in "${ALIASES[@]}"; do
    want=$(gid_of "$want"); found=0
    for g in "$P"/gids/*; do
      read -r v <"$g" 2>/dev/null || continue
      [ "$v" = "$want" ] || continue
      i=${g##*/}; read -r t <"$P/gid_attrs/types/$i" 2>/dev/null || continue
      [ "$t" = "RoCE v2" ] && { found=1; break; }
    done
    [ $found = 1 ] || return 1
  done
}
for i in $(seq 100); do have_gids && break; sleep 0.1; done
have_gids || setup_failed "rxe0 has no RoCEv2 GID for every alias (${ALIASES[*]})"
say "rxe0 on $NIC, vNICs ${ALIASES[*]}, kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s"

# shellcheck source=/dev/null
source "$OUT/job.sh" || setup_failed "cannot read $OUT/job.sh"
join() { local IFS=,; echo "$*"; }
export MAESTRO_VNICS=$(join "${ALIASES[@]}")
export MAESTRO_SOFTROCE_OUT=$OUT
export MAESTRO_SOFTROCE_NIC=$NIC  # tests may take an alias down and up again
if [ "$ROLE" != single ]; then
  export MAESTRO_VM_INDEX=$IDX
  export MAESTRO_PEER_VNICS=$(join "${PEER_ALIASES[@]}")
fi

start=$(date +%s.%N)
timeout --kill-after=5 "$SOFTROCE_TIMEOUT" "${SOFTROCE_CMD[@]}"
rc=$?
end=$(date +%s.%N)
echo "$end $start" | awk '{ printf "%.1f\n", $1 - $2 }' >"$OUT/timing.cmd.$IDX"
[ $rc = 124 ] && say "the command ran past ${SOFTROCE_TIMEOUT} s"
say "command exit $rc"
echo $rc >"$OUT/rc.$IDX"
exit $rc
