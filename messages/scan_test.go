package messages_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
)

// TestScanAcceptsEveryGoldenBody: each golden body is one value, and Scan
// says exactly how long it is.
func TestScanAcceptsEveryGoldenBody(t *testing.T) {
	for _, c := range goldenCases(t) {
		n, err := messages.Scan(c.want)
		if err != nil || n != len(c.want) {
			t.Errorf("%s: Scan = %d, %v; want %d, nil", c.name, n, err, len(c.want))
		}
		// Trailing bytes are not part of the value, as for the decoder.
		if n, err := messages.Scan(append(bytes.Clone(c.want), 0xc1)); err != nil || n != len(c.want) {
			t.Errorf("%s with a trailing byte: Scan = %d, %v", c.name, n, err)
		}
	}
}

func TestScanRefuses(t *testing.T) {
	deep := func(n int) []byte { return append([]byte(strings.Repeat("\x91", n)), 0xc0) }
	cases := []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"empty", nil, messages.ErrMalformed, "truncated at offset 0"},
		{"reserved code", []byte{0xc1}, messages.ErrMalformed, "invalid code 0xc1"},
		{"cut-off length", []byte{0xdb, 0, 0}, messages.ErrMalformed, "truncated"},
		{"cut-off uint64", []byte{0xcf, 0, 0}, messages.ErrDeclaredLength, "declares 8 bytes, 2 left"},
		{"map missing a value", w(t).fixmap(1).str("a").bytes(), messages.ErrMalformed, "truncated"},
		{"array32 of 2^31", []byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 0xc0}, messages.ErrDeclaredLength, "declares 2147483647 elements, 1 bytes left"},
		{"array16 one longer than the bytes", []byte{0xdc, 0, 3, 0xc0, 0xc0}, messages.ErrDeclaredLength, "declares 3 elements"},
		// A map entry takes two bytes at least: 2 entries need 4.
		{"map16 of two entries in three bytes", []byte{0xde, 0, 2, 0xa0, 0xc0, 0xa0}, messages.ErrDeclaredLength, "declares 4 elements, 3 bytes left"},
		{"map32 of 2^32-1", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa0, 0xa0}, messages.ErrDeclaredLength, "elements"},
		{"str32 beyond the end", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, messages.ErrDeclaredLength, "declares 4294967295 bytes, 1 left"},
		{"bin8 beyond the end", []byte{0xc4, 5, 'a'}, messages.ErrDeclaredLength, "declares 5 bytes, 1 left"},
		{"ext32 beyond the end", []byte{0xc9, 0, 1, 0, 0, 7}, messages.ErrDeclaredLength, "bytes"},
		{"fixext16 cut off", []byte{0xd8, 1, 2}, messages.ErrDeclaredLength, "declares 17 bytes, 2 left"},
		{"fixstr cut off", []byte{0xa5, 'e', 'x'}, messages.ErrDeclaredLength, "declares 5 bytes, 2 left"},
		{"nested over the limit", deep(messages.MaxDepth + 1), messages.ErrTooDeep, "nesting deeper than 32"},
		{"empty container over the limit", append([]byte(strings.Repeat("\x91", messages.MaxDepth)), 0x90), messages.ErrTooDeep, "nesting"},
		{"deep inside a map key", append(w(t).fixmap(1).raw(deep(40)).bytes(), 0xc0), messages.ErrTooDeep, "nesting"},
		{"a huge array deep inside", append(w(t).fixmap(1).str("x").arr(1).bytes(), 0xdd, 0, 0x10, 0, 0, 0xc0), messages.ErrDeclaredLength, "declares 1048576 elements"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := messages.Scan(c.data)
			var se *messages.ScanError
			if !errors.Is(err, c.want) || !errors.As(err, &se) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Scan(%x) = %v, want %v containing %q", c.data, err, c.want, c.msg)
			}
			if err := messages.Unmarshal(c.data, new(any)); !errors.Is(err, c.want) {
				t.Fatalf("Unmarshal = %v, want %v", err, c.want)
			}
		})
	}
	if _, err := messages.Scan(append([]byte(strings.Repeat("\x91", messages.MaxDepth)), 0xc0)); err != nil {
		t.Fatalf("%d levels: %v", messages.MaxDepth, err)
	}
}

