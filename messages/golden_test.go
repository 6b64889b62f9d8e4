package messages_test

// The golden tests build the expected bytes of every wire body with a small
// msgpack writer that is independent of the encoder under test and writes
// exactly the forms rmp_serde's to_vec_named emits: maps with string keys in
// declaration order, integers in their smallest form (a non-negative signed
// value takes the unsigned forms), f64 always as 0xcb, None as nil with the
// key kept, strings as str, serde_bytes fields as bin.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
)

// mp is the reference writer. Every method appends one msgpack item and
// returns the writer so a body reads top to bottom like the wire does.
type mp struct {
	t testing.TB
	b []byte
}

func w(t testing.TB) *mp { return &mp{t: t} }

func (m *mp) bytes() []byte { return m.b }

func (m *mp) u8(v byte) *mp { m.b = append(m.b, v); return m }

func (m *mp) be16(v uint16) *mp { m.b = binary.BigEndian.AppendUint16(m.b, v); return m }

func (m *mp) be32(v uint32) *mp { m.b = binary.BigEndian.AppendUint32(m.b, v); return m }

func (m *mp) be64(v uint64) *mp { m.b = binary.BigEndian.AppendUint64(m.b, v); return m }

// fixmap writes the header of a map of n entries. rmp uses fixmap below 16.
func (m *mp) fixmap(n int) *mp {
	if n < 0 || n > 15 {
		m.t.Fatalf("fixmap(%d): out of range", n)
	}
	return m.u8(0x80 | byte(n))
}

// arr writes an array header: fixarray, array16 or array32.
func (m *mp) arr(n int) *mp {
	switch {
	case n < 16:
		return m.u8(0x90 | byte(n))
	case n <= math.MaxUint16:
		return m.u8(0xdc).be16(uint16(n))
	default:
		return m.u8(0xdd).be32(uint32(n))
	}
}

// str writes fixstr, str8, str16 or str32, as rmp's write_str does.
func (m *mp) str(s string) *mp {
	n := len(s)
	switch {
	case n < 32:
		m.u8(0xa0 | byte(n))
	case n <= math.MaxUint8:
		m.u8(0xd9).u8(byte(n))
	case n <= math.MaxUint16:
		m.u8(0xda).be16(uint16(n))
	default:
		m.u8(0xdb).be32(uint32(n))
	}
	m.b = append(m.b, s...)
	return m
}

// bin writes bin8, bin16 or bin32, as serde_bytes does through rmp.
func (m *mp) bin(b []byte) *mp {
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		m.u8(0xc4).u8(byte(n))
	case n <= math.MaxUint16:
		m.u8(0xc5).be16(uint16(n))
	default:
		m.u8(0xc6).be32(uint32(n))
	}
	m.b = append(m.b, b...)
	return m
}

// uint writes rmp's write_uint: positive fixint, uint8, uint16, uint32, uint64.
func (m *mp) uint(v uint64) *mp {
	switch {
	case v < 128:
		return m.u8(byte(v))
	case v <= math.MaxUint8:
		return m.u8(0xcc).u8(byte(v))
	case v <= math.MaxUint16:
		return m.u8(0xcd).be16(uint16(v))
	case v <= math.MaxUint32:
		return m.u8(0xce).be32(uint32(v))
	default:
		return m.u8(0xcf).be64(v)
	}
}

// int writes rmp's write_sint: a non-negative value takes the unsigned forms,
// a negative one negative fixint, int8, int16, int32 or int64.
func (m *mp) int(v int64) *mp {
	switch {
	case v >= 0:
		return m.uint(uint64(v))
	case v >= -32:
		return m.u8(byte(int8(v)))
	case v >= math.MinInt8:
		return m.u8(0xd0).u8(byte(int8(v)))
	case v >= math.MinInt16:
		return m.u8(0xd1).be16(uint16(int16(v)))
	case v >= math.MinInt32:
		return m.u8(0xd2).be32(uint32(int32(v)))
	default:
		return m.u8(0xd3).be64(uint64(v))
	}
}

func (m *mp) f64(v float64) *mp { return m.u8(0xcb).be64(math.Float64bits(v)) }

func (m *mp) nil() *mp { return m.u8(0xc0) }

func (m *mp) bool(b bool) *mp {
	if b {
		return m.u8(0xc3)
	}
	return m.u8(0xc2)
}

// raw splices bytes built elsewhere, e.g. a command body inside a poll.
func (m *mp) raw(b []byte) *mp { m.b = append(m.b, b...); return m }

func sp(s string) *string { return &s }

func f64p(v float64) *float64 { return &v }

func i32p(v int32) *int32 { return &v }

func u64p(v uint64) *uint64 { return &v }

func epochp(v messages.Epoch) *messages.Epoch { return &v }

// wireDiff explains a mismatch: the first differing offset with a little
// context from both sides, then the full hex dumps.
func wireDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(i-8, 0)
	ctx := func(b []byte) string {
		if lo >= len(b) {
			return "(end)"
		}
		return hex.EncodeToString(b[lo:min(i+16, len(b))])
	}
	return fmt.Sprintf("first difference at offset %d (len got %d, want %d)\n got[%d:]:  %s\nwant[%d:]:  %s\n--- got\n%s--- want\n%s",
		i, len(got), len(want), lo, ctx(got), lo, ctx(want), hex.Dump(got), hex.Dump(want))
}

func assertWire(t *testing.T, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("wire bytes differ from rmp_serde's\n%s", wireDiff(got, want))
	}
}

// goldenCase is one body: the value handed to Marshal, the bytes rmp_serde
// would emit for it, a fresh destination to decode into, and whether the
// value is already in canonical form (so a decode must give it back equal).
type goldenCase struct {
	name      string
	v         any
	want      []byte
	fresh     func() any
	canonical bool
}

func newOf[T any]() func() any { return func() any { return new(T) } }

// Shared fixtures.
var (
	longStr  = strings.Repeat("x", 40)    // str8
	str300   = strings.Repeat("y", 300)   // str16
	str70000 = strings.Repeat("z", 70000) // str32
	bin300   = bytes.Repeat([]byte{7}, 300)
	bin70000 = bytes.Repeat([]byte{9}, 70000)
	sha      = strings.Repeat("ab", 32)
)

