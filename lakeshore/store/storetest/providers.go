package storetest

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// testProvidersCRUD: a provider is stored whole, listed by name, refused
// twice, and removed once.
func testProvidersCRUD(t *testing.T, e *env) {
	db := e.store(t)
	spec := json.RawMessage(`{"name":"b","kind":"script","script":{"command":"/x"}}`)
	for _, name := range []string{"b", "a"} {
		if err := db.CreateProvider(bg, store.Provider{Name: name, Kind: "script", Spec: spec, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.CreateProvider(bg, store.Provider{Name: "a", Kind: "ec2", Spec: spec, CreatedAt: t0}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second provider a: %v, want ErrExists", err)
	}
	got, err := db.Provider(bg, "b")
	if err != nil || got.Kind != "script" || string(got.Spec) != string(spec) || !got.CreatedAt.Equal(t0) {
		t.Fatalf("provider b = %+v, %v", got, err)
	}
	all, err := db.ListProviders(bg)
	if err != nil || len(all) != 2 || all[0].Name != "a" || all[1].Name != "b" {
		t.Fatalf("list = %+v, %v; want a, b", all, err)
	}
	if err := db.DeleteProvider(bg, "a"); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteProvider(bg, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if _, err := e.reopen(t).Provider(bg, "b"); err != nil {
		t.Fatalf("after reopen: %v", err)
	}
}

// launch makes worker id pending through provider p with its own token.
func launch(t *testing.T, db store.Store, id, label, tokenID string, setups int) store.Worker {
	t.Helper()
	l := store.Launch{WorkerID: id, Namespace: "default", Label: label, Provider: "p", Tags: []string{"gpu:h100"},
		Queues: []string{"training"}, Runners: []string{"process"}, Now: t0,
		Token: store.Token{ID: tokenID, Kind: store.TokenDaemon, Namespace: "default", Hash: "hash-" + tokenID, CreatedAt: t0}}
	for i := range setups {
		l.Setup = append(l.Setup, store.NewCommand{ID: id + "-setup-" + string(rune('a'+i)), WorkerID: id, Kind: store.KindSetup,
			Body: []byte{0x80}, Now: t0})
	}
	w, err := db.LaunchWorker(bg, l)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// testLaunchedWorkerIsAdoptedByItsHello: a launch makes a pending row
// bound to its token, with its setup FIFO; the first hello made with that
// token becomes that row (same id, the daemon's identity, setting_up),
// and a hello with any other token makes a row of its own.
func testLaunchedWorkerIsAdoptedByItsHello(t *testing.T, e *env) {
	db := e.store(t)
	w := launch(t, db, "w-launched", "fleet-00", "tok-1", 2)
	if w.State != operatorapi.StatePending || w.Provider != "p" || w.InstanceID != "" || w.Label != "fleet-00" ||
		w.SetupPending != 2 || w.LastSeq != 2 {
		t.Fatalf("launched = %+v", w)
	}
	if got := boundTo(t, db, "tok-1"); got != w.ID {
		t.Fatalf("token bound to %q, want %q", got, w.ID)
	}
	if err := db.SetInstance(bg, w.ID, "i-123"); err != nil {
		t.Fatal(err)
	}
	if err := db.SetInstance(bg, "nobody", "i-9"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("SetInstance of nobody: %v", err)
	}
	launch(t, db, "w-other", "fleet-01", "tok-2", 0)

	// Another daemon's token does not adopt the row.
	mintDaemonToken(t, db, "tok-3", false, nil)
	stranger, _, err := db.Hello(bg, store.Hello{NewID: "w-stranger", Namespace: "default", MachineID: "m-1", Label: "fleet-00",
		TokenID: "tok-3", Adopt: "tok-3", Now: t0.Add(time.Second)})
	if err != nil || stranger.ID != "w-stranger" {
		t.Fatalf("stranger hello = %+v, %v", stranger, err)
	}

	got, created, err := db.Hello(bg, store.Hello{NewID: "w-new", Namespace: "default", MachineID: "m-2", Label: "fleet-00",
		Capabilities: store.Capabilities{Runners: []string{"process"}}, TokenID: "tok-1", Adopt: "tok-1", Now: t0.Add(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if created || got.ID != w.ID || got.MachineID != "m-2" || got.State != operatorapi.StateSettingUp ||
		got.InstanceID != "i-123" || got.Provider != "p" {
		t.Fatalf("adopting hello = %+v (created %v), want worker %s on m-2, setting_up, i-123", got, created, w.ID)
	}
	cmds, err := db.Take(bg, w.ID, 0, 10, false, t0.Add(3*time.Second))
	if err != nil || len(cmds) != 2 || cmds[0].Seq != 1 || cmds[1].Seq != 2 {
		t.Fatalf("take = %+v, %v; want the two setups", cmds, err)
	}
	// A re-hello of the adopted daemon is a re-hello: no second row.
	again, created, err := db.Hello(bg, store.Hello{NewID: "w-newer", Namespace: "default", MachineID: "m-2", Label: "fleet-00",
		TokenID: "tok-1", Adopt: "tok-1", Now: t0.Add(4 * time.Second)})
	if err != nil || created || again.ID != w.ID {
		t.Fatalf("re-hello = %+v (created %v), %v", again, created, err)
	}
	all, err := db.ListWorkers(bg, "default")
	if err != nil || len(all) != 3 {
		t.Fatalf("workers = %d, %v; want launched, other, stranger", len(all), err)
	}
}
