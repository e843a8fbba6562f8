#!/bin/sh
# Launch script of the sparkfleet lab recipe, in the style of a real recipe's: defaults first (each
# one line `: "${NAME:=VALUE}"`, which sparkfleet reads to report upstream drift), then vllm.
set -eu
: "${CG_ESTIMATE:=0}"
: "${MAX_NUM_BATCHED_TOKENS:=2048}"
: "${LANGUAGE_MODEL_ONLY:=0}"
: "${KV_SLOTMAP_PIN:=0}"
export CG_ESTIMATE MAX_NUM_BATCHED_TOKENS LANGUAGE_MODEL_ONLY KV_SLOTMAP_PIN
# CG_ESTIMATE is what vLLM reads as VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (CUDA-graph KV deduction).
export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS="$CG_ESTIMATE"
exec vllm serve "$@"
