# Lab OVN: central (NB + SB ovsdb-server, ovn-northd) in the root namespace, and on each node
# a chassis named after the node: ovsdb-server, ovs-vswitchd (userspace datapath) and
# ovn-controller, inside the node's namespaces. Geneve between the chassis. The chassis reach
# the SB over the lab bridge (tcp:$BRIDGE_IP), as nodes reach OVN central over the network:
# central's directory is hidden from them (node-inner.sh).
#
# NB and SB take the nodes' network only over TLS (pssl: on the lab bridge, client
# certificates required, as ovsdb-server's SSL always asks for them), with a lab CA in
# $OVN_PKI (under central's directory, so hidden from the nodes): the databases' certificate
# names the bridge address; roam-controller's is a client certificate the installation
# mounts from a Secret; each chassis has its own (CN = its node's name) in its node's
# directory. The SB's node-facing remote has OVN's role `ovn-controller` (OVN's RBAC): a
# chassis may change only the rows of the chassis its certificate names, so one node's
# certificate cannot pose as another node's chassis. The host's loopback keeps plain TCP
# remotes for the tests' own tools (as an admin on the OVN central host would use the unix
# socket).

OVN_PKI=$CENTRAL/pki

# ovn_cert NAME CN EXTENSIONS: a certificate NAME.pem and key NAME.key for CN, signed by the
# lab CA, made once.
ovn_cert() {
  local name=$1 cn=$2 ext=$3
  [ -s "$OVN_PKI/$name.pem" ] && return 0
  (
    cd "$OVN_PKI" || exit 1
    printf '%b\n' "$ext" >"$name.ext"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$name.key" \
      -out "$name.csr" -subj "/CN=$cn" 2>/dev/null || exit 1
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$name.pem" \
      -days 3650 -extfile "$name.ext" 2>/dev/null || exit 1
    chmod 600 "$name.key"
  ) || { rm -f "$OVN_PKI/$name".*; log "could not make the lab's OVN certificate $name (openssl)"; return 1; }
}

