package servecli_test

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/servecli"
)

// The verbs lakeshore-server adds explain themselves as every verb of the
// CLI does: an example each, and --json on each that prints something to
// read.
func TestEveryServerVerbHasHelpAndExample(t *testing.T) {
	root := cli.Tree(cli.Env{ServerVerbs: servecli.Verbs})
	noJSON := map[string]bool{"lakeshore serve": true} // a server, not a read
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
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
		if !noJSON[path] && c.Flags().Lookup("json") == nil {
			t.Errorf("%s: no --json", path)
		}
	}
	for _, name := range []string{"serve", "blobs"} {
		c, _, err := root.Find([]string{name})
		if err != nil || c.Name() != name {
			t.Fatalf("lakeshore-server's tree has no %s: %v", name, err)
		}
		if c.DisableFlagParsing {
			t.Errorf("%s is the stand-in that hands off, not lakeshore-server's own verb", name)
		}
		walk(c)
	}
}
