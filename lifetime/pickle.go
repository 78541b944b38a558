package lifetime

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"unicode/utf8"
	"unsafe"
)

// This file is a small, safe decoder for the subset of Python's pickle
// format (protocols 2 to 5) that torch.cuda.memory._snapshot() produces:
// dicts, lists, tuples, strings, bytes, ints, floats, None and booleans.
//
// It never executes anything: opcodes that would import or call Python
// code (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, ...) are
// refused with an error naming the opcode and its offset. Every length is
// checked against the input that remains before anything is allocated, so
// a tiny file cannot make it allocate more than a small multiple of its own
// size; the memo, the mark stack and the value stack are bounded by the
// input too (each entry costs at least one input byte).

// pickleDict is a Python dict. Items are kept in insertion order and not
// deduplicated, so that SETITEMS stays O(1); lookups scan from the end so
// that a later assignment of the same key wins, as in Python. A dict with
// many keys gets an index of its string keys at its first lookup, so that
// a big dict looked up through many memo references costs its size once,
// not once per lookup.
type pickleDict struct {
	keys, vals []any
	index      map[string]int // string key -> last position; built lazily
	indexed    int            // len(keys) when index was built
}

// pickleDictScan is the size up to which a lookup scans instead of
// building an index (snapshot dicts have about 10 keys).
const pickleDictScan = 32

// get returns the value of a string key.
func (d *pickleDict) get(key string) (any, bool) {
	if len(d.keys) <= pickleDictScan {
		for i := len(d.keys) - 1; i >= 0; i-- {
			if k, ok := d.keys[i].(string); ok && k == key {
				return d.vals[i], true
			}
		}
		return nil, false
	}
	if d.index == nil || d.indexed != len(d.keys) {
		d.index = make(map[string]int, len(d.keys))
		for i, k := range d.keys {
			if s, ok := k.(string); ok {
				d.index[s] = i
			}
		}
		d.indexed = len(d.keys)
	}
	i, ok := d.index[key]
	if !ok {
		return nil, false
	}
	return d.vals[i], true
}

// pickleList is a Python list; a pointer because APPEND(S) mutates a list
// that the memo may also hold.
type pickleList struct {
	items []any
}

// pickleTuple is a Python tuple.
type pickleTuple []any

// pickleBigInt stands for an integer that does not fit in int64; it is an
// error only where a caller needs the value.
type pickleBigInt struct{}

// pickleUnset fills memo slots skipped by BINPUT, so that a BINGET of a
// slot never stored is an error rather than a None.
type pickleUnset struct{}

// Limits of the decoder, far above what real snapshots need.
const (
	maxPickleMarks = 1 << 12 // nesting of MARK ... (SETITEMS|APPENDS|TUPLE)
	maxPickleMemo  = 1 << 26 // memo slots
)

// pickleOpNames names every pickle opcode so that errors say which one was
// met, including those this decoder refuses.
var pickleOpNames = map[byte]string{
	'(': "MARK", '.': "STOP", '0': "POP", '1': "POP_MARK", '2': "DUP",
	'F': "FLOAT", 'I': "INT", 'J': "BININT", 'K': "BININT1", 'L': "LONG",
	'M': "BININT2", 'N': "NONE", 'P': "PERSID", 'Q': "BINPERSID", 'R': "REDUCE",
	'S': "STRING", 'T': "BINSTRING", 'U': "SHORT_BINSTRING", 'V': "UNICODE",
	'X': "BINUNICODE", 'a': "APPEND", 'b': "BUILD", 'c': "GLOBAL", 'd': "DICT",
	'}': "EMPTY_DICT", 'e': "APPENDS", 'g': "GET", 'h': "BINGET", 'i': "INST",
	'j': "LONG_BINGET", 'l': "LIST", ']': "EMPTY_LIST", 'o': "OBJ", 'p': "PUT",
	'q': "BINPUT", 'r': "LONG_BINPUT", 's': "SETITEM", 't': "TUPLE",
	')': "EMPTY_TUPLE", 'u': "SETITEMS", 'G': "BINFLOAT",
	0x80: "PROTO", 0x81: "NEWOBJ", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
	0x85: "TUPLE1", 0x86: "TUPLE2", 0x87: "TUPLE3", 0x88: "NEWTRUE",
	0x89: "NEWFALSE", 0x8a: "LONG1", 0x8b: "LONG4",
	'B': "BINBYTES", 'C': "SHORT_BINBYTES",
	0x8c: "SHORT_BINUNICODE", 0x8d: "BINUNICODE8", 0x8e: "BINBYTES8",
	0x8f: "EMPTY_SET", 0x90: "ADDITEMS", 0x91: "FROZENSET", 0x92: "NEWOBJ_EX",
	0x93: "STACK_GLOBAL", 0x94: "MEMOIZE", 0x95: "FRAME",
	0x96: "BYTEARRAY8", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}

