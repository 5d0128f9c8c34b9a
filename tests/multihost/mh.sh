#!/usr/bin/env bash
# Hosts on one machine: `mh.sh NHOSTS COMMAND...` makes NHOSTS (2-4) "hosts", each a Linux
# network namespace with its own UTS host name, joined by a bridge that lives in a further
# namespace of its own (the switch), each host with one address in a private subnet that
# exists only inside these namespaces. It then runs COMMAND (in the calling namespace) with
#   MH_DIR        a directory holding the tools below and the hostfile
#   MH_MPIRUN     Open MPI's mpirun started inside host 1 (the head host), with the hostfile,
#                 the launch agent (plm_rsh_agent, the stand-in for ssh) and btl tcp,self
#   MH_HOSTS      the host names, space separated (host i is "${MH_PREFIX}i")
#   MH_HOSTFILE   "NAME slots=2" per host
#   MH_SHAPE      `$MH_SHAPE HOST [rate R] [delay D] [jitter J] [loss PCT]` shapes that host's
#                 link both ways (netem where the kernel has it; else tbf for the rate, a
#                 random classic-BPF filter into a dropping class for the loss and, given a
#                 jitter, half the packets into a slow tbf class; no fixed delay);
#                 prints what is in force
#   MH_CUT        `$MH_CUT HOST` takes the host's link down at the switch (its packets vanish);
#                 `$MH_UNCUT HOST` brings it back
#   MH_KILLHOST   `$MH_KILLHOST HOST` SIGKILLs every process inside that host
#   MH_BYTES      `$MH_BYTES HOST` prints the bytes received plus sent on that host's link
#   MH_INHOST     `$MH_INHOST HOST COMMAND...` runs a command inside that host
# and removes every namespace, link and process it made when COMMAND ends, fails or is
# killed. Exits 77 (meson's "skipped") with the reason where namespaces cannot be made.
# The file system (and /dev/shm) is shared, as a cluster's shared file system would be.
set -u
nhosts=${1:?usage: mh.sh NHOSTS COMMAND...}
shift
[ "$nhosts" -ge 2 ] && [ "$nhosts" -le 4 ] || { echo "mh.sh: 2-4 hosts" >&2; exit 2; }