func payloadRef() messages.PayloadRef {
	return messages.PayloadRef{Bucket: "payloads", Key: "ns/k1", Size: 5_000_000_000, ContentType: "application/octet-stream", SHA256: sp(sha)}
}

func payloadRefWire(t testing.TB) []byte {
	return w(t).fixmap(5).
		str("bucket").str("payloads").
		str("key").str("ns/k1").
		str("size").uint(5_000_000_000).
		str("content_type").str("application/octet-stream").
		str("sha256").str(sha).bytes()
}

func capabilitiesWire(t testing.TB, runners []string, maxInv uint64, workdir string) []byte {
	m := w(t).fixmap(3).str("runners").arr(len(runners))
	for _, r := range runners {
		m.str(r)
	}
	return m.str("max_invocations").uint(maxInv).str("workdir").str(workdir).bytes()
}

func nilVersionsWire(t testing.TB, daemon string) []byte {
	return w(t).fixmap(10).
		str("daemon").str(daemon).
		str("protocol").str("1").
		str("runsc").nil().
		str("docker").nil().
		str("python").nil().
		str("kernel").nil().
		str("distro").nil().
		str("arch").nil().
		str("cpu").nil().
		str("gpu").nil().bytes()
}

func goldenCases(t testing.TB) []goldenCase {
	sixteen := make([]string, 16)
	for i := range sixteen {
		sixteen[i] = fmt.Sprintf("t%d=v", i)
	}
	tagsWire := w(t).arr(16)
	for _, s := range sixteen {
		tagsWire.str(s)
	}

	fullVersions := messages.Versions{
		Daemon: sp("0.9.1"), Protocol: sp(messages.ProtocolVersion), Runsc: sp("release-20240101.0"),
		Docker: sp("27.1.0"), Python: sp("Python 3.11.2"), Kernel: sp("Linux 6.1.0"),
		Distro: sp("Debian GNU/Linux 12 (bookworm)"), Arch: sp("x86_64"),
		CPU: &messages.CPUInfo{Model: "AMD EPYC 7763 64-Core Processor", Cores: 300},
		GPU: []messages.GPU{
			{Name: "NVIDIA A100-SXM4-80GB", Driver: "535.104.05", CUDA: sp("12.2")},
			{Name: "NVIDIA H100", Driver: "550.1", CUDA: nil},
		},
	}
	fullVersionsWire := w(t).fixmap(10).
		str("daemon").str("0.9.1").
		str("protocol").str("1").
		str("runsc").str("release-20240101.0").
		str("docker").str("27.1.0").
		str("python").str("Python 3.11.2").
		str("kernel").str("Linux 6.1.0").
		str("distro").str("Debian GNU/Linux 12 (bookworm)").
		str("arch").str("x86_64").
		str("cpu").fixmap(2).str("model").str("AMD EPYC 7763 64-Core Processor").str("cores").uint(300).
		str("gpu").arr(2).
		fixmap(3).str("name").str("NVIDIA A100-SXM4-80GB").str("driver").str("535.104.05").str("cuda").str("12.2").
		fixmap(3).str("name").str("NVIDIA H100").str("driver").str("550.1").str("cuda").nil().
		bytes()

	execFull := messages.Exec{
		ExecID: "ex_01", Command: "echo hi", Env: map[string]string{"A": "1", "B": longStr}, Stdin: "in",
		Workdir: sp("/tmp/w"), TimeoutS: f64p(20),
		Log:           &messages.LogSink{StdoutURL: "http://cp/v1/daemon/exec/ex_01/chunk", FlushMs: 250, FlushBytes: 70000},
		PayloadInline: messages.Bytes(bin300), PayloadRef: func() *messages.PayloadRef { p := payloadRef(); return &p }(),
	}
	execFullWire := w(t).fixmap(9).
		str("exec_id").str("ex_01").
		str("command").str("echo hi").
		str("env").fixmap(2).str("A").str("1").str("B").str(longStr).
		str("stdin").str("in").
		str("workdir").str("/tmp/w").
		str("timeout_s").f64(20).
		str("log").fixmap(5).
		str("stdout_url").str("http://cp/v1/daemon/exec/ex_01/chunk").
		str("stdin_url").nil().
		str("control_url").nil().
		str("flush_ms").uint(250).
		str("flush_bytes").uint(70000).
		str("payload_inline").bin(bin300).
		str("payload_ref").raw(payloadRefWire(t)).
		bytes()
	execMinimalWire := w(t).fixmap(9).
		str("exec_id").str("ex_02").
		str("command").str("true").
		str("env").fixmap(0).
		str("stdin").str("").
		str("workdir").nil().
		str("timeout_s").nil().
		str("log").nil().
		str("payload_inline").nil().
		str("payload_ref").nil().
		bytes()

	runFull := messages.Run{
		InvocationID: "inv_1", Function: messages.FunctionRef{Module: "pkg.mod", Qualname: "f"},
		RunConfig:          messages.RunConfig{Runner: sp("docker"), Image: "busybox", TimeoutS: 20, Env: map[string]string{"K": "V"}, Workdir: "/w"},
		ArgsBlob:           messages.Bytes(bin70000),
		ParentInvocationID: sp("inv_0"), RootInvocationID: sp("inv_root"), Script: sp("print(1)"), AsUser: sp("root"),
		PayloadRef: func() *messages.PayloadRef { p := payloadRef(); return &p }(),
	}
	runFullWire := w(t).fixmap(9).
		str("invocation_id").str("inv_1").
		str("function").fixmap(2).str("module").str("pkg.mod").str("qualname").str("f").
		str("run_config").fixmap(5).
		str("runner").str("docker").
		str("image").str("busybox").
		str("timeout_s").f64(20).
		str("env").fixmap(1).str("K").str("V").
		str("workdir").str("/w").
		str("args_blob").bin(bin70000).
		str("parent_invocation_id").str("inv_0").
		str("root_invocation_id").str("inv_root").
		str("script").str("print(1)").
		str("as_user").str("root").
		str("payload_ref").raw(payloadRefWire(t)).
		bytes()
	runMinimalWire := w(t).fixmap(8).
		str("invocation_id").str("inv_2").
		str("function").fixmap(2).str("module").str("m").str("qualname").str("q").
		str("run_config").fixmap(1).str("runner").nil().
		str("args_blob").bin(nil).
		str("parent_invocation_id").nil().
		str("root_invocation_id").nil().
		str("script").nil().
		str("as_user").nil().
		bytes()

	hibernateWire := w(t).fixmap(1).str("until_epoch_s").uint(1_700_000_000).bytes()
	setupWire := w(t).fixmap(4).str("script").str("apt-get install -y jq").str("sudo").bool(true).
		str("refresh_capabilities").bool(true).str("name").str("jq").bytes()
	otaWire := w(t).fixmap(3).str("version").str("0.9.2").str("url").str("https://cp/bin/nymph").str("sha256").str(sha).bytes()
	cancelWire := w(t).fixmap(2).str("invocation_id").nil().str("exec_id").str("ex_01").bytes()

	cmdWire := func(id, kind string, body []byte) []byte {
		return w(t).fixmap(3).str("id").str(id).str("kind").str(kind).str("body").raw(body).bytes()
	}

	invStatus := messages.InvocationStatus{InvocationID: "inv_1", State: messages.StateRunning, StartedAt: 1_700_000_000, ExitCode: nil, StdoutTail: ""}
	invStatusWire := w(t).fixmap(5).str("invocation_id").str("inv_1").str("state").str("running").
		str("started_at").uint(1_700_000_000).str("exit_code").nil().str("stdout_tail").str("").bytes()

	ackErrWire := func(typ, msg string, tb *string) []byte {
		m := w(t).fixmap(3).str("type").str(typ).str("message").str(msg).str("traceback")
		if tb == nil {
			return m.nil().bytes()
		}
		return m.str(*tb).bytes()
	}

	execResultWire := func(code int64, errStr *string, stdout string) []byte {
		m := w(t).fixmap(7).str("exit_code").int(code).str("stdout").str(stdout).str("stderr").str("e").
			str("duration_ms").uint(5_000_000_000).str("error")
		if errStr == nil {
			m.nil()
		} else {
			m.str(*errStr)
		}
		return m.str("result_inline").nil().str("result_ref").nil().bytes()
	}
	execResult := func(code int32, errStr *string, stdout string) messages.ExecResult {
		return messages.ExecResult{ExitCode: code, Stdout: stdout, Stderr: "e", DurationMs: 5_000_000_000, Error: errStr}
	}

	cases := []goldenCase{
		{
			name: "HelloRequest/minimal",
			v: messages.HelloRequest{MachineID: "host-a", Label: "", Tags: nil,
				Capabilities: messages.Capabilities{Runners: nil, MaxInvocations: 0, Workdir: "/var/lib/nymph"},
				Versions:     messages.Versions{Daemon: sp("0.9.1"), Protocol: sp("1")}},
			want: w(t).fixmap(5).
				str("machine_id").str("host-a").
				str("label").str("").
				str("tags").arr(0).
				str("capabilities").raw(capabilitiesWire(t, nil, 0, "/var/lib/nymph")).
				str("versions").raw(nilVersionsWire(t, "0.9.1")).
				bytes(),
			fresh: newOf[messages.HelloRequest](),
		},
		{
			name: "HelloRequest/lanes+public_key+versions",
			v: messages.HelloRequest{MachineID: "host-a", Label: longStr, Tags: sixteen, Lanes: []string{"gpu", "default"},
				Capabilities: messages.Capabilities{Runners: []string{"process", "docker"}, MaxInvocations: 300, Workdir: "/w"},
				Versions:     fullVersions, PublicKey: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
			want: w(t).fixmap(7).
				str("machine_id").str("host-a").
				str("label").str(longStr).
				str("tags").raw(tagsWire.bytes()).
				str("lanes").arr(2).str("gpu").str("default").
				str("capabilities").raw(capabilitiesWire(t, []string{"process", "docker"}, 300, "/w")).
				str("versions").raw(fullVersionsWire).
				str("public_key").str("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").
				bytes(),
			fresh:     newOf[messages.HelloRequest](),
			canonical: true,
		},
		{
			name: "HelloRequest/empty lanes omitted",
			v: &messages.HelloRequest{MachineID: "m", Label: "l", Tags: []string{}, Lanes: []string{},
				Capabilities: messages.Capabilities{Runners: []string{"echo"}, MaxInvocations: 70000, Workdir: "/w"},
				Versions:     messages.Versions{Daemon: sp("d"), Protocol: sp("1")}},
			want: w(t).fixmap(5).
				str("machine_id").str("m").str("label").str("l").str("tags").arr(0).
				str("capabilities").raw(capabilitiesWire(t, []string{"echo"}, 70000, "/w")).
				str("versions").raw(nilVersionsWire(t, "d")).bytes(),
			fresh: newOf[messages.HelloRequest](),
		},
		{
			name:      "Capabilities",
			v:         messages.Capabilities{Runners: []string{"process"}, MaxInvocations: 4, Workdir: "/w"},
			want:      capabilitiesWire(t, []string{"process"}, 4, "/w"),
			fresh:     newOf[messages.Capabilities](),
			canonical: true,
		},
		{
			name:  "Versions/nil probes",
			v:     messages.Versions{Daemon: sp("0.9.1"), Protocol: sp("1")},
			want:  nilVersionsWire(t, "0.9.1"),
			fresh: newOf[messages.Versions](),
			// canonical: a nil gpu decodes back nil.
			canonical: true,
		},
		{
			name:      "Versions/cpu+gpu",
			v:         fullVersions,
			want:      fullVersionsWire,
			fresh:     newOf[messages.Versions](),
			canonical: true,
		},
		{
			name: "HelloResponse/accepted",
			v: messages.HelloResponse{WorkerID: sp("65f0c0ffee0000000000beef"), SessionToken: sp("01HZX3J5Q8Z6V4W2Y0T8R6P4N2"),
				SessionTTLS: 86400, Config: nil, Cursor: sp("c-17"), KeyID: sp("k1"), KeyRotationMaxAgeS: 7_776_000,
				ServerTimeEpochS: epochp(1_700_000_000)},
			want: w(t).fixmap(9).
				str("worker_id").str("65f0c0ffee0000000000beef").
				str("session_token").str("01HZX3J5Q8Z6V4W2Y0T8R6P4N2").
				str("session_ttl_s").uint(86400).
				str("config").fixmap(0).
				str("cursor").str("c-17").
				str("reject").nil().
				str("key_id").str("k1").
				str("key_rotation_max_age_s").uint(7_776_000).
				str("server_time_epoch_s").uint(1_700_000_000).
				bytes(),
			fresh: newOf[messages.HelloResponse](),
		},
		{
			name: "HelloResponse/reject",
			v: &messages.HelloResponse{SessionTTLS: 86400, Config: map[string]any{},
				Reject: &messages.Reject{Code: messages.RejectProtocolMismatch, Message: "protocol 2 unsupported"}},
			want: w(t).fixmap(9).
				str("worker_id").nil().
				str("session_token").nil().
				str("session_ttl_s").uint(86400).
				str("config").fixmap(0).
				str("cursor").nil().
				str("reject").fixmap(2).str("code").str("protocol_mismatch").str("message").str("protocol 2 unsupported").
				str("key_id").nil().
				str("key_rotation_max_age_s").uint(0).
				str("server_time_epoch_s").nil().
				bytes(),
			fresh:     newOf[messages.HelloResponse](),
			canonical: true,
		},
		{
			name:      "ValidationError",
			v:         messages.ValidationError{Error: "missing field", Field: "capabilities.runners"},
			want:      w(t).fixmap(2).str("error").str("missing field").str("field").str("capabilities.runners").bytes(),
			fresh:     newOf[messages.ValidationError](),
			canonical: true,
		},
		{
			name: "PollRequest/first poll",
			v:    messages.PollRequest{WorkerID: "w1", Queue: "default", TimeoutS: 20.0, Cursor: nil, Invocations: nil},
			want: w(t).fixmap(5).
				str("worker_id").str("w1").
				str("queue").str("default").
				str("timeout_s").f64(20.0).
				str("cursor").nil().
				str("invocations").arr(0).
				bytes(),
			fresh: newOf[messages.PollRequest](),
		},
		{
			name: "PollRequest/invocations+updated_capabilities",
			v: &messages.PollRequest{WorkerID: "w1", Queue: "gpu*", TimeoutS: 0.5, Cursor: sp("c-18"),
				Invocations:         []messages.InvocationStatus{invStatus},
				UpdatedCapabilities: &messages.Capabilities{Runners: nil, MaxInvocations: 2, Workdir: "/w"}},
			want: w(t).fixmap(6).
				str("worker_id").str("w1").
				str("queue").str("gpu*").
				str("timeout_s").f64(0.5).
				str("cursor").str("c-18").
				str("invocations").arr(1).raw(invStatusWire).
				str("updated_capabilities").raw(capabilitiesWire(t, nil, 2, "/w")).
				bytes(),
			fresh: newOf[messages.PollRequest](),
		},
		{
			name:      "InvocationStatus/running",
			v:         invStatus,
			want:      invStatusWire,
			fresh:     newOf[messages.InvocationStatus](),
			canonical: true,
		},
		{
			name: "InvocationStatus/exit code+tail",
			v:    messages.InvocationStatus{InvocationID: "i", State: messages.StateFailed, StartedAt: 0, ExitCode: i32p(-200), StdoutTail: str300},
			want: w(t).fixmap(5).str("invocation_id").str("i").str("state").str("failed").
				str("started_at").uint(0).str("exit_code").int(-200).str("stdout_tail").str(str300).bytes(),
			fresh:     newOf[messages.InvocationStatus](),
			canonical: true,
		},
		{
			name: "PollResponse/commands",
			v: messages.PollResponse{
				Commands: []messages.Command{
					{ID: "c1", Kind: messages.KindHibernate, Body: msgpack.RawMessage(hibernateWire)},
					{ID: "c2", Kind: messages.KindResetBackoff, Body: msgpack.RawMessage{0xc0}},
					{ID: "c3", Kind: messages.KindRotateKey, Body: nil},
				},
				TargetNymphVersion: sp("0.9.2"), Cursor: sp("c-19"),
			},
			want: w(t).fixmap(3).
				str("commands").arr(3).
				raw(cmdWire("c1", "hibernate", hibernateWire)).
				raw(cmdWire("c2", "reset_backoff", []byte{0xc0})).
				raw(cmdWire("c3", "rotate_key", []byte{0xc0})).
				str("target_nymph_version").str("0.9.2").
				str("cursor").str("c-19").
				bytes(),
			fresh: newOf[messages.PollResponse](),
		},
		{
			name:  "PollResponse/empty",
			v:     messages.PollResponse{},
			want:  w(t).fixmap(3).str("commands").arr(0).str("target_nymph_version").nil().str("cursor").nil().bytes(),
			fresh: newOf[messages.PollResponse](),
		},
		{
			name:      "Command",
			v:         messages.Command{ID: "c9", Kind: messages.KindOtaUpdate, Body: msgpack.RawMessage(otaWire)},
			want:      cmdWire("c9", "ota_update", otaWire),
			fresh:     newOf[messages.Command](),
			canonical: true,
		},
		{
			name:  "Command/empty body is nil",
			v:     messages.Command{ID: "c10", Kind: messages.KindRotateKey},
			want:  cmdWire("c10", "rotate_key", []byte{0xc0}),
			fresh: newOf[messages.Command](),
		},
		{
			name:  "Command/empty non-nil body is nil",
			v:     messages.Command{ID: "c11", Kind: messages.KindResetBackoff, Body: msgpack.RawMessage{}},
			want:  cmdWire("c11", "reset_backoff", []byte{0xc0}),
			fresh: newOf[messages.Command](),
		},
		{
			name: "PollResponse/empty non-nil body is nil",
			v: messages.PollResponse{Commands: []messages.Command{
				{ID: "c1", Kind: messages.KindRotateKey, Body: msgpack.RawMessage{}},
				{ID: "c2", Kind: messages.KindHibernate, Body: msgpack.RawMessage(hibernateWire)},
			}},
			want: w(t).fixmap(3).str("commands").arr(2).
				raw(cmdWire("c1", "rotate_key", []byte{0xc0})).
				raw(cmdWire("c2", "hibernate", hibernateWire)).
				str("target_nymph_version").nil().str("cursor").nil().bytes(),
			fresh: newOf[messages.PollResponse](),
		},
		{
			name:      "Hibernate",
			v:         messages.Hibernate{UntilEpochS: 1_700_000_000},
			want:      hibernateWire,
			fresh:     newOf[messages.Hibernate](),
			canonical: true,
		},
		{
			name:      "Setup",
			v:         messages.Setup{Script: "apt-get install -y jq", Sudo: true, RefreshCapabilities: true, Name: sp("jq")},
			want:      setupWire,
			fresh:     newOf[messages.Setup](),
			canonical: true,
		},
		{
			name:      "Exec/full",
			v:         execFull,
			want:      execFullWire,
			fresh:     newOf[messages.Exec](),
			canonical: true,
		},
		{
			name:  "Exec/minimal env never nil",
			v:     messages.Exec{ExecID: "ex_02", Command: "true"},
			want:  execMinimalWire,
			fresh: newOf[messages.Exec](),
		},
		{
			name: "LogSink",
			v:    messages.LogSink{StdoutURL: "u", StdinURL: sp("i"), ControlURL: sp("c"), FlushMs: 100, FlushBytes: 8192},
			want: w(t).fixmap(5).str("stdout_url").str("u").str("stdin_url").str("i").str("control_url").str("c").
				str("flush_ms").uint(100).str("flush_bytes").uint(8192).bytes(),
			fresh:     newOf[messages.LogSink](),
			canonical: true,
		},
		{
			name:      "OtaUpdate",
			v:         messages.OtaUpdate{Version: "0.9.2", URL: "https://cp/bin/nymph", SHA256: sha},
			want:      otaWire,
			fresh:     newOf[messages.OtaUpdate](),
			canonical: true,
		},
		{
			name:      "Run/full",
			v:         runFull,
			want:      runFullWire,
			fresh:     newOf[messages.Run](),
			canonical: true,
		},
		{
			name:  "Run/minimal args_blob empty bin",
			v:     messages.Run{InvocationID: "inv_2", Function: messages.FunctionRef{Module: "m", Qualname: "q"}},
			want:  runMinimalWire,
			fresh: newOf[messages.Run](),
		},
		{
			name:      "Cancel",
			v:         messages.Cancel{ExecID: sp("ex_01")},
			want:      cancelWire,
			fresh:     newOf[messages.Cancel](),
			canonical: true,
		},
		{
			name:      "ExecResult/ok",
			v:         execResult(0, nil, "hello\n"),
			want:      execResultWire(0, nil, "hello\n"),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name:      "ExecResult/failed sentinel",
			v:         execResult(messages.ExitFailed, nil, ""),
			want:      execResultWire(-1, nil, ""),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name:      "ExecResult/timeout sentinel",
			v:         execResult(messages.ExitTimeout, nil, ""),
			want:      execResultWire(-2, nil, ""),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name:      "ExecResult/stdout truncated",
			v:         execResult(0, sp(messages.ErrStdoutTruncated), str70000),
			want:      execResultWire(0, sp("stdout truncated"), str70000),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name:      "ExecResult/stderr truncated",
			v:         execResult(200, sp(messages.ErrStderrTruncated), ""),
			want:      execResultWire(200, sp("stderr truncated"), ""),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name:      "ExecResult/both truncated",
			v:         execResult(-100, sp(messages.ErrBothTruncated), str300),
			want:      execResultWire(-100, sp("stdout truncated; stderr truncated"), str300),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name: "ExecResult/result_inline+result_ref",
			v: messages.ExecResult{ExitCode: 0, DurationMs: 1, ResultInline: messages.Bytes{1, 2},
				ResultRef: func() *messages.PayloadRef { p := payloadRef(); return &p }()},
			want: w(t).fixmap(7).str("exit_code").uint(0).str("stdout").str("").str("stderr").str("").
				str("duration_ms").uint(1).str("error").nil().str("result_inline").bin([]byte{1, 2}).
				str("result_ref").raw(payloadRefWire(t)).bytes(),
			fresh:     newOf[messages.ExecResult](),
			canonical: true,
		},
		{
			name: "Ack/succeeded",
			v:    messages.Ack{InvocationID: "inv_1", State: messages.StateSucceeded, ResultBlob: messages.Bytes(bin300), WorkerID: "w1"},
			want: w(t).fixmap(5).str("invocation_id").str("inv_1").str("state").str("succeeded").
				str("result_blob").bin(bin300).str("error").nil().str("worker_id").str("w1").bytes(),
			fresh:     newOf[messages.Ack](),
			canonical: true,
		},
		{
			name: "Ack/failed empty blob no worker",
			v: messages.Ack{InvocationID: "inv_1", State: messages.StateFailed,
				Error: &messages.AckError{Type: messages.ErrorTypeDaemon, Message: "unknown runner kind: x"}},
			want: w(t).fixmap(4).str("invocation_id").str("inv_1").str("state").str("failed").
				str("result_blob").bin(nil).
				str("error").raw(ackErrWire("DaemonError", "unknown runner kind: x", nil)).bytes(),
			fresh: newOf[messages.Ack](),
		},
		{
			name: "Ack/killed cancelled",
			v: &messages.Ack{InvocationID: "inv_1", State: messages.StateKilled, ResultBlob: messages.Bytes{},
				Error: &messages.AckError{Type: messages.ErrorTypeCancelled, Message: messages.CancelledShutdownMessage}, WorkerID: "w1"},
			want: w(t).fixmap(5).str("invocation_id").str("inv_1").str("state").str("killed").
				str("result_blob").bin(nil).
				str("error").raw(ackErrWire("Cancelled", "daemon shutdown grace expired", nil)).
				str("worker_id").str("w1").bytes(),
			fresh:     newOf[messages.Ack](),
			canonical: true,
		},
		{
			name:      "AckError/traceback",
			v:         messages.AckError{Type: "ValueError", Message: "bad", Traceback: sp("Traceback (most recent call last):\n")},
			want:      ackErrWire("ValueError", "bad", sp("Traceback (most recent call last):\n")),
			fresh:     newOf[messages.AckError](),
			canonical: true,
		},
		{
			name:      "PayloadRef",
			v:         payloadRef(),
			want:      payloadRefWire(t),
			fresh:     newOf[messages.PayloadRef](),
			canonical: true,
		},
		{
			name: "PresignRequest/get",
			v:    messages.PresignRequest{Op: messages.PresignGet, Key: sp("ns/k1"), JobID: sp("job-1")},
			want: w(t).fixmap(5).str("op").str("get").str("key").str("ns/k1").str("size").nil().
				str("jobId").str("job-1").str("kind").nil().bytes(),
			fresh:     newOf[messages.PresignRequest](),
			canonical: true,
		},
		{
			name: "PresignRequest/put",
			v:    messages.PresignRequest{Op: messages.PresignPut, Size: u64p(70000), Kind: sp("result")},
			want: w(t).fixmap(5).str("op").str("put").str("key").nil().str("size").uint(70000).
				str("jobId").nil().str("kind").str("result").bytes(),
			fresh:     newOf[messages.PresignRequest](),
			canonical: true,
		},
		{
			name: "PresignResponse",
			v:    messages.PresignResponse{URL: "http://store/x?sig=1", Key: "ns/k1", ExpiresAtS: 1_700_000_300},
			want: w(t).fixmap(3).str("url").str("http://store/x?sig=1").str("key").str("ns/k1").
				str("expires_at_epoch_s").uint(1_700_000_300).bytes(),
			fresh:     newOf[messages.PresignResponse](),
			canonical: true,
		},
		{
			name: "KeysRequest",
			v:    messages.KeysRequest{WorkerID: "w1", PublicKey: "pk", KeyID: "k2"},
			want: w(t).fixmap(3).str("worker_id").str("w1").str("public_key").str("pk").
				str("key_id").str("k2").bytes(),
			fresh:     newOf[messages.KeysRequest](),
			canonical: true,
		},
		{
			name:      "KeysResponse/accepted",
			v:         messages.KeysResponse{KeyID: sp("k2")},
			want:      w(t).fixmap(2).str("key_id").str("k2").str("reject").nil().bytes(),
			fresh:     newOf[messages.KeysResponse](),
			canonical: true,
		},
		{
			name: "KeysResponse/rejected",
			v:    messages.KeysResponse{Reject: &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: "m"}},
			want: w(t).fixmap(2).str("key_id").nil().str("reject").fixmap(2).
				str("code").str("key_id_mismatch").str("message").str("m").bytes(),
			fresh:     newOf[messages.KeysResponse](),
			canonical: true,
		},
		{
			name: "Event",
			v: messages.Event{InvocationID: "inv_1", Kind: "progress",
				Data: msgpack.RawMessage(w(t).fixmap(1).str("pct").uint(50).bytes()), TS: 1_700_000_001},
			want: w(t).fixmap(4).str("invocation_id").str("inv_1").str("kind").str("progress").
				str("data").fixmap(1).str("pct").uint(50).str("ts").uint(1_700_000_001).bytes(),
			fresh:     newOf[messages.Event](),
			canonical: true,
		},
		{
			name: "Event/no data is nil",
			v:    messages.Event{InvocationID: "inv_1", Kind: "log", TS: 1},
			want: w(t).fixmap(4).str("invocation_id").str("inv_1").str("kind").str("log").
				str("data").nil().str("ts").uint(1).bytes(),
			fresh: newOf[messages.Event](),
		},
		{
			name: "Event/empty data is nil",
			v:    &messages.Event{InvocationID: "inv_1", Kind: "log", Data: msgpack.RawMessage{}, TS: 1},
			want: w(t).fixmap(4).str("invocation_id").str("inv_1").str("kind").str("log").
				str("data").nil().str("ts").uint(1).bytes(),
			fresh: newOf[messages.Event](),
		},
		{
			name: "Event/worker_id when set",
			v:    messages.Event{InvocationID: "inv_1", Kind: "invocation.log", TS: 1, WorkerID: "w1"},
			want: w(t).fixmap(5).str("invocation_id").str("inv_1").str("kind").str("invocation.log").
				str("data").nil().str("ts").uint(1).str("worker_id").str("w1").bytes(),
			fresh:     newOf[messages.Event](),
			canonical: true,
		},
		{
			name: "LogData",
			v:    messages.LogData{Stream: messages.StreamStderr, Seq: 7, Data: messages.Bytes("oops\n")},
			want: w(t).fixmap(3).str("stream").str("stderr").str("seq").uint(7).
				str("data").bin([]byte("oops\n")).bytes(),
			fresh:     newOf[messages.LogData](),
			canonical: true,
		},
		{
			name: "LogData/dropped and no data",
			v:    messages.LogData{Stream: messages.StreamStdout, Seq: 9, Dropped: 70000},
			want: w(t).fixmap(4).str("stream").str("stdout").str("seq").uint(9).
				str("data").bin(nil).str("dropped").uint(70000).bytes(),
			fresh: newOf[messages.LogData](),
		},
		{
			name: "SetupOutcome",
			v: messages.SetupOutcome{Name: "setup", State: messages.StateFailed, ExitCode: 9, DurationMs: 1200,
				OutputTail: "oops\n"},
			want: w(t).fixmap(6).str("name").str("setup").str("state").str("failed").str("exit_code").uint(9).
				str("duration_ms").uint(1200).str("output_tail").str("oops\n").str("error").nil().bytes(),
			fresh:     newOf[messages.SetupOutcome](),
			canonical: true,
		},
		{
			name: "SetupOutcome/could not run",
			v:    messages.SetupOutcome{Name: "s", State: messages.StateFailed, ExitCode: -1, Error: sp("no bash")},
			want: w(t).fixmap(6).str("name").str("s").str("state").str("failed").str("exit_code").int(-1).
				str("duration_ms").uint(0).str("output_tail").str("").str("error").str("no bash").bytes(),
			fresh:     newOf[messages.SetupOutcome](),
			canonical: true,
		},
		{
			name: "OtaOutcome/refused",
			v: messages.OtaOutcome{Source: messages.OtaSourceCommand, Version: "2.0.0", Outcome: messages.OtaRefused,
				Code: messages.OtaCodeChecksumMismatch, Reason: sp("sha256 mismatch"), SHA256: "00"},
			want: w(t).fixmap(6).str("source").str("ota_update").str("version").str("2.0.0").str("outcome").str("refused").
				str("code").str("checksum_mismatch").str("reason").str("sha256 mismatch").str("sha256").str("00").bytes(),
			fresh:     newOf[messages.OtaOutcome](),
			canonical: true,
		},
		{
			name: "OtaOutcome/installed",
			v: messages.OtaOutcome{Source: messages.OtaSourceAuto, Version: "2.0.0", Outcome: messages.OtaInstalled,
				SHA256: "ab", Applies: messages.OtaAppliesNow},
			want: w(t).fixmap(6).str("source").str("auto_update").str("version").str("2.0.0").str("outcome").str("installed").
				str("reason").nil().str("sha256").str("ab").str("applies").str("now").bytes(),
			fresh:     newOf[messages.OtaOutcome](),
			canonical: true,
		},
		{
			name: "ResultChunk",
			v:    messages.ResultChunk{InvocationID: "inv_1", Seq: 300, Data: messages.Bytes("abc"), Last: true},
			want: w(t).fixmap(4).str("invocation_id").str("inv_1").str("seq").uint(300).
				str("data").bin([]byte("abc")).str("last").bool(true).bytes(),
			fresh:     newOf[messages.ResultChunk](),
			canonical: true,
		},
		{
			name: "ResultChunk/no data is empty bin",
			v:    messages.ResultChunk{InvocationID: "inv_1", Seq: 0, Last: false},
			want: w(t).fixmap(4).str("invocation_id").str("inv_1").str("seq").uint(0).
				str("data").bin(nil).str("last").bool(false).bytes(),
			fresh: newOf[messages.ResultChunk](),
		},
	}
	return cases
}

