#!/usr/bin/env bash
# Soft-RoCE harness: run a command inside a QEMU VM that has a real RDMA stack
# (rdma_rxe on a virtio NIC), for the verbs transport's tests.
#
#   scripts/softroce/run.sh [options] -- <command> [args...]
#
#   --two-vms        boot two VMs whose NICs are joined by a QEMU UDP socket
#                    "wire" (on host loopback) and run the command in both, so
#                    packets go between two RDMA devices (in one VM rxe
#                    short-cuts to itself). See "two VMs" below.
#   --timeout SEC    limit for the command inside the VM (default 420), from
#                    its start; the whole run is bounded by SEC + the boot
#                    allowance (SOFTROCE_BOOT_ALLOWANCE, default 600 s): an
#                    emulated boot takes 18-44 s on an idle host and took
#                    508 s beside the Python suites and the sanitizer builds.
#   --mem SIZE       VM memory (default 2G, 1G each with --two-vms).
#   --out DIR        host folder the guest may write to (default: a fresh
#                    scripts/softroce/.cache/runs/<stamp>); the console log
#                    goes there too.
#   --no-install     never install anything; fail if something is missing.
#
# As root, QEMU runs at nice SOFTROCE_NICE (default -5): see "Priority" below.
#
# The exit code is the command's (the worse of the two with --two-vms), 124
# when it ran past --timeout (or the VM hung), 125 when the VM or the RDMA
# setup failed before the command ran. Wall times (boot, command, total)
# are printed at the end.
#
# Host side: installs what is missing (Debian packages qemu-system-x86
# linux-image-amd64 busybox-static rdma-core ibverbs-utils rdmacm-utils
# libibverbs-dev librdmacm-dev; virtme-ng from PyPI into .cache/venv), then
# boots Debian's kernel with `vng --run /boot/vmlinuz-<ver> --disable-kvm`
# (QEMU software emulation: there is no usable KVM here), the host root file
# system shared read-only. Build on the host first; the guest runs the host's
# binaries in place.
#
# Guest side (guest.sh): loads rdma_rxe, ib_uverbs, rdma_ucm; `ulimit -l
# unlimited`; adds four IP aliases 192.168.50.1-4/24 ("vNICs") to the NIC;
# `rdma link add rxe0 type rxe netdev <nic>`; waits until every alias has its
# RoCEv2 GID; then runs the command in the current directory with
#   MAESTRO_VNICS=192.168.50.1,192.168.50.2,192.168.50.3,192.168.50.4
#   MAESTRO_SOFTROCE_OUT=<the writable folder>
#   MAESTRO_SOFTROCE_NIC=<the NIC> (tests may remove and re-add an alias)
# plus MAESTRO_SOFTROCE_RUN_ID (unique per run) and every MAESTRO_*, GTEST_*
# and SOFTROCE_PASS_ENV-named variable of the caller. All traffic stays inside the VM (the aliases are local addresses).
#
# Two VMs: VM 0 has 192.168.50.1-4, VM 1 has 192.168.50.11-14; both run the
# command with MAESTRO_VM_INDEX (0/1), MAESTRO_VNICS (own aliases),
# MAESTRO_PEER_VNICS (the other VM's) and MAESTRO_SOFTROCE_OUT pointing to the
# same host folder (a place to rendezvous through files).
#
# Under emulation everything is slow: boot ~20-25 s, a process start 50-80 ms,
# rxe ~30 MB/s in one VM and 6-8 MB/s between two. Good for correctness, not
# for performance numbers.
#
# Examples, from the repository root (the guest sees the host's files, so
# build on the host first, anywhere; build/ is git-ignored):
#   cmake -S . -B build && cmake --build build --target maestro_verbs_tests -j2
#   scripts/softroce/run.sh -- build/maestro_verbs_tests
#   scripts/softroce/run.sh --two-vms -- build/maestro_verbs_tests --gtest_filter='VerbsTwoVms.*'
# Measured here: boot 18-44 s (TCG; varies with host load), the verbs
# suite ~9-12 s, so ~30-55 s end to end; --two-vms ~25-50 s.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=$HERE/.cache
VIRTME_NG_VERSION=${SOFTROCE_VIRTME_NG_VERSION:-1.42}
DEB_PACKAGES=(qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-utils rdmacm-utils
              libibverbs-dev librdmacm-dev iproute2 kmod)

