package localdaemon

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseStatOddCommandName(t *testing.T) {
	line := "4242 (ny) mph (x)) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 200 18446744073709551615\n"
	st, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.state != 'S' || st.ppid != 17 || st.startTicks != 987654 {
		t.Fatalf("stat = %+v", st)
	}
	for _, bad := range []string{"", "1 (x S 1", "1 (x) S notanumber 1 1", "1 (x) S 1 2 3"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

func TestConfigFlag(t *testing.T) {
	cases := map[string][]string{
		"/a.toml": {"nymph", "run", "--config", "/a.toml"},
		"/b.toml": {"nymph", "run", "--config=/b.toml"},
		"":        {"nymph", "run", "--", "--config", "/c.toml"},
	}
	for want, args := range cases {
		if got := configFlag(args); got != want {
			t.Errorf("configFlag(%q) = %q, want %q", args, got, want)
		}
	}
	if got := configFlag([]string{"nymph", "--config"}); got != "" {
		t.Errorf("dangling --config = %q", got)
	}
}

func TestMissingProcRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "proc")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Scanner{ProcRoot: root}.Find(t.Context())
	if err == nil {
		t.Fatal("Find over an empty root succeeded")
	}
}
