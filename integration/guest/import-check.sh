#!/usr/bin/env bash
# Checks that a throw-away containerd imports and unpacks the test guests'
# OCI archives:
#
#   import-check.sh OUTDIR [CONTAINERD_DIR]
#
# OUTDIR is build.sh's output; CONTAINERD_DIR holds the containerd and ctr
# binaries (default: the tools dir integration/setup/deps.sh builds). With
# NERDCTL set to a nerdctl binary, `nerdctl load` is checked as well. Needs
# root: containerd runs in its own network namespace (vmshim-pack-check) with
# its own root, state and socket under a temp dir, and everything (daemon,
# image mounts, netns, temp dir) is removed on exit.
set -Eeuo pipefail

NETNS=vmshim-pack-check
NAMESPACE=vmshim-check

log() { echo "import-check: $*" >&2; }
die() {
	log "$*"
	exit 1
}

OUT=${1:?usage: import-check.sh OUTDIR [CONTAINERD_DIR]}
BIN=${2:-${VMSHIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmshim}/tools/containerd-v2.4.2}
[ -x "$BIN/containerd" ] && [ -x "$BIN/ctr" ] || die "no containerd/ctr in $BIN (run integration/setup/deps.sh)"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespace, containerd)"
ip netns list | grep -qw "$NETNS" && die "network namespace $NETNS exists; is another check running?"

TMP=$(mktemp -d /tmp/vmshim-pack-check.XXXX)
SOCK=$TMP/containerd.sock
PID=
MOUNTS=()

cleanup() {
	local m
	for m in "${MOUNTS[@]}"; do
		"$BIN/ctr" -a "$SOCK" -n "$NAMESPACE" images unmount --rm "$m" >/dev/null 2>&1 || umount "$m" 2>/dev/null || true
	done
	if [ -n "$PID" ]; then
		kill "$PID" 2>/dev/null || true
		wait "$PID" 2>/dev/null || true
	fi
	ip netns del "$NETNS" 2>/dev/null || true
	# Snapshots may still be mounted if containerd died mid-unpack.
	grep -q " $TMP/" /proc/mounts && awk -v t="$TMP/" 'index($2, t) == 1 { print $2 }' /proc/mounts |
		sort -r | xargs -r umount 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT

# ctr runs the client against the throw-away daemon; its stderr (cgroup v1
# deprecation noise on every call) is shown only when it fails.
ctr() {
	"$BIN/ctr" -a "$SOCK" -n "$NAMESPACE" "$@" 2>"$TMP/ctr.err" || {
		cat "$TMP/ctr.err" >&2
		return 1
	}
}

cat >"$TMP/config.toml" <<EOF
version = 3
root = "$TMP/root"
state = "$TMP/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
EOF

ip netns add "$NETNS"
nsenter --net=/run/netns/"$NETNS" "$BIN/containerd" --config "$TMP/config.toml" \
	--root "$TMP/root" --state "$TMP/state" --address "$SOCK" >"$TMP/containerd.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
	ctr version >/dev/null 2>&1 && break
	kill -0 "$PID" 2>/dev/null || { cat "$TMP/containerd.log" >&2; die "containerd exited"; }
	sleep 0.1
done
ctr version >/dev/null || die "containerd did not come up"

# check ARCHIVE REF FILE... imports ARCHIVE and checks the image REF exists,
# was unpacked, and its rootfs holds exactly FILE... (read-only, root-owned).
check() {
	local archive=$1 ref=$2 f mnt got want
	shift 2
	ctr images import "$OUT/$archive" >/dev/null
	ctr images ls -q | grep -qx "$ref" || die "$archive: image $ref not listed"
	# REF TYPE DIGEST STATUS SIZE UNPACKED, e.g. "... complete (3/3) ... true"
	ctr images check "name==$ref" | awk -v r="$ref" '$1 == r && $4 == "complete" && $NF == "true" { ok = 1 } END { exit !ok }' ||
		die "$archive: $ref is incomplete or not unpacked"
	mnt=$TMP/mnt-${archive%.tar}
	mkdir -p "$mnt"
	ctr images mount "$ref" "$mnt" >/dev/null
	MOUNTS+=("$mnt")
	got=$(cd "$mnt" && find . -mindepth 1 -printf '%P %y %m %u:%g\n' | sort)
	want=$(for f in "$@"; do
		echo "${f%/*} d 755 root:root"
		echo "$f f 444 root:root"
	done | sort -u)
	[ "$got" = "$want" ] || die "$archive: rootfs holds
$got
want
$want"
	for f in "$@"; do
		log "$ref: /$f $(stat -c %s "$mnt/$f") bytes"
	done
}

check disk-wait.tar localhost/vmshim-test/disk:wait disk/disk.qcow2
check disk-poweroff.tar localhost/vmshim-test/disk:poweroff disk/disk.qcow2
check kernel-wait.tar localhost/vmshim-test/kernel:wait boot/vmlinux boot/initrd.img
check kernel-poweroff.tar localhost/vmshim-test/kernel:poweroff boot/vmlinux boot/initrd.img
check kernel-agent.tar localhost/vmshim-test/kernel:agent boot/vmlinux boot/initrd.img
check disk-agent.tar localhost/vmshim-test/disk:agent disk/disk.qcow2
cmp "$OUT/disk-wait.qcow2" "$TMP/mnt-disk-wait/disk/disk.qcow2" || die "disk-wait: unpacked disk differs"
cmp "$OUT/vmlinux" "$TMP/mnt-kernel-wait/boot/vmlinux" || die "kernel-wait: unpacked kernel differs"
ctr images check >&2
ctr snapshots ls >&2
log "ok: 6 archives imported and unpacked by ctr"

if [ -n "${NERDCTL:-}" ]; then
	nerdctl() {
		"$NERDCTL" --address "$SOCK" --namespace vmshim-check-nerdctl --data-root "$TMP/nerdctl" "$@"
	}
	for a in {disk,kernel}-{wait,poweroff,agent}.tar; do
		nerdctl load -i "$OUT/$a" >&2
	done
	nerdctl images >&2
	[ "$(nerdctl images -q | sort -u | wc -l)" -eq 6 ] || die "nerdctl lists $(nerdctl images -q | sort -u | wc -l) images, want 6"
	log "ok: 6 archives loaded by nerdctl"
fi
