// Package projectconfig owns a project's launch defaults: the `.lakeshore`
// YAML file at a project's root and the gitignored `.lakeshore.local`
// beside it, found by walking up from the working directory, and their
// merge with the command line of `lakeshore daemon launch`.
//
// Discovery stops at the first directory holding either file, at the git
// root (a directory holding .git) or at /. Precedence is flag >
// .lakeshore.local > .lakeshore > the caller's default, field by field;
// lists replace, except setup scripts given as flags, which append to the
// configured ones. Script paths in a file are relative to that file's
// directory, and the scripts' text is what a launch carries.
//
// The file's keys, all optional, under `daemon:`: provider, name, runners,
// tags, queues (or its legacy synonym lanes), keep_alive_s, capacity (any
// mapping, handed on as a JSON object), bootstrap_script, setup_scripts.
// Unknown keys are ignored, so a newer file works with an older CLI.
package projectconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// The file names discovery looks for; Local is layered over Name.
const (
	Name  = ".lakeshore"
	Local = ".lakeshore.local"
)

// Flags are the launch's command-line values: nil (or a nil slice) is a
// flag not given. Relative script paths are relative to the dir given to
// Resolve (the working directory).
type Flags struct {
	// NoConfig skips discovery: only the flags count (--no-config).
	NoConfig bool
	// NoSetup drops every setup script, configured or given (--no-setup).
	NoSetup         bool
	Provider        *string
	Name            *string
	Runners         []string
	Tags            []string
	Queues          []string
	KeepAliveS      *int
	Capacity        json.RawMessage
	BootstrapScript *string
	// SetupScripts are appended to the configured ones.
	SetupScripts []string
}

// Script is a script the launch carries: where it was read from and its
// text.
type Script struct {
	// Path is absolute.
	Path string
	Text string
}

// Launch is the merged launch parameters. A field no flag and no file set
// is zero (nil for the lists, KeepAliveS and Capacity): the caller's
// default applies.
type Launch struct {
	Provider   string
	Name       string
	Runners    []string
	Tags       []string
	Queues     []string
	KeepAliveS *int
	// Capacity is a JSON object.
	Capacity        json.RawMessage
	BootstrapScript *Script
	SetupScripts    []Script
	// Files are the config files read, lowest precedence first.
	Files []string
}

// Resolve discovers the project files from dir (unless flags.NoConfig),
// layers them, applies flags and reads the scripts that won.
func Resolve(dir string, flags Flags) (Launch, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Launch{}, fmt.Errorf("projectconfig: %w", err)
	}
	if flags.Capacity != nil {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(flags.Capacity, &obj); err != nil || obj == nil {
			return Launch{}, fmt.Errorf("--capacity: must be a JSON object, got %q", flags.Capacity)
		}
	}
	var layers []layer
	if !flags.NoConfig {
		files, err := Discover(dir)
		if err != nil {
			return Launch{}, err
		}
		for _, f := range files {
			l, err := load(f)
			if err != nil {
				return Launch{}, err
			}
			layers = append(layers, l)
		}
	}
	layers = append(layers, flagLayer(dir, flags))
	var m merged
	var out Launch
	for _, l := range layers {
		m.add(l)
		if l.file != "" {
			out.Files = append(out.Files, l.file)
		}
	}
	out.Provider, out.Name, out.KeepAliveS = m.Provider, m.Name, m.KeepAliveS
	out.Runners, out.Tags, out.Queues, out.Capacity = m.Runners, m.Tags, m.Queues, m.Capacity
	if m.bootstrap != nil {
		s, err := m.bootstrap.read()
		if err != nil {
			return Launch{}, err
		}
		out.BootstrapScript = &s
	}
	if !flags.NoSetup {
		for _, ref := range m.setup {
			s, err := ref.read()
			if err != nil {
				return Launch{}, err
			}
			out.SetupScripts = append(out.SetupScripts, s)
		}
	}
	return out, nil
}

