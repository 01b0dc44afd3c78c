#!/usr/bin/env bash
# The pod image's entrypoint: the pod server, and for ENGINE=vlm a vLLM server beside it.
#
# The pod server reads its settings from the environment the control plane gives the pod
# (PORT, LANES, ENGINE, MODEL, POD_TOKEN, PAGE_TIMEOUT, DOCUMENT_CACHE_*; see podserver/config.py).
# For ENGINE=vlm the weights come from MODEL_PATH (a directory on a network volume, e.g.
# /workspace/models/olmOCR-2-7B-1025-FP8), else from /models/$MODEL when baked into the image,
# else vLLM fetches $MODEL from the Hugging Face hub at start.
#
# Without vLLM the pod server replaces this shell (exec): signals reach it directly. With vLLM
# both run as children; SIGTERM/SIGINT go to both, and when either exits the other is stopped
# and the pod exits with the first one's status, so RunPod sees a dead pod instead of one that
# answers "loading" forever.
set -euo pipefail

ENGINE=${ENGINE:-tesseract}
PYTHON=${PODSERVER_PYTHON:-python3}
export ENGINE

if [ "$ENGINE" != vlm ]; then
  exec "$PYTHON" -m podserver "$@"
fi

export MODEL=${MODEL:-allenai/olmOCR-2-7B-1025-FP8}
VLM_PORT=${VLM_PORT:-8001}
export VLM_URL=${VLM_URL:-http://127.0.0.1:${VLM_PORT}/v1}
weights=${MODEL_PATH:-}
if [ -z "$weights" ] && [ -d "/models/$MODEL" ]; then
  weights="/models/$MODEL"
fi
weights=${weights:-$MODEL}
if [ -n "${MODEL_PATH:-}" ] && [ ! -d "$MODEL_PATH" ]; then
  echo "entrypoint: MODEL_PATH=$MODEL_PATH is not a directory (is the network volume attached?)" >&2
  exit 1
fi

# olmOCR's own serving settings: a 16k context holds a page image and its longest answers.
# shellcheck disable=SC2086  # VLLM_ARGS is a list of extra flags
vllm serve "$weights" \
  --served-model-name "$MODEL" \
  --host 127.0.0.1 --port "$VLM_PORT" \
  --max-model-len "${VLM_MAX_MODEL_LEN:-16384}" \
  --gpu-memory-utilization "${VLM_GPU_MEMORY_UTILIZATION:-0.90}" \
  --limit-mm-per-prompt '{"image": 1}' \
  ${VLLM_ARGS:-} &
vllm_pid=$!

"$PYTHON" -m podserver "$@" &
pod_pid=$!

stopping=0
forward() {
  stopping=1
  kill -s "$1" "$pod_pid" "$vllm_pid" 2>/dev/null || true
}
trap 'forward TERM' TERM
trap 'forward INT' INT

# Until one of the two exits (a trapped signal interrupts wait, hence the loop).
while kill -0 "$pod_pid" 2>/dev/null && kill -0 "$vllm_pid" 2>/dev/null; do
  wait -n "$pod_pid" "$vllm_pid" || true
done
# A signal forwarded already is not sent twice: a second TERM while the pod server shuts down
# (aiohttp's handler gone) killed it, and the pod ended 143 instead of 0.
if [ "$stopping" = 0 ]; then
  kill -s TERM "$pod_pid" "$vllm_pid" 2>/dev/null || true
fi
pod_status=0
wait "$pod_pid" || pod_status=$?
wait "$vllm_pid" || true
if [ "$stopping" = 1 ]; then
  exit "$pod_status"
fi
echo "entrypoint: the pod server or vLLM exited on its own; stopping the pod" >&2
exit 1
