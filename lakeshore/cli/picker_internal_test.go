package cli

import (
	"testing"

	tea "github.com/charmbracelet/bubbletea"
)

// The picker's filter line: typed and pasted text goes in (a paste's line
// breaks do not), Backspace takes back a character, Ctrl-W a word and
// Ctrl-U the line; each change refilters, and a key that changes nothing
// says so.
func TestPickerFilterLine(t *testing.T) {
	m := &pickModel{}
	runes := func(s string, paste bool) tea.KeyMsg {
		return tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(s), Paste: paste}
	}
	for _, step := range []struct {
		key     tea.KeyMsg
		want    string
		changed bool
	}{
		{runes("west", false), "west", true},
		{tea.KeyMsg{Type: tea.KeySpace}, "west ", true},
		{runes("node-1\n7", true), "west node-17", true},
		{tea.KeyMsg{Type: tea.KeyBackspace}, "west node-1", true},
		{tea.KeyMsg{Type: tea.KeyCtrlW}, "west ", true},
		{tea.KeyMsg{Type: tea.KeyCtrlW}, "", true},
		{tea.KeyMsg{Type: tea.KeyBackspace}, "", false},
		{runes("gpu rig", true), "gpu rig", true},
		{tea.KeyMsg{Type: tea.KeyCtrlU}, "", true},
		{tea.KeyMsg{Type: tea.KeyCtrlU}, "", false},
	} {
		if changed := m.edit(step.key); string(m.filter) != step.want || changed != step.changed {
			t.Fatalf("after %q: filter %q (changed %v), want %q (%v)", step.key.String(), string(m.filter), changed, step.want, step.changed)
		}
	}
}
