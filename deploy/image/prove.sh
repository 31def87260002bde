#!/usr/bin/env bash
# Proves that the image serves without a container runtime: exports the image's file system,
# runs its entrypoint and command as the image says (uid 1000, its environment and working
# directory) under unshare (new pid, mount and network namespaces: tini is PID 1, ports are
# the image's own on a private loopback) and chroot, with the root file system read-only as
# deploy/kubernetes runs it. Then it checks liveness, readiness, an inference, the metrics and
# the drain on SIGTERM. Needs root, podman, unshare, nsenter, ip and curl.
#   deploy/image/prove.sh [image]        # default localhost/tritium:latest
set -euo pipefail
image=${1:-${IMAGE:-localhost/tritium:latest}}
work=$(mktemp -d)
root=$work/rootfs
log=$work/server.log
server=

say() { printf '%s %s\n' "$(date -u +%H:%M:%S.%3N)" "$*"; }
fail() { say "FAIL: $*"; echo "--- server log"; cat "$log" 2>/dev/null; exit 1; }
cleanup() {
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server"; fi
    rm -rf "$work"
}
trap cleanup EXIT

say "exporting the file system of $image"
# Never started, so no health checks to schedule.
container=$(podman create --no-healthcheck "$image")
mkdir "$root"
podman export "$container" | tar -C "$root" --numeric-owner -xf -
podman rm "$container" >/dev/null
config() { podman image inspect --format "{{json .Config.$1}}" "$image"; }
# The container's view, from the image's own configuration.
mapfile -t argv < <(jq -r '.[]' <<<"$(config Entrypoint)"; jq -r '.[]' <<<"$(config Cmd)")
mapfile -t environment < <(jq -r '.[]' <<<"$(config Env)")
user=$(jq -r . <<<"$(config User)")
workdir=$(jq -r . <<<"$(config WorkingDir)")
# The health check's exec form (["CMD", ...]), as a container engine would run it.
mapfile -t health < <(jq -r '.Test[1:][]' <<<"$(config Healthcheck)")
say "entrypoint + command: ${argv[*]}"
say "user $user, working directory $workdir"

# Inside the namespaces: loopback up, the root read-only, kernel file systems and writable
# scratch mounted as a kubelet would, then the image's entrypoint as its user.
# shellcheck disable=SC2016  # expanded by the inner bash, from its own arguments
inner='
set -e
root=$1 user=$2; shift 2
ip link set lo up
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o size=1g,mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
exec chroot --userspec="$user" "$root" /usr/bin/env -i "${@}"
'
unshare --pid --fork --mount --net --propagation private \
    bash -c "$inner" inner "$root" "$user" \
    "${environment[@]}" /usr/bin/env --chdir="$workdir" "${argv[@]}" >"$log" 2>&1 &
unshared=$!
# The namespace's PID 1 (tini) is unshare's one child.
for _ in $(seq 100); do
    server=$(tr -d ' ' <"/proc/$unshared/task/$unshared/children" 2>/dev/null) || true
    [ -n "$server" ] && break
    sleep 0.1
done
[ -n "$server" ] || fail "the entrypoint did not start"
# PID 1 is bash until the mounts are made, then chroot, env and the entrypoint in its place.
entry=$(basename "${argv[0]}")
for _ in $(seq 100); do
    [ "$(cat "/proc/$server/comm" 2>/dev/null)" = "$entry" ] && break
    sleep 0.1
done
say "started: pid $server on the host is PID 1 ($(cat "/proc/$server/comm")) in its namespace"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$server/status")
say "it runs as uid $uid"
[ "$uid" = 1000 ] || fail "not running as uid 1000"

