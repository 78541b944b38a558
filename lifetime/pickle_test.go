package lifetime

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"reflect"
	"strings"
	"testing"
)

// pk is a minimal pickle encoder (protocol 4, no memo) for building test
// inputs: kv for dicts in order, []any for lists, pickleTuple for tuples.
type kv struct {
	k string
	v any
}

func pk(v any) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x80, 4})
	pkValue(&b, v)
	b.WriteByte('.')
	return b.Bytes()
}

func pkValue(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteByte('N')
	case bool:
		if x {
			b.WriteByte(0x88)
		} else {
			b.WriteByte(0x89)
		}
	case int:
		pkValue(b, int64(x))
	case int64:
		b.WriteByte(0x8a)
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], uint64(x))
		b.WriteByte(8)
		b.Write(w[:])
	case float64:
		b.WriteByte('G')
		var w [8]byte
		binary.BigEndian.PutUint64(w[:], math.Float64bits(x))
		b.Write(w[:])
	case string:
		b.WriteByte('X')
		var w [4]byte
		binary.LittleEndian.PutUint32(w[:], uint32(len(x)))
		b.Write(w[:])
		b.WriteString(x)
	case []kv:
		b.WriteByte('}')
		if len(x) > 0 {
			b.WriteByte('(')
			for _, e := range x {
				pkValue(b, e.k)
				pkValue(b, e.v)
			}
			b.WriteByte('u')
		}
	case []any:
		b.WriteByte(']')
		if len(x) > 0 {
			b.WriteByte('(')
			for _, e := range x {
				pkValue(b, e)
			}
			b.WriteByte('e')
		}
	case pickleTuple:
		b.WriteByte('(')
		for _, e := range x {
			pkValue(b, e)
		}
		b.WriteByte('t')
	default:
		panic("pk: unsupported type")
	}
}

// plain converts decoded pickle values into comparable Go values.
func plain(v any) any {
	switch x := v.(type) {
	case *pickleDict:
		out := make([]kv, len(x.keys))
		for i := range x.keys {
			out[i] = kv{plain(x.keys[i]).(string), plain(x.vals[i])}
		}
		return out
	case *pickleList:
		out := make([]any, len(x.items))
		for i := range x.items {
			out[i] = plain(x.items[i])
		}
		return out
	case pickleTuple:
		if len(x) == 0 {
			return pickleTuple(nil)
		}
		out := make(pickleTuple, len(x))
		for i := range x {
			out[i] = plain(x[i])
		}
		return out
	}
	return v
}

// Produced by Python 3 (pickle.dumps) of
// [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**63-1, -2**63, 2**64,
//
//	1.5, True, False, None, "é", b"ab", (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4),
//	{}, (), {"k": [1]}, "x"*300]
//
// at the protocol named. (Protocol 2 pickles bytes through a GLOBAL, which
// the decoder refuses.)
var pythonFixtures = map[string]string{
	"3": "80035d7100284b004b014affffffff4bff4d00014dffff4a000001004a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a09000000000000000001473ff800000000000088894e5802000000c3a971014302616271024b018571034b014b028671044b014b024b03877105284b014b024b034b047471067d7107297d710858010000006b71095d710a4b016173582c010000787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878710b652e",
	"4": "800495ba010000000000005d94284b004b014affffffff4bff4d00014dffff4a000001004a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a09000000000000000001473ff800000000000088894e8c02c3a99443026162944b0185944b014b0286944b014b024b038794284b014b024b034b0474947d94297d948c016b945d944b016173582c01000078787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787894652e",
	"5": "800595ba010000000000005d94284b004b014affffffff4bff4d00014dffff4a000001004a000000808a0500000080008a08ffffffffffffff7f8a0800000000000000808a09000000000000000001473ff800000000000088894e8c02c3a99443026162944b0185944b014b0286944b014b024b038794284b014b024b034b0474947d94297d948c016b945d944b016173582c01000078787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787878787894652e",
}

func TestDecodePickleFromPython(t *testing.T) {
	want := []any{int64(0), int64(1), int64(-1), int64(255), int64(256), int64(65535), int64(65536),
		int64(math.MinInt32), int64(1 << 31), int64(math.MaxInt64), int64(math.MinInt64), pickleBigInt{},
		1.5, true, false, nil, "é", []byte("ab"), pickleTuple{int64(1)}, pickleTuple{int64(1), int64(2)},
		pickleTuple{int64(1), int64(2), int64(3)}, pickleTuple{int64(1), int64(2), int64(3), int64(4)},
		[]kv{}, pickleTuple(nil), []kv{{"k", []any{int64(1)}}}, strings.Repeat("x", 300)}
	for proto, h := range pythonFixtures {
		data, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		v, err := decodePickle(data)
		if err != nil {
			t.Fatalf("protocol %s: %v", proto, err)
		}
		if got := plain(v); !reflect.DeepEqual(got, want) {
			t.Errorf("protocol %s:\n got %#v\nwant %#v", proto, got, want)
		}
	}
}

