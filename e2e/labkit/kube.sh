# Lab Kubernetes control plane: etcd, kube-apiserver (on the lab bridge, so node
# namespaces reach it), kube-controller-manager with every controller a cluster runs by
# default (endpoints and EndpointSlices, quotas, node lifecycle, jobs, disruption budgets,
# the CSR signer with the lab CA, …; those that need a cloud provider disable themselves),
# each controller with its own ServiceAccount's credentials. Pod Security:
# PodSecurityPolicy admission, with the lab's policies (pod-security.yaml) applied as soon as
# the API server is up. The Node
# objects node-a and node-b are registered by the nodes' real kubelets, kube-scheduler is
# started with them (kubelet.sh). No kube-proxy: pods reach the API server at its own address (the
# lab overlay of deploy/ sets KUBERNETES_SERVICE_HOST).

KDIR=$LAB_DIR/kube

kube_pki() {
  local P=$KDIR/pki
  [ -f "$P/admin.crt" ] && [ -f "$KUBECONFIG_PATH" ] && return 0
  mkdir -p "$P"
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=roam-lab-ca" 2>/dev/null
    cat > apiserver.ext <<EXT
subjectAltName=IP:$BRIDGE_IP,IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
keyUsage=digitalSignature,keyEncipherment
EXT
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 -extfile apiserver.ext 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > client.ext
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 3650 -extfile client.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  cat > "$KUBECONFIG_PATH" <<KCF
apiVersion: v1
kind: Config
clusters:
- name: roam-lab
  cluster:
    server: https://$BRIDGE_IP:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$P/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 "$P/admin.crt")
    client-key-data: $(base64 -w0 "$P/admin.key")
contexts:
- name: roam-lab
  context: {cluster: roam-lab, user: admin}
current-context: roam-lab
KCF
  chmod 600 "$KUBECONFIG_PATH"
}

kube_curl() { curl -fsS --cacert "$KDIR/pki/ca.crt" --cert "$KDIR/pki/admin.crt" --key "$KDIR/pki/admin.key" "https://$BRIDGE_IP:$APISERVER_PORT$1"; }

kube_up() {
  local t0 P=$KDIR/pki
  [ -x "$KUBE_BIN/kube-apiserver" ] || die "kube-apiserver is not built; run e2e/labkit/build-kube.sh"
  mkdir -p "$KDIR/logs"
  kube_pki
  rm -rf "$KDIR/etcd-data"
  t0=$(now)
  /usr/bin/etcd --name roam-lab --data-dir "$KDIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "roam-lab=http://127.0.0.1:$ETCD_PEER_PORT" --quota-backend-bytes 1073741824 \
    >"$KDIR/logs/etcd.log" 2>&1 9>&- &
  echo $! > "$KDIR/etcd.pid"
  wait_for 30 "etcd health" "$KDIR/logs/etcd.log" \
    sh -c "curl -fsS http://127.0.0.1:$ETCD_CLIENT_PORT/health | grep -q '\"health\":\"true\"'" || return 1
  "$KUBE_BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --bind-address="$BRIDGE_IP" --advertise-address="$BRIDGE_IP" --secure-port="$APISERVER_PORT" --insecure-port=0 \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
    --client-ca-file="$P/ca.crt" \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction,PodSecurityPolicy --allow-privileged=true \
    --kubelet-client-certificate="$P/admin.crt" --kubelet-client-key="$P/admin.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --profiling=false --logtostderr=true --v=1 \
    >"$KDIR/logs/kube-apiserver.log" 2>&1 9>&- &
  echo $! > "$KDIR/kube-apiserver.pid"
  wait_for 90 "kube-apiserver /readyz" "$KDIR/logs/kube-apiserver.log" kube_curl /readyz || return 1
  log "kube-apiserver ready in $(elapsed "$t0") s"
  # no pod is admitted until a policy lets it in
  "$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" apply -f "$LABKIT/pod-security.yaml" \
    >"$KDIR/logs/pod-security.log" 2>&1 || { cat "$KDIR/logs/pod-security.log" >&2; return 1; }
  "$KUBE_BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG_PATH" \
    --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
    --controllers='*' --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=true \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 --port=0 --logtostderr=true --v=1 \
    >"$KDIR/logs/kube-controller-manager.log" 2>&1 9>&- &
  echo $! > "$KDIR/kube-controller-manager.pid"
  wait_for 60 "kube-controller-manager (default ServiceAccount)" "$KDIR/logs/kube-controller-manager.log" \
    kube_curl /api/v1/namespaces/default/serviceaccounts/default || return 1
  log "kube control plane up in $(elapsed "$t0") s"
}

kube_down() {
  local c
  for c in kube-controller-manager kube-apiserver etcd; do stop_pid "$KDIR/$c.pid"; done
  rm -rf "$KDIR/etcd-data"
}

kube_status() {
  if pid_alive "$KDIR/kube-apiserver.pid" && kube_curl /readyz >/dev/null 2>&1 \
    && pid_alive "$KDIR/etcd.pid" && pid_alive "$KDIR/kube-controller-manager.pid"; then
    echo "kube: up ($("$KUBE_BIN/kube-apiserver" --version), https://$BRIDGE_IP:$APISERVER_PORT)"
  else
    echo "kube: DOWN"; return 1
  fi
}