skip() { echo "mh.sh: skipping: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
for tool in ip unshare nsenter tc hostname; do
  command -v "$tool" >/dev/null || skip "$tool not found"
done
mpirun=${MH_MPIRUN_BIN:-$(command -v mpirun.openmpi || command -v mpirun || true)}
[ -n "$mpirun" ] || skip "Open MPI's mpirun not found"

# Names unique to this run, so that several runs (and other tests) can go at once.
tag=mh$$
export MH_PREFIX=${tag}h
sw=${tag}sw
subnet=10.213.$(($$ % 200 + 20))   # a /24 seen only inside this run's namespaces
MH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/${tag}.XXXXXX")
export MH_DIR
made=()

cleanup() {
  trap - EXIT INT TERM HUP
  local ns pids
  [ -n "${child:-}" ] && kill -9 "$child" 2>/dev/null
  for ns in "${made[@]}"; do
    # Every process still inside one of our namespaces (mpirun, orted, ranks).
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
  # Open MPI's session directories, named after our host names (killed jobs leave them).
  rm -rf "$MH_DIR" "${TMPDIR:-/tmp}/ompi.${MH_PREFIX}"[1-4].*
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

ip netns add "$sw" 2>/dev/null || skip "cannot create a network namespace (ip netns add)"
made+=("$sw")
ip -n "$sw" link add br0 type bridge || skip "cannot create a bridge inside a namespace"
ip -n "$sw" link set br0 up
unshare --uts true 2>/dev/null || skip "cannot create a UTS namespace (unshare --uts)"

hosts=""
for i in $(seq 1 "$nhosts"); do
  h=${MH_PREFIX}$i
  ip netns add "$h" || exit 1
  made+=("$h")
  # The host's eth0 and its port on the switch (p$i), made directly in their namespaces.
  ip link add eth0 netns "$h" type veth peer name "p$i" netns "$sw" || exit 1
  ip -n "$sw" link set "p$i" master br0 up
  ip -n "$h" addr add "$subnet.$i/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set lo up
  echo "$h slots=${MH_SLOTS:-2}" >>"$MH_DIR/hostfile"
  hosts="$hosts $h"
done
export MH_HOSTS=${hosts# } MH_HOSTFILE=$MH_DIR/hostfile MH_SUBNET=$subnet

# Runs a command inside host H: its network namespace, a UTS namespace named H.
cat >"$MH_DIR/inhost" <<'EOF'
#!/bin/sh
h=$1; shift
exec nsenter --net=/run/netns/"$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
EOF
# The launch agent mpirun calls as it would call ssh: AGENT HOST COMMAND-WORDS...; the words
# form one shell command line, as ssh runs them.
cat >"$MH_DIR/agent" <<EOF
#!/bin/sh
h=\$1; shift
case "\$h" in ${MH_PREFIX}[1-4]) ;; *) echo "agent: unknown host \$h" >&2; exit 255 ;; esac
exec "$MH_DIR/inhost" "\$h" sh -c "\$*"
EOF
# mpirun on the head host. Open MPI sees NHOSTS nodes by their host names; btl tcp,self (no
# shared memory, even inside a host); OOB and BTL only on eth0 (this run's subnet).
cat >"$MH_DIR/mpirun" <<EOF
#!/bin/sh
exec "$MH_DIR/inhost" ${MH_PREFIX}1 "$mpirun" --hostfile "$MH_DIR/hostfile" \\
  --mca plm_rsh_agent "$MH_DIR/agent" --mca plm_rsh_no_tree_spawn 1 \\
  --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \\
  --mca pml ob1 --mca osc ^ucx --mca hwloc_base_binding_policy none \\
  --allow-run-as-root --oversubscribe "\$@"
EOF
cat >"$MH_DIR/cut" <<EOF
#!/bin/sh
i=\${1#${MH_PREFIX}}
exec ip -n $sw link set "p\$i" down
EOF
cat >"$MH_DIR/uncut" <<EOF
#!/bin/sh
i=\${1#${MH_PREFIX}}
exec ip -n $sw link set "p\$i" up
EOF
cat >"$MH_DIR/bytes" <<EOF
#!/bin/sh
# bytes HOST: bytes received plus sent on that host's eth0 so far.
ip -n "\$1" -s link show eth0 | awk '/RX:/ { getline; s += \$1 } /TX:/ { getline; s += \$1 }
  END { print s }'
EOF
cat >"$MH_DIR/killhost" <<EOF
#!/bin/sh
pids=\$(ip netns pids "\$1")
[ -z "\$pids" ] || kill -9 \$pids
EOF
cat >"$MH_DIR/shape" <<EOF
#!/bin/sh
# shape HOST [rate R] [delay D] [jitter J] [loss PCT]: both directions of HOST's link.
h=\$1; shift
i=\${h#${MH_PREFIX}}
rate= delay= jitter= loss=
while [ \$# -ge 2 ]; do
  case "\$1" in rate) rate=\$2 ;; delay) delay=\$2 ;; jitter) jitter=\$2 ;; loss) loss=\$2 ;;
  *) echo "shape: unknown \$1" >&2; exit 2 ;; esac
  shift 2