// bigPoll is a poll answer of n exec commands with env and stdin, the
// shape a busy daemon decodes on every poll.
func bigPoll(t testing.TB, n int) []byte {
	resp := messages.PollResponse{}
	for i := range n {
		cmd, err := messages.EncodeCommand("c", messages.KindExec, &messages.Exec{
			ExecID: "01J00000000000000000000000", Command: "echo " + strings.Repeat("x", i%50),
			Env: map[string]string{"A": "1", "PATH": "/usr/bin:/bin", "HOME": "/root"}, Stdin: "in",
		})
		if err != nil {
			t.Fatal(err)
		}
		resp.Commands = append(resp.Commands, cmd)
	}
	b, err := messages.Marshal(&resp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestScanAllocatesNothing: Scan and the Value reads allocate nothing on a
// body they accept.
func TestScanAllocatesNothing(t *testing.T) {
	body := bigPoll(t, 64)
	if n := testing.AllocsPerRun(20, func() {
		if _, err := messages.Scan(body); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Scan: %v allocations per run", n)
	}
	v, err := messages.ScanValue(body)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() {
		cmds, count := v.Get("commands")
		if count != 1 || cmds.Len() != 64 {
			t.Fatalf("commands: %d, %d", count, cmds.Len())
		}
		for c := range cmds.Elems() {
			kind, _ := c.Get("kind")
			if s, ok := kind.Str(); !ok || string(s) != messages.KindExec {
				t.Fatalf("kind %x", []byte(kind))
			}
		}
		if vals, _ := v.Census(); vals < 64*10 {
			t.Fatalf("census: %d values", vals)
		}
	}); n != 0 {
		t.Fatalf("Value reads: %v allocations per run", n)
	}
}

func TestValueReads(t *testing.T) {
	body := w(t).fixmap(9).
		str("u").uint(1<<64 - 1).str("i").int(-70000).str("f").f64(0.5).str("s").str("abc").
		str("b").bin([]byte{1, 2}).str("a").arr(2).nil().bool(true).str("m").fixmap(1).str("k").uint(3).
		str("s").str("again").u8(0xc4).u8(1).raw([]byte("z")).uint(9).bytes()
	v, err := messages.ScanValue(body)
	if err != nil {
		t.Fatal(err)
	}
	get := func(k string) messages.Value {
		e, n := v.Get(k)
		if n == 0 {
			t.Fatalf("no key %q", k)
		}
		return e
	}
	if u, ok := get("u").Uint(); !ok || u != 1<<64-1 {
		t.Fatalf("u = %d %v", u, ok)
	}
	if _, ok := get("u").Int(); ok {
		t.Fatal("2^64-1 read as an int64")
	}
	if f, ok := get("u").Float(); !ok || f != 1<<64-1 {
		t.Fatalf("u as a float = %v %v", f, ok)
	}
	if n, ok := get("i").Int(); !ok || n != -70000 {
		t.Fatalf("i = %d %v", n, ok)
	}
	if _, ok := get("i").Uint(); ok {
		t.Fatal("a negative read as a uint")
	}
	if f, ok := get("f").Float(); !ok || f != 0.5 {
		t.Fatalf("f = %v", f)
	}
	if _, ok := get("f").Int(); ok {
		t.Fatal("a float read as an int")
	}
	// The last of a repeated key, and the count.
	if s, n := v.Get("s"); n != 2 || string(s[1:]) != "again" {
		t.Fatalf("s = %q ×%d", []byte(s), n)
	}
	if b, ok := get("b").Bin(); !ok || !bytes.Equal(b, []byte{1, 2}) {
		t.Fatalf("b = %v", b)
	}
	if _, ok := get("b").Str(); ok {
		t.Fatal("a bin read as a str")
	}
	// A bin key names a field as a str key does, as the decoder reads it.
	if z, n := v.Get("z"); n != 1 || z.Type() != messages.TypeInt {
		t.Fatalf("bin key z: %x ×%d", []byte(z), n)
	}
	a := get("a")
	var types []messages.Type
	for e := range a.Elems() {
		types = append(types, e.Type())
	}
	if a.Len() != 2 || len(types) != 2 || types[0] != messages.TypeNil || types[1] != messages.TypeBool {
		t.Fatalf("a: %v", types)
	}
	if k, n := get("m").Get("k"); n != 1 || k.Type() != messages.TypeInt {
		t.Fatalf("m.k: %x", []byte(k))
	}
	if vals, containers := v.Census(); vals != 1+9*2+2+2 || containers != 3 {
		t.Fatalf("census = %d values, %d containers", vals, containers)
	}
	// Reads of something that is not a whole value find nothing.
	for _, bad := range []messages.Value{nil, {0xc1}, {0xdc, 0}, {0x92, 0xc0}} {
		if bad.Type() != messages.TypeInvalid && bad.Type() != messages.TypeArray {
			t.Fatalf("%x: type %v", []byte(bad), bad.Type())
		}
		for range bad.Elems() {
		}
		if _, n := bad.Get("x"); n != 0 {
			t.Fatalf("%x: found a key", []byte(bad))
		}
	}
}

// BenchmarkScanCost measures what the scan adds to a decode: for each
// body, the time of Scan and of the msgpack/v5 decode alone are measured
// in the same loop and their ratio reported (scan/decode-%).
func BenchmarkScanCost(b *testing.B) {
	out := strings.Repeat("output line\n", messages.OutputCap/12)
	exec, err := messages.Marshal(&messages.ExecResult{ExitCode: 0, Stdout: out, Stderr: out[:4096], DurationMs: 5})
	if err != nil {
		b.Fatal(err)
	}
	ack, err := messages.Marshal(&messages.Ack{InvocationID: "i", State: messages.StateSucceeded, ResultBlob: bytes.Repeat([]byte{7}, messages.InlineThreshold)})
	if err != nil {
		b.Fatal(err)
	}
	hello, err := messages.Marshal(&messages.HelloRequest{MachineID: "m", Label: "l", Tags: []string{"a=b", "gpu=h100"},
		Capabilities: messages.Capabilities{Runners: []string{"process", "docker"}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		body []byte
		v    func() any
	}{
		{"poll-64-execs", bigPoll(b, 64), func() any { return new(messages.PollResponse) }},
		{"exec-result-1MiB", exec, func() any { return new(messages.ExecResult) }},
		{"ack-256KiB", ack, func() any { return new(messages.Ack) }},
		{"hello", hello, func() any { return new(messages.HelloRequest) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			var scan, decode time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := messages.Scan(c.body); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := msgpack.Unmarshal(c.body, c.v()); err != nil {
					b.Fatal(err)
				}
				scan += t1.Sub(t0)
				decode += time.Since(t1)
			}
			b.ReportMetric(float64(scan.Nanoseconds())/float64(b.N), "scan-ns/op")
			b.ReportMetric(float64(decode.Nanoseconds())/float64(b.N), "decode-ns/op")
			b.ReportMetric(100*float64(scan)/float64(decode), "scan/decode-%")
		})
	}
}

// FuzzScan checks the scanner against msgpack/v5 itself. What Scan
// accepts, the decoder steps over to the same length, and decodes into an
// interface and into every wire body without panicking. What Scan refuses,
// the decoder refuses too, unless the refusal is the nesting bound; and a
// declared-length refusal is one whose header really does claim more than
// the bytes after it.
func FuzzScan(f *testing.F) {
	for _, c := range goldenCases(f) {
		f.Add(c.want)
	}
	f.Add([]byte{})
	f.Add([]byte{0xc1})
	f.Add([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 0xc0})
	f.Add([]byte{0xde, 0, 2, 0xa0, 0xc0, 0xa0})
	f.Add([]byte{0xc9, 0, 0, 0, 1, 5, 0})
	f.Add(append([]byte(strings.Repeat("\x91", messages.MaxDepth+1)), 0xc0))
	f.Add(append(w(f).fixmap(1).str("exit_code").arr(300).bytes(), bytes.Repeat([]byte{0xc0}, 300)...))
	targets := []func() any{
		func() any { return new(any) },
		func() any { return new(messages.PollResponse) },
		func() any { return new(messages.PollRequest) },
		func() any { return new(messages.HelloRequest) },
		func() any { return new(messages.HelloResponse) },
		func() any { return new(messages.ExecResult) },
		func() any { return new(messages.Ack) },
		func() any { return new(messages.Event) },
		func() any { return new(messages.ResultChunk) },
		func() any { return new(messages.LogData) },
		func() any { return new(messages.Exec) },
		func() any { return new(messages.Run) },
		func() any { return new(msgpack.RawMessage) },
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := messages.Scan(data)
		rd := bytes.NewReader(data)
		skipErr := msgpack.NewDecoder(rd).Skip()
		if err == nil {
			if skipErr != nil {
				t.Fatalf("Scan accepted %x (%d bytes), msgpack/v5 refuses it: %v", data, n, skipErr)
			}
			if got := len(data) - rd.Len(); got != n {
				t.Fatalf("Scan says %d bytes, msgpack/v5 stepped over %d", n, got)
			}
			for _, v := range targets {
				_ = messages.Unmarshal(data, v())
			}
			v := messages.Value(data[:n])
			if vals, _ := v.Census(); vals > n {
				t.Fatalf("census of %d values in %d bytes", vals, n)
			}
			for k, e := range v.Entries() {
				_, _ = k.Bin()
				_, _ = e.Get("x")
			}
			return
		}
		var se *messages.ScanError
		if !errors.As(err, &se) {
			t.Fatalf("Scan error %T: %v", err, err)
		}
		switch {
		case errors.Is(err, messages.ErrTooDeep):
			// The decoder has no bound of its own.
		case errors.Is(err, messages.ErrDeclaredLength):
			if se.Declared <= se.Left {
				t.Fatalf("declared-length refusal of %d with %d left: %v", se.Declared, se.Left, err)
			}
			fallthrough
		default:
			if skipErr == nil {
				t.Fatalf("Scan refused %x (%v), msgpack/v5 steps over it", data, err)
			}
		}
	})
}