// TestGoldenWire compares Marshal with the bytes rmp_serde emits, for every
// body, passed both by value and by pointer.
func TestGoldenWire(t *testing.T) {
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			got, err := messages.Marshal(c.v)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			assertWire(t, got, c.want)

			// The other form: a pointer when given a value, a value when given a pointer.
			rv := reflect.ValueOf(c.v)
			var other any
			if rv.Kind() == reflect.Pointer {
				other = rv.Elem().Interface()
			} else {
				p := reflect.New(rv.Type())
				p.Elem().Set(rv)
				other = p.Interface()
			}
			got, err = messages.Marshal(other)
			if err != nil {
				t.Fatalf("Marshal(%T): %v", other, err)
			}
			assertWire(t, got, c.want)
		})
	}
}

// TestMarshalDoesNotMutate guards against normalising the caller's value in
// place: two goroutines may encode the same body, and a caller's nil slice
// must stay nil.
func TestMarshalDoesNotMutate(t *testing.T) {
	caps := &messages.Capabilities{Workdir: "/w"}
	p := &messages.PollRequest{WorkerID: "w", UpdatedCapabilities: caps}
	if _, err := messages.Marshal(p); err != nil {
		t.Fatal(err)
	}
	if p.Invocations != nil || caps.Runners != nil {
		t.Fatalf("Marshal changed its input: invocations=%#v runners=%#v", p.Invocations, caps.Runners)
	}
	cmds := []messages.Command{{ID: "a", Kind: messages.KindRotateKey}}
	if _, err := messages.Marshal(&messages.PollResponse{Commands: cmds}); err != nil {
		t.Fatal(err)
	}
	if cmds[0].Body != nil {
		t.Fatalf("Marshal changed the caller's command body to %x", []byte(cmds[0].Body))
	}
	h := &messages.HelloRequest{}
	if _, err := messages.Marshal(h); err != nil {
		t.Fatal(err)
	}
	if h.Tags != nil || h.Capabilities.Runners != nil {
		t.Fatalf("Marshal changed its input: %#v", h)
	}
}