// pickleCodeOps are opcodes that would run or import Python code.
var pickleCodeOps = map[byte]bool{
	'c': true, 0x93: true, 'R': true, 'b': true, 'i': true, 'o': true,
	0x81: true, 0x92: true, 0x82: true, 0x83: true, 0x84: true,
	'P': true, 'Q': true,
}

func pickleOpName(op byte) string {
	if n, ok := pickleOpNames[op]; ok {
		return fmt.Sprintf("%s (0x%02x)", n, op)
	}
	return fmt.Sprintf("0x%02x", op)
}

// pickleDecoder holds the state of one decode. It reads as it decodes: no
// copy of the input is kept, and an input stops being read where it stops
// being a pickle this decoder takes.
type pickleDecoder struct {
	r       *bufio.Reader
	size    int // the input's size, or -1 where unknown (then bounded by MaxFileSize)
	pos     int // bytes read
	op      byte
	scratch [256]byte
	stack   []any
	marks   []int
	memo    []any
	cost    uint64 // what decoding allocated, about (maxPickleDecode)
	owned   bool   // the last take returned an allocation of its own
}

// Bounds of one decode, far beyond a real snapshot's needs: the memory
// decoding may allocate (counted per opcode, string byte and slice grown),
// and the longest string or bytes value.
const (
	maxPickleDecode = 256 << 20
	maxPickleValue  = 16 << 20
	pickleOpCost    = 16 // an opcode's value boxed (the slices it goes in count as they grow)
	pickleDictCost  = 64 // a pickleDict
	pickleListCost  = 32 // a pickleList
	pickleSmallCost = 16 // a short string's rounding to its allocation
)

// decodePickle decodes one pickle that must span all of data.
func decodePickle(data []byte) (any, error) {
	v, _, _, err := decodePickleFrom(bytes.NewReader(data), len(data))
	return v, err
}

// decodePickleFrom decodes one pickle that must span all of r (of size
// bytes, or -1 where unknown) and returns it, the bytes it read and about
// what it allocated.
func decodePickleFrom(r io.Reader, size int) (any, int, uint64, error) {
	d := &pickleDecoder{r: bufio.NewReaderSize(r, 64<<10), size: size, stack: make([]any, 0, 256), cost: 256 * 16}
	v, err := d.run()
	if err != nil {
		return nil, d.pos, d.cost, fmt.Errorf("pickle: %w", err)
	}
	return v, d.pos, d.cost, nil
}

func (d *pickleDecoder) errorf(at int, format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", at, fmt.Sprintf(format, args...))
}

// spend counts n bytes that decoding allocates against maxPickleDecode.
// The bound is maxTraceMemory where that is lower (in tests): the decoded
// pickle is counted with its conversion into traces.
func (d *pickleDecoder) spend(at int, n uint64) error {
	d.cost += n
	if limit := min(maxPickleDecode, maxTraceMemory); d.cost > limit {
		return d.errorf(at, "decoding needs more than %d MiB of memory: refused", limit>>20)
	}
	return nil
}

