#!/usr/bin/env bash
# Llama 3 on one GPU: pipetrain (bench/lm_fit.sh llama) beside the torchtitan-style peer
# (../shared/bench/peer/llama_peer.py, copied next to the checkout as PEER) in one command, so the
# two are compared on the same machine. One JSON line each; the peer's under COMPILE=0 and 1.
#   PEER=peer/llama_peer.py bench/llama_peer.sh PRESET B T [extra fit flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
preset=$1 B=$2 T=$3
shift 3
PEER=${PEER:-../shared/bench/peer/llama_peer.py}
STEPS=${STEPS:-40} bench/lm_fit.sh llama "$preset" "$B" "$T" bf16-mixed "$@"
for compile in ${PEER_COMPILE:-1 0}; do
  PRESET=$preset B=$B T=$T STEPS=${PEER_STEPS:-20} COMPILE=$compile python3 "$PEER" |
    sed "s/^{/{\"peer\": \"compile=$compile\", /"
done