two_vms=0
cmd_timeout=420
mem=""
out=""
install=1
while [ $# -gt 0 ]; do
  case "$1" in
    --two-vms) two_vms=1 ;;
    --timeout) cmd_timeout=$2; shift ;;
    --mem) mem=$2; shift ;;
    --out) out=$2; shift ;;
    --no-install) install=0 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "softroce: unknown option '$1' (the command goes after --)" >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "usage: $0 [--two-vms] [--timeout SEC] [--mem SIZE] [--out DIR] -- <command...>" >&2; exit 2; }

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
T0=$(now)
log() { echo "softroce: $*" >&2; }

# ---- host prerequisites ------------------------------------------------------
missing_packages() {
  local p
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
ensure_host() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  if [ -n "${missing// /}" ]; then
    [ $install = 1 ] || { log "missing Debian packages: $missing"; return 1; }
    [ "$(id -u)" = 0 ] || { log "missing Debian packages (run as root, or install them): $missing"; return 1; }
    log "installing $missing"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$CACHE/apt.log" 2>&1 \
      || { log "apt-get failed, see $CACHE/apt.log"; tail -5 "$CACHE/apt.log" >&2; return 1; }
  fi
  if [ ! -x "$CACHE/venv/bin/vng" ]; then
    [ $install = 1 ] || { log "virtme-ng is not installed in $CACHE/venv"; return 1; }
    log "installing virtme-ng $VIRTME_NG_VERSION into $CACHE/venv"
    # Debian's python, not a pyenv shim: the venv must work without the shims.
    local py=/usr/bin/python3
    [ -x $py ] || py=$(command -v python3)
    if ! "$py" -m venv "$CACHE/venv" >"$CACHE/venv.log" 2>&1; then
      [ $install = 1 ] && [ "$(id -u)" = 0 ] && apt-get install -y -qq python3-venv >>"$CACHE/venv.log" 2>&1
      "$py" -m venv "$CACHE/venv" >>"$CACHE/venv.log" 2>&1 || { log "cannot create a venv, see $CACHE/venv.log"; return 1; }
    fi
    "$CACHE/venv/bin/pip" install -q "virtme-ng==$VIRTME_NG_VERSION" >>"$CACHE/venv.log" 2>&1 \
      || { log "pip install virtme-ng failed, see $CACHE/venv.log"; return 1; }
  fi
}

