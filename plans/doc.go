// Package plans is arenaplan's plan file: a planner.Plan together with the
// lifetime.Trace it was made for (and, optionally, the Workload that trace
// describes), written to disk as a small checksummed, zstd-compressed file
// and read back with every byte distrusted.
//
// A plan file is untrusted input. Decode and Load bound every size before
// they allocate (the file, the declared payload, every count against the
// bytes left), verify the checksum before decompressing, and re-verify what
// they decoded: the trace is validated, the plan is re-checked with
// planner.Check, the stored trace fingerprint, arena size and lower bound
// must equal the recomputed ones. A file that passes is as trustworthy as
// a plan fresh from planner.Run. Every failure is an error that wraps one
// of the sentinel errors below (ErrNotPlan, ErrVersion, ErrCorrupt,
// ErrChecksum, ErrTooLarge, ErrInvalid), so callers can branch with
// errors.Is; Load's errors name the file.
//
// The checksum is SHA-256, which detects corruption, not tampering: anyone
// can write a file with a valid checksum. Safety against crafted files
// comes from the bounds and the re-verification, not from the checksum.
//
// It is not a planner, it knows nothing about devices, and it does not
// keep a cache or index of plans: one file holds one plan of one trace
// (format version 1, File, Encode/Decode/Save/Load) or one family of plans
// sharing an arena (format version 2, Family, EncodeFamily/DecodeFamily/
// SaveFamily/LoadFamily; the family readers also read version 1 files as
// a family of one member). A family file is verified member by member as
// a version 1 file is, then as a whole with planner.CheckFamily.
// Decoding costs one SHA-256 pass over the compressed bytes, one zstd
// decompression and one planner.Check (O(n log n) in the buffers): a
// 62k-buffer plan is a file of about 0.5 MB (8 bytes a buffer) that
// decodes in 55-80 ms and encodes in 130-160 ms on one core, about half
// of either being planner.Check (BenchmarkDecode, BenchmarkEncode).
//
// # File layout (format version 1)
//
// All integers in the header are little-endian.
//
//	offset size  field
//	0      8     magic "ARENAPLN"
//	8      2     format version (1)
//	10     2     header length (64)
//	12     4     flags (0; reserved)
//	16     8     compressed payload length C (the file is exactly 64+C bytes)
//	24     8     uncompressed payload length U (at most MaxPayload, and at
//	             most max(64*C, 1 MiB))
//	32     32    SHA-256 of header bytes [0, 32) followed by the C payload bytes
//	64     C     payload: one zstd frame, window at most 8 MiB
//
// # What a file may cost
//
// The bounds come from the largest real plans. The largest we know, the
// 1M-buffer scaling trace of BENCHMARKS.md, is a payload of 24 MB (24
// bytes a buffer; the traces of ../shared/data take 19 to 23) in a file of
// 8.3 MB; MaxPayload is 64 MiB, 2.6 times that. Real plans compress 1.7
// (MiniMalloc's challenging traces) to 4.8 times (IREE's mobilebert), and
// a built-in workload of 65536 identical layers, the most regular plan we
// make, 19 times; a file may declare at most 64 times its compressed
// bytes (and always 1 MiB), so a zstd bomb is refused from its header
// before anything is decompressed: the 114 KB file declaring
// 1 GiB, or any file declaring more than MaxPayload. A payload within the
// bounds is decompressed once, into one buffer of exactly U bytes (peak
// memory U plus the decoder's block buffers, not the 3.4 to 6 times U of
// a growing buffer), and a frame that yields more than U stops there.
// Parsing then bounds the buffers, gaps, shared buffers and members a
// file may hold by its compressed size, one per compressed byte and at
// least 65536 (real plans hold 0.12 to 0.62), since each costs a few
// hundred bytes of memory and verification: minimal buffers all alike
// compress to almost nothing. So decoding a file costs time and memory
// proportional to its compressed size. LoadAny and DecodeAny decompress a
// file once whatever its version, for readers that take either.
//
// The uncompressed payload is a sequence of sections, each a kind byte, a
// uvarint body length and the body, in increasing kind order, ended by the
// kind byte 0 as the payload's last byte:
//
//	1 meta      trace fingerprint [32]byte, trace name, algorithm, alignment,
//	            arena, lower bound, optimal (0/1), elapsed and to-best (ns;
//	            Encode writes 0, so that the same plan gives the same
//	            bytes; files written before hold planning times)
//	2 buffers   count, then per buffer: name, size, align, start (delta from
//	            the previous buffer's start), end-start, stream, tag, fixed,
//	            hint, offset, gap count, gaps (start-buffer start, length,
//	            window flag, lo, hi)
//	3 prior     optional: count, then an offset per buffer (Trace.Prior)
//	4 torch     optional: Trace.Torch
//	5 workload  optional: member count (always 1), then name,
//	            fingerprint [32]byte, dimension count, (name, value) pairs
//	0 end
//
// # Family payload (format version 2)
//
// The header is the same, with version 2. The payload is a family section,
// one member section per member, then the end byte 0:
//
//	16 family   algorithm, alignment, arena, lower bound, separate arenas,
//	            elapsed (ns; 0 from EncodeFamily), shared count, then per shared key: key, offset,
//	            size, alignment (in offset order), and the member count
//	17 member   name, alone arena, then the member's own payload: sections
//	            1 to 5 as above (its workload in section 5), an optional
//	            section 6 (keys: count = buffer count, then one key string
//	            per buffer, "" for private; present only when some buffer
//	            is shared), and the end byte 0
//	0 end
//
// Strings are a uvarint length and the bytes; unsigned numbers are
// uvarints, signed ones zigzag varints; every varint must be minimal, every
// flag 0 or 1, so a decoded file has exactly one encoding. Readers refuse
// section kinds they do not know (kind 6 outside a family member, too).
package plans
