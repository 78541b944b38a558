#!/usr/bin/env bash
# Builds what scripts/gpu-torch.sh carries to a GPU machine (which has no
# Go): the PyTorch bridge's shared library, the C ABI checker and the abuse
# cases (abuse); FAULT=1 also builds the library that panics on demand.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dev/torch
CGO_ENABLED=1 go build -buildmode=c-shared -trimpath -o .dev/torch/libarenaplan.so ./cmd/libarenaplan
gcc -O2 -Wall -o .dev/torch/abi_check cmd/libarenaplan/abicheck/abi_check.c -ldl -lpthread
gcc -O2 -Wall -o .dev/torch/abuse cmd/libarenaplan/abicheck/abuse.c -ldl -lpthread
gcc -O2 -Wall -o .dev/torch/eager_steps cmd/libarenaplan/abicheck/eager_steps.c -ldl
# PyTorch's side of arenaplan_torch_alloc: c10::OutOfMemoryError, with a stand-in for libc10 and without.
g++ -O2 -Wall -rdynamic -o .dev/torch/torch_oom_check cmd/libarenaplan/abicheck/torch_oom_check.cc -ldl
g++ -O2 -Wall -DNO_C10 -o .dev/torch/torch_oom_check_nc10 cmd/libarenaplan/abicheck/torch_oom_check.cc -ldl
if [ "${FAULT:-0}" = 1 ]; then
	# Every export made to panic on demand (cmd/libarenaplan/fault.go), for abuse's fault case.
	CGO_ENABLED=1 go build -tags arenaplan_fault -buildmode=c-shared -trimpath -o .dev/torch/libarenaplan-fault.so ./cmd/libarenaplan
	rm -f .dev/torch/libarenaplan-fault.h
fi
ls -la .dev/torch