# The newest installed kernel whose modules include rdma_rxe.
pick_kernel() {
  local k v best=""
  for k in /boot/vmlinuz-*; do
    [ -e "$k" ] || continue
    v=${k#/boot/vmlinuz-}
    ls /lib/modules/"$v"/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* >/dev/null 2>&1 && best=$v
  done
  [ -n "$best" ] && echo "$best"
}

mkdir -p "$CACHE"
ensure_host || exit 125
KVER=$(pick_kernel) || { log "no kernel under /boot with the rdma_rxe module"; exit 125; }
export PATH=$CACHE/venv/bin:$PATH

if [ -z "$out" ]; then
  mkdir -p "$CACHE/runs"
  # Keep the last few runs for post-mortems.
  ls -1d "$CACHE"/runs/*/ 2>/dev/null | head -n -5 | xargs -r rm -rf
  out=$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$$
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/rc.* "$out"/timing.* "$out"/console.*

# What the guest runs: the command (quoted), where, and the environment.
{
  printf 'cd %q\n' "$PWD"
  printf 'SOFTROCE_CMD=('; printf '%q ' "$@"; printf ')\n'
  printf 'SOFTROCE_TIMEOUT=%q\n' "$cmd_timeout"
  # Tells this run's files in a reused --out folder from an earlier run's.
  printf 'export MAESTRO_SOFTROCE_RUN_ID=%q\n' "$(date +%s%N)-$$-$RANDOM"
  env | grep -E '^(MAESTRO_|GTEST_)' | cut -d= -f1 | while read -r name; do printf 'export %s=%q\n' "$name" "${!name}"; done
  for name in ${SOFTROCE_PASS_ENV:-}; do printf 'export %s=%q\n' "$name" "${!name-}"; done
} >"$out/job.sh"

vm_limit=$((cmd_timeout + ${SOFTROCE_BOOT_ALLOWANCE:-600}))
# vCPUs per VM: emulated CPUs are host threads, and the host has 2 cores.
cpus=${SOFTROCE_VM_CPUS:-$((two_vms ? 1 : 2))}
# Priority: the guest runs 50-70x slower than the host, so on a host kept
# busy by other work (CI runs the Python suites beside it) an even share of
# the cores stretches its run the most: importing torch in the guest took
# 210 s on an idle host, 523 s with both cores busy and 1133 s beside CI's
# Python stage (a third of its bound then went to the boot). As root, QEMU
# runs at nice SOFTROCE_NICE (default -5: about three times the share of a
# process at 0; what it takes from the others is the same CPU time, sooner).
nice_cmd=()
[ "$(id -u)" = 0 ] && nice_cmd=(nice -n "${SOFTROCE_NICE:--5}")
# One VM: $1 index, $2 role (single|0|1), $3 memory, remaining: extra vng args.
boot_vm() {
  local index=$1 role=$2 memory=$3
  shift 3
  now >"$out/timing.launch.$index"
  timeout --kill-after=10 $vm_limit "${nice_cmd[@]}" vng --run /boot/vmlinuz-"$KVER" --disable-kvm -m "$memory" -p "$cpus" \
    --rwdir "$out" "$@" --exec "$HERE/guest.sh $out $role" </dev/null 2>&1 | tee "$out/console.$index.log"
  return "${PIPESTATUS[0]}"
}

result_of() {  # $1 index, $2 vng exit code -> the run's exit code
  if [ -f "$out/rc.$1" ]; then cat "$out/rc.$1"
  elif [ "$2" = 124 ] || [ "$2" = 137 ]; then echo 124
  else echo 125; fi
}

log "kernel $KVER, run folder $out"
if [ $two_vms = 0 ]; then
  boot_vm 0 single "${mem:-2G}" --network user
  rc=$(result_of 0 $?)
else
  # Two QEMU socket netdevs sending UDP to each other on host loopback.
  base=$((20000 + ($$ % 20000) * 2))
  wire() { echo "-netdev socket,id=w0,udp=127.0.0.1:$2,localaddr=127.0.0.1:$1 -device virtio-net-pci,netdev=w0,mac=52:54:00:5a:00:0$3"; }
  boot_vm 0 0 "${mem:-1G}" --name softroce0 --qemu-opts="$(wire $base $((base + 1)) 1)" >/dev/null &
  p0=$!
  boot_vm 1 1 "${mem:-1G}" --name softroce1 --qemu-opts="$(wire $((base + 1)) $base 2)" >/dev/null &
  p1=$!
  wait $p0; r0=$(result_of 0 $?)
  wait $p1; r1=$(result_of 1 $?)
  for i in 0 1; do echo "===== VM $i console"; cat "$out/console.$i.log"; done
  log "VM 0 exit $r0, VM 1 exit $r1"
  rc=$r0; [ "$r0" = 0 ] && rc=$r1
fi

# Boot: from launching QEMU to guest.sh starting (guest clock; good to ~0.1 s).
boot=$(for i in 0 1; do [ -f "$out/timing.start.$i" ] && awk -v a="$(cat "$out/timing.launch.$i")" \
         -v b="$(cat "$out/timing.start.$i")" 'BEGIN { printf "%.1f\n", b - a }'; done | sort -n | tail -1)
run=$(cat "$out"/timing.cmd.* 2>/dev/null | sort -n | tail -1)
log "exit $rc; wall time $(since "$T0") s (VM boot ${boot:-?} s, command ${run:-?} s); logs in $out"
exit "$rc"
