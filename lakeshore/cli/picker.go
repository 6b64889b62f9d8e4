package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"

	"nymph/lakeshore/operatorapi"
)

// pickerRows is how many daemons the picker shows at once when the
// terminal does not say its height; a taller fleet scrolls.
const pickerRows = 10

// pickOutcome is how the picker ended.
type pickOutcome int

const (
	pickOpen pickOutcome = iota
	pickChosen
	pickEscaped
	pickInterrupted
)

// pickModel is the daemon picker: a filter line over a scrolling list of
// daemons. Every word typed must occur (case-insensitively) in a row's
// label, id, queues or tags for it to stay listed.
type pickModel struct {
	ws   []operatorapi.Worker
	rows []string // one aligned line per worker, as shown
	hay  []string // rows, lowercased, for matching

	match  []int // indexes into ws that pass the filter, in order
	cursor int   // index into match
	top    int   // first match shown
	height int   // rows shown at once
	width  int   // terminal columns; 0 when unknown

	filter  []rune // what was typed
	outcome pickOutcome
}

func newPickModel(ws []operatorapi.Worker) *pickModel {
	m := &pickModel{ws: ws, height: pickerRows}
	labelW, idW := 0, 0
	for _, w := range ws {
		labelW = max(labelW, len(orDash(w.Label)))
		idW = max(idW, len(w.ID))
	}
	for _, w := range ws {
		row := fmt.Sprintf("%-*s  %-*s  queues: %s", labelW, orDash(w.Label), idW, w.ID, joinOrDash(w.Queues))
		if len(w.Tags) > 0 {
			row += "  tags: " + strings.Join(w.Tags, ",")
		}
		m.rows = append(m.rows, row)
		m.hay = append(m.hay, strings.ToLower(row))
	}
	m.refilter()
	return m
}

func (m *pickModel) Init() tea.Cmd { return nil }

// refilter recomputes the matches, keeping the highlighted daemon when it
// still matches.
func (m *pickModel) refilter() {
	keep := -1
	if m.cursor < len(m.match) {
		keep = m.match[m.cursor]
	}
	terms := strings.Fields(strings.ToLower(string(m.filter)))
	m.match = m.match[:0]
	m.cursor = 0
	for i, h := range m.hay {
		ok := true
		for _, t := range terms {
			if !strings.Contains(h, t) {
				ok = false
				break
			}
		}
		if ok {
			if i == keep {
				m.cursor = len(m.match)
			}
			m.match = append(m.match, i)
		}
	}
	m.scroll()
}

func (m *pickModel) move(by int) {
	if len(m.match) == 0 {
		return
	}
	m.cursor = min(max(m.cursor+by, 0), len(m.match)-1)
	m.scroll()
}

// scroll keeps the cursor inside the shown window.
func (m *pickModel) scroll() {
	if m.cursor < m.top {
		m.top = m.cursor
	}
	if m.cursor >= m.top+m.height {
		m.top = m.cursor - m.height + 1
	}
	m.top = max(0, min(m.top, len(m.match)-m.height))
}

func (m *pickModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		// Four lines of header and footer; never fewer than three rows.
		m.height = max(3, min(pickerRows, msg.Height-4))
		m.width = msg.Width
		m.scroll()
		return m, nil
	case tea.KeyMsg:
		switch msg.Type {
		case tea.KeyCtrlC:
			m.outcome = pickInterrupted
			return m, tea.Quit
		case tea.KeyEsc:
			m.outcome = pickEscaped
			return m, tea.Quit
		case tea.KeyCtrlZ:
			return m, tea.Suspend
		case tea.KeyEnter:
			if len(m.match) > 0 {
				m.outcome = pickChosen
				return m, tea.Quit
			}
			return m, nil
		case tea.KeyUp, tea.KeyCtrlP, tea.KeyShiftTab:
			m.move(-1)
			return m, nil
		case tea.KeyDown, tea.KeyCtrlN, tea.KeyTab:
			m.move(1)
			return m, nil
		case tea.KeyPgUp:
			m.move(-m.height)
			return m, nil
		case tea.KeyPgDown:
			m.move(m.height)
			return m, nil
		}
	}
	if msg, ok := msg.(tea.KeyMsg); ok && m.edit(msg) {
		m.refilter()
	}
	return m, nil
}

