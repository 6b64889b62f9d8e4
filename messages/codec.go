package messages

import (
	"bytes"
	"fmt"
	"math"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ContentType is the media type of every msgpack body on the daemon routes.
const ContentType = "application/x-msgpack"

// ProtocolVersion is the value of HelloRequest.Versions.Protocol.
const ProtocolVersion = "1"

// normalizer is implemented by bodies that must replace nil lists and maps
// with empty ones before encoding, because the Rust side rejects nil there.
// normalize runs on a shallow copy of the caller's body, so it may assign
// fields but must copy anything it changes behind a pointer or a slice.
type normalizer interface {
	normalize()
}

var normalizerType = reflect.TypeFor[normalizer]()

// normalized returns a normalised copy of v, whether v is a body or a
// pointer to one. The caller's value is never changed: a body may be encoded
// from several goroutines, and a nil the caller set stays nil.
func normalized(v any) any {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() {
		return v
	}
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return v
		}
		rv = rv.Elem()
	}
	if !reflect.PointerTo(rv.Type()).Implements(normalizerType) {
		return v
	}
	cp := reflect.New(rv.Type())
	cp.Elem().Set(rv)
	n := cp.Interface().(normalizer)
	n.normalize()
	return n
}

// Marshal encodes v the way rmp_serde's to_vec_named does: a map with string
// keys in declaration order, compact integers, float64 floats. v may be a
// body or a pointer to one; either way nil lists and maps the Rust side
// rejects go out empty.
func Marshal(v any) ([]byte, error) {
	v = normalized(v)
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("msgpack encode %T: %w", v, err)
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes a msgpack body into v. Unknown keys are skipped and a
// missing key leaves the field at its zero value, as serde does for Option.
// Scan runs first: a body that is not one well-formed value, that nests
// deeper than MaxDepth or whose headers declare more than its bytes hold is
// refused before the decoder allocates anything for it (the decoder sizes a
// slice by its declared length before reading a single element, so ten
// bytes claiming 2^31 commands would otherwise ask for a hundred gigabytes).
func Unmarshal(data []byte, v any) error {
	if _, err := Scan(data); err != nil {
		return fmt.Errorf("msgpack decode %T: %w", v, err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("msgpack decode %T: %w", v, err)
	}
	return nil
}

// Bytes is a byte field (args_blob, result_blob, payload_inline). It is
// encoded as msgpack bin; decoding also accepts str and an array of small
// integers, which is what serde emits for a Vec<u8> without serde_bytes.
// A nil Bytes encodes as nil; a non-nil empty one as an empty bin.
type Bytes []byte

var (
	_ msgpack.CustomEncoder = Bytes(nil)
	_ msgpack.CustomDecoder = (*Bytes)(nil)
)

// EncodeMsgpack implements msgpack.CustomEncoder.
func (b Bytes) EncodeMsgpack(enc *msgpack.Encoder) error {
	if b == nil {
		return enc.EncodeNil()
	}
	return enc.EncodeBytes(b)
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (b *Bytes) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case c == msgpcode.Nil:
		*b = nil
		return dec.Skip()
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		v, err := dec.DecodeBytes()
		if err != nil {
			return err
		}
		if v == nil {
			v = []byte{}
		}
		*b = v
		return nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		// The declared length is not trusted for the allocation.
		out := make([]byte, 0, min(max(n, 0), 4096))
		for i := 0; i < n; i++ {
			v, err := dec.DecodeInt64()
			if err != nil {
				return fmt.Errorf("byte array element %d: %w", i, err)
			}
			if v < 0 || v > 255 {
				return fmt.Errorf("byte array element %d: %d is not a byte", i, v)
			}
			out = append(out, byte(v))
		}
		*b = out
		return nil
	default:
		return fmt.Errorf("msgpack: code %#x is not bytes", c)
	}
}

// Epoch is a time on the wire in unix seconds. It is encoded as an integer
// and decodes from an integer or a float (fractions are truncated).
type Epoch int64

var (
	_ msgpack.CustomEncoder = Epoch(0)
	_ msgpack.CustomDecoder = (*Epoch)(nil)
)

// EncodeMsgpack implements msgpack.CustomEncoder.
func (e Epoch) EncodeMsgpack(enc *msgpack.Encoder) error {
	return enc.EncodeInt(int64(e))
}

// DecodeMsgpack implements msgpack.CustomDecoder.
func (e *Epoch) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		f, err := dec.DecodeFloat64()
		if err != nil {
			return err
		}
		if math.IsNaN(f) || math.IsInf(f, 0) || f > math.MaxInt64 || f < math.MinInt64 {
			return fmt.Errorf("epoch seconds %v out of range", f)
		}
		*e = Epoch(int64(f))
		return nil
	}
	if c == msgpcode.Uint64 {
		v, err := dec.DecodeUint64()
		if err != nil {
			return err
		}
		if v > math.MaxInt64 {
			return fmt.Errorf("epoch seconds %d out of range", v)
		}
		*e = Epoch(v)
		return nil
	}
	v, err := dec.DecodeInt64()
	if err != nil {
		return err
	}
	*e = Epoch(v)
	return nil
}
