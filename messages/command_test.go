package messages_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
)

// TestDecodeCommandKinds: each kind decodes to its own type, equal to what
// was encoded.
func TestDecodeCommandKinds(t *testing.T) {
	byName := map[string]goldenCase{}
	for _, c := range goldenCases(t) {
		byName[c.name] = c
	}
	cases := []struct {
		kind string
		body []byte
		want any
	}{
		{messages.KindHibernate, byName["Hibernate"].want, &messages.Hibernate{UntilEpochS: 1_700_000_000}},
		{messages.KindSetup, byName["Setup"].want, ptrTo(byName["Setup"].v)},
		{messages.KindExec, byName["Exec/full"].want, ptrTo(byName["Exec/full"].v)},
		{messages.KindOtaUpdate, byName["OtaUpdate"].want, ptrTo(byName["OtaUpdate"].v)},
		{messages.KindResetBackoff, []byte{0xc0}, messages.ResetBackoff{}},
		{messages.KindRotateKey, []byte{0xc0}, messages.RotateKey{}},
		{messages.KindRun, byName["Run/full"].want, ptrTo(byName["Run/full"].v)},
		{messages.KindCancel, byName["Cancel"].want, ptrTo(byName["Cancel"].v)},
		{messages.KindCancel, w(t).fixmap(1).str("invocation_id").str("inv_9").bytes(), &messages.Cancel{InvocationID: sp("inv_9")}},
		{messages.KindSetup, w(t).fixmap(1).str("script").str("true").bytes(), &messages.Setup{Script: "true"}},
		{messages.KindRun, w(t).fixmap(1).str("invocation_id").str("inv").bytes(), &messages.Run{InvocationID: "inv"}},
		// A string sent as bin is taken, as serde's String visitor takes UTF-8 bytes.
		{messages.KindExec, w(t).fixmap(2).str("exec_id").str("ex").str("command").bin([]byte("true")).bytes(),
			&messages.Exec{ExecID: "ex", Command: "true"}},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			got := messages.DecodeCommand(messages.Command{ID: "id1", Kind: c.kind, Body: msgpack.RawMessage(c.body)})
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("DecodeCommand = %#v\nwant %#v", got, c.want)
			}
		})
	}
}

func ptrTo(v any) any {
	rv := reflect.ValueOf(v)
	p := reflect.New(rv.Type())
	p.Elem().Set(rv)
	return p.Interface()
}