func TestDecodeLong(t *testing.T) {
	for _, c := range []struct {
		in   string
		want any
	}{
		{"", int64(0)},
		{"ff", int64(-1)},
		{"ff00", int64(255)},
		{"0080", int64(-32768)},
		{"ffffffffffffff7f", int64(math.MaxInt64)},
		{"0000000000000080", int64(math.MinInt64)},
		{"ffffffffffffff7f00", int64(math.MaxInt64)},
		{"0000000000000080ff", int64(math.MinInt64)},
		{"000000000000008000", pickleBigInt{}}, // 2^63
		{"ffffffffffffff7fff", pickleBigInt{}}, // -2^63-1
		{"000000000000000001", pickleBigInt{}}, // 2^64
	} {
		b, _ := hex.DecodeString(c.in)
		if got := decodeLong(b); got != c.want {
			t.Errorf("decodeLong(%s) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestDecodePickleErrors(t *testing.T) {
	huge := []byte{0x80, 4, 0x8d}
	huge = binary.LittleEndian.AppendUint64(huge, 1<<62)
	deep := append([]byte{0x80, 4}, bytes.Repeat([]byte{'('}, maxPickleMarks+1)...)
	for _, c := range []struct {
		name, in, want string
	}{
		{"empty", "", "not a pickle"},
		{"csv", "id,lower,upper,size\n", "not a pickle"},
		{"protocol 1", "\x80\x01N.", "unsupported pickle protocol 1"},
		{"global", "\x80\x02cos\nsystem\n.", "offset 2: opcode GLOBAL (0x63) would import or call Python code; refused"},
		{"stack global", "\x80\x04\x8c\x02os\x8c\x06system\x93.", "offset 14: opcode STACK_GLOBAL (0x93) would import"},
		{"reduce", "\x80\x04N)R.", "offset 4: opcode REDUCE (0x52) would import"},
		{"build", "\x80\x04}}b.", "BUILD (0x62) would import"},
		{"newobj", "\x80\x04NN\x81.", "NEWOBJ (0x81) would import"},
		{"persid", "\x80\x04NQ.", "BINPERSID (0x51) would import"},
		{"unsupported", "\x80\x04N0N.", "offset 3: unsupported opcode POP (0x30)"},
		{"unknown byte", "\x80\x04\xff.", "offset 2: unsupported opcode 0xff"},
		{"truncated string", "\x80\x04\x8c\x05ab", "offset 2: SHORT_BINUNICODE (0x8c) needs 5 bytes, only 2 remain"},
		{"huge string", string(huge), "BINUNICODE8 (0x8d) needs 4611686018427387904 bytes, only 0 remain"},
		{"huge bytes", "\x80\x04B\xff\xff\xff\x7f.", "BINBYTES (0x42) needs 2147483647 bytes"},
		{"bad utf8", "\x80\x04\x8c\x01\xff.", "not valid UTF-8"},
		{"no stop", "\x80\x04N", "offset 3: truncated: no STOP opcode"},
		{"trailing", "\x80\x04N.xyz", "offset 4: 3 bytes of trailing data after STOP"},
		{"empty stack", "\x80\x04.", "STOP (0x2e) on an empty stack"},
		{"memo unset", "\x80\x04h\x05.", "offset 2: memo index 5 was never stored"},
		{"memo skipped", "\x80\x04Nq\x03h\x01.", "memo index 1 was never stored"},
		{"memo far", "\x80\x04Nr\x00\x00\x00\x10.", "memo index 268435456 is out of range"},
		{"setitems odd", "\x80\x04}(Nu.", "SETITEMS with an odd number (1) of items"},
		{"setitem on list", "\x80\x04]NNs.", "SETITEM on a list, not a dict"},
		{"append to dict", "\x80\x04}Na.", "APPEND to a dict, not a list"},
		{"appends no mark", "\x80\x04]e.", "APPENDS (0x65) without MARK"},
		{"pop below mark", "\x80\x04](a.", "APPEND (0x61) on an empty stack"},
		{"tuple2 short", "\x80\x04N\x86.", "TUPLE2 (0x86) needs 2 items"},
		{"tuple2 across mark", "\x80\x04N(N\x86.", "TUPLE2 (0x86) needs 2 items"},
		{"deep marks", string(deep), "MARK nesting deeper than 4096"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodePickle([]byte(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "pickle: ") {
				t.Errorf("err = %v, want the prefix %q", err, "pickle: ")
			}
		})
	}
}

func TestDecodePickleEncoder(t *testing.T) {
	// The test encoder and the decoder agree, including nested containers.
	v := []kv{{"a", []any{int64(1), "two", 3.5, nil, true, pickleTuple{int64(-7)}}}, {"b", []kv{}}}
	got, err := decodePickle(pk(v))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(plain(got), v) {
		t.Fatalf("got %#v, want %#v", plain(got), v)
	}
}

func TestPickleDictLaterKeyWins(t *testing.T) {
	got, err := decodePickle(pk([]kv{{"a", int64(1)}, {"a", int64(2)}}))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := got.(*pickleDict).get("a"); v != int64(2) {
		t.Fatalf("a = %v, want 2", v)
	}
}
