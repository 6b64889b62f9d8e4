package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

const day = 24 * time.Hour

// parseSpan reads a span as operators type it: a number with a unit s, m,
// h or d ("30s", "1.5h", "3d"), or a Go duration ("1h30m").
func parseSpan(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	unit := map[byte]time.Duration{'s': time.Second, 'm': time.Minute, 'h': time.Hour, 'd': day}
	if u, ok := unit[s[len(s)-1]]; ok {
		if n, err := strconv.ParseFloat(s[:len(s)-1], 64); err == nil {
			return spanOf(n, u, s)
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (want e.g. 30s, 5m, 2h, 3d)", s)
	}
	return d, nil
}

func spanOf(n float64, unit time.Duration, orig string) (time.Duration, error) {
	if math.IsNaN(n) || math.IsInf(n, 0) || math.Abs(n*float64(unit)) > math.MaxInt64 {
		return 0, fmt.Errorf("%q is out of range", orig)
	}
	return time.Duration(n * float64(unit)), nil
}

// ParseCleanupAge parses `daemon cleanup --older-than`: 30m, 2h, 5d, or a
// bare number of hours ("24"). Range checks (0 < age <= 168h) are the
// server's, so its error is what the operator sees.
func ParseCleanupAge(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if n, err := strconv.ParseFloat(t, 64); err == nil {
		return spanOf(n, time.Hour, s)
	}
	d, err := parseSpan(t)
	if err != nil {
		return 0, fmt.Errorf("--older-than: %w; a bare number is hours", err)
	}
	return d, nil
}

// ParseUntil parses `daemon hibernate --until`: a relative span after now
// ("+30s", "+5m", "+1h", "+3d", "+1h30m") or an ISO-8601 time. A deadline
// in the past is not refused here; the server answers it with a 400.
func ParseUntil(s string, now time.Time) (time.Time, error) {
	t := strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(t, "+"); ok {
		d, err := parseSpan(rest)
		if err != nil {
			return time.Time{}, fmt.Errorf("--until: %w", err)
		}
		return now.Add(d), nil
	}
	// ISO-8601 forms; layouts without a zone are read in now's location.
	isoLayouts := [...]string{
		time.RFC3339Nano,
		"2006-01-02T15:04:05Z0700",
		"2006-01-02T15:04Z07:00",
		"2006-01-02T15:04:05",
		"2006-01-02T15:04",
		"2006-01-02 15:04:05",
		"2006-01-02 15:04",
		"2006-01-02",
	}
	for _, layout := range isoLayouts {
		if tm, err := time.ParseInLocation(layout, t, now.Location()); err == nil {
			return tm, nil
		}
	}
	return time.Time{}, fmt.Errorf("--until %q: want +30s, +5m, +1h, +3d or an ISO-8601 time such as 2026-01-02T15:04:05Z", s)
}

// ParseTTL parses `token create --ttl` into whole seconds (rounded up).
func ParseTTL(s string) (int64, error) {
	d, err := parseSpan(s)
	if err != nil {
		return 0, fmt.Errorf("--ttl: %w", err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("--ttl %q: must be positive", s)
	}
	return int64((d + time.Second - 1) / time.Second), nil
}

// ParseEnv turns repeated --env K=V flags into a map; a later K wins.
func ParseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		if strings.ContainsAny(k, " \t\n\x00") {
			return nil, fmt.Errorf("--env %q: the name must not contain whitespace or NUL", kv)
		}
		env[k] = v
	}
	return env, nil
}

// parseSeconds reads a positive number of seconds (fractions allowed).
func parseSeconds(flag, s string) (time.Duration, error) {
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || n <= 0 || math.IsNaN(n) || math.IsInf(n, 0) || n > float64(math.MaxInt64/int64(time.Second)) {
		return 0, fmt.Errorf("%s %q: want a positive number of seconds", flag, s)
	}
	return time.Duration(n * float64(time.Second)), nil
}
