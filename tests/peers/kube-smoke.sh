#!/usr/bin/env bash
# A smoke check of a control plane started by kube_cluster.py, with curl and its tokens:
#
#   tests/peers/kube-smoke.sh DIR/NAME/cluster.json
#
# As admin: /version, /readyz, create a Namespace "smoke", a Service and an EndpointSlice
# in it, list them back. As the limited user: list them (200), create a Service and
# delete the Namespace (403 each). No token: 403; a wrong token: 401. Then deletes the
# Service and the EndpointSlice again (the Namespace stays: no controller manager would
# ever finish deleting it). Prints each step; exit status non-zero at the first surprise.
set -euo pipefail

J="${1:?usage: kube-smoke.sh DIR/NAME/cluster.json}"
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$J" "$1"; }
S=$(field server)
A=$(field admin_token)
L=$(field limited_token)
CA=$(field ca_file)

# call EXPECTED_STATUS TOKEN METHOD PATH [JSON]: prints the body to $OUT
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
call() {
    local want=$1 token=$2 method=$3 path=$4 body=${5:-}
    local args=(-sS --cacert "$CA" -X "$method" -o "$OUT" -w '%{http_code}')
    [ -n "$token" ] && args+=(-H "Authorization: Bearer $token")
    [ -n "$body" ] && args+=(-H 'Content-Type: application/json' -d "$body")
    local got
    got=$(curl "${args[@]}" "$S$path")
    printf '%-6s %-60s %s\n' "$method" "$path" "$got"
    if [ "$got" != "$want" ]; then
        echo "kube-smoke.sh: expected $want, got $got: $(head -c 400 "$OUT")" >&2
        return 1
    fi
}
names() { python3 -c 'import json,sys; print(" ".join(i["metadata"]["name"] for i in json.load(open(sys.argv[1]))["items"]))' "$OUT"; }

call 200 "$A" GET /version
python3 -c 'import json,sys; print("       version:", json.load(open(sys.argv[1]))["gitVersion"])' "$OUT"
call 200 "$A" GET /readyz
ns='{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"smoke"}}'
svc='{"apiVersion":"v1","kind":"Service","metadata":{"name":"cart"},"spec":{"ports":[{"name":"http","port":8080,"protocol":"TCP"}],"selector":{"app":"cart"}}}'
eps='{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"cart-1","labels":{"kubernetes.io/service-name":"cart"}},"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[{"addresses":["10.1.0.5"],"conditions":{"ready":true}}]}'
if ! call 201 "$A" POST /api/v1/namespaces "$ns" 2>/dev/null; then
    call 200 "$A" GET /api/v1/namespaces/smoke
fi
call 201 "$A" POST /api/v1/namespaces/smoke/services "$svc"
python3 -c 'import json,sys; print("       clusterIP:", json.load(open(sys.argv[1]))["spec"]["clusterIP"])' "$OUT"
call 201 "$A" POST /apis/discovery.k8s.io/v1/namespaces/smoke/endpointslices "$eps"
call 200 "$A" GET /api/v1/namespaces
echo "       namespaces: $(names)"
call 200 "$L" GET /api/v1/namespaces/smoke/services
echo "       services (limited): $(names)"
call 200 "$L" GET /apis/discovery.k8s.io/v1/endpointslices
echo "       endpointslices (limited): $(names)"
call 403 "$L" POST /api/v1/namespaces/smoke/services "${svc/cart/evil}"
call 403 "$L" DELETE /api/v1/namespaces/smoke
call 403 "" GET /api/v1/namespaces
call 401 "wrong-token" GET /api/v1/namespaces
call 200 "$A" DELETE /apis/discovery.k8s.io/v1/namespaces/smoke/endpointslices/cart-1
call 200 "$A" DELETE /api/v1/namespaces/smoke/services/cart
echo "kube-smoke.sh: ok ($S)"