// grew counts a slice of elem-byte items that grew from capacity was to
// now: the new array is allocated whole, the old one left to the collector.
func (d *pickleDecoder) grew(at int, was, now int, elem uint64) error {
	if now == was {
		return nil
	}
	return d.spend(at, uint64(now)*elem)
}

// take returns the next n bytes, or an error when fewer remain: a forged
// length never allocates memory the input cannot fill. The slice is valid
// until the next take, unless d.owned says it is an allocation of its own.
func (d *pickleDecoder) take(at int, n uint64) ([]byte, error) {
	d.owned = false
	if d.size >= 0 && n > uint64(d.size-d.pos) {
		return nil, d.errorf(at, "%s needs %d bytes, only %d remain", pickleOpName(d.op), n, d.size-d.pos)
	}
	if n > maxPickleValue {
		return nil, d.errorf(at, "%s needs %d bytes, more than any value of a memory snapshot (%d MiB)", pickleOpName(d.op), n, maxPickleValue>>20)
	}
	if n <= uint64(len(d.scratch)) {
		k, err := io.ReadFull(d.r, d.scratch[:n])
		d.pos += k
		if err != nil {
			return nil, d.errorf(at, "%s needs %d bytes, only %d remain", pickleOpName(d.op), n, k)
		}
		return d.scratch[:n], nil
	}
	// Where the input's size is known, n was checked against what
	// remains and is allocated once. Otherwise the value grows as its
	// bytes arrive, by doubling from 1 MiB, so that a forged length costs
	// what is there: up to twice n in all.
	c := n
	if d.size < 0 {
		c = min(n, 1<<20)
		if err := d.spend(at, 2*n); err != nil {
			return nil, err
		}
	} else if err := d.spend(at, n); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, c)
	for uint64(len(buf)) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(cap(buf), int(n)-len(buf)))
		}
		k, err := d.r.Read(buf[len(buf):min(cap(buf), int(n))])
		buf = buf[:len(buf)+k]
		d.pos += k
		if err != nil && uint64(len(buf)) < n {
			return nil, d.errorf(at, "%s needs %d bytes, only %d remain", pickleOpName(d.op), n, len(buf))
		}
	}
	d.owned = true
	return buf, nil
}

func (d *pickleDecoder) pop(at int) (any, error) {
	n := len(d.stack)
	if n == 0 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] == n) {
		return nil, d.errorf(at, "%s on an empty stack", pickleOpName(d.op))
	}
	v := d.stack[n-1]
	d.stack = d.stack[:n-1]
	return v, nil
}

func (d *pickleDecoder) top(at int) (any, error) {
	n := len(d.stack)
	if n == 0 || (len(d.marks) > 0 && d.marks[len(d.marks)-1] == n) {
		return nil, d.errorf(at, "%s on an empty stack", pickleOpName(d.op))
	}
	return d.stack[n-1], nil
}

// topAs returns the value on top of the stack, which op fills, as a T: a
// dict for SETITEM(S), which sets items "on" it, a list for APPEND(S),
// which append "to" it.
func topAs[T any](d *pickleDecoder, at int, prep, want string) (T, error) {
	var zero T
	t, err := d.top(at)
	if err != nil {
		return zero, err
	}
	v, ok := t.(T)
	if !ok {
		return zero, d.errorf(at, "%s %s a %s, not a %s", pickleOpNames[d.op], prep, pickleTypeName(t), want)
	}
	return v, nil
}

