package cli_test

import (
	"strings"
	"testing"
	"time"
)

// Times and durations read as a person reads them, against a real control
// plane: a span from now keeps its unit ("+3d" is "in 3d", not "in 2d"),
// a refused past deadline is a date, not epoch seconds, and a bare number
// of hours is shown with its unit.
func TestTimesAndDurationsAreReadable(t *testing.T) {
	cp := newRealCP(t)
	cp.hello("gpu-rig", "x86_64")

	r := cp.run(runOpts{}, "daemon", "hibernate", "gpu-rig", "--until", "+3d")
	if r.code != 0 || !strings.Contains(r.stdout, "(in 3d;") {
		t.Fatalf("hibernate +3d: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "list"); !strings.Contains(r.stdout, "(hibernating 3d)") {
		t.Fatalf("list after +3d: %+v", r)
	}
	for _, until := range []string{"+90m", "+1h"} {
		cp.run(runOpts{}, "daemon", "wake", "gpu-rig")
		r = cp.run(runOpts{}, "daemon", "hibernate", "gpu-rig", "--until", until)
		want := map[string]string{"+90m": "(in 1h30m;", "+1h": "(in 1h;"}[until]
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("hibernate %s: want %q in %+v", until, want, r)
		}
		// This daemon never polled: the wake withdrew the hibernate
		// before it, and the list shows the one just queued.
		shown := "(hibernating " + strings.TrimSuffix(strings.TrimPrefix(want, "(in "), ";") + ")"
		if r := cp.run(runOpts{}, "daemon", "list"); !strings.Contains(r.stdout, shown) {
			t.Fatalf("list after %s: want %q in %+v", until, shown, r)
		}
	}

	r = cp.run(runOpts{}, "daemon", "hibernate", "gpu-rig", "--until", "2020-01-01T00:00:00Z")
	if !strings.Contains(r.stderr, "deadline 2020-01-01T00:00:00Z is in the past (it is now "+time.Now().UTC().Format("2006-01-02")) {
		t.Fatalf("past deadline: %+v", r)
	}

	r = cp.run(runOpts{}, "daemon", "cleanup", "--older-than", "24", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "no daemon unseen for more than 24h\n") {
		t.Fatalf("cleanup --older-than 24: %+v", r)
	}
	r = cp.run(runOpts{}, "daemon", "cleanup", "--older-than", "1.5", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "more than 1h30m\n") {
		t.Fatalf("cleanup --older-than 1.5: %+v", r)
	}
}