// TestEncodeCommandBodies encodes each of the seven kinds and cancel through
// EncodeCommand and checks the body bytes and the command framing.
func TestEncodeCommandBodies(t *testing.T) {
	byName := map[string]goldenCase{}
	for _, c := range goldenCases(t) {
		byName[c.name] = c
	}
	cases := []struct {
		kind string
		body any
		want []byte
	}{
		{messages.KindHibernate, &messages.Hibernate{UntilEpochS: 1_700_000_000}, byName["Hibernate"].want},
		{messages.KindSetup, byName["Setup"].v, byName["Setup"].want},
		{messages.KindExec, byName["Exec/full"].v, byName["Exec/full"].want},
		{messages.KindExec, &messages.Exec{ExecID: "ex_02", Command: "true"}, byName["Exec/minimal env never nil"].want},
		{messages.KindOtaUpdate, byName["OtaUpdate"].v, byName["OtaUpdate"].want},
		{messages.KindResetBackoff, nil, []byte{0xc0}},
		{messages.KindRotateKey, nil, []byte{0xc0}},
		{messages.KindRun, byName["Run/full"].v, byName["Run/full"].want},
		{messages.KindRun, &messages.Run{InvocationID: "inv_2", Function: messages.FunctionRef{Module: "m", Qualname: "q"}}, byName["Run/minimal args_blob empty bin"].want},
		{messages.KindCancel, byName["Cancel"].v, byName["Cancel"].want},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			cmd, err := messages.EncodeCommand("id-"+c.kind, c.kind, c.body)
			if err != nil {
				t.Fatalf("EncodeCommand: %v", err)
			}
			if cmd.ID != "id-"+c.kind || cmd.Kind != c.kind {
				t.Fatalf("framing: %+v", cmd)
			}
			assertWire(t, cmd.Body, c.want)
			framed, err := messages.Marshal(cmd)
			if err != nil {
				t.Fatal(err)
			}
			assertWire(t, framed, w(t).fixmap(3).str("id").str("id-"+c.kind).str("kind").str(c.kind).str("body").raw(c.want).bytes())
		})
	}
}