// TestDecodeCommandRefusals: anything that does not fit becomes Unknown
// carrying the id, the kind and a reason naming the field where there is one.
func TestDecodeCommandRefusals(t *testing.T) {
	execBody := func(extra ...func(*mp)) []byte {
		m := w(t).fixmap(1 + len(extra)).str("exec_id").str("ex")
		for _, f := range extra {
			f(m)
		}
		return m.bytes()
	}
	cases := []struct {
		name   string
		kind   string
		body   []byte
		reason string
	}{
		{"unknown kind", "frobnicate", w(t).fixmap(0).bytes(), `unknown command kind "frobnicate"`},
		{"empty kind", "", w(t).nil().bytes(), "unknown command kind"},
		{"kind case matters", "Exec", execBody(), "unknown command kind"},

		{"body is an array", messages.KindExec, w(t).arr(1).str("ex").bytes(), "not a map"},
		{"body is a string", messages.KindSetup, w(t).str("echo").bytes(), "not a map"},
		{"body is an int", messages.KindHibernate, w(t).uint(1_700_000_000).bytes(), "not a map"},
		{"body is bin", messages.KindRun, w(t).bin([]byte{0x80}).bytes(), "not a map"},

		{"nil body exec", messages.KindExec, w(t).nil().bytes(), "body"},
		{"nil body hibernate", messages.KindHibernate, w(t).nil().bytes(), "body"},
		{"nil body setup", messages.KindSetup, w(t).nil().bytes(), "body"},
		{"nil body ota_update", messages.KindOtaUpdate, w(t).nil().bytes(), "body"},
		{"nil body run", messages.KindRun, w(t).nil().bytes(), "body"},
		{"nil body cancel", messages.KindCancel, w(t).nil().bytes(), "body"},
		{"absent body exec", messages.KindExec, nil, "body"},

		{"exec_id as int", messages.KindExec, w(t).fixmap(1).str("exec_id").uint(7).bytes(), "exec_id"},
		{"env as list", messages.KindExec, execBody(func(m *mp) { m.str("env").arr(1).str("A=1") }), "env"},
		{"env value as int", messages.KindExec, execBody(func(m *mp) { m.str("env").fixmap(1).str("A").uint(1) }), "env"},
		{"command as int", messages.KindExec, execBody(func(m *mp) { m.str("command").uint(1) }), "command"},
		{"timeout_s as string", messages.KindExec, execBody(func(m *mp) { m.str("timeout_s").str("20") }), "timeout_s"},
		{"timeout_s negative", messages.KindExec, execBody(func(m *mp) { m.str("timeout_s").f64(-1) }), "timeout_s"},
		{"log as string", messages.KindExec, execBody(func(m *mp) { m.str("log").str("u") }), "log"},
		{"log without stdout_url", messages.KindExec, execBody(func(m *mp) { m.str("log").fixmap(1).str("flush_ms").uint(5) }), "log.stdout_url"},
		{"payload_inline as map", messages.KindExec, execBody(func(m *mp) { m.str("payload_inline").fixmap(0) }), "payload_inline"},
		{"payload_ref size as string", messages.KindExec, execBody(func(m *mp) {
			m.str("payload_ref").fixmap(1).str("size").str("big")
		}), "payload_ref"},
		{"sudo as string", messages.KindSetup, w(t).fixmap(2).str("script").str("s").str("sudo").str("yes").bytes(), "sudo"},
		{"name as int", messages.KindSetup, w(t).fixmap(2).str("script").str("s").str("name").uint(1).bytes(), "name"},
		{"until_epoch_s as string", messages.KindHibernate, w(t).fixmap(1).str("until_epoch_s").str("soon").bytes(), "until_epoch_s"},
		{"url as array", messages.KindOtaUpdate, w(t).fixmap(2).str("url").arr(0).str("sha256").str(sha).bytes(), "url"},
		{"function as string", messages.KindRun, w(t).fixmap(2).str("invocation_id").str("i").str("function").str("m:f").bytes(), "function"},
		{"run_config env as list", messages.KindRun, w(t).fixmap(2).str("invocation_id").str("i").
			str("run_config").fixmap(1).str("env").arr(0).bytes(), "run_config"},
		{"args_blob 256", messages.KindRun, w(t).fixmap(2).str("invocation_id").str("i").
			str("args_blob").arr(1).uint(256).bytes(), "args_blob"},
		{"exec_id of cancel as bool", messages.KindCancel, w(t).fixmap(1).str("exec_id").bool(true).bytes(), "exec_id"},

		{"missing exec_id", messages.KindExec, w(t).fixmap(1).str("command").str("true").bytes(), "exec_id"},
		{"nil exec_id", messages.KindExec, w(t).fixmap(1).str("exec_id").nil().bytes(), "exec_id"},
		{"missing script", messages.KindSetup, w(t).fixmap(1).str("sudo").bool(true).bytes(), "script"},
		{"missing url", messages.KindOtaUpdate, w(t).fixmap(1).str("version").str("1").bytes(), "url"},
		{"missing invocation_id", messages.KindRun, w(t).fixmap(1).str("args_blob").bin(nil).bytes(), "invocation_id"},
		{"missing until_epoch_s", messages.KindHibernate, w(t).fixmap(0).bytes(), "until_epoch_s"},
		{"zero until_epoch_s", messages.KindHibernate, w(t).fixmap(1).str("until_epoch_s").uint(0).bytes(), "until_epoch_s"},
		{"cancel with neither id", messages.KindCancel, w(t).fixmap(2).str("invocation_id").nil().str("exec_id").str("").bytes(), "invocation_id or exec_id"},

		{"truncated body", messages.KindExec, w(t).fixmap(2).str("exec_id").str("ex").bytes(), "truncated"},
		{"truncated string", messages.KindExec, w(t).fixmap(1).str("exec_id").u8(0xa5).raw([]byte("ex")).bytes(), "declares"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := messages.DecodeCommand(messages.Command{ID: "id-" + c.name, Kind: c.kind, Body: msgpack.RawMessage(c.body)})
			u, ok := got.(messages.Unknown)
			if !ok {
				t.Fatalf("DecodeCommand = %#v, want Unknown", got)
			}
			if u.ID != "id-"+c.name || u.Kind != c.kind {
				t.Fatalf("Unknown lost the command's identity: %#v", u)
			}
			if !strings.Contains(u.Reason, c.reason) {
				t.Fatalf("reason %q does not mention %q", u.Reason, c.reason)
			}
		})
	}
}

