package controlplane

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"nymph/messages"
)

// The fuzz targets below feed each daemon route's decoder arbitrary bytes.
// Whatever arrives, the decoder returns a value or a 4xx naming a field,
// never panics, and allocates no more than a few times the body: that is
// the bound an unauthenticated stranger and a compromised daemon both meet.

// decodeBudget is what decoding a body of n bytes may allocate: the typed
// decode copies strings through a buffer (twice the body), the poll's
// integer cursor copies the body once more; the slack covers the decoder's
// own state and the refusal's text.
func decodeBudget(n int) uint64 { return 4*uint64(n) + 256<<10 }

// fuzzDecode runs decode on body and checks the contract above.
func fuzzDecode(t *testing.T, body []byte, decode func([]byte) error) error {
	t.Helper()
	var err error
	got := heapAllocated(func() { err = decode(body) })
	if err != nil {
		var fe *fieldError
		if !errors.As(err, &fe) || fe.status < 400 || fe.status >= 500 {
			t.Fatalf("decode %x: %v (%T), want a 4xx fieldError", body, err, err)
		}
	}
	if budget := decodeBudget(len(body)); got > budget {
		t.Fatalf("decoding %d bytes allocated %d, over %d", len(body), got, budget)
	}
	return err
}

// addHostileSeeds adds shapes every decoder should refuse cheaply.
func addHostileSeeds(f *testing.F, field string) {
	f.Add([]byte{})
	f.Add([]byte{0xc0})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add(mpMap(mpStr(field), mpArray(512, 0xc0)))
	f.Add(mpMap(mpStr(field), mpArray(512, 0x80)))
	f.Add(mpMap(mpStr(field), mpStr("a"), mpStr(field), mpStr("b")))
	f.Add(append(mpMap(mpStr(field)), []byte("\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\xc0")...))
}

