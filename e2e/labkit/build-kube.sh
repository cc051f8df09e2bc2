#!/usr/bin/env bash
# Build the lab's Kubernetes binaries (v1.20.2: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl) from Debian bookworm's own `kubernetes` source package.
# Offline except apt. Cached outside the checkout: a second run is a no-op.
# Cold: ~6-8 min on 2 cores. Env: ROAM_CACHE (default /var/cache/roam).
set -euo pipefail
CACHE=${ROAM_CACHE:-/var/cache/roam}
WORK=$CACHE/kube
BIN_DIR=$WORK/bin
BINS=${KUBE_BINS:-"kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"}
need=""
for b in $BINS; do [ -x "$BIN_DIR/$b" ] || need="$need cmd/$b"; done
if [ -z "$need" ]; then
  echo "kube: cached in $BIN_DIR ($("$BIN_DIR/kube-apiserver" --version))"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# deb-src entries for the mirrors already configured (only if none exist yet)
if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      > /etc/apt/sources.list.d/debian-src.sources
  else
    sed -n -e 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/debian-src.list
  fi
  apt-get update -qq
fi
echo "kube: installing Go and the build tools (apt-get)"
apt-get install -y -qq --no-install-recommends dpkg-dev golang-go make rsync jq \
  golang-github-modern-go-reflect2-dev >/dev/null
mkdir -p "$WORK/src"
cd "$WORK/src"
if ! ls -d kubernetes-*/ >/dev/null 2>&1; then
  echo "kube: fetching bookworm's Kubernetes source (apt-get source, ~1 min)"
  apt-get source -qq kubernetes 2>&1 | grep -v unsandboxed || true
fi
SRC=$(ls -d "$WORK"/src/kubernetes-*/ | head -1)
cd "$SRC"
UPVER=$(basename "$SRC" | sed -e 's/^kubernetes-//' -e 's/.*really//')
# Go >= 1.18: the vendored reflect2 v1.0.1 makes the apiserver SIGSEGV on the first
# custom object; swap in Debian's v1.0.2.
if ! grep -q 'modern-go/reflect2 v1.0.2' vendor/modules.txt; then
  rm -rf vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
  rm -f vendor/github.com/modern-go/reflect2/go.mod
  sed -i 's#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v1.0.2#g' vendor/modules.txt go.mod
fi
cat > "$WORK/kube-version.env" <<V
KUBE_GIT_VERSION='v$UPVER'
KUBE_GIT_MAJOR='${UPVER%%.*}'
KUBE_GIT_MINOR='$(echo "$UPVER" | cut -d. -f2)'
KUBE_GIT_TREE_STATE='clean'
V
# Build like debian/rules does (GOPATH mode, generators first); `go build` alone fails on this tree.
echo "kube: building$need from the source (6-8 min on 2 CPUs, once: cached in $BIN_DIR)"
# GOFLAGS=-v (the Makefile's variable) names each package as go compiles it: counted into a
# progress line every 250, the rest of the output passed through.
t0=$SECONDS
set +e
env -u GOFLAGS -u GOPATH HOME="$WORK" CGO_ENABLED=0 GOPROXY=off GOTOOLCHAIN=local \
  KUBE_GIT_VERSION_FILE="$WORK/kube-version.env" make WHAT="${need# }" GOFLAGS=-v 2>&1 | {
  n=0
  while IFS= read -r line; do
    if [[ $line =~ ^[A-Za-z0-9._/~-]+$ ]]; then
      n=$((n + 1))
      [ $((n % 250)) = 0 ] && echo "kube: +$((SECONDS - t0)) s, $n Go packages compiled"
    else
      printf '%s\n' "$line"
    fi
  done
  echo "kube: +$((SECONDS - t0)) s, $n Go packages compiled"
}
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || { echo "kube: the build failed (make exited $rc; its output is above)" >&2; exit "$rc"; }
for b in $BINS; do install -D -m755 "_output/bin/$b" "$BIN_DIR/$b"; done
echo "kube: built $BINS into $BIN_DIR"