// TestBodylessKinds: reset_backoff and rotate_key are dispatched on the kind
// alone, whatever the body holds.
func TestBodylessKinds(t *testing.T) {
	bodies := map[string][]byte{
		"absent":  nil,
		"nil":     {0xc0},
		"map":     w(t).fixmap(1).str("why").str("ops").bytes(),
		"array":   w(t).arr(0).bytes(),
		"garbage": {0xc1, 0xff, 0x00},
	}
	for name, body := range bodies {
		if got := messages.DecodeCommand(messages.Command{ID: "a", Kind: messages.KindResetBackoff, Body: body}); got != (messages.ResetBackoff{}) {
			t.Errorf("reset_backoff with %s body = %#v", name, got)
		}
		if got := messages.DecodeCommand(messages.Command{ID: "b", Kind: messages.KindRotateKey, Body: body}); got != (messages.RotateKey{}) {
			t.Errorf("rotate_key with %s body = %#v", name, got)
		}
	}
}

// TestOtaUpdateSHA: a non-hex sha256 still decodes (the OTA actor refuses
// it, so the refusal is reported where it can be acted on); ValidSHA256 is
// the check it uses.
func TestOtaUpdateSHA(t *testing.T) {
	body := w(t).fixmap(3).str("version").str("0.9.2").str("url").str("https://cp/bin/nymph").str("sha256").str("not-hex").bytes()
	got, ok := messages.DecodeCommand(messages.Command{ID: "o", Kind: messages.KindOtaUpdate, Body: body}).(*messages.OtaUpdate)
	if !ok || got.SHA256 != "not-hex" || messages.ValidSHA256(got.SHA256) {
		t.Fatalf("DecodeCommand = %#v", got)
	}

	valid := []string{sha, strings.Repeat("0", 64), strings.Repeat("F", 64), strings.Repeat("aB", 32)}
	invalid := []string{
		"", strings.Repeat("a", 63), strings.Repeat("a", 65), strings.Repeat("g", 64),
		strings.Repeat("a", 63) + "\n", strings.Repeat("a", 64) + "\n", "\n" + strings.Repeat("a", 64),
		" " + strings.Repeat("a", 63), strings.Repeat("a", 62) + "é", "0x" + strings.Repeat("a", 62),
		strings.Repeat("ａ", 64),
	}
	for _, s := range valid {
		if !messages.ValidSHA256(s) {
			t.Errorf("ValidSHA256(%q) = false", s)
		}
	}
	for _, s := range invalid {
		if messages.ValidSHA256(s) {
			t.Errorf("ValidSHA256(%q) = true", s)
		}
	}
}

// TestPollResponseCommandsDecode: a poll batch with one good command, one
// unknown kind and one broken body decodes, and each command dispatches on
// its own — a bad one never hides the others.
func TestPollResponseCommandsDecode(t *testing.T) {
	body := w(t).fixmap(2).str("commands").arr(4).
		fixmap(3).str("id").str("1").str("kind").str("exec").str("body").
		fixmap(1).str("exec_id").str("ex").
		fixmap(3).str("id").str("2").str("kind").str("teleport").str("body").fixmap(0).
		fixmap(3).str("id").str("3").str("kind").str("exec").str("body").fixmap(1).str("env").arr(0).
		fixmap(2).str("id").str("4").str("kind").str("rotate_key").
		str("target_nymph_version").str("1.0.0").bytes()
	var pr messages.PollResponse
	if err := messages.Unmarshal(body, &pr); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, c := range pr.Commands {
		switch v := messages.DecodeCommand(c).(type) {
		case *messages.Exec:
			kinds = append(kinds, "exec:"+v.ExecID)
		case messages.RotateKey:
			kinds = append(kinds, "rotate_key")
		case messages.Unknown:
			kinds = append(kinds, "unknown:"+v.ID)
		default:
			t.Fatalf("unexpected %#v", v)
		}
	}
	if got := strings.Join(kinds, ","); got != "exec:ex,unknown:2,unknown:3,rotate_key" {
		t.Fatalf("dispatch = %s", got)
	}
}
