package controlplane

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"nymph/messages"
)

// mpMap builds a msgpack map from raw keys and values, in order, so a test
// can repeat a key or put any bytes under one.
func mpMap(kv ...[]byte) []byte {
	b := []byte{0xdf, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(kv)/2))
	for _, x := range kv {
		b = append(b, x...)
	}
	return b
}

// mpStr is a msgpack str.
func mpStr(s string) []byte {
	b := []byte{0xdb, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(s)))
	return append(b, s...)
}

// mpArray is an array32 of n copies of the one-byte value elem: the
// cheapest way to declare n elements the bytes really hold.
func mpArray(n int, elem byte) []byte {
	b := []byte{0xdd, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	return append(b, bytes.Repeat([]byte{elem}, n)...)
}

func mp(t testing.TB, v any) []byte {
	b, err := messages.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heapAllocated is how many bytes f allocates (in all, freed or not).
func heapAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// hostileElems is how many elements the hostile lists below hold: 4 Mi
// one-byte elements, which the generic decode this replaced turned into
// 64 MiB (nils) to 470 MiB (empty maps).
const hostileElems = 4 << 20

// TestHostileBodiesCostNothingToRefuse posts, to each daemon route's
// decoder, bodies made of millions of one-byte elements where a field
// wants something else (or at all). Each is refused naming the field, and
// refusing it allocates almost nothing: the checks read the bytes in
// place.
func TestHostileBodiesCostNothingToRefuse(t *testing.T) {
	// hello is a valid hello, without tags unless more names them.
	hello := func(more ...[]byte) []byte {
		kv := [][]byte{mpStr("machine_id"), mpStr("m"), mpStr("label"), mpStr("l"),
			mpStr("capabilities"), mpMap(mpStr("runners"), mpArray(1, 0xa0)),
			mpStr("versions"), mpMap(mpStr("daemon"), mpStr("1"), mpStr("protocol"), mpStr("1"))}
		return mpMap(append(kv, more...)...)
	}
	decHello := func(b []byte) error { _, _, err := decodeHello(b); return err }
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		body   []byte
		status int
		field  string
		msg    string
	}{
		{"exec result: exit_code an array of nils", func(b []byte) error { _, err := decodeExecResult(b, false); return err },
			mpMap(mpStr("exit_code"), mpArray(hostileElems, 0xc0)), 422, "exit_code", "must be a number"},
		{"exec result JSON: nulls", func(b []byte) error { _, err := decodeExecResult(b, true); return err },
			[]byte(`{"exit_code":0,"x":[` + strings.Repeat("null,", hostileElems) + `null]}`), 400, "body", "JSON values"},
		{"hello: tags of empty strings", decHello, hello(mpStr("tags"), mpArray(hostileElems, 0xa0)), 422, "tags", "elements in"},
		{"hello: lanes of nils", decHello, hello(mpStr("tags"), mpArray(0, 0), mpStr("lanes"), mpArray(hostileElems, 0xc0)), 422, "lanes", "list of strings"},
		{"hello: versions full of nils", decHello,
			mpMap(mpStr("machine_id"), mpStr("m"), mpStr("label"), mpStr("l"), mpStr("tags"), mpArray(0, 0),
				mpStr("capabilities"), mpMap(mpStr("runners"), mpArray(0, 0)),
				mpStr("versions"), mpMap(mpStr("daemon"), mpStr("1"), mpStr("protocol"), mpStr("1"), mpStr("gpu"), mpArray(hostileElems, 0xc0))),
			422, "versions", "values in"},
		{"hello: versions full of empty maps", decHello,
			mpMap(mpStr("machine_id"), mpStr("m"), mpStr("label"), mpStr("l"), mpStr("tags"), mpArray(0, 0),
				mpStr("capabilities"), mpMap(mpStr("runners"), mpArray(0, 0)),
				mpStr("versions"), mpMap(mpStr("daemon"), mpStr("1"), mpStr("protocol"), mpStr("1"), mpStr("x"), mpArray(hostileElems/8, 0x80))),
			422, "versions", "values in"},
		{"poll: invocations of empty maps", func(b []byte) error { _, _, err := decodePollBody(b); return err },
			mpMap(mpStr("worker_id"), mpStr("w"), mpStr("invocations"), mpArray(hostileElems, 0x80)), 422, "invocations", "elements in"},
		{"ack: result_blob of nils", func(b []byte) error { _, err := decodeAck(b); return err },
			mpMap(mpStr("invocation_id"), mpStr("i"), mpStr("state"), mpStr("failed"), mpStr("result_blob"), mpArray(hostileElems, 0xc0)), 422, "result_blob", "must be a bytes"},
		{"event: log data of nils", func(b []byte) error { _, _, _, err := decodeEvent(b); return err },
			mpMap(mpStr("invocation_id"), mpStr("i"), mpStr("kind"), mpStr(messages.EventInvocationLog),
				mpStr("data"), mpMap(mpStr("stream"), mpStr("stdout"), mpStr("seq"), []byte{1}, mpStr("data"), mpArray(hostileElems, 0xc0))),
			422, "data.data", "must be a bytes"},
		{"result chunk: data of empty maps", func(b []byte) error { _, err := decodeResultChunk(b); return err },
			mpMap(mpStr("invocation_id"), mpStr("i"), mpStr("data"), mpArray(hostileElems, 0x80)), 422, "data", "must be a bytes"},
		{"presign: key of nils", func(b []byte) error { _, err := decodePresign(b, false); return err },
			mpMap(mpStr("op"), mpStr("get"), mpStr("key"), mpArray(hostileElems, 0xc0)), 422, "key", "must be a string"},
		// A repeated key: the decoder would decode both copies, the checks
		// see one.
		{"hello: tags twice", decHello, hello(mpStr("tags"), mpArray(hostileElems, 0xa0), mpStr("tags"), mpArray(0, 0)), 422, "tags", "given 2 times"},
		{"poll: worker_id twice", func(b []byte) error { _, _, err := decodePollBody(b); return err },
			mpMap(mpStr("worker_id"), mpStr("w"), mpStr("worker_id"), mpStr("w")), 422, "worker_id", "given 2 times"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			got := heapAllocated(func() { err = tc.decode(tc.body) })
			var fe *fieldError
			if !errors.As(err, &fe) || fe.status != tc.status || fe.field != tc.field || !strings.Contains(fe.msg, tc.msg) {
				t.Fatalf("err = %#v, want %d %s %q", err, tc.status, tc.field, tc.msg)
			}
			// A few KiB of error text and reflection caches; nothing that
			// grows with the body.
			if got > 256<<10 {
				t.Fatalf("refusing a %d-byte body allocated %d bytes", len(tc.body), got)
			}
			t.Logf("%d-byte body refused with %d bytes allocated: %v", len(tc.body), got, err)
		})
	}
}

