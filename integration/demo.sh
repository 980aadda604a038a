#!/usr/bin/env bash
# Boots a VM image as a containerd task, end to end: a private containerd
# in its own network namespace, the test guest image imported, `ctr run`
# with the vm runtime, the guest's console, an ACPI power-down, clean-up.
set -euo pipefail

: "${VMSHIM_BIN:?}" "${VMSHIM_CONTAINERD:?}" "${VMSHIM_GUEST:?}"
RUNTIME=io.containerd.vm.v2
NETNS=vmshim-demo-$$
DIR=$(mktemp -d /tmp/vmshim-demo.XXXXXX)
SOCK=$DIR/containerd.sock
CTR=("$VMSHIM_CONTAINERD/ctr" -a "$SOCK" -n vmshim-demo)

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

cleanup() {
	set +e
	[ -n "${CTD_PID:-}" ] && kill "$CTD_PID" 2>/dev/null && wait "$CTD_PID" 2>/dev/null
	ip netns delete "$NETNS" 2>/dev/null
	grep -o " ${DIR}[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null
	rm -rf "$DIR"
	# The VM ran in the cgroup /vmshim-demo/ID; its parent stays behind,
	# as with runc.
	rmdir /sys/fs/cgroup/*/vmshim-demo 2>/dev/null
}
trap cleanup EXIT

say "starting a private containerd in network namespace $NETNS"
cat >"$DIR/config.toml" <<TOML
version = 3
root = "$DIR/root"
state = "$DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
TOML
ip netns add "$NETNS"
PATH=$VMSHIM_BIN:$PATH nsenter --net="/run/netns/$NETNS" -- \
	"$VMSHIM_CONTAINERD/containerd" --config "$DIR/config.toml" >"$DIR/containerd.log" 2>&1 &
CTD_PID=$!
for _ in $(seq 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done

say "importing the test VM images (a Debian kernel + busybox guest)"
for a in disk-poweroff kernel-wait; do "${CTR[@]}" images import "$VMSHIM_GUEST/$a.tar"; done
"${CTR[@]}" images ls -q

say "ctr run --rm --runtime $RUNTIME localhost/vmshim-test/disk:poweroff demo-disk"
say "(a bootable disk through SeaBIOS; the guest powers itself off)"
"${CTR[@]}" run --rm --runtime "$RUNTIME" localhost/vmshim-test/disk:poweroff demo-disk
echo "exit status: $?"

say "ctr run --rm --runtime $RUNTIME localhost/vmshim-test/kernel:wait demo-kernel   (in the background)"
"${CTR[@]}" run --rm --runtime "$RUNTIME" localhost/vmshim-test/kernel:wait demo-kernel >"$DIR/console.log" 2>&1 &
RUN_PID=$!
for _ in $(seq 600); do
	grep -q VMSHIM-GUEST-BOOTED "$DIR/console.log" 2>/dev/null && break
	if ! kill -0 "$RUN_PID" 2>/dev/null; then cat "$DIR/console.log"; echo "ctr run ended early" >&2; exit 1; fi
	sleep 0.2
done
"${CTR[@]}" task ls
say "ctr task kill demo-kernel   (SIGTERM: the ACPI power button)"
"${CTR[@]}" task kill demo-kernel
status=0
wait "$RUN_PID" || status=$?
cat "$DIR/console.log"
echo "exit status: $status"

say "cleaning up"
"${CTR[@]}" containers ls -q
echo "done"
