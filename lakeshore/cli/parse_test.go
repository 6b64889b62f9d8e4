package cli_test

import (
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/messages"
)

func TestParseCleanupAge(t *testing.T) {
	good := map[string]time.Duration{
		"30m":   30 * time.Minute,
		"2h":    2 * time.Hour,
		"5d":    5 * 24 * time.Hour,
		"24":    24 * time.Hour,
		"1.5":   90 * time.Minute,
		"0.5d":  12 * time.Hour,
		"1h30m": 90 * time.Minute,
		" 6h ":  6 * time.Hour,
		"90s":   90 * time.Second,
		// Range is the server's business: these parse and are refused there.
		"0":    0,
		"-2h":  -2 * time.Hour,
		"200h": 200 * time.Hour,
	}
	for in, want := range good {
		got, err := cli.ParseCleanupAge(in)
		if err != nil || got != want {
			t.Errorf("ParseCleanupAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "h", "2x", "five days", "1e400", "NaN", "d"} {
		if got, err := cli.ParseCleanupAge(in); err == nil {
			t.Errorf("ParseCleanupAge(%q) = %v, want an error", in, got)
		}
	}
}

func TestParseUntil(t *testing.T) {
	loc := time.FixedZone("X", 2*3600)
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, loc)
	good := map[string]time.Time{
		"+30s":                        now.Add(30 * time.Second),
		"+5m":                         now.Add(5 * time.Minute),
		"+1h":                         now.Add(time.Hour),
		"+3d":                         now.Add(72 * time.Hour),
		"+1h30m":                      now.Add(90 * time.Minute),
		"+1.5h":                       now.Add(90 * time.Minute),
		"2026-03-02T08:00:00Z":        time.Date(2026, 3, 2, 8, 0, 0, 0, time.UTC),
		"2026-03-02T08:00:00.5+01:00": time.Date(2026, 3, 2, 7, 0, 0, 5e8, time.UTC),
		"2026-03-02T08:00:00+0100":    time.Date(2026, 3, 2, 7, 0, 0, 0, time.UTC),
		"2026-03-02T08:00:00":         time.Date(2026, 3, 2, 8, 0, 0, 0, loc),
		"2026-03-02T08:00":            time.Date(2026, 3, 2, 8, 0, 0, 0, loc),
		"2026-03-02 08:00:00":         time.Date(2026, 3, 2, 8, 0, 0, 0, loc),
		"2026-03-02":                  time.Date(2026, 3, 2, 0, 0, 0, 0, loc),
		// A past deadline parses; the server answers it with a 400.
		"2020-01-01T00:00:00Z": time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		"+-5m":                 now.Add(-5 * time.Minute),
	}
	for in, want := range good {
		got, err := cli.ParseUntil(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseUntil(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "+", "+5x", "tomorrow", "30m", "2026-13-01", "2026-03-02T25:00:00Z", "+1e400h"} {
		if got, err := cli.ParseUntil(in, now); err == nil {
			t.Errorf("ParseUntil(%q) = %v, want an error", in, got)
		}
	}
}

func TestParseTTL(t *testing.T) {
	good := map[string]int64{"1h": 3600, "30m": 1800, "7d": 7 * 86400, "1.5s": 2, "90": 90}
	for in, want := range good {
		got, err := cli.ParseTTL(in)
		if in == "90" {
			// A bare number is not a duration for --ttl.
			if err == nil {
				t.Errorf("ParseTTL(%q) = %d, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ParseTTL(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0s", "-1h", "soon"} {
		if _, err := cli.ParseTTL(in); err == nil {
			t.Errorf("ParseTTL(%q) accepted", in)
		}
	}
}

func TestParseEnv(t *testing.T) {
	env, err := cli.ParseEnv([]string{"A=1", "B=x=y", "EMPTY=", "A=2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(env) != 3 || env["A"] != "2" || env["B"] != "x=y" || env["EMPTY"] != "" {
		t.Fatalf("env = %v", env)
	}
	if env, err := cli.ParseEnv(nil); err != nil || env != nil {
		t.Fatalf("ParseEnv(nil) = %v, %v", env, err)
	}
	for _, bad := range []string{"NOVALUE", "=v", "A B=1"} {
		if _, err := cli.ParseEnv([]string{bad}); err == nil {
			t.Errorf("ParseEnv(%q) accepted", bad)
		}
	}
}

func TestRemoteExitCode(t *testing.T) {
	cases := map[int32]int{
		0:                    0,
		1:                    1,
		42:                   42,
		252:                  252,
		255:                  255,
		messages.ExitFailed:  cli.ExitExecFailed,
		messages.ExitTimeout: cli.ExitExecTimeout,
		-3:                   cli.ExitExecFailed,
		256:                  cli.ExitExecFailed,
		-2147483648:          cli.ExitExecFailed,
	}
	for in, want := range cases {
		if got := cli.RemoteExitCode(in); got != want {
			t.Errorf("RemoteExitCode(%d) = %d, want %d", in, got, want)
		}
	}
	if cli.ExitExecFailed != 255 || cli.ExitExecTimeout != 254 || cli.ExitExecWaitExpired != 253 || cli.ExitExecCLIFailed != 125 {
		t.Fatal("documented exec exit codes changed")
	}
}
