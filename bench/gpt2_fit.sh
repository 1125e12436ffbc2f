#!/usr/bin/env bash
# GPT-2 through `pipetrain fit` on one GPU (the name earlier results were measured under):
#   bench/gpt2_fit.sh [size=124M] [B=16] [T=1024] [precision=bf16-mixed] [extra fit flags...]
exec "$(dirname "$0")/lm_fit.sh" gpt2 "$@"
