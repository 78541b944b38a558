#!/usr/bin/env bash
# Builds what scripts/gpu-torch.sh carries to a GPU machine (which has no
# Go): the PyTorch bridge's shared library and the C ABI checker.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dev/torch
CGO_ENABLED=1 go build -buildmode=c-shared -trimpath -o .dev/torch/libarenaplan.so ./cmd/libarenaplan
gcc -O2 -Wall -o .dev/torch/abi_check cmd/libarenaplan/abicheck/abi_check.c -ldl -lpthread
ls -la .dev/torch
