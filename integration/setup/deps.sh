#!/usr/bin/env bash
# Installs what vmshim's demo and tests need on a Debian 12 machine:
# Debian packages, containerd built with `go install`, and nerdctl built
# and critest from throw-away tool modules, into the tools dir.
# Idempotent: a second run installs and builds nothing.
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CACHE=${VMSHIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmshim}
NERDCTL_VERSION=${NERDCTL_VERSION:-v2.0.0}
TOOLS=$CACHE/tools/containerd-$CONTAINERD_VERSION
NERDCTL_DIR=$CACHE/tools/nerdctl-$NERDCTL_VERSION
CRITEST_VERSION=${CRITEST_VERSION:-v1.37.0}
CRITEST_DIR=$CACHE/tools/cri-tools-$CRITEST_VERSION

PACKAGES=(
	qemu-system-x86 qemu-utils         # the VMMs and qcow2 tooling
	busybox-static cpio                # test-guest initramfs
	curl bzip2 make                    # test-guest udhcpc6, built from Debian's busybox source (with gcc, libc6-dev)
	syslinux syslinux-common mtools fdisk dosfstools  # bootable test disk, no loop devices
	xz-utils zstd binutils             # test-guest kernel extraction (xz/zstd, readelf)
	grub-common xorriso isolinux ovmf  # UEFI and CD-ROM test guests (uefi.sh: grub-mkimage, ISO 9660) and the UEFI firmware
	gvncviewer                         # gvnccapture: the VNC test's real client
	debootstrap e2fsprogs debian-archive-keyring  # cloud test guest: Debian root fs, ext4 image without mounts
	containernetworking-plugins iproute2 iptables     # CNI for pod networking
	runc                               # the runc pods `make bench` compares with
	swtpm                              # the VMs' TPMs (vmshim.io/tpm)
	util-linux procps kmod
	gcc libc6-dev                      # cgo, for the unit tests under -race
	python3-yaml                       # FuzzCloudInit reads its documents back with PyYAML, as cloud-init does
)

log() { echo "setup: $*" >&2; }

apt_install() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	for attempt in 1 2; do
		if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
			return 0
		fi
		log "apt-get failed (attempt $attempt)"
		sleep 5
	done
	return 1
}

apt_install "${PACKAGES[@]}"

if [ ! -x "$TOOLS/containerd" ] || [ ! -x "$TOOLS/ctr" ] || [ ! -x "$TOOLS/containerd-shim-runc-v2" ]; then
	log "building containerd $CONTAINERD_VERSION (with ctr and the runc shim) into $TOOLS"
	mkdir -p "$TOOLS"
	GOBIN=$TOOLS CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
		go install "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
fi
# `go install nerdctl@version` fails (the module proxy refuses to list
# nerdctl's versions), and the checksum database lacks some of the modules
# it needs: build it from a tool module of its own, those modules exempt.
if [ ! -x "$NERDCTL_DIR/nerdctl" ]; then
	log "building nerdctl $NERDCTL_VERSION into $NERDCTL_DIR"
	mod=$(mktemp -d)
	(
		trap 'rm -rf "$mod"' EXIT
		cd "$mod"
		export GONOSUMDB=github.com/containerd/nerdctl,github.com/containerd/nydus-snapshotter,github.com/containerd/stargz-snapshotter/ipfs
		export GOFLAGS=-buildvcs=false CGO_ENABLED=0
		go mod init vmshim-tools >/dev/null 2>&1
		go get -tool "github.com/containerd/nerdctl/v2/cmd/nerdctl@$NERDCTL_VERSION" 2>/dev/null
		mkdir -p "$NERDCTL_DIR"
		go build -o "$NERDCTL_DIR/nerdctl.tmp" github.com/containerd/nerdctl/v2/cmd/nerdctl
		mv "$NERDCTL_DIR/nerdctl.tmp" "$NERDCTL_DIR/nerdctl"
	)
fi
# critest is a Go test binary of cri-tools (its Makefile builds it with
# `go test -c`); like nerdctl, it comes from a tool module of its own,
# cri-tools exempt from the checksum database, which lacks it.
if [ ! -x "$CRITEST_DIR/critest" ]; then
	log "building critest $CRITEST_VERSION into $CRITEST_DIR"
	mod=$(mktemp -d)
	(
		trap 'rm -rf "$mod"' EXIT
		cd "$mod"
		export GONOSUMDB=sigs.k8s.io/cri-tools
		export GOFLAGS=-buildvcs=false CGO_ENABLED=0
		go mod init vmshim-tools >/dev/null 2>&1
		go get -t "sigs.k8s.io/cri-tools/cmd/critest@$CRITEST_VERSION" 2>/dev/null
		mkdir -p "$CRITEST_DIR"
		go test -c -trimpath -o "$CRITEST_DIR/critest.tmp" sigs.k8s.io/cri-tools/cmd/critest
		mv "$CRITEST_DIR/critest.tmp" "$CRITEST_DIR/critest"
	)
fi
echo "$TOOLS"
