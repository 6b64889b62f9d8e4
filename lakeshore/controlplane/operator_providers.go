package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/providers"
	"nymph/lakeshore/store"
)

// OpenProvider turns a registered provider into its launcher. dir is a
// private directory for the launcher's files (the podman provider keeps
// each bootstrap there). It validates the spec: an error naming the
// field is the operator's to fix.
type OpenProvider func(ctx context.Context, spec providers.Spec, dir string) (providers.Launcher, error)

// providerNameRe is what a provider may be called: it appears in paths,
// in worker rows and on command lines. Compiled on first use, as the
// package's other patterns (its program is tens of kilobytes).
var providerNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) })

// providerCheckTimeout bounds `provider add`'s check of the provider.
const providerCheckTimeout = 30 * time.Second

// launcherCache keeps one launcher per provider, opened on first use and
// dropped when the provider is removed or registered again; the spec it
// was opened from is kept so a replica that sees a provider re-registered
// elsewhere opens the new one.
type launcherCache struct {
	open OpenProvider
	dir  string // DataDir/providers; "" puts the launchers' files in a temp dir
	mu   sync.Mutex
	by   map[string]cachedLauncher
}

type cachedLauncher struct {
	spec []byte
	l    providers.Launcher
}

// get returns the launcher of p, opening it when p's spec changed.
func (c *launcherCache) get(ctx context.Context, p store.Provider) (providers.Launcher, providers.Spec, error) {
	spec, err := decodeProviderSpec(p)
	if err != nil {
		return nil, providers.Spec{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.by[p.Name]; ok && bytes.Equal(e.spec, p.Spec) {
		return e.l, spec, nil
	}
	if c.open == nil {
		return nil, spec, badField(http.StatusServiceUnavailable, "provider", "this control plane was started without provider support")
	}
	l, err := c.open(ctx, spec, c.launcherDir(p.Name))
	if err != nil {
		return nil, spec, err
	}
	if c.by == nil {
		c.by = map[string]cachedLauncher{}
	}
	c.by[p.Name] = cachedLauncher{spec: bytes.Clone(p.Spec), l: l}
	return l, spec, nil
}

func (c *launcherCache) launcherDir(name string) string {
	if c.dir == "" {
		return ""
	}
	return filepath.Join(c.dir, name)
}

func (c *launcherCache) drop(name string) {
	c.mu.Lock()
	delete(c.by, name)
	c.mu.Unlock()
}

// decodeProviderSpec reads a stored provider back into its spec.
func decodeProviderSpec(p store.Provider) (providers.Spec, error) {
	var spec providers.Spec
	if err := json.Unmarshal(p.Spec, &spec); err != nil {
		return providers.Spec{}, fmt.Errorf("provider %q: stored spec: %w", p.Name, err)
	}
	spec.Name, spec.Kind = p.Name, providers.Kind(p.Kind)
	return spec, nil
}

// specFromRequest builds the spec a ProviderRequest describes: Config is
// decoded strictly into the kind's settings, so a misspelt key is named.
func specFromRequest(req operatorapi.ProviderRequest) (providers.Spec, error) {
	if req.Name == "" {
		return providers.Spec{}, badField(http.StatusBadRequest, "name", "a provider needs a name (lakeshore provider add KIND NAME ...)")
	}
	if !providerNameRe().MatchString(req.Name) {
		return providers.Spec{}, badField(http.StatusBadRequest, "name",
			"%q: use letters, digits, '.', '_' and '-' (at most 63, starting with a letter or digit)", req.Name)
	}
	spec := providers.Spec{Name: req.Name, Kind: providers.Kind(req.Kind)}
	var target any
	switch spec.Kind {
	case providers.KindEC2:
		spec.EC2 = &providers.EC2Spec{}
		target = spec.EC2
	case providers.KindPodman:
		spec.Podman = &providers.PodmanSpec{}
		target = spec.Podman
	case providers.KindScript:
		spec.Script = &providers.ScriptSpec{}
		target = spec.Script
	default:
		return providers.Spec{}, badField(http.StatusBadRequest, "kind", "unknown provider kind %q: use ec2, podman or script", req.Kind)
	}
	cfg := bytes.TrimSpace(req.Config)
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(cfg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(target); err != nil {
		return providers.Spec{}, badField(http.StatusBadRequest, "config", "%s settings: %v", spec.Kind, err)
	}
	return spec, nil
}

func (s *Server) handleCreateProvider(w http.ResponseWriter, r *http.Request) {
	var req operatorapi.ProviderRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	spec, err := specFromRequest(req)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	p := store.Provider{Name: spec.Name, Kind: string(spec.Kind), Spec: raw, CreatedAt: s.now().UTC()}
	if _, err := s.st.Provider(r.Context(), p.Name); err == nil {
		writeOperatorError(w, badField(http.StatusConflict, "name",
			"provider %q exists; remove it first (lakeshore provider remove %s)", p.Name, p.Name))
		return
	} else if !isNotFound(err) {
		writeOperatorError(w, err)
		return
	}
	// Opening validates the settings; the check proves them against the
	// provider itself, so a wrong credential is an error now, not at the
	// first launch.
	s.launchers.drop(p.Name)
	l, _, err := s.launchers.get(r.Context(), p)
	if err != nil {
		s.launchers.drop(p.Name)
		writeOperatorError(w, providerError(err))
		return
	}
	if !req.NoCheck {
		ctx, cancel := context.WithTimeout(r.Context(), providerCheckTimeout)
		err := l.Check(ctx)
		cancel()
		if err != nil {
			s.launchers.drop(p.Name)
			s.log.Info().Err(err).Str("provider", p.Name).Msg("provider refused: its check failed")
			writeOperatorError(w, badField(http.StatusUnprocessableEntity, "config",
				"provider %q does not work as configured: %v (fix it, or register it anyway with --no-check)", p.Name, err))
			return
		}
	}
	err = s.st.CreateProvider(r.Context(), p)
	if errors.Is(err, store.ErrExists) {
		writeOperatorError(w, badField(http.StatusConflict, "name",
			"provider %q exists; remove it first (lakeshore provider remove %s)", p.Name, p.Name))
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("provider", p.Name).Msg("create provider")
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("provider", p.Name).Str("kind", p.Kind).Bool("checked", !req.NoCheck).Msg("provider registered")
	writeJSON(w, http.StatusCreated, providerView(p, 0))
}

// providerError is what an operator sees of an error opening or calling
// a provider: the provider's own words (validation names the field).
func providerError(err error) error {
	var fe *fieldError
	if errors.As(err, &fe) {
		return err
	}
	return badField(http.StatusBadRequest, "config", "%v", err)
}

func providerView(p store.Provider, workers int) operatorapi.Provider {
	cfg := json.RawMessage("{}")
	if spec, err := decodeProviderSpec(p); err == nil {
		var v any
		switch {
		case spec.EC2 != nil:
			v = spec.EC2
		case spec.Podman != nil:
			v = spec.Podman
		case spec.Script != nil:
			v = spec.Script
		}
		if b, err := json.Marshal(v); err == nil && v != nil {
			cfg = b
		}
	}
	return operatorapi.Provider{Name: p.Name, Kind: p.Kind, Config: cfg, CreatedAt: p.CreatedAt, Workers: workers}
}

// launchedCounts counts the namespace's workers per provider.
func (s *Server) launchedCounts(ctx context.Context) (map[string]int, error) {
	all, err := s.listWorkers(ctx, operatorapi.DefaultNamespace)
	if err != nil {
		return nil, err
	}
	n := map[string]int{}
	for _, w := range all {
		if w.Provider != "" {
			n[w.Provider]++
		}
	}
	return n, nil
}

func (s *Server) handleListProviders(w http.ResponseWriter, r *http.Request) {
	ps, err := s.st.ListProviders(r.Context())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	counts, err := s.launchedCounts(r.Context())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.ProviderList{Providers: make([]operatorapi.Provider, 0, len(ps))}
	for _, p := range ps {
		out.Providers = append(out.Providers, providerView(p, counts[p.Name]))
	}
	writeJSON(w, http.StatusOK, out)
}

// provider reads a registered provider; one nothing is registered as is
// a 404 naming the way to list and add them.
func (s *Server) provider(ctx context.Context, name string) (store.Provider, error) {
	p, err := s.st.Provider(ctx, name)
	if isNotFound(err) {
		return store.Provider{}, badField(http.StatusNotFound, "provider",
			"no provider %q is registered (lakeshore provider list; lakeshore provider add ...)", name)
	}
	return p, err
}

func (s *Server) handleGetProvider(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	p, err := s.provider(r.Context(), name)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	counts, err := s.launchedCounts(r.Context())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, providerView(p, counts[p.Name]))
}

func (s *Server) handleDeleteProvider(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	p, err := s.provider(r.Context(), name)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	// Its daemons' instances could no longer be terminated or read: the
	// operator says so explicitly.
	counts, err := s.launchedCounts(r.Context())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	if n := counts[name]; n > 0 && r.URL.Query().Get("force") != "true" {
		writeOperatorError(w, badField(http.StatusConflict, "provider",
			"provider %q launched %d daemon(s) that still have rows: kill them first (lakeshore daemon kill ...), "+
				"or remove it anyway with --force (their instances are then yours to end)", name, n))
		return
	}
	if err := s.st.DeleteProvider(r.Context(), name); err != nil && !isNotFound(err) {
		writeOperatorError(w, err)
		return
	}
	s.launchers.drop(name)
	s.log.Info().Str("provider", name).Msg("provider removed")
	writeJSON(w, http.StatusOK, providerView(p, 0))
}