// TestUnknownKeysAreSteppedOverCheaply: an ack that is valid but for a key
// nobody reads, holding millions of nils, decodes without allocating for
// them.
func TestUnknownKeysAreSteppedOverCheaply(t *testing.T) {
	body := mpMap(mpStr("invocation_id"), mpStr("i"), mpStr("state"), mpStr("failed"),
		mpStr("exit_code"), mpArray(hostileElems, 0xc0), mpStr("more"), mpArray(hostileElems/8, 0x80))
	var ack messages.Ack
	var err error
	got := heapAllocated(func() { ack, err = decodeAck(body) })
	if err != nil || ack.InvocationID != "i" || ack.State != messages.StateFailed {
		t.Fatalf("ack %+v, %v", ack, err)
	}
	if got > 256<<10 {
		t.Fatalf("decoding a %d-byte ack allocated %d bytes", len(body), got)
	}
}

// TestListBoundsLetRealBodiesThrough: lists as a daemon sends them pass,
// long ones included, and the bound sits where their decode would cost
// more than their bytes.
func TestListBoundsLetRealBodiesThrough(t *testing.T) {
	h := helloReq("m", "l")
	for i := range 2000 {
		h.Tags = append(h.Tags, "tag-number="+strings.Repeat("x", i%40))
	}
	gpu := "NVIDIA H100 80GB HBM3"
	for range 16 {
		h.Versions.GPU = append(h.Versions.GPU, messages.GPU{Name: gpu, Driver: "550.54.15", CUDA: &gpu})
	}
	h.Versions.CPU = &messages.CPUInfo{Model: "AMD EPYC 9654 96-Core Processor", Cores: 192}
	req, versions, err := decodeHello(mp(t, h))
	if err != nil || len(req.Tags) != 2001 || len(req.Versions.GPU) != 16 {
		t.Fatalf("hello: %d tags, %v", len(req.Tags), err)
	}
	var v map[string]any
	if err := json.Unmarshal(versions, &v); err != nil || v["arch"] != "x86_64" || len(v["gpu"].([]any)) != 16 {
		t.Fatalf("versions %s: %v", versions, err)
	}

	poll := &messages.PollRequest{WorkerID: "w", Cursor: str("3")}
	for range 1000 {
		poll.Invocations = append(poll.Invocations, messages.InvocationStatus{
			InvocationID: "01J2Z3Y4X5W6V7T8S9R0QPNMKJ", State: messages.StateRunning, StartedAt: 1_700_000_000})
	}
	body := mp(t, poll)
	if len(body) > limitPoll {
		t.Fatalf("a poll of 1000 runs is %d bytes, over the cap", len(body))
	}
	if got, cursor, err := decodePollBody(body); err != nil || len(got.Invocations) != 1000 || cursor == nil || *cursor != 3 {
		t.Fatalf("poll: %d invocations, %v", len(got.Invocations), err)
	}

	// Tiny tags: a few hundred pass on the slack, a hundred thousand do not.
	h = helloReq("m", "l")
	h.Tags = make([]string, 500)
	if _, _, err := decodeHello(mp(t, h)); err != nil {
		t.Fatalf("500 empty tags: %v", err)
	}
	h.Tags = make([]string, 100_000)
	var fe *fieldError
	if _, _, err := decodeHello(mp(t, h)); !errors.As(err, &fe) || fe.field != "tags" {
		t.Fatalf("100000 empty tags: %v", err)
	}
}

