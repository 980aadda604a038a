#!/usr/bin/env bash
# Builds the single-node Kubernetes cluster the integration suite starts:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
# and kubectl, each from the Go module proxy at a pinned version, static
# (CGO_ENABLED=0) and -trimpath, into the tools dir.
#
#   $VMSHIM_CACHE/tools/etcd-$ETCD_VERSION/etcd
#   $VMSHIM_CACHE/tools/kubernetes-$KUBE_VERSION/{kube-apiserver,...,kubectl}
#
# Idempotent: a second run builds nothing. Prints the two directories.
set -Eeuo pipefail

ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
CACHE=${VMSHIM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmshim}
ETCD_DIR=$CACHE/tools/etcd-$ETCD_VERSION
KUBE_DIR=$CACHE/tools/kubernetes-$KUBE_VERSION
KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { echo "kube-setup: $*" >&2; }

# quiet runs a command with its output kept in a file, shown only if the
# command fails.
quiet() {
	local out status=0
	out=$(mktemp)
	"$@" >"$out" 2>&1 || status=$?
	[ "$status" -eq 0 ] || tail -n 30 "$out" >&2
	rm -f "$out"
	return "$status"
}

# retry runs a command that downloads, and runs it once more if it fails.
retry() {
	if "$@"; then
		return 0
	fi
	log "failed, retrying once: $*"
	sleep 5
	"$@"
}

# installed reports whether every file named is an executable.
installed() {
	local f
	for f in "$@"; do
		[ -x "$f" ] || return 1
	done
}

# The throw-away tool modules, removed on exit.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# place installs a built binary by a rename in its directory, so the
# binary appears whole or not at all.
place() {
	install -m 0755 "$1" "$(dirname "$2")/.$(basename "$2").new"
	mv -f "$(dirname "$2")/.$(basename "$2").new" "$2"
}

# toolmod makes the throw-away module NAME under $TMP/mod and enters it.
toolmod() {
	mkdir -p "$TMP/mod/$1"
	cd "$TMP/mod/$1"
	go mod init "vmshim-$1" >/dev/null 2>&1
}

# build_etcd builds etcd's server command from go.etcd.io/etcd/server/v3.
build_etcd() {
	installed "$ETCD_DIR/etcd" && return 0
	log "building etcd $ETCD_VERSION into $ETCD_DIR"
	toolmod etcd
	retry quiet go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
	mkdir -p "$ETCD_DIR"
	go build -trimpath -ldflags "-s -w" -o "$TMP/bin/etcd" go.etcd.io/etcd/server/v3
	place "$TMP/bin/etcd" "$ETCD_DIR/etcd"
}

# staging_modules prints the modules k8s.io/kubernetes's go.mod replaces
# with its ./staging tree: the proxy serves each at v0.MINOR.PATCH.
staging_modules() {
	local gomod
	retry quiet go mod download "k8s.io/kubernetes@$KUBE_VERSION"
	gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[ -n "$gomod" ] || {
		log "no go.mod for k8s.io/kubernetes@$KUBE_VERSION"
		return 1
	}
	# Both forms: "replace OLD => NEW" and, inside a block, "OLD => NEW".
	awk '{ sub(/^replace[ \t]+/, ""); n = split($0, f) }
		n >= 3 && f[2] == "=>" && f[3] ~ /^\.\/staging\// { print f[1] }' "$gomod"
}

# build_kube builds the Kubernetes commands from a tool module requiring
# k8s.io/kubernetes, its staging modules replaced by their published
# versions, with the version stamped as Kubernetes' own build does.
build_kube() {
	local want=() c
	for c in "${KUBE_COMMANDS[@]}"; do want+=("$KUBE_DIR/$c"); done
	installed "${want[@]}" && return 0
	log "building Kubernetes $KUBE_VERSION (${KUBE_COMMANDS[*]}) into $KUBE_DIR"
	local staging=() pkgs=() m minor patch ldflags
	toolmod kubernetes
	mapfile -t staging < <(staging_modules)
	[ ${#staging[@]} -gt 0 ] || {
		log "k8s.io/kubernetes@$KUBE_VERSION replaces no staging modules"
		return 1
	}
	minor=${KUBE_VERSION#v1.}
	patch=${minor#*.}
	minor=${minor%%.*}
	for m in "${staging[@]}"; do
		go mod edit -replace "$m=$m@v0.$minor.$patch"
	done
	log "${#staging[@]} staging modules replaced with their v0.$minor.$patch releases"
	for c in "${KUBE_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c@$KUBE_VERSION"); done
	retry quiet go get -tool "${pkgs[@]}"
	ldflags="-s -w"
	for m in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $m.gitVersion=$KUBE_VERSION -X $m.gitMajor=1 -X $m.gitMinor=$minor"
		ldflags+=" -X $m.gitTreeState=clean -X $m.buildDate=1970-01-01T00:00:00Z"
	done
	pkgs=()
	for c in "${KUBE_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	mkdir -p "$KUBE_DIR"
	go build -trimpath -ldflags "$ldflags" -o "$TMP/bin/" "${pkgs[@]}"
	for c in "${KUBE_COMMANDS[@]}"; do place "$TMP/bin/$c" "$KUBE_DIR/$c"; done
}

# One build at a time: a second run waits, then finds everything built.
mkdir -p "$CACHE/tools"
exec {lock}>"$CACHE/tools/.kube.lock"
flock "$lock"
build_etcd
build_kube
echo "$ETCD_DIR"
echo "$KUBE_DIR"