inside() { nsenter --net="/proc/$server/ns/net" "$@"; }
# A command in the container, as its user: what a container engine's exec would run.
in_image() {
    nsenter --target "$server" --net --mount --root --wd --setuid "${user%%:*}" \
        --setgid "${user##*:}" /usr/bin/env -i "${environment[@]}" "$@"
}
healthcheck() {
    if in_image "${health[@]}" >/dev/null 2>&1; then echo healthy; else echo unhealthy; fi
}
status() { inside curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$1" || true; }

for _ in $(seq 600); do
    [ "$(status 8000/v2/health/live)" = 200 ] && break
    kill -0 "$server" 2>/dev/null || fail "the server exited during startup"
    sleep 0.2
done
say "GET :8000/v2/health/live -> $(status 8000/v2/health/live)"
ready=$(status 8000/v2/health/ready)
say "GET :8000/v2/health/ready -> $ready"
[ "$ready" = 200 ] || fail "not ready"
verdict=$(healthcheck)
say "HEALTHCHECK ${health[*]:0:1} ... -> $verdict"
[ "$verdict" = healthy ] || fail "the image's health check fails on a ready server"

body='{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},
{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[10,20,30,40]}]}'
answer=$(inside curl -sf --max-time 10 http://127.0.0.1:8000/v2/models/add_sub/infer -d "$body")
say "POST :8000/v2/models/add_sub/infer -> $answer"
sums=$(jq -c '.outputs[] | select(.name == "OUTPUT0") | .data' <<<"$answer")
[ "$sums" = "[11,22,33,44]" ] || fail "OUTPUT0 is $sums, not [11,22,33,44]"
successes=$(inside curl -sf --max-time 5 http://127.0.0.1:8002/metrics \
    | grep '^nv_inference_request_success{model="add_sub"' || true)
say "GET :8002/metrics -> $successes"
[ -n "$successes" ] || fail "no add_sub success counter on the metrics port"
# gRPC with the tritonclient the image carries (tritium depends on it).
grpc_check='
import numpy as np
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient("127.0.0.1:8001")
inputs = [grpcclient.InferInput(name, [4], "FP32") for name in ("INPUT0", "INPUT1")]
inputs[0].set_data_from_numpy(np.array([1, 2, 3, 4], dtype=np.float32))
inputs[1].set_data_from_numpy(np.array([10, 20, 30, 40], dtype=np.float32))
result = client.infer("add_sub", inputs)
print(f"ServerReady {client.is_server_ready()}, ModelInfer add_sub OUTPUT1",
      result.as_numpy("OUTPUT1").tolist())
'
grpc_answer=$(in_image python3 -c "$grpc_check" 2>&1) || fail "gRPC: $grpc_answer"
say "gRPC :8001 -> $grpc_answer"
[ "$grpc_answer" = "ServerReady True, ModelInfer add_sub OUTPUT1 [-9.0, -18.0, -27.0, -36.0]" ] \
    || fail "gRPC answered something else"

# A request in flight from before SIGTERM until after the lame duck (about 8 s of tokens) is
# drained: it finishes, it does not fail.
inside curl -s -o "$work/inflight.json" -w '%{http_code}' --max-time 60 \
    http://127.0.0.1:8000/v2/models/llm/generate \
    -d '{"text_input": "drain me", "max_tokens": 400}' >"$work/inflight.code" &
inflight=$!
sleep 0.5
infer_status() {
    inside curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
        http://127.0.0.1:8000/v2/models/add_sub/infer -d "$body" || true
}
logged() {
    for _ in $(seq 600); do
        grep -q "$1" "$log" && return 0
        kill -0 "$server" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
say "SIGTERM to the entrypoint (pid $server)"
kill -TERM "$server"
for _ in $(seq 100); do
    ready=$(status 8000/v2/health/ready)
    [ "$ready" != 200 ] && break
    sleep 0.05
done
say "GET :8000/v2/health/ready -> $ready"
# Any answer but 200 fails a probe; tritonserver says 400.
case $ready in 200 | 000) fail "still ready (or gone) after SIGTERM" ;; esac
verdict=$(healthcheck)
say "HEALTHCHECK in the lame duck -> $verdict"
[ "$verdict" = unhealthy ] || fail "the image's health check passes a server going down"
during=$(infer_status)
say "POST :8000/v2/models/add_sub/infer in the lame duck -> $during"
[ "$during" = 200 ] || fail "a new request was refused during the lame duck"
logged "lame duck over" || fail "no end of the lame duck in the log"
say "lame duck over; POST :8000/v2/models/add_sub/infer while draining -> $(infer_status)"
code=0
wait "$unshared" || code=$?
wait "$inflight" || true
server=
say "in-flight /generate answered $(cat "$work/inflight.code"): $(cut -c1-80 "$work/inflight.json")"
say "the entrypoint exited with code $code"
echo "--- server log"
cat "$log"
echo "---"
[ "$(cat "$work/inflight.code")" = 200 ] || fail "the in-flight request was not drained"
[ "$code" = 0 ] || fail "exit code $code"
# The in-flight request counts with the BLS request it made.
grep -Eq "shutdown complete: [1-9][0-9]* request\(s\) drained, 0 cancelled" "$log" \
    || fail "no drain log line"
say "PASS: live, ready, healthy, HTTP and gRPC inference, metrics; SIGTERM -> not ready," \
    "still serving -> drained -> exit 0"
