#!/usr/bin/env bash
# make demo — what runs today, end to end, on one Linux or macOS machine:
#
#  1. The node agent standalone (`macfleet serve`): a synthesized model is loaded into
#     a real llama.cpp runner process, answers a streamed chat completion through the
#     OpenAI API, and is unloaded with a measured report.
#  2. The control plane: a real kube-apiserver + etcd, `macfleet manager`, two simulated
#     Macs, config/samples/ and a demo deployment scheduled onto the Macs, shown with
#     `kubectl get md,mr,mn`.
#
# The cluster-mode agent and the gateway (which join the two halves) are the next
# issue. DEMO_EXIT=1 exits at the end instead of waiting for Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
work=$root/.cache/demo
mkdir -p "$work"
assets=${KUBEBUILDER_ASSETS:?run through make demo}
kubectl="$assets/kubectl"
export MACFLEET_RUNNER=${MACFLEET_RUNNER:-$root/bin/macfleet-runner}
mf=$root/bin/macfleet
api_port=${DEMO_API_PORT:-18080}
probe_port=${DEMO_PROBE_PORT:-18081}

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
	local deadline=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || { echo "timed out waiting for $what" >&2; return 1; }
		sleep 0.2
	done
}

say "1. Standalone agent: a synthesized model in a real runner"
[[ -f $work/small.gguf ]] || "$mf" synth-model --preset small -o "$work/small.gguf"
"$mf" serve --listen "127.0.0.1:$api_port" --memory-ceiling 2Gi \
	--model "demo=$work/small.gguf:ctx=1024,parallel=2,residency=Resident" >"$work/serve.log" 2>&1 &
pids+=($!)
wait_for 60 "the agent" curl -sf "127.0.0.1:$api_port/readyz"
echo "\$ curl -N http://127.0.0.1:$api_port/v1/chat/completions -d '{\"model\":\"demo\",\"stream\":true,...}'"
curl -sSN "127.0.0.1:$api_port/v1/chat/completions" -H 'Content-Type: application/json' \
	-d '{"model":"demo","stream":true,"max_tokens":24,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hello to the fleet."}]}' |
	tee "$work/stream.txt" | sed -n '1,4p;/usage/p;/DONE/p' | cut -c1-200
grep -q '^data: \[DONE\]' "$work/stream.txt" || { echo "the stream did not end with [DONE]" >&2; exit 1; }
echo
echo "\$ curl http://127.0.0.1:$api_port/api/status   (pool: ceiling, usage, committed; per model)"
curl -sS "127.0.0.1:$api_port/api/status" | cut -c1-400
echo
echo "\$ curl -X POST http://127.0.0.1:$api_port/api/models/demo/unload?wait=true"
curl -sS -X POST "127.0.0.1:$api_port/api/models/demo/unload?wait=true" | grep -o '"lastUnload":{[^}]*}' | head -1

say "2. Control plane: kube-apiserver + etcd, macfleet manager, two simulated Macs"
rm -f "$root/.cache/dev-cluster/kubeconfig"
hack/dev-cluster.sh "$assets" >"$work/dev-cluster.log" 2>&1 &
pids+=($!)
wait_for 120 "the API server" test -s "$root/.cache/dev-cluster/kubeconfig"
export KUBECONFIG=$root/.cache/dev-cluster/kubeconfig
"$mf" manager --metrics-bind-address 0 --health-probe-bind-address "127.0.0.1:$probe_port" >"$work/manager.log" 2>&1 &
pids+=($!)
wait_for 60 "the manager" curl -sf "127.0.0.1:$probe_port/readyz"

"$kubectl" apply -f hack/demo/fleet.yaml
now=$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)
for spec in mac-studio-1:48Gi:Apple\ M2\ Ultra mac-mini-1:12Gi:Apple\ M4; do
	IFS=: read -r name ceiling chip <<<"$spec"
	"$kubectl" apply -f - <<LEASE
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: $name, namespace: macfleet-node-lease}
spec: {holderIdentity: $name, leaseDurationSeconds: 3600, renewTime: "$now"}
LEASE
	"$kubectl" patch macnode "$name" --subresource=status --type=merge -p "{\"status\":{
		\"hardware\":{\"chip\":\"$chip\"},\"agent\":{\"version\":\"demo\",\"address\":\"192.0.2.10:8080\"},
		\"memory\":{\"ceiling\":\"$ceiling\",\"pressure\":\"OK\"},
		\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"AgentReady\",\"message\":\"simulated by make demo\",\"lastTransitionTime\":\"$now\"}]}}" >/dev/null
done
"$kubectl" apply -f config/samples/ -f hack/demo/tiny-chat.yaml
wait_for 60 "tiny-chat's replicas to be bound" bash -c \
	"[[ \$('$kubectl' get mr -l macfleet.dev/deployment=tiny-chat -o jsonpath='{.items[*].spec.nodeName}' | wc -w) == 2 ]]"
wait_for 60 "the sample's memory estimate to fail offline" bash -c \
	"'$kubectl' get md qwen-7b -o jsonpath='{.status.conditions[?(@.type==\"Scheduled\")].reason}' | grep -q MemoryEstimateFailed"
echo "\$ kubectl get md,mr,mn"
"$kubectl" get md,mr,mn
echo
echo "qwen-7b cannot be estimated here (no network to the model hub):"
"$kubectl" get md qwen-7b -o jsonpath='{.status.conditions[?(@.type=="Scheduled")].message}'
echo

say "Running"
echo "Agent:  http://127.0.0.1:$api_port/v1   (model \"demo\", unloaded; the next request loads it again)"
echo "Kube:   export KUBECONFIG=$KUBECONFIG"
echo "Logs:   $work/*.log"
if [[ ${DEMO_EXIT:-0} == 1 ]]; then
	exit 0
fi
echo "Ctrl-C stops everything."
wait "${pids[0]}"