# The lab CA and its certificates, each made once (kept across `up`; a new CA would orphan
# the Secret the installation holds).
ovn_pki() {
  mkdir -p "$OVN_PKI"
  if [ ! -s "$OVN_PKI/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$OVN_PKI/ca.key" \
      -out "$OVN_PKI/ca.pem" -days 3650 -subj /CN=roam-lab-ovn-ca 2>/dev/null \
      || { rm -rf "$OVN_PKI"; log "could not make the lab's OVN CA (openssl)"; return 1; }
    chmod 600 "$OVN_PKI/ca.key"
  fi
  local server="subjectAltName=IP:$BRIDGE_IP,IP:127.0.0.1\nextendedKeyUsage=serverAuth" n
  ovn_cert nb nb "$server" && ovn_cert sb sb "$server" \
    && ovn_cert roam-controller roam-controller "extendedKeyUsage=clientAuth" || return 1
  for n in $NODES; do
    ovn_cert "chassis-$n" "$n" "extendedKeyUsage=clientAuth" || return 1
  done
}

ovn_central_up() {
  mkdir -p "$CENTRAL"
  rm -f "$CENTRAL"/*.db
  ovsdb-tool create "$CENTRAL/ovnnb_db.db" "$OVN_SHARE/ovn/ovn-nb.ovsschema"
  ovsdb-tool create "$CENTRAL/ovnsb_db.db" "$OVN_SHARE/ovn/ovn-sb.ovsschema"
  ovn_pki || return 1
  local db
  for db in nb sb; do
    local port=$NB_TCP_PORT nodes_remote=()
    if [ $db = nb ]; then
      nodes_remote=(--remote="pssl:$port:$BRIDGE_IP")
    else
      # the node-facing remote is a Connection row (set below): only there can it have a role
      port=$SB_TCP_PORT nodes_remote=(--remote=db:OVN_Southbound,SB_Global,connections)
    fi
    nodes_remote+=(--private-key="$OVN_PKI/$db.key" --certificate="$OVN_PKI/$db.pem" --ca-cert="$OVN_PKI/ca.pem")
    ovsdb-server -vconsole:off --detach --no-chdir --pidfile="$CENTRAL/ovn${db}_db.pid" \
      --log-file="$CENTRAL/ovsdb-server-$db.log" --unixctl="$CENTRAL/ovn${db}_db.ctl" \
      --remote="punix:$CENTRAL/ovn${db}_db.sock" --remote="ptcp:$port:127.0.0.1" \
      "${nodes_remote[@]}" "$CENTRAL/ovn${db}_db.db" 9>&- || return 1
  done
  ovn-nbctl --no-wait init
  ovn-sbctl init
  ovn-sbctl set-connection role=ovn-controller "pssl:$SB_TCP_PORT:$BRIDGE_IP" || return 1
  # ovn-northd at the lowest CPU priority (ROAM_LAB_NORTHD_NICE, default 19): on a cluster
  # OVN central runs on hosts of its own; here it shares the lab's CPUs with both nodes'
  # QEMUs and ovn-controllers, and with many addresses in the NB its full recomputes (northd
  # 23.03: ~2.3 s of CPU each at 10 000) would take CPU a node's VM and ovn-controller need.
  nice -n "${ROAM_LAB_NORTHD_NICE:-19}" ovn-northd -vconsole:off --detach --no-chdir --pidfile="$CENTRAL/ovn-northd.pid" --log-file="$CENTRAL/ovn-northd.log" \
    --unixctl="$CENTRAL/ovn-northd.ctl" --ovnnb-db="$OVN_NB_DB" --ovnsb-db="$OVN_SB_DB" 9>&- || return 1
}

# node_vsctl NODE ARGS...: ovs-vsctl against the node's local Open_vSwitch database.
node_vsctl() { local n=$1; shift; ovs-vsctl --timeout=30 --db="$(node_ovs_db "$n")" "$@"; }

ovn_chassis_up() {
  local n=$1 d; d=$(node_dir "$n")
  mkdir -p "$d/ovs"
  rm -f "$d/ovs/conf.db"
  ovsdb-tool create "$d/ovs/conf.db" "$OVN_SHARE/openvswitch/vswitch.ovsschema"
  node_exec "$n" ovsdb-server -vconsole:off --detach --no-chdir --pidfile=/run/openvswitch/ovsdb-server.pid \
    --log-file="$d/logs/ovsdb-server.log" --remote=punix:/run/openvswitch/db.sock \
    --unixctl=/run/openvswitch/ovsdb-server.ctl "$d/ovs/conf.db" || return 1
  node_vsctl "$n" --no-wait init
  node_exec "$n" ovs-vswitchd -vconsole:off --detach --no-chdir --pidfile=/run/openvswitch/ovs-vswitchd.pid \
    --log-file="$d/logs/ovs-vswitchd.log" unix:/run/openvswitch/db.sock || return 1
  node_vsctl "$n" -- --may-exist add-br br-int -- set bridge br-int datapath_type=netdev \
    fail-mode=secure other-config:disable-in-band=true
  # underlay for userspace tunnelling: the tunnel IP lives on an OVS bridge (br-phy)
  node_vsctl "$n" -- --may-exist add-br br-phy -- set bridge br-phy datapath_type=netdev \
    -- --may-exist add-port br-phy gnv0
  node_exec "$n" ip addr add "$(node_tunnel_ip "$n")/24" dev br-phy
  node_exec "$n" ip link set br-phy up
  # the chassis's certificate and the CA, in the node's own directory
  mkdir -p "$d/ovs/pki"
  cp "$OVN_PKI/ca.pem" "$d/ovs/pki/ca.pem"
  cp "$OVN_PKI/chassis-$n.pem" "$d/ovs/pki/chassis.pem"
  install -m 600 "$OVN_PKI/chassis-$n.key" "$d/ovs/pki/chassis.key"
  node_vsctl "$n" set-ssl "$d/ovs/pki/chassis.key" "$d/ovs/pki/chassis.pem" "$d/ovs/pki/ca.pem"
  node_vsctl "$n" set open . external_ids:system-id="$n" external_ids:hostname="$n" \
    external_ids:ovn-remote="ssl:$BRIDGE_IP:$SB_TCP_PORT" external_ids:ovn-encap-type=geneve \
    external_ids:ovn-encap-ip="$(node_tunnel_ip "$n")" external_ids:ovn-bridge-datapath-type=netdev \
    external_ids:ovn-encap-tos=inherit
  node_exec "$n" ovn-controller -vconsole:off --detach --no-chdir --pidfile=/run/ovn/ovn-controller.pid \
    --log-file="$d/logs/ovn-controller.log" unix:/run/openvswitch/db.sock || return 1
}

ovn_up() {
  local t0 n; t0=$(now)
  ovn_central_up || return 1
  for n in $NODES; do ovn_chassis_up "$n" || return 1; done
  for n in $NODES; do
    wait_for 60 "chassis $n in the SB database" "$(node_dir "$n")/logs/ovn-controller.log" \
      ovn-sbctl --timeout=5 get Chassis "$n" name || return 1
  done
  # a geneve tunnel port to the other chassis on each node
  for n in $NODES; do
    wait_for 60 "geneve tunnel on $n" "$(node_dir "$n")/logs/ovn-controller.log" \
      sh -c "ovs-vsctl --db=$(node_ovs_db "$n") --columns=type find Interface type=geneve | grep -q geneve" || return 1
  done
  log "OVN up in $(elapsed "$t0") s"
}

ovn_down() {
  local n d f
  for n in $NODES; do
    d=$(node_dir "$n")
    for f in ovn/ovn-controller openvswitch/ovs-vswitchd openvswitch/ovsdb-server; do
      stop_pid "$d/fs_run/$f.pid"
    done
  done
  for f in ovn-northd ovnsb_db ovnnb_db; do stop_pid "$CENTRAL/$f.pid"; done
}

ovn_status() {
  local ok=0 n d
  if pid_alive "$CENTRAL/ovnnb_db.pid" && pid_alive "$CENTRAL/ovnsb_db.pid" && pid_alive "$CENTRAL/ovn-northd.pid" \
    && ovn-nbctl --timeout=5 show >/dev/null 2>&1; then
    echo "ovn central: up (NB $OVN_NB_DB, tcp:127.0.0.1:$NB_TCP_PORT, ssl:$BRIDGE_IP:$NB_TCP_PORT; SB ssl:$BRIDGE_IP:$SB_TCP_PORT)"
  else
    echo "ovn central: DOWN"; ok=1
  fi
  for n in $NODES; do
    d=$(node_dir "$n")/fs_run
    if pid_alive "$d/ovn/ovn-controller.pid" && pid_alive "$d/openvswitch/ovs-vswitchd.pid" \
      && pid_alive "$d/openvswitch/ovsdb-server.pid" && ovn-sbctl --timeout=5 get Chassis "$n" name >/dev/null 2>&1; then
      echo "ovn chassis $n: up"
    else
      echo "ovn chassis $n: DOWN"; ok=1
    fi
  done
  return $ok
}