// popMark returns the items pushed since the last MARK and removes them
// and the mark. The returned slice aliases the stack: callers copy it.
func (d *pickleDecoder) popMark(at int) ([]any, error) {
	if len(d.marks) == 0 {
		return nil, d.errorf(at, "%s without MARK", pickleOpName(d.op))
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := d.stack[m:]
	d.stack = d.stack[:m]
	return items, nil
}

func (d *pickleDecoder) memoPut(at int, idx uint64) error {
	v, err := d.top(at)
	if err != nil {
		return err
	}
	// A memo index can be any number, but each slot below it costs memory:
	// allow only indices the input read so far could have filled one by one.
	if idx >= maxPickleMemo || idx > uint64(d.pos) {
		return d.errorf(at, "memo index %d is out of range", idx)
	}
	was := cap(d.memo)
	if n := uint64(len(d.memo)); idx >= n {
		if err := d.spend(at, 16*(idx+1-n)); err != nil {
			return err
		}
	}
	for uint64(len(d.memo)) <= idx {
		d.memo = append(d.memo, pickleUnset{})
	}
	if err := d.grew(at, was, cap(d.memo), 16); err != nil {
		return err
	}
	d.memo[idx] = v
	return nil
}

func (d *pickleDecoder) memoGet(at int, idx uint64) error {
	if idx >= uint64(len(d.memo)) {
		return d.errorf(at, "memo index %d was never stored", idx)
	}
	if _, unset := d.memo[idx].(pickleUnset); unset {
		return d.errorf(at, "memo index %d was never stored", idx)
	}
	d.stack = append(d.stack, d.memo[idx])
	return nil
}

func (d *pickleDecoder) run() (any, error) {
	if head, _ := d.r.Peek(2); len(head) < 2 || head[0] != 0x80 {
		return nil, fmt.Errorf("not a pickle of protocol 2 or later (no PROTO opcode at offset 0)")
	}
	for {
		at := d.pos
		op, err := d.r.ReadByte()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, d.errorf(at, "%v", err)
		}
		d.pos++
		d.op = op
		if err := d.spend(at, pickleOpCost); err != nil {
			return nil, err
		}
		if len(d.stack) == cap(d.stack) {
			// Every opcode pushes at most one value: the stack grows here.
			d.stack = slices.Grow(d.stack, 1)
			if err := d.grew(at, 0, cap(d.stack), 16); err != nil {
				return nil, err
			}
		}
		switch op {
		case 0x80: // PROTO
			b, err := d.take(at, 1)
			if err != nil {
				return nil, err
			}
			if b[0] < 2 || b[0] > 5 {
				return nil, d.errorf(at, "unsupported pickle protocol %d", b[0])
			}
		case 0x95: // FRAME: a length hint for buffered readers; we hold it all.
			if _, err := d.take(at, 8); err != nil {
				return nil, err
			}
		case '}':
			if err := d.spend(at, pickleDictCost); err != nil {
				return nil, err
			}
			d.stack = append(d.stack, &pickleDict{})
		case ']':
			if err := d.spend(at, pickleListCost); err != nil {
				return nil, err
			}
			d.stack = append(d.stack, &pickleList{})
		case ')':
			d.stack = append(d.stack, pickleTuple(nil))
		case '(':
			if len(d.marks) >= maxPickleMarks {
				return nil, d.errorf(at, "MARK nesting deeper than %d", maxPickleMarks)
			}
			d.marks = append(d.marks, len(d.stack))
		case 's': // SETITEM
			v, err := d.pop(at)
			if err != nil {
				return nil, err
			}
			k, err := d.pop(at)
			if err != nil {
				return nil, err
			}
			dict, err := topAs[*pickleDict](d, at, "on", "dict")
			if err != nil {
				return nil, err
			}
			was := cap(dict.keys)
			dict.keys = append(dict.keys, k)
			dict.vals = append(dict.vals, v)
			if err := d.grew(at, was, cap(dict.keys), 32); err != nil {
				return nil, err
			}
		case 'u': // SETITEMS
			items, err := d.popMark(at)
			if err != nil {
				return nil, err
			}
			if len(items)%2 != 0 {
				return nil, d.errorf(at, "SETITEMS with an odd number (%d) of items", len(items))
			}
			dict, err := topAs[*pickleDict](d, at, "on", "dict")
			if err != nil {
				return nil, err
			}
			// Size the dict once: SETITEMS usually fills a fresh EMPTY_DICT.
			was := cap(dict.keys)
			dict.keys = slices.Grow(dict.keys, len(items)/2)
			dict.vals = slices.Grow(dict.vals, len(items)/2)
			if err := d.grew(at, was, cap(dict.keys), 32); err != nil {
				return nil, err
			}
			for i := 0; i < len(items); i += 2 {
				dict.keys = append(dict.keys, items[i])
				dict.vals = append(dict.vals, items[i+1])
			}
		case 'a': // APPEND
			v, err := d.pop(at)
			if err != nil {
				return nil, err
			}
			list, err := topAs[*pickleList](d, at, "to", "list")
			if err != nil {
				return nil, err
			}
			was := cap(list.items)
			list.items = append(list.items, v)
			if err := d.grew(at, was, cap(list.items), 16); err != nil {
				return nil, err
			}
		case 'e': // APPENDS
			items, err := d.popMark(at)
			if err != nil {
				return nil, err
			}
			list, err := topAs[*pickleList](d, at, "to", "list")
			if err != nil {
				return nil, err
			}
			was := cap(list.items)
			list.items = append(list.items, items...)
			if err := d.grew(at, was, cap(list.items), 16); err != nil {
				return nil, err
			}
		case 0x8c, 'X', 0x8d: // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
			n, err := d.arg(at, op)
			if err != nil {
				return nil, err
			}
			b, err := d.take(at, n)
			if err != nil {
				return nil, err
			}
			if !utf8.Valid(b) {
				return nil, d.errorf(at, "%s is not valid UTF-8", pickleOpName(op))
			}
			if d.owned {
				// A long value read into its own array, never written
				// again: the string keeps it instead of a copy.
				d.stack = append(d.stack, unsafe.String(&b[0], len(b)))
			} else {
				if err := d.spend(at, uint64(len(b))+pickleSmallCost); err != nil {
					return nil, err
				}
				d.stack = append(d.stack, string(b))
			}
		case 'C', 'B', 0x8e: // SHORT_BINBYTES, BINBYTES, BINBYTES8
			n, err := d.arg(at, op)
			if err != nil {
				return nil, err
			}
			b, err := d.take(at, n)
			if err != nil {
				return nil, err
			}
			if !d.owned {
				if err := d.spend(at, uint64(len(b))+pickleSmallCost); err != nil {
					return nil, err
				}
				b = append([]byte(nil), b...)
			}
			d.stack = append(d.stack, b)
		case 'J': // BININT: 4-byte signed little-endian
			b, err := d.take(at, 4)
			if err != nil {
				return nil, err
			}
			d.stack = append(d.stack, int64(int32(binary.LittleEndian.Uint32(b))))
		case 'K', 'M': // BININT1, BININT2: unsigned
			v, err := d.arg(at, op)
			if err != nil {
				return nil, err
			}
			d.stack = append(d.stack, int64(v))
		case 0x8a: // LONG1: n-byte two's complement little-endian
			nb, err := d.take(at, 1)
			if err != nil {
				return nil, err
			}
			b, err := d.take(at, uint64(nb[0]))
			if err != nil {
				return nil, err
			}
			d.stack = append(d.stack, decodeLong(b))
		case 'G': // BINFLOAT: 8-byte big-endian IEEE 754
			b, err := d.take(at, 8)
			if err != nil {
				return nil, err
			}
			d.stack = append(d.stack, math.Float64frombits(binary.BigEndian.Uint64(b)))
		case 'N':
			d.stack = append(d.stack, nil)
		case 0x88:
			d.stack = append(d.stack, true)
		case 0x89:
			d.stack = append(d.stack, false)
		case 0x85, 0x86, 0x87: // TUPLE1..3
			n := int(op - 0x84)
			if len(d.stack) < n || (len(d.marks) > 0 && d.marks[len(d.marks)-1] > len(d.stack)-n) {
				return nil, d.errorf(at, "%s needs %d items on the stack", pickleOpName(op), n)
			}
			if err := d.spend(at, 16*uint64(n)); err != nil {
				return nil, err
			}
			t := make(pickleTuple, n)
			copy(t, d.stack[len(d.stack)-n:])
			d.stack = append(d.stack[:len(d.stack)-n], t)
		case 't': // TUPLE
			items, err := d.popMark(at)
			if err != nil {
				return nil, err
			}
			if err := d.spend(at, 16*uint64(len(items))); err != nil {
				return nil, err
			}
			d.stack = append(d.stack, append(pickleTuple(nil), items...))
		case 0x94: // MEMOIZE
			if err := d.memoPut(at, uint64(len(d.memo))); err != nil {
				return nil, err
			}
		case 'q', 'r': // BINPUT, LONG_BINPUT
			idx, err := d.arg(at, op)
			if err != nil {
				return nil, err
			}
			if err := d.memoPut(at, idx); err != nil {
				return nil, err
			}
		case 'h', 'j': // BINGET, LONG_BINGET
			idx, err := d.arg(at, op)
			if err != nil {
				return nil, err
			}
			if err := d.memoGet(at, idx); err != nil {
				return nil, err
			}
		case '.': // STOP
			v, err := d.pop(at)
			if err != nil {
				return nil, err
			}
			if n, _ := io.Copy(io.Discard, io.LimitReader(d.r, 1<<20)); n > 0 {
				if n == 1<<20 {
					return nil, d.errorf(d.pos, "more than 1 MiB of trailing data after STOP")
				}
				return nil, d.errorf(d.pos, "%d bytes of trailing data after STOP", n)
			}
			return v, nil
		default:
			if pickleCodeOps[op] {
				return nil, d.errorf(at, "opcode %s would import or call Python code; refused", pickleOpName(op))
			}
			return nil, d.errorf(at, "unsupported opcode %s", pickleOpName(op))
		}
	}
	return nil, d.errorf(d.pos, "truncated: no STOP opcode")
}