// TestNumberForms pins the integer and float forms called out by the wire
// conventions, through real bodies.
func TestNumberForms(t *testing.T) {
	cases := []struct {
		name string
		v    any
		want []byte
	}{
		{"timeout_s 20.0 is float64", messages.PollRequest{WorkerID: "w", TimeoutS: 20.0, Invocations: []messages.InvocationStatus{}},
			w(t).fixmap(5).str("worker_id").str("w").str("queue").str("").str("timeout_s").raw([]byte{0xcb, 0x40, 0x34, 0, 0, 0, 0, 0, 0}).
				str("cursor").nil().str("invocations").arr(0).bytes()},
		{"300 is uint16", messages.CPUInfo{Model: "m", Cores: 300},
			w(t).fixmap(2).str("model").str("m").str("cores").raw([]byte{0xcd, 0x01, 0x2c}).bytes()},
		{"70000 is uint32", messages.LogSink{StdoutURL: "u", FlushMs: 127, FlushBytes: 70000},
			w(t).fixmap(5).str("stdout_url").str("u").str("stdin_url").nil().str("control_url").nil().
				str("flush_ms").raw([]byte{0x7f}).str("flush_bytes").raw([]byte{0xce, 0x00, 0x01, 0x11, 0x70}).bytes()},
		{"5e9 is uint64", messages.ResultChunk{InvocationID: "i", Seq: 5_000_000_000, Data: messages.Bytes{}},
			w(t).fixmap(4).str("invocation_id").str("i").str("seq").raw([]byte{0xcf, 0, 0, 0, 0x01, 0x2a, 0x05, 0xf2, 0x00}).
				str("data").raw([]byte{0xc4, 0x00}).str("last").raw([]byte{0xc2}).bytes()},
		{"128 is uint8, -1 is 0xff", messages.ExecResult{ExitCode: -1, DurationMs: 128},
			w(t).fixmap(7).str("exit_code").raw([]byte{0xff}).str("stdout").str("").str("stderr").str("").
				str("duration_ms").raw([]byte{0xcc, 0x80}).str("error").nil().str("result_inline").nil().str("result_ref").nil().bytes()},
		{"-2 is 0xfe, -33 is int8", messages.InvocationStatus{InvocationID: "i", State: "s", StartedAt: -33, ExitCode: i32p(-2)},
			w(t).fixmap(5).str("invocation_id").str("i").str("state").str("s").str("started_at").raw([]byte{0xd0, 0xdf}).
				str("exit_code").raw([]byte{0xfe}).str("stdout_tail").str("").bytes()},
		{"positive int32 takes unsigned forms", messages.ExecResult{ExitCode: 255},
			w(t).fixmap(7).str("exit_code").raw([]byte{0xcc, 0xff}).str("stdout").str("").str("stderr").str("").
				str("duration_ms").uint(0).str("error").nil().str("result_inline").nil().str("result_ref").nil().bytes()},
		{"negative epoch int32 form", messages.Hibernate{UntilEpochS: -70000},
			w(t).fixmap(1).str("until_epoch_s").raw([]byte{0xd2, 0xff, 0xfe, 0xee, 0x90}).bytes()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := messages.Marshal(c.v)
			if err != nil {
				t.Fatal(err)
			}
			assertWire(t, got, c.want)
		})
	}
}

