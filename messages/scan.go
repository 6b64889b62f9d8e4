package messages

import (
	"errors"
	"fmt"
	"iter"
	"math"
)

// MaxDepth is the deepest nesting Scan accepts: a container may hold
// containers MaxDepth levels down, counting itself. Every body of the
// protocol nests a few levels (a poll answer, its commands, an exec, its
// env); user data travels as bin, which does not nest.
const MaxDepth = 32

// Why Scan refuses a body.
var (
	// ErrMalformed: the bytes are not one msgpack value (an invalid code,
	// or a length header cut off at the end).
	ErrMalformed = errors.New("malformed msgpack")
	// ErrDeclaredLength: a header declares more than the bytes left can
	// hold (an element takes at least one byte, a map entry two).
	ErrDeclaredLength = errors.New("declared length larger than the bytes left")
	// ErrTooDeep: containers nest deeper than MaxDepth.
	ErrTooDeep = errors.New("nested deeper than the limit")
)

// ScanError says where and why Scan refused a body. It unwraps to one of
// ErrMalformed, ErrDeclaredLength and ErrTooDeep.
type ScanError struct {
	Err    error
	Offset int  // of the code at fault
	Code   byte // the code at fault
	// Declared and Left are, for ErrDeclaredLength, the length the header
	// declares (payload bytes of a str, bin or ext; elements of an array;
	// keys and values of a map) and the bytes left after the header.
	Declared, Left int
	// Truncated: for ErrMalformed, the body ends inside a header.
	Truncated bool
}

func (e *ScanError) Error() string {
	switch {
	case e.Err == ErrDeclaredLength && (e.Code&0xe0 == 0x80 || e.Code >= 0xdc && e.Code <= 0xdf):
		return fmt.Sprintf("code %#x at offset %d declares %d elements, %d bytes left", e.Code, e.Offset, e.Declared, e.Left)
	case e.Err == ErrDeclaredLength:
		return fmt.Sprintf("code %#x at offset %d declares %d bytes, %d left", e.Code, e.Offset, e.Declared, e.Left)
	case e.Err == ErrTooDeep:
		return fmt.Sprintf("nesting deeper than %d at offset %d", MaxDepth, e.Offset)
	case e.Truncated:
		return fmt.Sprintf("truncated at offset %d", e.Offset)
	default:
		return fmt.Sprintf("invalid code %#x at offset %d", e.Code, e.Offset)
	}
}

func (e *ScanError) Unwrap() error { return e.Err }

// header is what one msgpack code and its length bytes say.
type header struct {
	size  int // bytes of the header itself (code and length)
	data  int // payload bytes that follow it (str, bin, ext, fixed-size numbers)
	elems int // values that follow it (array elements; map keys and values)
	kind  Type
}

// maxLen stands for a declared length no body can hold where int has 32
// bits, so that doubling a map's length stays in range; with 64 bits every
// 32-bit length is kept as it is.
const maxLen = math.MaxInt / 4

// bigEndian reads the n-byte length at b[i:], false when it is cut off.
func bigEndian(b []byte, i, n int) (int, bool) {
	if len(b)-i < n {
		return 0, false
	}
	var l uint64
	for _, x := range b[i : i+n] {
		l = l<<8 | uint64(x)
	}
	return int(min(l, maxLen)), true
}

// readHeader reads the header at b[i]. It checks only that the header
// itself is whole; the caller checks its lengths against what is left.
func readHeader(b []byte, i int) (header, *ScanError) {
	if i >= len(b) {
		return header{}, &ScanError{Err: ErrMalformed, Offset: i, Truncated: true}
	}
	c := b[i]
	switch {
	case c <= 0x7f, c >= 0xe0:
		return header{size: 1, kind: TypeInt}, nil
	case c <= 0x8f:
		return header{size: 1, elems: 2 * int(c&0x0f), kind: TypeMap}, nil
	case c <= 0x9f:
		return header{size: 1, elems: int(c & 0x0f), kind: TypeArray}, nil
	case c <= 0xbf:
		return header{size: 1, data: int(c & 0x1f), kind: TypeStr}, nil
	}
	var h header
	var lenBytes int
	switch c {
	case 0xc0:
		return header{size: 1, kind: TypeNil}, nil
	case 0xc2, 0xc3:
		return header{size: 1, kind: TypeBool}, nil
	case 0xcc, 0xd0:
		return header{size: 1, data: 1, kind: TypeInt}, nil
	case 0xcd, 0xd1:
		return header{size: 1, data: 2, kind: TypeInt}, nil
	case 0xce, 0xd2:
		return header{size: 1, data: 4, kind: TypeInt}, nil
	case 0xcf, 0xd3:
		return header{size: 1, data: 8, kind: TypeInt}, nil
	case 0xca:
		return header{size: 1, data: 4, kind: TypeFloat}, nil
	case 0xcb:
		return header{size: 1, data: 8, kind: TypeFloat}, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		// fixext: a type byte, then 1, 2, 4, 8 or 16 bytes.
		return header{size: 1, data: 1 + 1<<(c-0xd4), kind: TypeExt}, nil
	case 0xd9:
		lenBytes, h.kind = 1, TypeStr
	case 0xda:
		lenBytes, h.kind = 2, TypeStr
	case 0xdb:
		lenBytes, h.kind = 4, TypeStr
	case 0xc4:
		lenBytes, h.kind = 1, TypeBin
	case 0xc5:
		lenBytes, h.kind = 2, TypeBin
	case 0xc6:
		lenBytes, h.kind = 4, TypeBin
	case 0xc7:
		lenBytes, h.kind = 1, TypeExt
	case 0xc8:
		lenBytes, h.kind = 2, TypeExt
	case 0xc9:
		lenBytes, h.kind = 4, TypeExt
	case 0xdc:
		lenBytes, h.kind = 2, TypeArray
	case 0xdd:
		lenBytes, h.kind = 4, TypeArray
	case 0xde:
		lenBytes, h.kind = 2, TypeMap
	case 0xdf:
		lenBytes, h.kind = 4, TypeMap
	default: // 0xc1, never used
		return header{}, &ScanError{Err: ErrMalformed, Offset: i, Code: c}
	}
	n, ok := bigEndian(b, i+1, lenBytes)
	if !ok {
		return header{}, &ScanError{Err: ErrMalformed, Offset: i + 1, Truncated: true}
	}
	h.size = 1 + lenBytes
	switch h.kind {
	case TypeArray:
		h.elems = n
	case TypeMap:
		h.elems = 2 * n
	case TypeExt:
		h.data = 1 + n // the type byte
	default:
		h.data = n
	}
	return h, nil
}

