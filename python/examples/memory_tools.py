"""PyTorch's memory tooling with arenaplan as the allocator: statistics,
snapshots for memory_viz, MemPool, and out of memory as PyTorch words it.

    python3 examples/memory_tools.py
"""
import torch

import arenaplan.torch as ap

ap.install()

torch.cuda.reset_peak_memory_stats()
x = torch.randn(4096, 4096, device="cuda")
y = x @ x
print("allocated", torch.cuda.memory_allocated(), "peak", torch.cuda.max_memory_allocated(),
      "reserved", torch.cuda.memory_reserved())

torch.cuda.memory._record_memory_history(max_entries=10000)
z = y.relu()
torch.cuda.memory._dump_snapshot("/tmp/arenaplan-snapshot.pickle")  # drag into pytorch.org/memory_viz
torch.cuda.memory._record_memory_history(enabled=None)

pool = torch.cuda.MemPool()  # served by arenaplan: its tensors share its segments
with torch.cuda.use_mem_pool(pool):
    w = torch.empty(1 << 20, device="cuda")
print("pool", pool.id, "segments", len(pool.snapshot()))

try:
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
except RuntimeError as e:  # accelerate's find_executable_batch_size looks for this wording
    assert "CUDA out of memory." in str(e)
    print("refused:", str(e).splitlines()[0][:100])
print("num_ooms", torch.cuda.memory_stats()["num_ooms"])
