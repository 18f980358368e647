#!/usr/bin/env bash
# make demo — a whole macfleet on this machine (hack/localfleet, test/support/localfleet):
# kube-apiserver + etcd, `macfleet manager`, `macfleet gateway`, two `macfleet agent`s
# simulating Macs with different memory ceilings (each with its own node credential),
# and a model server holding a synthesized GGUF model. It applies config/samples/,
# waits for the replicas to be Ready, streams a chat completion through the gateway,
# makes a tool call, asks the vision sample about two images, wakes the autoscaled sample from zero replicas with a request,
# runs Claude Code against the 32k-context coder sample (when hack/npm's clients are
# installed), shows a team's key scoped to its namespace and its usage, shows `kubectl
# get md,mr,mn`, the agents' certificates (mutual TLS, no shared secret), and keeps
# the fleet running until Ctrl-C (DEMO_EXIT=1 exits instead).
# The gateway runs as the chart runs it by default, with team keys: the operator's
# steps use the admin key the local fleet writes into fleet.env (ADMIN_KEY).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
work=$root/.cache/demo
mkdir -p "$work"
assets=${KUBEBUILDER_ASSETS:?run through make demo}
kubectl="$assets/kubectl"
env_file=$work/fleet.env

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
	local deadline=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || { echo "timed out waiting for $what" >&2; return 1; }
		kill -0 "$fleet_pid" 2>/dev/null || { echo "the fleet stopped; see $work/fleet.log" >&2; tail -20 "$work/fleet.log" >&2; return 1; }
		sleep 0.5
	done
}

go build -o bin/localfleet ./hack/localfleet
rm -f "$env_file"
say "Starting a local fleet: API server, manager, gateway, two simulated Macs"
bin/localfleet -dir "$work/fleet" -env-file "$env_file" -binary bin/macfleet -runner bin/macfleet-runner \
	>"$work/fleet.log" 2>&1 &
fleet_pid=$!
cleanup() {
	kill "$fleet_pid" 2>/dev/null || true
	wait "$fleet_pid" 2>/dev/null || true
}
trap cleanup EXIT
wait_for 600 "the fleet to start" test -s "$env_file"
sed 's/^/  /' "$work/fleet.log"
# shellcheck source=/dev/null
source "$env_file"
export KUBECONFIG

say "kubectl apply -f config/samples/"
"$kubectl" apply -f config/samples/
"$kubectl" wait --for=condition=Available md/tiny-chat --timeout=300s

say "A streamed chat completion through the gateway ($GATEWAY)"
echo "\$ curl -N $GATEWAY/v1/chat/completions -H \"Authorization: Bearer \$ADMIN_KEY\" -d '{\"model\":\"tiny-chat\",\"stream\":true,...}'"
curl -sSN "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' \
	-d '{"model":"tiny-chat","stream":true,"max_tokens":24,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hello to the fleet."}]}' |
	tee "$work/stream.txt" | sed -n '1,4p;/usage/p;/DONE/p' | cut -c1-200
grep -q '^data: \[DONE\]' "$work/stream.txt" || { echo "the stream did not end with [DONE]" >&2; exit 1; }

say "The fleet prompt cache: a conversation's next turn goes to the replica that holds its start"
# A system prompt of a few 64-token blocks; turn 2 repeats turn 1 and adds to it. The
# gateway sends each request's prefix digests; the runner that saved turn 1 reports
# them, and the gateway routes turn 2 there (--routing=prefix-cache, the default).
system=$(printf 'You are the fleet assistant of team %s. ' alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega)
turn1='{"role":"system","content":"'$system'"},{"role":"user","content":"Which Mac holds this conversation?"}'
chat_turn() { # chat_turn MESSAGES OUT
	curl -sS "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' \
		-d '{"model":"tiny-chat","max_tokens":4,"temperature":0,"messages":['"$1"']}' >"$2"
}
chat_turn "$turn1" "$work/turn1.json"
echo "turn 1: $(grep -o '"prompt_tokens":[0-9]*' "$work/turn1.json"), $(grep -o '"cached_tokens":[0-9]*' "$work/turn1.json" || echo '"cached_tokens":0')"
turn2=$turn1',{"role":"assistant","content":"The one the gateway picked."},{"role":"user","content":"And the next turn?"}'
# The runner saves turn 1's state after answering and the gateway learns of it from the
# agent's prefix events a moment later: ask until turn 2 restores it (at most 10 s).
# A hit restores at least turn 1's system prompt (3 blocks of 64 tokens and more); a
# replica that holds nothing of it shares only the template's first tokens.
attempts=0
turn2_hits() {
	attempts=$((attempts + 1))
	chat_turn "$turn2" "$work/turn2.json" || return 1
	local cached
	cached=$(grep -o '"cached_tokens":[0-9]*' "$work/turn2.json" | cut -d: -f2)
	((${cached:-0} >= 192))
}
wait_for 10 "turn 2 to restore turn 1's prefix" turn2_hits
echo "turn 2: $(grep -o '"prompt_tokens":[0-9]*' "$work/turn2.json"), $(grep -o '"cached_tokens":[0-9]*' "$work/turn2.json") (attempt $attempts)   (docs/fleet.md: routing)"