// Discover returns the project files that apply to dir: those of the
// nearest directory, from dir up, holding Name or Local (Name first), or
// none when the walk reaches a git root or / first.
func Discover(dir string) ([]string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("projectconfig: %w", err)
	}
	for {
		var found []string
		for _, n := range []string{Name, Local} {
			p := filepath.Join(dir, n)
			switch _, err := os.Stat(p); {
			case err == nil:
				found = append(found, p)
			case !errors.Is(err, fs.ErrNotExist):
				return nil, fmt.Errorf("projectconfig: %w", err)
			}
		}
		if len(found) > 0 {
			return found, nil
		}
		if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
			return nil, nil // the project's root: nothing above it is its config
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil, nil
		}
		dir = parent
	}
}

// layer is what one file (or the flags) sets; a nil field is not set.
type layer struct {
	file       string
	Provider   *string
	Name       *string
	Runners    []string
	Tags       []string
	Queues     []string
	KeepAliveS *int
	Capacity   json.RawMessage
	bootstrap  *scriptRef
	setup      []scriptRef
	// setupAppends marks the flags' setup scripts.
	setupAppends bool
}

// scriptRef is a script named by a file's key or a flag, read only when it
// wins, so an overridden one need not exist.
type scriptRef struct {
	path  string // absolute
	where string // the file and key (or flag) that named it, for errors
}

func (r scriptRef) read() (Script, error) {
	b, err := os.ReadFile(r.path)
	if err != nil {
		return Script{}, fmt.Errorf("%s: %w", r.where, err)
	}
	return Script{Path: r.path, Text: string(b)}, nil
}

// merged is the layers so far.
type merged struct {
	Provider, Name        string
	Runners, Tags, Queues []string
	KeepAliveS            *int
	Capacity              json.RawMessage
	bootstrap             *scriptRef
	setup                 []scriptRef
}

func (m *merged) add(l layer) {
	if l.Provider != nil {
		m.Provider = *l.Provider
	}
	if l.Name != nil {
		m.Name = *l.Name
	}
	if l.Runners != nil {
		m.Runners = l.Runners
	}
	if l.Tags != nil {
		m.Tags = l.Tags
	}
	if l.Queues != nil {
		m.Queues = l.Queues
	}
	if l.KeepAliveS != nil {
		m.KeepAliveS = l.KeepAliveS
	}
	if l.Capacity != nil {
		m.Capacity = l.Capacity
	}
	if l.bootstrap != nil {
		m.bootstrap = l.bootstrap
	}
	switch {
	case l.setupAppends:
		m.setup = append(m.setup, l.setup...)
	case l.setup != nil:
		m.setup = l.setup
	}
}

func flagLayer(dir string, f Flags) layer {
	l := layer{Provider: f.Provider, Name: f.Name, Runners: f.Runners, Tags: f.Tags, Queues: f.Queues,
		KeepAliveS: f.KeepAliveS, Capacity: f.Capacity, setupAppends: true}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	if f.BootstrapScript != nil {
		l.bootstrap = &scriptRef{path: abs(*f.BootstrapScript), where: "--bootstrap-script " + *f.BootstrapScript}
	}
	for _, p := range f.SetupScripts {
		l.setup = append(l.setup, scriptRef{path: abs(p), where: "--setup-script " + p})
	}
	return l
}

// load parses one project file. A syntax error or a value of the wrong
// type is an error naming the file and the line.
func load(path string) (layer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return layer{}, fmt.Errorf("projectconfig: %w", err)
	}
	l := layer{file: path}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		if se, ok := errors.AsType[*yaml.SyntaxError](err); ok && se.Token != nil {
			return layer{}, fmt.Errorf("%s: line %d: %s", path, se.Token.Position.Line, se.Message)
		}
		return layer{}, fmt.Errorf("%s: %w", path, err)
	}
	if len(f.Docs) == 0 || f.Docs[0].Body == nil {
		return l, nil // empty, or comments only
	}
	p := parse{path: path, base: filepath.Dir(path)}
	root := unwrap(f.Docs[0].Body)
	if isNull(root) {
		return l, nil
	}
	m, ok := root.(ast.MapNode)
	if !ok {
		return layer{}, p.fail(root, "", "must be a mapping with a daemon: section")
	}
	for it := m.MapRange(); it.Next(); {
		if it.Key().GetToken().Value != "daemon" {
			continue
		}
		if err := p.daemon(unwrap(it.Value()), &l); err != nil {
			return layer{}, err
		}
	}
	return l, nil
}

// parse reads the nodes of one file.
type parse struct {
	path, base string
}