func FuzzDecodeHello(f *testing.F) {
	h := helloReq("m", "l")
	f.Add(mp(f, h))
	gpu := "H100"
	h.Lanes, h.PublicKey, h.Incarnation, h.SingleJob = []string{"a", "b"}, "AAAA", "01J2Z3Y4X5W6V7T8S9R0QPNMKJ", true
	h.Versions.GPU = []messages.GPU{{Name: gpu, Driver: "550", CUDA: &gpu}}
	h.Versions.CPU = &messages.CPUInfo{Model: "EPYC", Cores: 64}
	f.Add(mp(f, h))
	addHostileSeeds(f, "tags")
	f.Fuzz(func(t *testing.T, body []byte) {
		var req messages.HelloRequest
		var versions []byte
		err := fuzzDecode(t, body, func(b []byte) (err error) { req, versions, err = decodeHello(b); return err })
		if err != nil {
			return
		}
		if req.MachineID == "" || req.Versions.Protocol == nil || !json.Valid(versions) {
			t.Fatalf("accepted a hello without machine_id, protocol or JSON versions: %+v %s", req, versions)
		}
		if _, err := messages.Marshal(&req); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

func FuzzDecodePoll(f *testing.F) {
	code := int32(3)
	f.Add(mp(f, &messages.PollRequest{WorkerID: "w", Queue: "q", TimeoutS: 20, Cursor: str("7"),
		Invocations:         []messages.InvocationStatus{{InvocationID: "i", State: "running", StartedAt: 5, ExitCode: &code, StdoutTail: "x"}},
		UpdatedCapabilities: &messages.Capabilities{Runners: []string{"process"}, MaxInvocations: 2}}))
	f.Add(mpMap(mpStr("worker_id"), mpStr("w"), mpStr("cursor"), []byte{0xcd, 1, 0}, mpStr("timeout_s"), []byte{0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1}))
	addHostileSeeds(f, "invocations")
	f.Fuzz(func(t *testing.T, body []byte) {
		var req messages.PollRequest
		var cursor *int64
		err := fuzzDecode(t, body, func(b []byte) (err error) { req, cursor, err = decodePollBody(b); return err })
		if err != nil {
			return
		}
		if req.WorkerID == "" || req.TimeoutS < 0 || cursor != nil && *cursor < 0 {
			t.Fatalf("accepted poll %+v cursor %v", req, cursor)
		}
	})
}

func FuzzDecodeAck(f *testing.F) {
	tb := "Traceback"
	f.Add(mp(f, &messages.Ack{InvocationID: "i", State: messages.StateSucceeded, ResultBlob: messages.Bytes("result")}))
	f.Add(mp(f, &messages.Ack{InvocationID: "i", State: messages.StateFailed, Error: &messages.AckError{Type: "E", Message: "m", Traceback: &tb}, WorkerID: "w"}))
	f.Add(mpMap(mpStr("invocation_id"), mpStr("i"), mpStr("state"), mpStr("killed"), mpStr("result_blob"), mpArray(3, 0x7f)))
	addHostileSeeds(f, "result_blob")
	f.Fuzz(func(t *testing.T, body []byte) {
		var ack messages.Ack
		if fuzzDecode(t, body, func(b []byte) (err error) { ack, err = decodeAck(b); return err }) != nil {
			return
		}
		switch ack.State {
		case messages.StateSucceeded, messages.StateFailed, messages.StateKilled:
		default:
			t.Fatalf("accepted state %q", ack.State)
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add(mp(f, logEvent("i", "w", messages.StreamStdout, 1, "hello\n")))
	for kind, data := range map[string]any{
		messages.EventSetupFinished: &messages.SetupOutcome{Name: "s", State: messages.StateFailed, ExitCode: 2, OutputTail: "t"},
		messages.EventOtaFinished:   &messages.OtaOutcome{Source: messages.OtaSourceCommand, Version: "1", Outcome: messages.OtaRefused, Code: messages.OtaCodeBusy},
		eventInvocationProgress:     map[string]any{"pct": 50},
	} {
		ev, err := messages.NewEvent("i", kind, "w", data, time.Unix(1_700_000_000, 0))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(mp(f, ev))
	}
	addHostileSeeds(f, "data")
	f.Fuzz(func(t *testing.T, body []byte) {
		var ev messages.Event
		var size int64
		if fuzzDecode(t, body, func(b []byte) (err error) { ev, _, size, err = decodeEvent(b); return err }) != nil {
			return
		}
		if ev.InvocationID == "" || ev.Kind == "" || len(ev.Data) == 0 || size < 0 || size > int64(len(body)) {
			t.Fatalf("accepted event %+v size %d", ev, size)
		}
	})
}

func FuzzDecodeResultChunk(f *testing.F) {
	f.Add(mp(f, &messages.ResultChunk{InvocationID: "i", Seq: 2, Data: messages.Bytes("abc"), Last: true}))
	addHostileSeeds(f, "data")
	f.Fuzz(func(t *testing.T, body []byte) {
		var c messages.ResultChunk
		if fuzzDecode(t, body, func(b []byte) (err error) { c, err = decodeResultChunk(b); return err }) == nil && c.InvocationID == "" {
			t.Fatalf("accepted a chunk without invocation_id: %+v", c)
		}
	})
}

func FuzzDecodeExecResult(f *testing.F) {
	e := "stdout truncated"
	sum := "ab"
	f.Add(mp(f, &messages.ExecResult{ExitCode: -2, Stdout: "o", Stderr: "e", DurationMs: 9, Error: &e, ResultInline: messages.Bytes{1},
		ResultRef: &messages.PayloadRef{Bucket: "b", Key: "k", Size: 1, ContentType: "x", SHA256: &sum}}), false)
	f.Add([]byte(`{"exit_code":1,"stdout":"x\u0000","stderr":"","duration_ms":4,"error":null,"result_inline":"AAE="}`), true)
	f.Add([]byte(`{"exit_code":0,"x":[null,null,null,[],{}]}`), true)
	f.Add([]byte(`{"exit_code":1} {}`), true)
	f.Add(mpMap(mpStr("exit_code"), mpArray(300, 0xc0)), false)
	f.Add(mpMap(mpStr("exit_code"), []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), false)
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		var res messages.ExecResult
		if fuzzDecode(t, body, func(b []byte) (err error) { res, err = decodeExecResult(b, asJSON); return err }) != nil {
			return
		}
		if _, err := messages.Marshal(&res); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}

func FuzzDecodePresign(f *testing.F) {
	key, size := "k", uint64(5)
	req := &messages.PresignRequest{Op: messages.PresignPut, Key: &key, Size: &size, JobID: &key, Kind: &key}
	f.Add(mp(f, req), false)
	f.Add(mustJSON(f, req), true)
	f.Add([]byte(`{"op":"get","key":["a","b"]}`), true)
	f.Add(mpMap(mpStr("op"), mpStr("get"), mpStr("size"), []byte{0xd0, 0xff}), false)
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		fuzzDecode(t, body, func(b []byte) error { _, err := decodePresign(b, asJSON); return err })
	})
}

func FuzzDecodeKeys(f *testing.F) {
	f.Add(mp(f, &messages.KeysRequest{WorkerID: "w", PublicKey: "AAAA", KeyID: "k_x"}))
	addHostileSeeds(f, "public_key")
	f.Fuzz(func(t *testing.T, body []byte) {
		fuzzDecode(t, body, func(b []byte) error { _, err := parseKeys(b); return err })
	})
}