done
for side in "-n \$h eth0" "-n $sw p\$i"; do
  set -- \$side
  tc "\$1" "\$2" qdisc del dev "\$3" root 2>/dev/null
  args=
  [ -n "\$delay" ] && args="\$args delay \$delay \${jitter}"
  [ -n "\$loss" ] && args="\$args loss \$loss%"
  [ -n "\$rate" ] && args="\$args rate \$rate"
  if tc "\$1" "\$2" qdisc add dev "\$3" root netem \$args 2>/dev/null; then
    how="netem\$args"
    continue
  fi
  # No netem in this kernel: htb with a default class (tbf for the rate inside) and a
  # classic-BPF filter on a random u32: a random PCT% of packets to a pfifo of limit 0 (the
  # loss) and, with a jitter, half of the others to a slow tbf class (the jitter, below).
  tc "\$1" "\$2" qdisc add dev "\$3" root handle 1: htb default 10 r2q 100000 || exit 1
  tc "\$1" "\$2" class add dev "\$3" parent 1: classid 1:10 htb rate 100gbit
  how="htb"
  if [ -n "\$rate" ]; then
    tc "\$1" "\$2" qdisc add dev "\$3" parent 1:10 handle 10: tbf rate "\$rate" burst 256kb \\
      latency 50ms || exit 1
    how="\$how tbf rate \$rate"
  fi
  k1=0
  if [ -n "\$loss" ]; then
    tc "\$1" "\$2" class add dev "\$3" parent 1: classid 1:20 htb rate 100gbit
    tc "\$1" "\$2" qdisc add dev "\$3" parent 1:20 handle 20: pfifo limit 0 || exit 1
    k1=\$(awk -v p="\$loss" 'BEGIN { printf "%.0f", p / 100 * 4294967296 }')
    how="\$how, random drop \$loss%"
  fi
  k2=\$k1
  if [ -n "\$jitter" ]; then
    # Jitter without netem (no fq, plug or etf qdisc either): half of the packets go through a
    # tbf whose rate passes one 1500-byte packet per DELAY and that holds a packet at most
    # DELAY + JITTER (dropped beyond): those wait 0 to DELAY + JITTER behind each other and
    # overtake nothing, the other half passes at once, so the delay varies packet to packet
    # and the two halves reorder, as with netem's jitter (a queueing delay, not netem's law).
    d=\$(awk -v t="\$delay" 'BEGIN { v = t + 0; if (t ~ /us\$/) v /= 1000; else if (t !~ /ms\$/) v *= 1000; printf "%.3f", v }')
    j=\$(awk -v t="\$jitter" 'BEGIN { v = t + 0; if (t ~ /us\$/) v /= 1000; else if (t !~ /ms\$/) v *= 1000; printf "%.3f", v }')
    srate=\$(awk -v d="\$d" 'BEGIN { printf "%dkbit", 1500 * 8 / d }')
    slat=\$(awk -v d="\$d" -v j="\$j" 'BEGIN { printf "%dus", (d + j) * 1000 }')
    tc "\$1" "\$2" class add dev "\$3" parent 1: classid 1:30 htb rate 100gbit
    tc "\$1" "\$2" qdisc add dev "\$3" parent 1:30 handle 30: tbf rate "\$srate" burst 1600 \\
      latency "\$slat" || exit 1
    k2=\$(awk -v k="\$k1" 'BEGIN { printf "%.0f", k + (4294967296 - k) / 2 }')
    how="\$how, jitter: half the packets queued in tbf rate \$srate latency \$slat (0 to \$delay + \$jitter)"
  elif [ -n "\$delay" ]; then
    how="\$how (no netem in this kernel: delay \$delay not applied)"
  fi
  if [ "\$k2" != 0 ]; then
    # A = random u32; A < k1: classid 1:20 (dropped); k1 <= A < k2: 1:30 (slow); else no
    # match (the default class).
    tc "\$1" "\$2" filter add dev "\$3" parent 1: protocol all bpf \\
      bytecode "6,32 0 0 4294963256,53 1 0 \$k1,6 0 0 65568,53 1 0 \$k2,6 0 0 65584,6 0 0 0" \\
      || exit 1
  fi
done
echo "shaped \$h: \$how"
EOF
chmod +x "$MH_DIR"/inhost "$MH_DIR"/agent "$MH_DIR"/mpirun "$MH_DIR"/cut "$MH_DIR"/killhost \
  "$MH_DIR"/shape "$MH_DIR"/bytes "$MH_DIR"/uncut
export MH_MPIRUN=$MH_DIR/mpirun MH_SHAPE=$MH_DIR/shape MH_CUT=$MH_DIR/cut MH_UNCUT=$MH_DIR/uncut \
  MH_KILLHOST=$MH_DIR/killhost MH_INHOST=$MH_DIR/inhost MH_BYTES=$MH_DIR/bytes

# Every host must reach every other one before anything is launched.
for i in $(seq 2 "$nhosts"); do
  ok=0
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    if ip netns exec "${MH_PREFIX}1" bash -c "exec 3<>/dev/tcp/$subnet.$i/1" 2>&1 |
        grep -q refused; then ok=1; break; fi
    sleep 0.2
  done
  [ "$ok" = 1 ] || { echo "mh.sh: host $i unreachable from host 1" >&2; exit 1; }
done

"$@" &
child=$!
wait "$child"
rc=$?
exit "$rc"