func (p parse) fail(n ast.Node, key, format string, args ...any) error {
	if key != "" {
		key += ": "
	}
	return fmt.Errorf("%s: line %d: %s%s", p.path, line(n), key, fmt.Sprintf(format, args...))
}

func line(n ast.Node) int {
	if t := n.GetToken(); t != nil && t.Position != nil {
		return t.Position.Line
	}
	return 0
}

// unwrap sees through an anchor (&name value) to its value.
func unwrap(n ast.Node) ast.Node {
	for {
		a, ok := n.(*ast.AnchorNode)
		if !ok {
			return n
		}
		n = a.Value
	}
}

func isNull(n ast.Node) bool {
	_, ok := n.(*ast.NullNode)
	return ok
}

// text is the string a scalar node holds, plain, quoted or a block.
func text(n ast.Node) (string, bool) {
	switch v := n.(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.LiteralNode:
		return v.Value.Value, true
	}
	return "", false
}

func (p parse) daemon(n ast.Node, l *layer) error {
	if isNull(n) {
		return nil
	}
	m, ok := n.(ast.MapNode)
	if !ok {
		return p.fail(n, "daemon", "must be a mapping")
	}
	seen := map[string]int{}
	for it := m.MapRange(); it.Next(); {
		k, v := it.Key(), unwrap(it.Value())
		field := k.GetToken().Value
		key := "daemon." + field
		if field == "lanes" {
			field = "queues" // the legacy name
		}
		if first, dup := seen[field]; dup {
			return p.fail(k, key, "given again (first at line %d)", first)
		}
		seen[field] = line(k)
		if isNull(v) {
			continue // "key:" with no value sets nothing
		}
		var err error
		switch field {
		case "provider":
			l.Provider, err = p.str(v, key)
		case "name":
			l.Name, err = p.str(v, key)
		case "runners":
			l.Runners, err = p.list(v, key)
		case "tags":
			l.Tags, err = p.list(v, key)
		case "queues":
			l.Queues, err = p.list(v, key)
		case "keep_alive_s":
			i, ok := v.(*ast.IntegerNode)
			var s int
			if !ok || yaml.NodeToValue(i, &s) != nil {
				return p.fail(v, key, "must be an integer (-1 pool, 0 single job, N seconds)")
			}
			l.KeepAliveS = &s
		case "capacity":
			l.Capacity, err = p.capacity(v, key)
		case "bootstrap_script":
			var s *string
			if s, err = p.str(v, key); err == nil {
				r := p.script(*s, key, v)
				l.bootstrap = &r
			}
		case "setup_scripts":
			var paths []string
			if paths, err = p.list(v, key); err == nil {
				l.setup = []scriptRef{}
				for j, s := range paths {
					l.setup = append(l.setup, p.script(s, fmt.Sprintf("%s[%d]", key, j), v.(*ast.SequenceNode).Values[j]))
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (p parse) script(path, key string, n ast.Node) scriptRef {
	if !filepath.IsAbs(path) {
		path = filepath.Join(p.base, path)
	}
	return scriptRef{path: path, where: fmt.Sprintf("%s: line %d: %s", p.path, line(n), key)}
}

func (p parse) str(n ast.Node, key string) (*string, error) {
	s, ok := text(n)
	if !ok {
		return nil, p.fail(n, key, "must be a string")
	}
	return &s, nil
}

func (p parse) list(n ast.Node, key string) ([]string, error) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		return nil, p.fail(n, key, "must be a list of strings")
	}
	out := []string{}
	for j, e := range seq.Values {
		s, ok := text(unwrap(e))
		if !ok || strings.TrimSpace(s) == "" {
			return nil, p.fail(e, fmt.Sprintf("%s[%d]", key, j), "must be a non-empty string")
		}
		out = append(out, s)
	}
	return out, nil
}

func (p parse) capacity(n ast.Node, key string) (json.RawMessage, error) {
	if _, ok := n.(ast.MapNode); !ok {
		return nil, p.fail(n, key, "must be a mapping (it is passed to the launcher as a JSON object)")
	}
	var v map[string]any
	if err := yaml.NodeToValue(n, &v); err != nil {
		return nil, p.fail(n, key, "%v", err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, p.fail(n, key, "cannot be a JSON object: %v", err)
	}
	return b, nil
}