// TestReferenceWriter checks the reference writer itself against msgpack
// forms written out by hand, so the golden bytes are not built on sand.
func TestReferenceWriter(t *testing.T) {
	cases := []struct {
		name string
		got  []byte
		want string
	}{
		{"fixint", w(t).uint(127).bytes(), "7f"},
		{"uint8", w(t).uint(128).bytes(), "cc80"},
		{"uint16", w(t).uint(300).bytes(), "cd012c"},
		{"uint32", w(t).uint(70000).bytes(), "ce00011170"},
		{"uint64", w(t).uint(5_000_000_000).bytes(), "cf000000012a05f200"},
		{"sint positive", w(t).int(200).bytes(), "ccc8"},
		{"negfixint", w(t).int(-32).bytes(), "e0"},
		{"int8", w(t).int(-33).bytes(), "d0df"},
		{"int16", w(t).int(-200).bytes(), "d1ff38"},
		{"int32", w(t).int(-70000).bytes(), "d2fffeee90"},
		{"int64", w(t).int(-5_000_000_000).bytes(), "d3fffffffed5fa0e00"},
		{"f64", w(t).f64(20).bytes(), "cb4034000000000000"},
		{"fixstr", w(t).str("ab").bytes(), "a26162"},
		{"str8", w(t).str(strings.Repeat("a", 32)).bytes()[:2], "d920"},
		{"str16", w(t).str(str300).bytes()[:3], "da012c"},
		{"str32", w(t).str(str70000).bytes()[:5], "db00011170"},
		{"bin8", w(t).bin([]byte{1}).bytes(), "c40101"},
		{"bin16", w(t).bin(bin300).bytes()[:3], "c5012c"},
		{"bin32", w(t).bin(bin70000).bytes()[:5], "c600011170"},
		{"arr", w(t).arr(2).bytes(), "92"},
		{"array16", w(t).arr(16).bytes(), "dc0010"},
		{"map", w(t).fixmap(15).bytes(), "8f"},
		{"nil bool", w(t).nil().bool(true).bool(false).bytes(), "c0c3c2"},
	}
	for _, c := range cases {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("%s: writer emits %s, msgpack says %s", c.name, got, c.want)
		}
	}
}
