package cli

import (
	"testing"
	"time"
)

func TestSpanRoundsToItsUnit(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{400 * time.Millisecond, "0s"},
		{59*time.Second + 600*time.Millisecond, "1m"},
		{59*time.Minute + 59*time.Second, "1h"},
		{90 * time.Minute, "1h30m"},
		{9*time.Hour + 59*time.Minute + 45*time.Second, "10h"},
		{23*time.Hour + 40*time.Minute, "24h"},
		{72*time.Hour - time.Second, "3d"},
		{36 * time.Hour, "36h"},
		{10 * 24 * time.Hour, "10d"},
	} {
		if got := span(c.d); got != c.want {
			t.Errorf("span(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
