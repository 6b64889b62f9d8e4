package messages_test

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
)

// TestGoldenRoundTrip decodes every golden body and encodes it again: the
// bytes must come back identical, and a body already in canonical form must
// decode back equal.
func TestGoldenRoundTrip(t *testing.T) {
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			dst := c.fresh()
			if err := messages.Unmarshal(c.want, dst); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			again, err := messages.Marshal(dst)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			assertWire(t, again, c.want)
			if !c.canonical {
				return
			}
			want := reflect.ValueOf(c.v)
			if want.Kind() == reflect.Pointer {
				want = want.Elem()
			}
			if got := reflect.ValueOf(dst).Elem().Interface(); !reflect.DeepEqual(got, want.Interface()) {
				t.Fatalf("decoded\n%#v\nwant\n%#v", got, want.Interface())
			}
		})
	}
}

func chunkWith(t *testing.T, data []byte) []byte {
	return w(t).fixmap(4).str("invocation_id").str("i").str("seq").uint(1).str("data").raw(data).str("last").bool(true).bytes()
}

func TestBytesDecoding(t *testing.T) {
	ok := []struct {
		name string
		data []byte
		want messages.Bytes
	}{
		{"bin8", w(t).bin([]byte{1, 2, 255}).bytes(), messages.Bytes{1, 2, 255}},
		{"empty bin", w(t).bin(nil).bytes(), messages.Bytes{}},
		{"bin16", w(t).bin(bin300).bytes(), messages.Bytes(bin300)},
		{"bin32", w(t).bin(bin70000).bytes(), messages.Bytes(bin70000)},
		{"str", w(t).str("abc").bytes(), messages.Bytes("abc")},
		{"str8", w(t).str(longStr).bytes(), messages.Bytes(longStr)},
		{"array of fixints", w(t).arr(3).uint(1).uint(2).uint(127).bytes(), messages.Bytes{1, 2, 127}},
		{"array of uint8", w(t).arr(2).uint(128).uint(255).bytes(), messages.Bytes{128, 255}},
		{"array of wide ints in range", w(t).arr(2).raw([]byte{0xcd, 0x00, 0x05}).raw([]byte{0xd0, 0x06}).bytes(), messages.Bytes{5, 6}},
		{"empty array", w(t).arr(0).bytes(), messages.Bytes{}},
		{"array16", func() []byte {
			m := w(t).arr(20)
			for i := range 20 {
				m.uint(uint64(i))
			}
			return m.bytes()
		}(), messages.Bytes{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}},
		{"nil", w(t).nil().bytes(), nil},
	}
	for _, c := range ok {
		t.Run(c.name, func(t *testing.T) {
			var rc messages.ResultChunk
			if err := messages.Unmarshal(chunkWith(t, c.data), &rc); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(rc.Data, c.want) {
				t.Fatalf("data = %v, want %v", rc.Data, c.want)
			}
			var top messages.Bytes
			if err := messages.Unmarshal(c.data, &top); err != nil {
				t.Fatalf("Unmarshal top-level: %v", err)
			}
			if !reflect.DeepEqual(top, c.want) {
				t.Fatalf("top-level = %v, want %v", top, c.want)
			}
		})
	}

	bad := []struct {
		name string
		data []byte
		why  string
	}{
		{"256 in array", w(t).arr(2).uint(1).uint(256).bytes(), "256 is not a byte"},
		{"-1 in array", w(t).arr(2).uint(1).int(-1).bytes(), "-1 is not a byte"},
		{"uint64 max in array", w(t).arr(1).uint(1<<64 - 1).bytes(), "not a byte"},
		{"string in array", w(t).arr(1).str("a").bytes(), "element 0"},
		{"float in array", w(t).arr(1).f64(1).bytes(), "element 0"},
		{"map", w(t).fixmap(0).bytes(), "not bytes"},
		{"int", w(t).uint(5).bytes(), "not bytes"},
		{"bool", w(t).bool(true).bytes(), "not bytes"},
		{"array longer than body", []byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 0x01}, "declares 2147483647 elements"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			var rc messages.ResultChunk
			err := messages.Unmarshal(chunkWith(t, c.data), &rc)
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("err = %v, want one containing %q", err, c.why)
			}
			cmd := messages.Command{ID: "r", Kind: messages.KindRun,
				Body: w(t).fixmap(2).str("invocation_id").str("inv").str("args_blob").raw(c.data).bytes()}
			// A malformed length is refused before any field is looked at;
			// any other refusal names the field.
			u, isUnknown := messages.DecodeCommand(cmd).(messages.Unknown)
			if !isUnknown || !strings.Contains(u.Reason, "args_blob") && !strings.Contains(u.Reason, "declares") {
				t.Fatalf("DecodeCommand = %#v, want Unknown naming args_blob", messages.DecodeCommand(cmd))
			}
		})
	}
}

