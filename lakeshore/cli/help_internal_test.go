package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every verb explains itself with an example, and every verb that prints
// something to read offers --json.
func TestEveryVerbHasHelpAndExample(t *testing.T) {
	root := (&app{env: Env{Getenv: envMap(nil)}}).rootCmd()
	noJSON := map[string]bool{
		"lakeshore serve":      true, // a server, not a read
		"lakeshore completion": true, // prints a shell script
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		path := c.CommandPath()
		if c.Short == "" {
			t.Errorf("%s: no short help", path)
		}
		if c.HasSubCommands() {
			for _, sub := range c.Commands() {
				walk(sub)
			}
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s: no example", path)
		}
		// A stand-in for a verb of lakeshore-server has that verb's flags
		// there (servecli's own test walks them).
		if !noJSON[path] && c.Annotations[annHandOff] == "" && c.Flags().Lookup("json") == nil {
			t.Errorf("%s: no --json", path)
		}
	}
	walk(root)
}

// The remote command's flags are never parsed as lakeshore's.
func TestExecStopsParsingAtTheDaemon(t *testing.T) {
	root := (&app{env: Env{Getenv: envMap(nil)}}).rootCmd()
	for _, path := range [][]string{{"daemon", "exec"}, {"exec"}} {
		c, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ParseFlags([]string{"--timeout", "5", "gpu", "ls", "--timeout", "9", "-la"}); err != nil {
			t.Fatalf("%v: %v", path, err)
		}
		if got := strings.Join(c.Flags().Args(), " "); got != "gpu ls --timeout 9 -la" {
			t.Errorf("%v: args = %q", path, got)
		}
		if v, _ := c.Flags().GetFloat64("timeout"); v != 5 {
			t.Errorf("%v: --timeout = %v", path, v)
		}
	}
}