// Scan checks that data starts with one well-formed msgpack value, nested
// no deeper than MaxDepth, none of whose headers declares more than the
// bytes after it can hold, and returns the value's length. It walks the
// bytes once and allocates nothing unless it refuses. Anything it accepts
// the decoder can decode without sizing an allocation by a length the body
// does not back, because every declared length is then one the bytes hold.
func Scan(data []byte) (int, error) {
	// open[d] counts the values still owed by the container open at depth
	// d+1.
	var open [MaxDepth]int
	depth := 0
	i := 0
	for {
		h, err := readHeader(data, i)
		if err != nil {
			return 0, err
		}
		left := len(data) - i - h.size
		if h.data > left {
			return 0, &ScanError{Err: ErrDeclaredLength, Offset: i, Code: data[i], Declared: h.data, Left: left}
		}
		if h.kind == TypeArray || h.kind == TypeMap {
			if h.elems > left {
				return 0, &ScanError{Err: ErrDeclaredLength, Offset: i, Code: data[i], Declared: h.elems, Left: left}
			}
			if depth == MaxDepth {
				return 0, &ScanError{Err: ErrTooDeep, Offset: i, Code: data[i]}
			}
		}
		i += h.size + h.data
		if h.elems > 0 {
			open[depth] = h.elems
			depth++
			continue
		}
		// One value is complete; so may be the containers it closes.
		for depth > 0 {
			open[depth-1]--
			if open[depth-1] > 0 {
				break
			}
			depth--
		}
		if depth == 0 {
			return i, nil
		}
	}
}

// Type is the kind of one msgpack value.
type Type uint8

// The kinds of msgpack value. Integers are one kind, signed or not.
const (
	TypeInvalid Type = iota
	TypeNil
	TypeBool
	TypeInt
	TypeFloat
	TypeStr
	TypeBin
	TypeArray
	TypeMap
	TypeExt
)

// Value is one msgpack value as it sits in a body: its bytes, exactly. A
// Value is cut from a body Scan accepted (ScanValue); its methods read it
// in place, without allocating, and treat bytes that are not one value as
// TypeInvalid.
type Value []byte

// ScanValue runs Scan over data and returns the value it starts with.
// Bytes after that value are ignored, as the decoder ignores them.
func ScanValue(data []byte) (Value, error) {
	n, err := Scan(data)
	if err != nil {
		return nil, err
	}
	return Value(data[:n]), nil
}

func (v Value) header() (header, bool) {
	h, err := readHeader(v, 0)
	if err != nil || h.size+h.data > len(v) {
		return header{}, false
	}
	return h, true
}

// Type is the kind of v.
func (v Value) Type() Type {
	h, ok := v.header()
	if !ok {
		return TypeInvalid
	}
	return h.kind
}

// IsNil reports whether v is nil.
func (v Value) IsNil() bool { return len(v) > 0 && v[0] == 0xc0 }

// Len is the number of elements of an array, of entries of a map, of
// bytes of a str, bin or ext payload; 0 for anything else.
func (v Value) Len() int {
	h, ok := v.header()
	if !ok {
		return 0
	}
	switch h.kind {
	case TypeMap:
		return h.elems / 2
	case TypeArray:
		return h.elems
	case TypeStr, TypeBin:
		return h.data
	case TypeExt:
		return h.data - 1
	}
	return 0
}

// Payload is what follows the header: the bytes of a str or bin, the
// elements of an array or map.
func (v Value) payload() []byte {
	h, ok := v.header()
	if !ok {
		return nil
	}
	return v[h.size:]
}