func TestEpochDecoding(t *testing.T) {
	cases := []struct {
		name string
		v    []byte
		want messages.Epoch
	}{
		{"fixint", w(t).uint(5).bytes(), 5},
		{"uint32", w(t).uint(1_700_000_000).bytes(), 1_700_000_000},
		{"uint64", w(t).uint(5_000_000_000).bytes(), 5_000_000_000},
		{"int32 form of a positive", []byte{0xd2, 0x65, 0x53, 0xf1, 0x00}, 1_700_000_000},
		{"negative", w(t).int(-70000).bytes(), -70000},
		{"float64", w(t).f64(1_700_000_000.75).bytes(), 1_700_000_000},
		{"float32", w(t).u8(0xca).be32(math.Float32bits(1_700_000_000)).bytes(), 1_700_000_000},
		{"nil", w(t).nil().bytes(), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h messages.Hibernate
			if err := messages.Unmarshal(w(t).fixmap(1).str("until_epoch_s").raw(c.v).bytes(), &h); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if h.UntilEpochS != c.want {
				t.Fatalf("until_epoch_s = %d, want %d", h.UntilEpochS, c.want)
			}
		})
	}
	for name, v := range map[string][]byte{
		"NaN":            {0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1},
		"+Inf":           w(t).f64(math.Inf(1)).bytes(),
		"1e300":          w(t).f64(1e300).bytes(),
		"uint64 > int64": w(t).uint(1<<63 + 5).bytes(),
		"string":         w(t).str("1700000000").bytes(),
	} {
		t.Run("rejects "+name, func(t *testing.T) {
			var h messages.Hibernate
			if err := messages.Unmarshal(w(t).fixmap(1).str("until_epoch_s").raw(v).bytes(), &h); err == nil {
				t.Fatalf("decoded %x to %d, want an error", v, h.UntilEpochS)
			}
		})
	}
	// A server time sent as a float (some control planes keep f64 seconds).
	var hr messages.HelloResponse
	body := w(t).fixmap(2).str("session_ttl_s").uint(86400).str("server_time_epoch_s").f64(1_700_000_000.5).bytes()
	if err := messages.Unmarshal(body, &hr); err != nil {
		t.Fatal(err)
	}
	if hr.ServerTimeEpochS == nil || *hr.ServerTimeEpochS != 1_700_000_000 {
		t.Fatalf("server_time_epoch_s = %v", hr.ServerTimeEpochS)
	}
}

func TestPayloadRefSpellings(t *testing.T) {
	ref := func(ctKey string, extra bool) []byte {
		n := 5
		if extra {
			n = 6
		}
		m := w(t).fixmap(n).str("bucket").str("b").str("key").str("k").str("size").uint(300).
			str(ctKey).str("text/plain")
		if extra {
			m.str("etag").arr(2).str("x").fixmap(1).str("y").nil()
		}
		return m.str("sha256").str(sha).bytes()
	}
	want := messages.PayloadRef{Bucket: "b", Key: "k", Size: 300, ContentType: "text/plain", SHA256: sp(sha)}
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"content_type", ref("content_type", false)},
		{"contentType", ref("contentType", false)},
		{"contentType with unknown keys", ref("contentType", true)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p messages.PayloadRef
			if err := messages.Unmarshal(c.body, &p); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, want) {
				t.Fatalf("got %#v, want %#v", p, want)
			}
			// The same ref inside an exec body.
			cmd := messages.Command{ID: "e", Kind: messages.KindExec, Body: w(t).fixmap(2).
				str("exec_id").str("x").str("payload_ref").raw(c.body).bytes()}
			e, ok := messages.DecodeCommand(cmd).(*messages.Exec)
			if !ok {
				t.Fatalf("DecodeCommand = %#v", messages.DecodeCommand(cmd))
			}
			if e.PayloadRef == nil || !reflect.DeepEqual(*e.PayloadRef, want) {
				t.Fatalf("payload_ref = %#v", e.PayloadRef)
			}
		})
	}
	// Both spellings: the snake_case one wins; a nil ref stays nil.
	var p messages.PayloadRef
	body := w(t).fixmap(2).str("contentType").str("camel").str("content_type").str("snake").bytes()
	if err := messages.Unmarshal(body, &p); err != nil || p.ContentType != "snake" {
		t.Fatalf("both spellings: %v %q", err, p.ContentType)
	}
	var r messages.ExecResult
	if err := messages.Unmarshal(w(t).fixmap(2).str("exit_code").uint(0).str("result_ref").nil().bytes(), &r); err != nil || r.ResultRef != nil {
		t.Fatalf("nil result_ref: %v %#v", err, r.ResultRef)
	}
}

