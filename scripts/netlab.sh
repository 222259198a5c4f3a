#!/usr/bin/env bash
# A network of K "nodes" on one machine, for real: each node is a Linux network namespace
# (tula-n0 ... tula-n<K-1>) with one veth link ("lab0", 10.77.0.<i+1>/24) to a bridge
# (tula-br0) in the root namespace, and every link shaped with tc's token bucket filter (tbf)
# in both directions. Workers of one node talk over that node's own stack (loopback); workers
# of different nodes cross two shaped links, as on a cluster's network between nodes.
# netem is not in every kernel; tbf is.
#
#   scripts/netlab.sh up [K] [RATE]   # default 2 nodes at 200mbit
#   scripts/netlab.sh rate RATE       # re-shape every link while jobs run (e.g. 50mbit)
#   scripts/netlab.sh status          # nodes, addresses, the shaping in force
#   scripts/netlab.sh down            # remove every namespace, link and the bridge
#
# Needs root (ip netns, tc). Tula places its workers in these nodes with
# `cluster.netlab: tula` (tula.runtime.group.dist.join_lab_node): rank r runs on node
# r // cluster.workers_per_node.
set -euo pipefail
PREFIX=${NETLAB_PREFIX:-tula}
BR=${PREFIX}-br0
SUBNET=10.77.0
BURST=${NETLAB_BURST:-64kb}
LATENCY=${NETLAB_LATENCY:-50ms}

nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}-n[0-9]+$" | sort -V || true; }

shape() { # shape <dev> <rate> [netns]: tbf on the device's egress
    local dev=$1 rate=$2 ns=${3:-}
    local run=(); [ -n "$ns" ] && run=(ip netns exec "$ns")
    "${run[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$BURST" latency "$LATENCY"
}

up() {
    local k=${1:-2} rate=${2:-200mbit}
    [ -z "$(nodes)" ] || down
    ip link add "$BR" type bridge
    ip link set "$BR" up
    ip addr add "$SUBNET.254/24" dev "$BR"   # the root namespace (torchrun's rendezvous store) as seen from the nodes
    for i in $(seq 0 $((k - 1))); do
        local ns=${PREFIX}-n$i host=${PREFIX}-v$i
        ip netns add "$ns"
        ip link add "$host" type veth peer name lab0 netns "$ns"
        ip link set "$host" master "$BR" up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev lab0
        ip -n "$ns" link set lab0 up
        ip -n "$ns" link set lo up
        shape lab0 "$rate" "$ns"   # leaving the node
        shape "$host" "$rate"      # arriving at the node
    done
    echo "[netlab] $k node(s) up, links at $rate: $(nodes | tr '\n' ' ')"
}

rate() {
    local r=${1:?usage: netlab.sh rate RATE (e.g. 50mbit)} i=0
    for ns in $(nodes); do
        i=${ns##*-n}
        ip netns exec "$ns" tc qdisc change dev lab0 root tbf rate "$r" burst "$BURST" latency "$LATENCY"
        tc qdisc change dev "${PREFIX}-v$i" root tbf rate "$r" burst "$BURST" latency "$LATENCY"
    done
    echo "[netlab] links now at $r"
}

status() {
    for ns in $(nodes); do
        echo "$ns: $(ip -n "$ns" -4 -o addr show dev lab0 | awk '{print $4}') $(ip netns exec "$ns" tc qdisc show dev lab0 | head -1)"
    done
}

down() {
    for ns in $(nodes); do
        ip netns del "$ns" || true
    done
    ip link del "$BR" 2>/dev/null || true
    for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${PREFIX}-v[0-9]+$" || true); do
        ip link del "$v" 2>/dev/null || true
    done
    echo "[netlab] down"
}

cmd=${1:-status}
shift || true
case "$cmd" in
    up | rate | status | down) "$cmd" "$@" ;;
    *) echo "usage: $0 up [K] [RATE] | rate RATE | status | down" >&2; exit 2 ;;
esac