// edit applies a key to the filter line: typed or pasted text is added,
// Backspace takes a character back, Ctrl-W a word, Ctrl-U the line. It
// reports whether the filter changed. (The filter is a line of words,
// so it needs no cursor of its own, and no line-editor library: the one
// bubbles has looks for a clipboard program on $PATH as it loads, which
// every run of lakeshore, picker or none, paid for.)
func (m *pickModel) edit(k tea.KeyMsg) bool {
	n := len(m.filter)
	switch k.Type {
	case tea.KeyRunes:
		for _, r := range k.Runes {
			if unicode.IsPrint(r) {
				m.filter = append(m.filter, r)
			}
		}
	case tea.KeySpace:
		m.filter = append(m.filter, ' ')
	case tea.KeyBackspace, tea.KeyCtrlH:
		if n > 0 {
			m.filter = m.filter[:n-1]
		}
	case tea.KeyCtrlW:
		s := strings.TrimRightFunc(string(m.filter), unicode.IsSpace)
		i := strings.LastIndexFunc(s, unicode.IsSpace)
		m.filter = []rune(s[:i+1])
	case tea.KeyCtrlU:
		m.filter = m.filter[:0]
	}
	return len(m.filter) != n
}

func (m *pickModel) View() string {
	switch m.outcome {
	case pickChosen:
		// What stays on the terminal once the picker is gone.
		return m.fit("daemon: "+describe(m.ws[m.match[m.cursor]])) + "\n"
	case pickEscaped, pickInterrupted:
		return ""
	}
	var b strings.Builder
	b.WriteString(m.fit("Pick a daemon: type to filter, ↑/↓ to move, Enter to run, Esc or Ctrl-C to cancel") + "\n")
	// The line and its cursor, a reverse-video cell; faint help until
	// something is typed.
	line := "filter> " + string(m.filter) + "\x1b[7m \x1b[27m"
	if len(m.filter) == 0 {
		line += "\x1b[2mtype to narrow the list\x1b[22m"
	}
	b.WriteString(m.fit(line) + "\n")
	if len(m.match) == 0 {
		b.WriteString(m.fit(fmt.Sprintf("  no daemon matches %q", string(m.filter))) + "\n")
	}
	end := min(m.top+m.height, len(m.match))
	for i := m.top; i < end; i++ {
		mark := "  "
		if i == m.cursor {
			mark = "> "
		}
		b.WriteString(m.fit(mark+m.rows[m.match[i]]) + "\n")
	}
	foot := fmt.Sprintf("  %d of %s", len(m.match), plural(len(m.ws), "daemon"))
	if hidden := len(m.match) - end; hidden > 0 {
		foot += fmt.Sprintf(", %d more below", hidden)
	}
	if m.top > 0 {
		foot += fmt.Sprintf(", %d above", m.top)
	}
	b.WriteString(m.fit(foot))
	return b.String()
}

// fit cuts a line to the terminal's width: a wrapped line would throw off
// the redraw, which counts lines.
func (m *pickModel) fit(s string) string {
	if m.width <= 1 {
		return s
	}
	return ansi.Truncate(s, m.width-1, "…")
}

// errNoDaemonChosen is the picker left with Esc.
var errNoDaemonChosen = errors.New("no daemon chosen (Esc); nothing ran")

// pick runs the interactive picker on the terminal in/out and returns the
// daemon chosen. Ctrl-C (a key while the terminal is raw) and a cancelled
// ctx (a signal) both end it at once with exit 130.
func pick(ctx context.Context, in io.Reader, out io.Writer, ws []operatorapi.Worker) (operatorapi.Worker, error) {
	p := tea.NewProgram(newPickModel(ws),
		tea.WithContext(ctx),
		tea.WithInput(in),
		tea.WithOutput(out),
		// main's signal context already turns SIGINT and SIGTERM into a
		// cancelled ctx, which ends the program.
		tea.WithoutSignalHandler(),
	)
	final, err := p.Run()
	if err != nil {
		if ctx.Err() != nil {
			return operatorapi.Worker{}, exitWith(ExitInterrupted, errors.New("interrupted; no daemon chosen, nothing ran"))
		}
		return operatorapi.Worker{}, fmt.Errorf("daemon picker: %w", err)
	}
	m := final.(*pickModel)
	switch m.outcome {
	case pickChosen:
		return m.ws[m.match[m.cursor]], nil
	case pickInterrupted:
		return operatorapi.Worker{}, exitWith(ExitInterrupted, errors.New("interrupted; no daemon chosen, nothing ran"))
	default:
		return operatorapi.Worker{}, errNoDaemonChosen
	}
}