// TestUnknownKeysAndMissingOptions: what serde does on the Rust side, the Go
// side must do too — skip keys it does not know, take a missing Option as
// None.
func TestUnknownKeysAndMissingOptions(t *testing.T) {
	// A poll response from a server that knows nothing of cursors, with
	// extra keys of every shape before, between and after the known ones.
	body := w(t).fixmap(5).
		str("future_list").arr(2).uint(1).fixmap(1).str("deep").arr(1).bin([]byte{1}).
		str("commands").arr(1).
		fixmap(4).str("id").str("c1").str("priority").f64(1.5).str("kind").str("reset_backoff").str("body").nil().
		str("future_map").fixmap(1).str("k").str(str300).
		str("target_nymph_version").nil().
		str("future_int").uint(5_000_000_000).
		bytes()
	// An ext value under an unknown key is skipped too.
	body[0]++
	body = append(body, w(t).str("future_ext").raw([]byte{0xc7, 0x02, 0x05, 0xaa, 0xbb}).bytes()...)
	var pr messages.PollResponse
	if err := messages.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	if len(pr.Commands) != 1 || pr.Commands[0].ID != "c1" || pr.Commands[0].Kind != "reset_backoff" || pr.Cursor != nil {
		t.Fatalf("decoded %#v", pr)
	}
	if got := messages.DecodeCommand(pr.Commands[0]); got != (messages.ResetBackoff{}) {
		t.Fatalf("command = %#v", got)
	}

	// A hello response with only the non-Option keys.
	var hr messages.HelloResponse
	if err := messages.Unmarshal(w(t).fixmap(3).str("session_ttl_s").uint(86400).str("config").fixmap(0).
		str("key_rotation_max_age_s").uint(0).bytes(), &hr); err != nil {
		t.Fatal(err)
	}
	if hr.WorkerID != nil || hr.SessionToken != nil || hr.Cursor != nil || hr.Reject != nil || hr.KeyID != nil || hr.ServerTimeEpochS != nil {
		t.Fatalf("missing options not nil: %#v", hr)
	}

	// An exec with only the required keys: every Option nil.
	cmd := messages.Command{ID: "e", Kind: messages.KindExec, Body: w(t).fixmap(4).str("exec_id").str("x").
		str("command").str("true").str("env").fixmap(0).str("stdin").str("").bytes()}
	e, ok := messages.DecodeCommand(cmd).(*messages.Exec)
	if !ok {
		t.Fatalf("DecodeCommand = %#v", messages.DecodeCommand(cmd))
	}
	if e.Workdir != nil || e.TimeoutS != nil || e.Log != nil || e.PayloadInline != nil || e.PayloadRef != nil {
		t.Fatalf("missing options not nil: %#v", e)
	}

	// An ack without error or worker_id, and an InvocationStatus without exit_code.
	var a messages.Ack
	if err := messages.Unmarshal(w(t).fixmap(3).str("invocation_id").str("i").str("state").str("succeeded").
		str("result_blob").bin([]byte("r")).bytes(), &a); err != nil || a.Error != nil || a.WorkerID != "" {
		t.Fatalf("ack: %v %#v", err, a)
	}
	var is messages.InvocationStatus
	if err := messages.Unmarshal(w(t).fixmap(1).str("invocation_id").str("i").bytes(), &is); err != nil || is.ExitCode != nil {
		t.Fatalf("status: %v %#v", err, is)
	}
}

