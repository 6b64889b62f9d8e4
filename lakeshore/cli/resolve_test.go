package cli_test

import (
	"errors"
	"strings"
	"testing"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
)

func TestResolveDaemon(t *testing.T) {
	ws := []operatorapi.Worker{
		{ID: "aaaa000000000000000000a1", Label: "gpu-rig-1", State: operatorapi.StateActive},
		{ID: "aaaa000000000000000000a2", Label: "gpu-rig-2", State: operatorapi.StateActive},
		{ID: "bbbb000000000000000000b1", Label: "cpu", State: operatorapi.StateActive},
		{ID: "bbbb000000000000000000b2", Label: "cpu-big", State: operatorapi.StateActive},
		{ID: "cccc000000000000000000c1", Label: "local", State: operatorapi.StateStale},
		{ID: "cccc000000000000000000c2", Label: "local", State: operatorapi.StateActive},
		{ID: "dddd000000000000000000d1", Label: "twin", State: operatorapi.StateActive},
		{ID: "dddd000000000000000000d2", Label: "twin", State: operatorapi.StateActive},
		{ID: "eeee000000000000000000e1", Label: "old", State: operatorapi.StateGone},
		{ID: "eeee000000000000000000e2", Label: "old", State: operatorapi.StateStale},
		{ID: "ffff000000000000000000f1", Label: "gpu-rig-1x", State: operatorapi.StateActive},
	}
	ok := map[string]string{
		"aaaa000000000000000000a2": "aaaa000000000000000000a2", // exact id
		"gpu-rig-2":                "aaaa000000000000000000a2", // exact label
		"gpu-rig-1":                "aaaa000000000000000000a1", // exact label beats the prefix of gpu-rig-1x
		"gpu-rig-1x":               "ffff000000000000000000f1",
		"cpu":                      "bbbb000000000000000000b1", // exact label beats prefix of cpu-big
		"cpu-":                     "bbbb000000000000000000b2", // unique prefix
		"local":                    "cccc000000000000000000c2", // shared label: the one live row wins
		"tw":                       "",                         // ambiguous prefix
		"twin":                     "",                         // shared label, both live
		"old":                      "",                         // shared label, none live
		"gpu":                      "",                         // ambiguous prefix
	}
	for arg, want := range ok {
		w, err := cli.ResolveDaemon(ws, arg)
		if want == "" {
			var amb *cli.AmbiguousError
			if !errors.As(err, &amb) || len(amb.Candidates) < 2 {
				t.Errorf("ResolveDaemon(%q) = %v, %v; want ambiguity", arg, w.ID, err)
				continue
			}
			for _, c := range amb.Candidates {
				if !strings.Contains(err.Error(), c.ID) {
					t.Errorf("ambiguity message %q does not list %s", err, c.ID)
				}
			}
			continue
		}
		if err != nil || w.ID != want {
			t.Errorf("ResolveDaemon(%q) = %q, %v; want %q", arg, w.ID, err, want)
		}
	}
	for _, arg := range []string{"nope", "aaaa", ""} {
		_, err := cli.ResolveDaemon(ws, arg)
		var nm *cli.NoMatchError
		if err == nil || (arg != "" && !errors.As(err, &nm)) {
			t.Errorf("ResolveDaemon(%q) err = %v, want no match", arg, err)
		}
	}
	// Candidates are listed in a stable order.
	_, err := cli.ResolveDaemon(ws, "gpu")
	var amb *cli.AmbiguousError
	errors.As(err, &amb)
	var labels []string
	for _, c := range amb.Candidates {
		labels = append(labels, c.Label)
	}
	if strings.Join(labels, ",") != "gpu-rig-1,gpu-rig-1x,gpu-rig-2" {
		t.Errorf("candidates = %v", labels)
	}
}
