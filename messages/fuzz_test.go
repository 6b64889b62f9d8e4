package messages_test

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
)

// addCommandSeeds seeds with every golden command body under its own kind
// and under the others, plus a few known-bad shapes.
func addCommandSeeds(f *testing.F, add func(kind string, body []byte)) {
	t := f
	kinds := []string{messages.KindHibernate, messages.KindSetup, messages.KindExec, messages.KindOtaUpdate,
		messages.KindResetBackoff, messages.KindRotateKey, messages.KindRun, messages.KindCancel, "unknown"}
	var bodies [][]byte
	for _, c := range goldenCases(t) {
		switch c.v.(type) {
		case messages.Hibernate, messages.Setup, messages.Exec, *messages.Exec, messages.OtaUpdate,
			messages.Run, messages.Cancel, messages.LogSink, messages.PayloadRef:
			bodies = append(bodies, c.want)
		}
	}
	bodies = append(bodies,
		nil, []byte{0xc0}, []byte{0x80}, []byte{0x90},
		w(t).fixmap(1).str("exec_id").uint(7).bytes(),
		w(t).fixmap(2).str("invocation_id").str("i").str("args_blob").arr(2).uint(1).uint(256).bytes(),
		append(w(t).fixmap(1).str("env").bytes(), 0xdf, 0x7f, 0xff, 0xff, 0xff),
		w(t).fixmap(1).str("until_epoch_s").f64(1e300).bytes(),
	)
	for _, k := range kinds {
		for _, b := range bodies {
			add(k, b)
		}
	}
}

// FuzzDecodeCommand: whatever kind and body arrive, DecodeCommand returns
// one of its documented types and never panics; a typed result encodes again.
func FuzzDecodeCommand(f *testing.F) {
	addCommandSeeds(f, func(kind string, body []byte) { f.Add(kind, body) })
	f.Fuzz(func(t *testing.T, kind string, body []byte) {
		cmd := messages.Command{ID: "fuzz", Kind: kind, Body: msgpack.RawMessage(body)}
		got := messages.DecodeCommand(cmd)
		switch v := got.(type) {
		case messages.Unknown:
			if v.ID != "fuzz" || v.Kind != kind || v.Reason == "" {
				t.Fatalf("Unknown without identity or reason: %#v", v)
			}
			return
		case messages.ResetBackoff, messages.RotateKey:
			return
		case *messages.Hibernate, *messages.Setup, *messages.Exec, *messages.OtaUpdate, *messages.Run, *messages.Cancel:
		default:
			t.Fatalf("DecodeCommand returned %T", got)
		}
		again, err := messages.EncodeCommand("fuzz", kind, got)
		if err != nil {
			t.Fatalf("re-encode %T: %v", got, err)
		}
		if back := messages.DecodeCommand(again); back == nil {
			t.Fatalf("re-decode of %x gave nil", []byte(again.Body))
		}
	})
}

// FuzzUnmarshalPoll: random bytes into a PollResponse never panic; whatever
// decodes dispatches and encodes again.
func FuzzUnmarshalPoll(f *testing.F) {
	t := f
	for _, c := range goldenCases(t) {
		if _, ok := c.v.(messages.PollResponse); ok {
			f.Add(c.want)
		}
	}
	addCommandSeeds(f, func(kind string, body []byte) {
		if len(body) == 0 {
			return
		}
		f.Add(w(t).fixmap(3).str("commands").arr(1).
			fixmap(3).str("id").str("c").str("kind").str(kind).str("body").raw(body).
			str("target_nymph_version").nil().str("cursor").str("c-1").bytes())
	})
	f.Add(append(w(t).fixmap(1).str("commands").bytes(), 0xdd, 0x7f, 0xff, 0xff, 0xff, 0x90))
	f.Add([]byte{})
	f.Add([]byte{0xc1})
	f.Fuzz(func(t *testing.T, data []byte) {
		var pr messages.PollResponse
		if err := messages.Unmarshal(data, &pr); err != nil {
			return
		}
		for _, c := range pr.Commands {
			if messages.DecodeCommand(c) == nil {
				t.Fatalf("DecodeCommand(%#v) = nil", c)
			}
		}
		out, err := messages.Marshal(&pr)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var again messages.PollResponse
		if err := messages.Unmarshal(out, &again); err != nil {
			t.Fatalf("re-decode of our own encoding %x: %v", out, err)
		}
	})
}
