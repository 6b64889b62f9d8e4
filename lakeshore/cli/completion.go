package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// completionBudget bounds the control-plane call behind a <TAB>.
const completionBudget = 3 * time.Second

func (a *app) completionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print a shell completion script",
		Long: `Print a completion script for your shell. Daemon arguments complete to the
labels of the daemons on the control plane (asked live, with a 3 s budget).

What each shell needs besides the script:
  bash        the bash-completion package (apt-get install bash-completion,
              dnf install bash-completion, brew install bash-completion@2),
              loaded by your ~/.bashrc; without it <TAB> says
              "_get_comp_words_by_ref: command not found"
  zsh         compinit enabled once: autoload -U compinit; compinit in ~/.zshrc
  fish        nothing more
  powershell  nothing more`,
		Example: `  source <(lakeshore completion bash)                            # this shell
  lakeshore completion bash > ~/.local/share/bash-completion/completions/lakeshore
  lakeshore completion zsh > "${fpath[1]}/_lakeshore"
  lakeshore completion fish > ~/.config/fish/completions/lakeshore.fish
  lakeshore completion powershell | Out-String | Invoke-Expression`,
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		Args:      exactArgs(1, "one shell: bash, zsh, fish or powershell"),
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			out := a.env.Stdout
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(out)
			}
			return usagef("unknown shell %q: want bash, zsh, fish or powershell", args[0])
		},
	}
	return cmd
}

// completeDaemon completes the first argument to daemon labels (and ids
// when what was typed looks like one).
func (a *app) completeDaemon(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return a.daemonNames(cmdContext(cmd), toComplete), cobra.ShellCompDirectiveNoFileComp
}

// cmdContext is the command's context; completion runs commands that were
// found but never executed, which carry none.
func cmdContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// completeExecDaemon completes the daemon, then leaves the remote command
// to the shell's default completion.
func (a *app) completeExecDaemon(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	return a.daemonNames(cmdContext(cmd), toComplete), cobra.ShellCompDirectiveNoFileComp
}

func (a *app) daemonNames(ctx context.Context, prefix string) []string {
	c, err := a.client()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, completionBudget)
	defer cancel()
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	add := func(name, desc string) {
		if name == "" || seen[name] || !strings.HasPrefix(name, prefix) {
			return
		}
		seen[name] = true
		out = append(out, name+"\t"+desc)
	}
	for _, w := range sortedWorkers(ws) {
		add(w.Label, fmt.Sprintf("%s %s", w.State, w.ID))
	}
	if prefix != "" {
		for _, w := range ws {
			add(w.ID, fmt.Sprintf("%s %s", w.State, w.Label))
		}
	}
	return out
}

// completeQueue completes --queue to the queues the daemons belong to.
func (a *app) completeQueue(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	c, err := a.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmdContext(cmd), completionBudget)
	defer cancel()
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	set := map[string]bool{}
	for _, w := range ws {
		for _, q := range w.Queues {
			if strings.HasPrefix(q, toComplete) {
				set[q] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for q := range set {
		out = append(out, q)
	}
	sort.Strings(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}