// TestNumberDecoding: an int where a float is declared decodes (serde does
// the same); timeout_s from the Go control plane is float, from others may be
// an integer.
func TestNumberDecoding(t *testing.T) {
	var p messages.PollRequest
	if err := messages.Unmarshal(w(t).fixmap(2).str("worker_id").str("w").str("timeout_s").uint(20).bytes(), &p); err != nil || p.TimeoutS != 20 {
		t.Fatalf("int timeout_s: %v %v", err, p.TimeoutS)
	}
	if err := messages.Unmarshal(w(t).fixmap(1).str("timeout_s").raw([]byte{0xca, 0x41, 0xa0, 0, 0}).bytes(), &p); err != nil || p.TimeoutS != 20 {
		t.Fatalf("float32 timeout_s: %v %v", err, p.TimeoutS)
	}
	cmd := messages.Command{ID: "e", Kind: messages.KindExec, Body: w(t).fixmap(2).str("exec_id").str("x").str("timeout_s").uint(30).bytes()}
	e, ok := messages.DecodeCommand(cmd).(*messages.Exec)
	if !ok || e.TimeoutS == nil || *e.TimeoutS != 30 {
		t.Fatalf("DecodeCommand = %#v", messages.DecodeCommand(cmd))
	}
}

// TestUnmarshalRefusesImpossibleLengths: a header that claims more elements
// than the body has bytes is refused before anything is allocated for it.
func TestUnmarshalRefusesImpossibleLengths(t *testing.T) {
	cases := map[string][]byte{
		"commands array32":    append(w(t).fixmap(1).str("commands").bytes(), 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x90),
		"commands array16":    append(w(t).fixmap(1).str("commands").bytes(), 0xdc, 0xff, 0xff, 0x90),
		"top map32":           {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa0, 0xa0},
		"str32 beyond end":    append(w(t).fixmap(1).str("target_nymph_version").bytes(), 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'),
		"bin32 beyond end":    append(w(t).fixmap(1).str("x").bytes(), 0xc6, 0xff, 0xff, 0xff, 0xff, 'a'),
		"truncated map":       w(t).fixmap(3).str("commands").arr(0).bytes(),
		"truncated uint64":    append(w(t).fixmap(1).str("x").bytes(), 0xcf, 0, 0),
		"reserved code":       w(t).fixmap(1).str("x").u8(0xc1).bytes(),
		"empty input":         {},
		"deep nesting":        append([]byte(strings.Repeat("\x91", 2000)), 0xc0),
		"deep nesting in key": append(append(w(t).fixmap(1).str("x").bytes(), strings.Repeat("\x91", 1100)...), 0xc0),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			var pr messages.PollResponse
			if err := messages.Unmarshal(data, &pr); err == nil {
				t.Fatalf("decoded %x without error: %#v", data, pr)
			}
		})
	}
	// Nesting up to the limit is fine, one level more is not.
	var v any
	if err := messages.Unmarshal(append([]byte(strings.Repeat("\x91", messages.MaxDepth)), 0xc0), &v); err != nil {
		t.Fatalf("%d levels: %v", messages.MaxDepth, err)
	}
	if err := messages.Unmarshal(append([]byte(strings.Repeat("\x91", messages.MaxDepth+1)), 0xc0), &v); !errors.Is(err, messages.ErrTooDeep) {
		t.Fatalf("%d levels: %v, want ErrTooDeep", messages.MaxDepth+1, err)
	}
}

// TestDecodeIntoAny checks a body of every msgpack form decodes into an
// interface value, the way HelloResponse.config does.
func TestDecodeIntoAny(t *testing.T) {
	cfg := w(t).fixmap(8).
		str("a").uint(5_000_000_000).str("b").int(-70000).str("c").f64(0.25).str("d").bin([]byte{1}).
		str("e").arr(2).str("x").nil().str("f").fixmap(1).str("g").bool(true).
		str("h").raw([]byte{0xca, 0x3f, 0x80, 0, 0}).str("i").str(str300).bytes()
	var hr messages.HelloResponse
	if err := messages.Unmarshal(w(t).fixmap(1).str("config").raw(cfg).bytes(), &hr); err != nil {
		t.Fatal(err)
	}
	if len(hr.Config) != 8 {
		t.Fatalf("config = %#v", hr.Config)
	}
	if _, err := messages.Marshal(hr); err != nil {
		t.Fatal(err)
	}
	var raw msgpack.RawMessage
	if err := messages.Unmarshal(cfg, &raw); err != nil || len(raw) != len(cfg) {
		t.Fatalf("raw: %v %d", err, len(raw))
	}
}
