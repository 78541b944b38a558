"""Writes the small torch-snapshot-like pickles the lifetime tests read.

Run from this folder with python3 (no torch needed): python3 gen_torch_fixture.py
The expected lifetimes and statistics are worked out in torch_test.go.
"""
import pickle

frames = [{"name": "forward", "filename": "model.py", "line": 12}]


def ev(action, addr, size, stream=0, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "time_us": 1795303288758466, "compile_context": "N/A",
         "user_metadata": "", "frames": frames}
    e.update(extra)
    return e


dev0 = [
    ev("alloc", 0x1000, 1000),                      # A, t=0
    ev("alloc", 0x2000, 2000, stream=7),            # B, t=1
    ev("free_requested", 0x1000, 1000),             # t=2
    ev("free_completed", 0x1000, 1000),
    ev("segment_alloc", 0x100000, 2097152),
    ev("alloc", 0x3000, 3000),                      # C, t=3
    ev("free_requested", 0x2000, 2000, stream=7),   # t=4
    ev("alloc", 0x4000, 500),                       # D, t=5
    ev("free_completed", 0x2000, 2000, stream=7),   # B waited for D's alloc
    ev("free_requested", 0x9000, 4096),             # P: allocated before the trace, t=6
    ev("free_completed", 0x9000, 4096),
    {"action": "oom", "device_free": 0, "time_us": 1, "frames": []},
    ev("alloc", 0x5000, 100, user_metadata=b"\x00bytes"),  # E, t=7, never freed
    ev("free_requested", 0x3000, 3000),             # t=8
    ev("free_completed", 0x3000, 3000),
    ev("segment_free", 0x200000, 1048576),
    ev("free_requested", 0x4000, 500),              # t=9, no completion
]
dev2 = [ev("alloc", 0x7000, 64)]


def block(addr, size, state):
    return {"address": addr, "size": size, "requested_size": size,
            "state": state, "frames": []}


segments = [
    {"device": 0, "address": 0x0, "total_size": 4194304, "allocated_size": 8704,
     "active_size": 8704, "requested_size": 8292, "stream": 0,
     "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
     "frames": [], "blocks": [block(0xA000, 8192, "active_allocated"),
                              block(0x5000, 512, "active_allocated"),
                              block(0xC000, 4185600, "inactive")]},
    {"device": 0, "address": 0x100000, "total_size": 2097152, "allocated_size": 0,
     "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
     "blocks": [block(0x100000, 2097152, "inactive")]},
    {"device": 2, "address": 0x7000, "total_size": 1048576, "allocated_size": 512,
     "active_size": 512, "requested_size": 64, "stream": 0, "segment_type": "small",
     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
     "blocks": [block(0x7000, 512, "active_allocated")]},
]

snapshot = {
    "segments": segments,
    "device_traces": [dev0, [], dev2],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                           "garbage_collection_threshold": 0.0,
                           "expandable_segments": False, "huge": 2 ** 70,
                           "negative": -123456789012, "note": "x" * 300},
    "external_annotations": [],
}

with open("torch_small.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=4)

# The same events without segment data: HasSegments must be false.
with open("torch_nosegments.pickle", "wb") as f:
    pickle.dump({"device_traces": [dev0]}, f, protocol=4)