say "A tool call: the model's own chat template renders the tools, tool_choice \"required\" constrains sampling"
# One call (parallel_tool_calls false), greedy: the trained test model names the city
# the question does (docs/testing.md).
tool_body='{"model":"tiny-chat","max_tokens":160,"temperature":0,"parallel_tool_calls":false,"tool_choice":"required","messages":[{"role":"user","content":"Weather in Paris?"}],
 "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
 "properties":{"city":{"type":"string","maxLength":24}},"required":["city"],"additionalProperties":false}}}]}'
echo "\$ curl $GATEWAY/v1/chat/completions -H \"Authorization: Bearer \$ADMIN_KEY\" -d '{\"model\":\"tiny-chat\",\"tool_choice\":\"required\",\"tools\":[get_weather],...}'"
curl -sS "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' -d "$tool_body" | tee "$work/tool.json" | cut -c1-400
echo
grep -q '"finish_reason":"tool_calls"' "$work/tool.json" || { echo "no tool call came back" >&2; exit 1; }
grep -q 'city\\":\\"Paris' "$work/tool.json" || { echo "the tool call does not name the city asked for (Paris)" >&2; exit 1; }

say "An image question: a vision model with its projector (config/samples/tiny-vision.yaml; docs/vision.md)"
# Two 8x8 PNGs as data URIs: a gradient, asked twice (the second time the prompt cache
# holds the image's tokens), then a checkerboard (a miss from the image on).
gradient='iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAbElEQVR42hXNQRUAUQhCUaMYhShGeVGIQhSizB+XXA7ODDtouIHBQ4YOM8suWm5h8ZKl+0CskDiBsIioHhx76LiDw0eO3oN/4FVf+J8h0PduzBqZ8x/bxNQPwgaFy192SGgelC0q13/CJaXlA8Z7WAFXOTbyAAAAAElFTkSuQmCC'
checkers='iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAF0lEQVR42mNgYGD4//8/FhK7KAQMPh0AXXNfoWyFCAcAAAAASUVORK5CYII='
"$kubectl" wait --for=condition=Available md/tiny-vision --timeout=300s
ask_image() { # $1 base64 PNG, $2 output file
	curl -sS "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' \
		-d '{"model":"tiny-vision","max_tokens":6,"temperature":0,"messages":[{"role":"user","content":[
		{"type":"image_url","image_url":{"url":"data:image/png;base64,'"$1"'"}},{"type":"text","text":"What is in this picture?"}]}]}' >"$2"
	echo "$(grep -o '"prompt_tokens":[0-9]*' "$2" || true), $(grep -o '"cached_tokens":[0-9]*' "$2" || echo '"cached_tokens":0')"
}
echo "\$ curl $GATEWAY/v1/chat/completions -d '{\"model\":\"tiny-vision\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",...},{\"type\":\"text\",...}]}]}'"
echo "the gradient:            $(ask_image "$gradient" "$work/image1.json")"
echo "the gradient again:      $(ask_image "$gradient" "$work/image2.json")"
echo "a checkerboard:          $(ask_image "$checkers" "$work/image3.json")"
cached_of() { grep -o '"cached_tokens":[0-9]*' "$1" | cut -d: -f2 || true; }
grep -q '"finish_reason"' "$work/image1.json" || { echo "the vision sample did not answer: $(cut -c1-300 "$work/image1.json")" >&2; exit 1; }
again=$(cached_of "$work/image2.json") other=$(cached_of "$work/image3.json")
((${again:-0} > ${other:-0})) ||
	{ echo "the same image again was not a prompt-cache hit beyond the other image's (${again:-0} against ${other:-0} cached tokens)" >&2; exit 1; }

say "A mixture-of-experts model stored in three files (config/samples/tiny-moe.yaml; docs/models.md)"
# A tiny Qwen3-Coder-shaped model (experts, its own vocabulary and chat template, random
# weights: the words are noise, the paths are the point). The agent fetched all three
# parts; the memory column counts every expert; the same prompt again restores its state.
"$kubectl" wait --for=condition=Available md/tiny-moe --timeout=300s
"$kubectl" get md tiny-moe
ask_moe() { # $1 output file
	curl -sS "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' \
		-d '{"model":"tiny-moe","max_tokens":8,"temperature":0,"messages":[{"role":"system","content":"You are a coding agent. Read the files you are given and answer briefly."},{"role":"user","content":"What does main.go do?"}]}' >"$1"
	grep -q '"finish_reason"' "$1" || { echo "the MoE sample did not answer: $(cut -c1-300 "$1")" >&2; return 1; }
	echo "$(grep -o '"prompt_tokens":[0-9]*' "$1"), $(grep -o '"cached_tokens":[0-9]*' "$1" || echo '"cached_tokens":0')"
}
echo "\$ curl $GATEWAY/v1/chat/completions -d '{\"model\":\"tiny-moe\",\"temperature\":0,\"messages\":[...]}'"
echo "first:  $(ask_moe "$work/moe1.json")"
echo "again:  $(ask_moe "$work/moe2.json")"
moe_cached=$(cached_of "$work/moe2.json")
((${moe_cached:-0} > 0)) || { echo "the MoE sample's repeated prompt was not a prompt-cache hit" >&2; exit 1; }
[[ $(LC_ALL=C grep -o '"content":"[^"]*"' "$work/moe1.json") == "$(LC_ALL=C grep -o '"content":"[^"]*"' "$work/moe2.json")" ]] ||
	{ echo "the MoE sample answered the same greedy prompt differently after a cache hit" >&2; exit 1; }

say "The OnDemand sample loads on its first request (the gateway holds it meanwhile)"
"$kubectl" wait --for=condition=Available md/tiny-chat-ondemand --timeout=300s
curl -sS "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' -w '\n' \
	-d '{"model":"tiny-chat-ondemand","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}' | cut -c1-300

say "The autoscaled sample is at zero replicas; its first request wakes it (the gateway holds it meanwhile)"
"$kubectl" get md tiny-chat-autoscaled
curl -sS "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $ADMIN_KEY" -H 'Content-Type: application/json' -w '\n' \
	-d '{"model":"tiny-chat-autoscaled","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}' |
	tee "$work/wake.json" | cut -c1-300
grep -q '"finish_reason"' "$work/wake.json" || { echo "the autoscaled sample did not answer from zero" >&2; exit 1; }
"$kubectl" get md tiny-chat-autoscaled

say "A coding agent: Claude Code against the gateway (config/samples/coder.yaml, 32k context)"
"$kubectl" wait --for=condition=Available md/coder --timeout=300s
claude_env=(ANTHROPIC_BASE_URL="$GATEWAY" ANTHROPIC_API_KEY="$ADMIN_KEY" ANTHROPIC_MODEL=coder
	ANTHROPIC_DEFAULT_HAIKU_MODEL=coder CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1)
echo "\$ ${claude_env[*]/$ADMIN_KEY/\$ADMIN_KEY} claude -p \"Say hi\""
claude_bin=${CACHE_DIR:-$HOME/.cache/macfleet}/npm/node_modules/.bin/claude
if [[ -x $claude_bin ]]; then
	# The model answers "Hi"; the first turn prefills Claude Code's ~12k-token prompt.
	env HOME="$work/claude-home" "${claude_env[@]}" DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
		DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_MAX_OUTPUT_TOKENS=64 timeout 300 "$claude_bin" -p "Say hi" </dev/null ||
		{ echo "Claude Code failed against the gateway" >&2; exit 1; }
else
	echo "(Claude Code is not installed here: 'make deps DEPS_GOALS=test' installs it and Codex CLI, pinned,"
	echo " into ${CACHE_DIR:-$HOME/.cache/macfleet}/npm. README: \"Use with Claude Code\", \"Use with Codex\".)"
fi

say "Teams: a key of namespace team-a reaches what team-a may use, and nothing else"
team_key=$(od -An -N24 -tx1 /dev/urandom | tr -d " \n")
echo "\$ kubectl create namespace team-a"
echo "\$ kubectl -n team-a create secret generic demo-key --type=macfleet.dev/api-key --from-literal=key=\$TEAM_KEY"
"$kubectl" create namespace team-a
"$kubectl" -n team-a create secret generic demo-key --type=macfleet.dev/api-key --from-literal=key="$team_key"
team_chat() { # team_chat OUTPUT: the team key's chat with tiny-chat; prints the HTTP status
	curl -sS -o "$1" -w '%{http_code}' "$GATEWAY/v1/chat/completions" -H "Authorization: Bearer $team_key" \
		-H 'Content-Type: application/json' -d '{"model":"tiny-chat","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}'
}
wait_for 10 "the gateway to take the new key" sh -c "curl -sf -o /dev/null -H 'Authorization: Bearer $team_key' $GATEWAY/v1/models"
echo "tiny-chat lives in namespace default, so to team-a's key it does not exist:"
status=$(team_chat "$work/team.json")
echo "  $status $(cut -c1-200 "$work/team.json")"
[[ $status == 404 ]] || { echo "team-a's key reached another namespace's model (HTTP $status)" >&2; exit 1; }
echo "\$ kubectl patch md tiny-chat --type=merge -p '{\"spec\":{\"access\":{\"namespaces\":[\"team-a\"]}}}'"
"$kubectl" patch md tiny-chat --type=merge -p '{"spec":{"access":{"namespaces":["team-a"]}}}'
wait_for 10 "the grant to reach the gateway" sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer $team_key' $GATEWAY/v1/models/tiny-chat)\" = 200 ]"
status=$(team_chat "$work/team.json")
echo "  $status $(cut -c1-200 "$work/team.json")"
[[ $status == 200 ]] || { echo "the granted model did not answer team-a's key (HTTP $status)" >&2; exit 1; }
echo "\$ macfleet usage -n team-a      # the gateways' ledger (TokenUsage), summed per day and key"
wait_for 10 "the gateway's ledger" sh -c "bin/macfleet usage -n team-a -o csv | grep -q demo-key"
bin/macfleet usage -n team-a
echo "A budget of 1 token a minute for team-a: its next request is refused until the minute ends"
"$kubectl" apply -f - <<'YAML'
apiVersion: macfleet.dev/v1alpha1
kind: TokenBudget
metadata: {name: demo, namespace: team-a}
spec: {tokensPerMinute: 1}
YAML
wait_for 10 "the budget to refuse team-a" sh -c "[ \"\$(curl -s -D '$work/budget.headers' -o '$work/budget.json' -w '%{http_code}' \
	-H 'Authorization: Bearer $team_key' -H 'Content-Type: application/json' $GATEWAY/v1/chat/completions \
	-d '{\"model\":\"tiny-chat\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}')\" = 429 ]"
echo "  429 $(grep -i '^retry-after' "$work/budget.headers" | tr -d '\r') $(cut -c1-240 "$work/budget.json")"

say "The data plane trusts no shared secret: each Mac serves mutual TLS with its own certificate"
"$kubectl" get csr -o custom-columns='CSR:.metadata.name,SIGNER:.spec.signerName,REQUESTOR:.spec.username,STATUS:.status.conditions[*].type'
mac=$("$kubectl" get mn -o jsonpath='{.items[0].metadata.name}')
pin=$("$kubectl" -n macfleet-nodes get secret "$mac-credential" -o jsonpath='{.metadata.annotations.macfleet\.dev/node-key-sha256}')
echo "\$ kubectl -n macfleet-nodes get secret $mac-credential   # the key its certificates must use: $pin"
[[ -n $pin ]] || { echo "no key pinned to $mac after its first certificate" >&2; exit 1; }
addr=$("$kubectl" get mn -o jsonpath='{.items[0].status.agent.address}')
code=$(curl -sk -o /dev/null -w '%{http_code}' "https://$addr/api/status" || true)
echo "\$ curl -k https://$addr/api/status    # no client certificate: $code"
[[ $code == 401 ]] || { echo "an agent answered $code without a credential, want 401" >&2; exit 1; }
plain=$(curl -s -m 5 "http://$addr/api/status" || true)
echo "\$ curl http://$addr/api/status     # plain HTTP: $plain"
[[ $plain != *'"ready"'* ]] || { echo "an agent served plain HTTP" >&2; exit 1; }
echo "  (make attack tries each exploit of docs/security.md against a fleet like this one)"

say "kubectl get md,mr,mn"
"$kubectl" get md,mr,mn -o wide

say "Running"
echo "Gateway:  $GATEWAY/v1   (models: curl -H \"Authorization: Bearer \$ADMIN_KEY\" $GATEWAY/v1/models)"
echo "Console:  $GATEWAY/ui/   (Macs, models, unloads, usage, playground; sign in with the admin key or team-a's)"
echo "Keys:     ADMIN_KEY=$ADMIN_KEY   TEAM_KEY=$team_key (team-a)"
echo "Kube:     export KUBECONFIG=$KUBECONFIG"
echo "Logs:     $LOGS/"
if [[ ${DEMO_EXIT:-0} == 1 ]]; then
	exit 0
fi
echo "Ctrl-C stops everything."
wait "$fleet_pid"
