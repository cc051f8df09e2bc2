#!/bin/sh
# roam-cni node installer: the roam-cni DaemonSet runs it on every node (deploy/cni-daemonset.yaml).
# It copies the plugin into the node's CNI bin dir, writes a kubeconfig for the plugin from the
# pod's ServiceAccount, and writes 00-roam.conflist (it sorts before other conflists: the
# runtime uses the first). Then it stays up and rewrites the kubeconfig whenever the
# ServiceAccount token changes (projected tokens rotate). Every file is written beside its
# place and renamed into it, so the runtime never reads half a file.
#
# Settings (environment): ROAM_CNI_HOST_ROOT (where the node's / is mounted, /host),
# ROAM_CNI_BINARY (the plugin in the image), ROAM_CNI_API_SERVER (https://HOST:PORT; default from
# KUBERNETES_SERVICE_HOST/PORT), ROAM_CNI_OVS_DB, ROAM_CNI_BRIDGE, ROAM_CNI_ANNOTATION_TIMEOUT,
# ROAM_CNI_NETWORK_NAME, ROAM_CNI_CNI_VERSION, ROAM_CNI_SA_DIR. `install.sh --once` installs and
# exits. `install.sh --check` asks the plugin itself (CNI STATUS: the node's OVS database
# answers and has the bridge) and prints why not: the DaemonSet's readiness probe, so that a
# node without OVS shows as not ready, with the reason in the pod's events; the running
# installer logs the same every minute while it fails.
set -eu

HOST=${ROAM_CNI_HOST_ROOT:-/host}
BINARY=${ROAM_CNI_BINARY:-/usr/local/bin/roam-cni}
SA=${ROAM_CNI_SA_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}
OVS_DB=${ROAM_CNI_OVS_DB:-unix:/run/openvswitch/db.sock}
BRIDGE=${ROAM_CNI_BRIDGE:-br-int}
TIMEOUT=${ROAM_CNI_ANNOTATION_TIMEOUT:-30}
NETWORK=${ROAM_CNI_NETWORK_NAME:-roam}
CNI_VERSION=${ROAM_CNI_CNI_VERSION:-1.0.0}
BIN_DIR=$HOST/opt/cni/bin
CONF_DIR=$HOST/etc/cni/net.d
# the plugin runs on the node: it reads its kubeconfig at the node's path
KUBECONFIG_NODE_PATH=/etc/cni/net.d/roam-cni.kubeconfig

log() { printf '[roam-cni-install %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The plugin's STATUS against this node's OVS (the config STATUS needs: cniVersion 1.1.0).
# Prints the plugin's error message when it is not ready.
check() {
  out=$(printf '{"cniVersion":"1.1.0","name":"%s","type":"roam-cni","ovsDb":"%s","bridge":"%s"}' \
    "$NETWORK" "$OVS_DB" "$BRIDGE" | CNI_COMMAND=STATUS "$BINARY" 2>&1) && return 0
  msg=$(printf '%s' "$out" | sed -n 's/.*"msg": *"\([^"]*\)".*/\1/p' | head -1)
  printf 'roam-cni cannot plug pods on this node: %s (is Open vSwitch with ovn-controller running here?)\n' \
    "${msg:-$out}"
  return 1
}
if [ "${1:-}" = --check ]; then check; exit $?; fi

if [ -n "${ROAM_CNI_API_SERVER:-}" ]; then
  API=$ROAM_CNI_API_SERVER
elif [ -n "${KUBERNETES_SERVICE_HOST:-}" ]; then
  API=https://${KUBERNETES_SERVICE_HOST}:${KUBERNETES_SERVICE_PORT:-443}
else
  die "no API server: set ROAM_CNI_API_SERVER or run in a pod (KUBERNETES_SERVICE_HOST)"
fi
case $TIMEOUT in '' | *[!0-9]*) die "ROAM_CNI_ANNOTATION_TIMEOUT=$TIMEOUT: a whole number of seconds" ;; esac
[ -x "$BINARY" ] || die "$BINARY: no plugin binary in the image"
[ -r "$SA/token" ] && [ -r "$SA/ca.crt" ] || die "$SA: no ServiceAccount token and CA (automountServiceAccountToken?)"
[ -d "$BIN_DIR" ] || die "$BIN_DIR: mount the node's /opt/cni/bin there"
[ -d "$CONF_DIR" ] || die "$CONF_DIR: mount the node's /etc/cni/net.d there"

# put FILE into place from stdin (written beside it, then renamed)
put() {
  cat > "$(dirname "$1")/.$(basename "$1").tmp"
  mv -f "$(dirname "$1")/.$(basename "$1").tmp" "$1"
}

install_binary() {
  cp "$BINARY" "$BIN_DIR/.roam-cni.tmp"
  chmod 755 "$BIN_DIR/.roam-cni.tmp"
  mv -f "$BIN_DIR/.roam-cni.tmp" "$BIN_DIR/roam-cni"
  log "installed $BIN_DIR/roam-cni"
}

write_kubeconfig() {
  old_umask=$(umask)
  umask 077
  put "$CONF_DIR/roam-cni.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $API
    certificate-authority-data: $(base64 -w0 < "$SA/ca.crt")
users:
- name: roam-cni
  user:
    token: $(cat "$SA/token")
contexts:
- name: roam-cni
  context: {cluster: local, user: roam-cni}
current-context: roam-cni
KUBECONFIG
  umask "$old_umask"
  log "wrote $CONF_DIR/roam-cni.kubeconfig (API $API)"
}

write_conflist() {
  put "$CONF_DIR/00-roam.conflist" <<CONFLIST
{
  "cniVersion": "$CNI_VERSION",
  "cniVersions": ["1.0.0", "1.1.0"],
  "name": "$NETWORK",
  "plugins": [
    {
      "type": "roam-cni",
      "kubeconfig": "$KUBECONFIG_NODE_PATH",
      "ovsDb": "$OVS_DB",
      "bridge": "$BRIDGE",
      "annotationTimeoutSeconds": $TIMEOUT
    }
  ]
}
CONFLIST
  log "wrote $CONF_DIR/00-roam.conflist"
}

install_binary
write_kubeconfig
write_conflist
[ "${1:-}" = --once ] && exit 0

trap 'log "stopping (the plugin and its config stay installed)"; exit 0' TERM INT
token=$(cat "$SA/token")
while :; do
  if why=$(check); then
    [ "${ready:-}" = yes ] || log "ready: the node's OVS answers ($OVS_DB, bridge $BRIDGE)"
    ready=yes
  else
    log "ERROR: $why"
    ready=no
  fi
  sleep 60 &
  wait $! || true
  now=$(cat "$SA/token")
  if [ "$now" != "$token" ]; then
    write_kubeconfig
    token=$now
  fi
done
