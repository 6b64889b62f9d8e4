package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/test/harness"
)

// bashCompletion is where Debian's bash-completion package keeps the
// functions cobra's bash script calls (test/infra/install.sh installs it).
const bashCompletion = "/usr/share/bash-completion/bash_completion"

// `lakeshore completion bash --help` says what each shell needs, and the
// bash part is true: without the bash-completion package a <TAB> fails
// with the message the help quotes, with it the same <TAB> completes.
func TestCompletionHelpSaysWhatEachShellNeeds(t *testing.T) {
	t.Parallel()
	bins := harness.Binaries(t)
	help, err := exec.Command(bins.Lakeshore, "completion", "bash", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("completion --help: %v\n%s", err, help)
	}
	for _, want := range []string{"bash-completion package", `"_get_comp_words_by_ref: command not found"`, "compinit", "fish        nothing more"} {
		if !bytes.Contains(help, []byte(want)) {
			t.Errorf("completion --help lacks %q:\n%s", want, help)
		}
	}

	// One <TAB> after "lakeshore dae", as bash calls a completion function.
	tab := `source <(lakeshore completion bash)
COMP_WORDS=(lakeshore dae); COMP_CWORD=1; COMP_LINE="lakeshore dae"; COMP_POINT=${#COMP_LINE}
__start_lakeshore lakeshore dae lakeshore
echo "reply: ${COMPREPLY[*]}"
`
	press := func(t *testing.T, prelude string) (stdout, stderr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "--norc", "--noprofile", "-c", prelude+tab)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bins.Lakeshore)+":"+os.Getenv("PATH"), "HOME="+t.TempDir())
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bash: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
		}
		return out.String(), errb.String()
	}
	t.Run("without bash-completion", func(t *testing.T) {
		out, errs := press(t, "")
		if strings.TrimSpace(out) != "reply:" || !strings.Contains(errs, "_get_comp_words_by_ref: command not found") {
			t.Fatalf("stdout %q, stderr %q", out, errs)
		}
	})
	t.Run("with bash-completion", func(t *testing.T) {
		if _, err := os.Stat(bashCompletion); err != nil {
			t.Skipf("bash-completion is not installed (%v); test/infra/install.sh installs it", err)
		}
		out, errs := press(t, "source "+bashCompletion+"\n")
		if strings.TrimSpace(out) != "reply: daemon" || strings.Contains(errs, "command not found") {
			t.Fatalf("stdout %q, stderr %q", out, errs)
		}
	})
}