// Str returns the bytes of a str.
func (v Value) Str() ([]byte, bool) {
	if v.Type() != TypeStr {
		return nil, false
	}
	return v.payload(), true
}

// Bin returns the bytes of a bin or a str, which is what Bytes decodes
// from besides an array of small integers.
func (v Value) Bin() ([]byte, bool) {
	switch v.Type() {
	case TypeStr, TypeBin:
		return v.payload(), true
	}
	return nil, false
}

// Bool returns a boolean.
func (v Value) Bool() (b, ok bool) {
	if len(v) == 0 || v[0] != 0xc2 && v[0] != 0xc3 {
		return false, false
	}
	return v[0] == 0xc3, true
}

// be reads n big-endian bytes of v after its code.
func (v Value) be(n int) (uint64, bool) {
	if len(v) < 1+n {
		return 0, false
	}
	var x uint64
	for _, c := range v[1 : 1+n] {
		x = x<<8 | uint64(c)
	}
	return x, true
}

// Int returns an integer that fits an int64.
func (v Value) Int() (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	c := v[0]
	switch {
	case c <= 0x7f:
		return int64(c), true
	case c >= 0xe0:
		return int64(int8(c)), true
	}
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		u, ok := v.be(1 << (c - 0xcc))
		if !ok || u > math.MaxInt64 {
			return 0, false
		}
		return int64(u), true
	case 0xd0:
		u, ok := v.be(1)
		return int64(int8(u)), ok
	case 0xd1:
		u, ok := v.be(2)
		return int64(int16(u)), ok
	case 0xd2:
		u, ok := v.be(4)
		return int64(int32(u)), ok
	case 0xd3:
		u, ok := v.be(8)
		return int64(u), ok
	}
	return 0, false
}

// Uint returns a non-negative integer.
func (v Value) Uint() (uint64, bool) {
	if len(v) > 0 && v[0] == 0xcf {
		return v.be(8)
	}
	n, ok := v.Int()
	if !ok || n < 0 {
		return 0, false
	}
	return uint64(n), true
}

// Float returns a float, or an integer as a float.
func (v Value) Float() (float64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	switch v[0] {
	case 0xca:
		u, ok := v.be(4)
		return float64(math.Float32frombits(uint32(u))), ok
	case 0xcb:
		u, ok := v.be(8)
		return math.Float64frombits(u), ok
	}
	if u, ok := v.Uint(); ok {
		return float64(u), true
	}
	if n, ok := v.Int(); ok {
		return float64(n), true
	}
	return 0, false
}

// skip returns the offset after the value at b[i], walking nested values
// with one counter: a well-formed value needs no stack to be stepped over.
// It returns -1 when the bytes are not a whole value.
func skip(b []byte, i int) int {
	for owed := 1; owed > 0; owed-- {
		h, err := readHeader(b, i)
		if err != nil || h.data > len(b)-i-h.size {
			return -1
		}
		i += h.size + h.data
		owed += h.elems
	}
	return i
}

// Elems iterates over the elements of an array; it yields nothing for
// anything else.
func (v Value) Elems() iter.Seq[Value] {
	return func(yield func(Value) bool) {
		h, ok := v.header()
		if !ok || h.kind != TypeArray {
			return
		}
		i := h.size
		for range h.elems {
			end := skip(v, i)
			if end < 0 || !yield(v[i:end]) {
				return
			}
			i = end
		}
	}
}

// Entries iterates over the keys and values of a map; it yields nothing
// for anything else.
func (v Value) Entries() iter.Seq2[Value, Value] {
	return func(yield func(Value, Value) bool) {
		h, ok := v.header()
		if !ok || h.kind != TypeMap {
			return
		}
		i := h.size
		for range h.elems / 2 {
			mid := skip(v, i)
			if mid < 0 {
				return
			}
			end := skip(v, mid)
			if end < 0 || !yield(v[i:mid], v[mid:end]) {
				return
			}
			i = end
		}
	}
}

// KeyIs reports whether a map key names key the way the decoder reads a
// struct field's name: a str or a bin with those bytes.
func (v Value) KeyIs(key string) bool {
	b, ok := v.Bin()
	return ok && string(b) == key
}

// Get returns the value of key in a map and how many times the key occurs
// (a decoder keeps the last; each occurrence is decoded all the same).
func (v Value) Get(key string) (val Value, count int) {
	for k, e := range v.Entries() {
		if k.KeyIs(key) {
			val = e
			count++
		}
	}
	return val, count
}

// Census counts what v holds: values (v itself, every element, every map
// key and value, at every depth) and, of those, containers. It is what a
// decode into interface values makes one Go value of each.
func (v Value) Census() (values, containers int) {
	i := 0
	for owed := 1; owed > 0; owed-- {
		h, err := readHeader(v, i)
		if err != nil || h.data > len(v)-i-h.size {
			return values, containers
		}
		values++
		if h.kind == TypeArray || h.kind == TypeMap {
			containers++
		}
		i += h.size + h.data
		owed += h.elems
	}
	return values, containers
}