// pickleArgSize is the width in bytes of the little-endian unsigned
// argument of the opcodes that carry one: a string's or bytes' length, a
// small int, a memo index.
var pickleArgSize = [256]uint8{
	0x8c: 1, 'X': 4, 0x8d: 8, // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
	'C': 1, 'B': 4, 0x8e: 8, // SHORT_BINBYTES, BINBYTES, BINBYTES8
	'K': 1, 'M': 2, // BININT1, BININT2
	'q': 1, 'r': 4, // BINPUT, LONG_BINPUT
	'h': 1, 'j': 4, // BINGET, LONG_BINGET
}

// arg reads the unsigned argument of op (pickleArgSize).
func (d *pickleDecoder) arg(at int, op byte) (uint64, error) {
	b, err := d.take(at, uint64(pickleArgSize[op]))
	if err != nil {
		return 0, err
	}
	switch len(b) {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.LittleEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.LittleEndian.Uint32(b)), nil
	default:
		return binary.LittleEndian.Uint64(b), nil
	}
}

// decodeLong decodes LONG1's little-endian two's complement bytes into an
// int64, or pickleBigInt when the value does not fit.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	neg := b[len(b)-1]&0x80 != 0
	if len(b) > 8 {
		// Wider encodings still fit when the extra bytes only extend the sign.
		ext := byte(0)
		if neg {
			ext = 0xff
		}
		for _, c := range b[8:] {
			if c != ext {
				return pickleBigInt{}
			}
		}
		if (b[7]&0x80 != 0) != neg {
			return pickleBigInt{}
		}
		b = b[:8]
	}
	var u uint64
	for i := len(b) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	if neg && len(b) < 8 {
		u |= ^uint64(0) << (8 * uint(len(b)))
	}
	return int64(u)
}

func pickleTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64:
		return "int"
	case pickleBigInt:
		return "big int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *pickleDict:
		return "dict"
	case *pickleList:
		return "list"
	case pickleTuple:
		return "tuple"
	default:
		return fmt.Sprintf("%T", v)
	}
}