// TestIntegerCursorBecomesNil: a cursor sent as an integer is read as
// such, and the rest of the body decodes around it.
func TestIntegerCursorBecomesNil(t *testing.T) {
	body := mpMap(mpStr("worker_id"), mpStr("w"), mpStr("cursor"), []byte{0xcd, 0x01, 0x00}, mpStr("queue"), mpStr("q"),
		mpStr("invocations"), mpArray(0, 0))
	req, cursor, err := decodePollBody(body)
	if err != nil || cursor == nil || *cursor != 256 || req.WorkerID != "w" || req.Queue != "q" || req.Cursor != nil {
		t.Fatalf("poll %+v cursor %v: %v", req, cursor, err)
	}
}

// TestJSONBodiesDecodeInPlace: decodeJSON keeps its refusals (trailing
// data, a type error named by field) and bounds a body's density.
func TestJSONBodiesDecodeInPlace(t *testing.T) {
	var v struct {
		A int               `json:"a"`
		M map[string]string `json:"m"`
	}
	for _, tc := range []struct {
		body  string
		field string
		msg   string
	}{
		{`{"a":1} {"a":2}`, "body", "trailing data"},
		{`{"a":1}}`, "body", "trailing data"},
		{`{"a":"x"}`, "a", "must be int"},
		{`{"a":`, "body", "malformed JSON"},
		{`[1]`, "body", "not a JSON object"},
		{`{"m":{` + strings.Repeat(`"k":"",`, 200_000) + `"k":""}}`, "body", "JSON values in"},
	} {
		err := decodeJSON([]byte(tc.body), &v)
		var fe *fieldError
		if !errors.As(err, &fe) || fe.status != http.StatusBadRequest || fe.field != tc.field || !strings.Contains(fe.msg, tc.msg) {
			t.Fatalf("%.40q: %v, want %s %q", tc.body, err, tc.field, tc.msg)
		}
	}
	// Strings with commas and escaped quotes count as one value.
	body := `{"a":7,"m":{"k":"` + strings.Repeat(`,\",[{`, 100_000) + `"}}`
	if err := decodeJSON([]byte(body), &v); err != nil || v.A != 7 || len(v.M["k"]) != 500_000 {
		t.Fatalf("dense string: %v", err)
	}
	if err := decodeJSON(nil, &v); err != nil {
		t.Fatalf("empty body: %v", err)
	}
}
