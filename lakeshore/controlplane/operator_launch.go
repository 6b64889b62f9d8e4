package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"nymph/dist"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/providers"
	"nymph/lakeshore/providers/bootstrap"
	"nymph/lakeshore/releases"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// Launch bounds. A launcher call that takes longer than launchCallTimeout
// is abandoned (a cloud's RunInstances answers in seconds; a script that
// hangs is killed by the script provider at its own timeout first).
const (
	launchCallTimeout = 5 * time.Minute
	terminateTimeout  = 2 * time.Minute
	consoleTimeout    = time.Minute
	maxLaunchName     = 63
	maxLaunchScripts  = 16
)

// launchTokenTTL bounds how long a launched daemon's enrollment token
// waits for its first hello (a slow image boot, a long bootstrap script).
const launchTokenTTL = 24 * time.Hour

// handleLaunch launches daemons through a registered provider. For each,
// in up to Concurrency launcher calls at once: a token of its own (an
// enrollment token when signatures are required), the pending Worker row
// bound to it with its setup FIFO, the rendered bootstrap, the launcher
// call, and the instance id on the row. A launch that fails leaves no row
// and no live token behind.
func (s *Server) handleLaunch(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	body, err := readBody(w, r, limitCommand)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.LaunchRequest
	if err := decodeJSON(body, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	if err := checkLaunch(&req); err != nil {
		writeOperatorError(w, err)
		return
	}
	p, err := s.provider(r.Context(), req.Provider)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	launcher, _, err := s.launchers.get(r.Context(), p)
	if err != nil {
		writeOperatorError(w, providerError(err))
		return
	}
	rel, err := s.launchRelease(r.Context(), ns)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	now := s.now().UTC()
	names := launchNames(req, now)
	plan := launchPlan{
		req: req, ns: ns, provider: p.Name, launcher: launcher,
		serverURL: s.currentPublicURL(r.Host),
		binaryURL: s.releaseURL(r.Host, rel),
		sha256:    rel.SHA256,
		enroll:    s.ident.requireSigs,
	}
	s.log.Info().Str("provider", p.Name).Int("count", len(names)).Int("concurrency", req.Concurrency).
		Str("release", rel.Version).Msg("launch")

	launched := make([]*store.Worker, len(names))
	failed := make([]error, len(names))
	// Launches run to their end even if the operator goes away: a machine
	// started for a request that was cancelled half-way would otherwise be
	// running with no row naming it.
	launchCtx := context.WithoutCancel(r.Context())
	sem := make(chan struct{}, req.Concurrency)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			wk, err := s.launchOne(launchCtx, plan, name)
			if err != nil {
				failed[i] = err
				return
			}
			launched[i] = &wk
		}()
	}
	wg.Wait()

	out := operatorapi.LaunchResponse{Launched: []operatorapi.Worker{}, Failed: []operatorapi.LaunchFailure{}}
	for i, name := range names {
		if wk := launched[i]; wk != nil {
			out.Launched = append(out.Launched, s.workerView(*wk, s.now()))
			continue
		}
		out.Failed = append(out.Failed, operatorapi.LaunchFailure{Name: name, Error: failed[i].Error()})
	}
	if len(out.Launched) == 0 {
		// Launches failing alike say so once, not once per daemon.
		var (
			msgs  []string
			byErr = map[string][]string{}
		)
		for _, f := range out.Failed {
			if byErr[f.Error] == nil {
				msgs = append(msgs, f.Error)
			}
			byErr[f.Error] = append(byErr[f.Error], f.Name)
		}
		for i, m := range msgs {
			msgs[i] = strings.Join(byErr[m], ", ") + ": " + m
		}
		writeOperatorError(w, badField(http.StatusBadGateway, "provider", "%s through provider %q failed, and nothing was left behind: %s",
			launchCount(len(out.Failed)), p.Name, strings.Join(msgs, "; ")))
		return
	}
	status := http.StatusCreated
	if len(out.Failed) > 0 {
		status = http.StatusMultiStatus
	}
	writeJSON(w, status, out)
}

func launchCount(n int) string {
	if n == 1 {
		return "the launch"
	}
	return fmt.Sprintf("all %d launches", n)
}

// launchPlan is what every launch of one request shares.
type launchPlan struct {
	req       operatorapi.LaunchRequest
	ns        string
	provider  string
	launcher  providers.Launcher
	serverURL string
	binaryURL string
	sha256    string
	enroll    bool
}

// launchOne makes one daemon: its row and token, then the launcher call.
func (s *Server) launchOne(ctx context.Context, plan launchPlan, name string) (store.Worker, error) {
	now := s.now().UTC()
	id := newWorkerID(now)
	log := s.log.With().Str("worker_id", id).Str("provider", plan.provider).Str("name", name).Logger()

	kind, prefix := store.TokenDaemon, daemonTokenPrefix
	if plan.enroll {
		kind, prefix = store.TokenEnroll, enrollTokenPrefix
	}
	secret := newSecret(prefix)
	tok := store.Token{
		ID: newULID(), Kind: kind, Namespace: plan.ns, Label: "launch " + name,
		Hash: hashSecret(secret), CreatedAt: now,
	}
	if plan.enroll {
		exp := now.Add(launchTokenTTL)
		tok.ExpiresAt = &exp
	}
	setup := make([]store.NewCommand, 0, len(plan.req.SetupScripts))
	for i, script := range plan.req.SetupScripts {
		cid := newULID()
		label := fmt.Sprintf("launch setup %d", i+1)
		cmd, err := messages.EncodeCommand(cid, messages.KindSetup, &messages.Setup{Script: script, Name: &label})
		if err != nil {
			return store.Worker{}, fmt.Errorf("encode setup %d: %w", i+1, err)
		}
		setup = append(setup, store.NewCommand{ID: cid, WorkerID: id, Kind: store.KindSetup, Body: cmd.Body, Now: now})
	}
	wk, err := s.st.LaunchWorker(ctx, store.Launch{
		WorkerID: id, Namespace: plan.ns, Label: name, Provider: plan.provider,
		Tags: plan.req.Tags, Queues: plan.req.Queues, Runners: plan.req.Runners, Now: now,
		Token: tok, Setup: setup,
	})
	if err != nil {
		log.Error().Err(err).Msg("launch: store")
		return store.Worker{}, errors.New("the control plane could not record the worker; retry")
	}
	keepAlive := -1
	if plan.req.KeepAliveS != nil {
		keepAlive = *plan.req.KeepAliveS
	}
	script, err := bootstrap.Render(bootstrap.Input{
		ServerURL: plan.serverURL, BinaryURL: plan.binaryURL, BinarySHA256: plan.sha256,
		Token: secret, Enroll: plan.enroll,
		Label: name, Tags: plan.req.Tags, Queues: plan.req.Queues, Runners: plan.req.Runners,
		KeepAliveS: keepAlive, PreScript: plan.req.BootstrapScript,
	})
	if err == nil {
		callCtx, cancel := context.WithTimeout(ctx, launchCallTimeout)
		var inst providers.Instance
		inst, err = plan.launcher.Launch(callCtx, providers.LaunchRequest{
			WorkerID: id, Name: name, Bootstrap: script, Capacity: plan.req.Capacity,
		})
		cancel()
		if err == nil {
			wk.InstanceID = inst.ID
			if err := s.st.SetInstance(ctx, id, inst.ID); err != nil {
				// The instance runs and its daemon will say hello; the
				// row just cannot name it. Say so rather than orphan it.
				log.Error().Err(err).Str("instance_id", inst.ID).Msg("launch: record instance id")
			}
			log.Info().Str("instance_id", inst.ID).Msg("launched")
			s.changed(id)
			return wk, nil
		}
	}
	s.unlaunch(ctx, log, plan.ns, id, tok.ID)
	log.Info().Err(err).Msg("launch failed")
	return store.Worker{}, err
}

// unlaunch removes what a failed launch made: the row and its token.
func (s *Server) unlaunch(ctx context.Context, log zerolog.Logger, ns, workerID, tokenID string) {
	if err := s.st.DeleteWorker(ctx, ns, workerID); err != nil && !isNotFound(err) {
		log.Error().Err(err).Msg("launch failed, and its row could not be removed: lakeshore daemon cleanup will")
	}
	if _, err := s.st.RevokeToken(ctx, tokenID, s.now()); err != nil {
		log.Error().Err(err).Msg("launch failed, and its token could not be revoked")
	}
	s.announce(tokenAnnouncement(tokenID))
	s.forget(workerID)
}

// checkLaunch validates req and fills its defaults.
func checkLaunch(req *operatorapi.LaunchRequest) error {
	if req.Provider == "" {
		return badField(http.StatusBadRequest, "provider", "no provider was given (--provider NAME, or provider: in .lakeshore; lakeshore provider list)")
	}
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > operatorapi.MaxLaunchCount {
		return badField(http.StatusBadRequest, "count", "must be between 1 and %d, got %d", operatorapi.MaxLaunchCount, req.Count)
	}
	if req.Concurrency == 0 {
		req.Concurrency = operatorapi.DefaultLaunchWorkers
	}
	if req.Concurrency < 1 || req.Concurrency > operatorapi.MaxLaunchCount {
		return badField(http.StatusBadRequest, "concurrency", "must be between 1 and %d, got %d", operatorapi.MaxLaunchCount, req.Concurrency)
	}
	req.Concurrency = min(req.Concurrency, req.Count)
	for _, f := range []struct{ field, v string }{{"name", req.Name}, {"label", req.Label}} {
		if len(f.v) > maxLaunchName {
			return badField(http.StatusBadRequest, f.field, "longer than %d characters", maxLaunchName)
		}
		if strings.ContainsFunc(f.v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return badField(http.StatusBadRequest, f.field, "must not contain control characters")
		}
	}
	if c := bytes.TrimSpace(req.Capacity); len(c) > 0 {
		if c[0] != '{' {
			return badField(http.StatusBadRequest, "capacity", "must be a JSON object, e.g. '{\"instance_type\": \"g5.2xlarge\"}'")
		}
		req.Capacity = c
	} else {
		req.Capacity = nil
	}
	for _, list := range []struct {
		field string
		v     []string
	}{{"tags", req.Tags}, {"queues", req.Queues}, {"runners", req.Runners}} {
		for i, v := range list.v {
			if strings.TrimSpace(v) == "" || strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
				return badField(http.StatusBadRequest, list.field, "entry %d is empty or has control characters", i)
			}
		}
	}
	if len(req.Runners) == 0 {
		req.Runners = []string{messages.RunnerKinds[0]}
	}
	for _, k := range req.Runners {
		if !slices.Contains(messages.RunnerKinds, k) {
			return badField(http.StatusBadRequest, "runners", "unknown runner kind %q (known: %s)", k, strings.Join(messages.RunnerKinds, ", "))
		}
	}
	if req.KeepAliveS != nil && *req.KeepAliveS < -1 {
		return badField(http.StatusBadRequest, "keepAliveS", "must be -1 (pool), 0 (single job) or a number of seconds, got %d", *req.KeepAliveS)
	}
	if len(req.SetupScripts) > maxLaunchScripts {
		return badField(http.StatusBadRequest, "setupScripts", "at most %d setup scripts, got %d", maxLaunchScripts, len(req.SetupScripts))
	}
	for i, sc := range req.SetupScripts {
		if strings.TrimSpace(sc) == "" {
			return badField(http.StatusBadRequest, "setupScripts", "script %d is empty", i+1)
		}
	}
	return nil
}

// launchNames are the labels of a launch: Label, or Name (a prefix with
// Count > 1), or <provider>-<short id>.
func launchNames(req operatorapi.LaunchRequest, now time.Time) []string {
	base := req.Label
	if base == "" {
		base = req.Name
	}
	if base == "" {
		id := newWorkerID(now)
		base = req.Provider + "-" + strings.ToLower(id[len(id)-6:])
	}
	if req.Count == 1 {
		return []string{base}
	}
	width := len(strconv.Itoa(req.Count - 1))
	out := make([]string, req.Count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%0*d", base, max(width, 2), i)
	}
	return out
}

// launchTriple is the nymph build a launched machine downloads.
const launchTriple = dist.FallbackTriple

// launchRelease picks the nymph a launched daemon installs: the
// namespace's target version when one is set, else the highest published
// for launchTriple.
func (s *Server) launchRelease(ctx context.Context, ns string) (releases.Release, error) {
	if s.rel.store == nil {
		return releases.Release{}, badField(http.StatusConflict, "provider",
			"this control plane keeps no releases, so a launched machine has no nymph to download")
	}
	target := ""
	if v, err := s.st.TargetVersion(ctx, ns); err != nil {
		return releases.Release{}, err
	} else if v != nil {
		target = *v
	}
	if target != "" {
		rel, err := s.rel.store.GetContext(ctx, target, launchTriple)
		if errors.Is(err, releases.ErrNotFound) {
			return releases.Release{}, badField(http.StatusConflict, "provider",
				"the target version %s is not published for %s: publish it (lakeshore release publish PATH --version %s)", target, launchTriple, target)
		}
		return rel, err
	}
	rel, err := s.rel.store.LatestContext(ctx, launchTriple)
	if errors.Is(err, releases.ErrNotFound) {
		return releases.Release{}, badField(http.StatusConflict, "provider",
			"no nymph release is published for %s, so a launched machine has nothing to install: publish one first (lakeshore release publish PATH --version V)", launchTriple)
	}
	return rel, err
}

// handleLaunchLog answers a launched daemon's console output.
func (s *Server) handleLaunchLog(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	launcher, err := s.launcherOf(r.Context(), wk)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	latest := r.URL.Query().Get("latest") != "false"
	ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
	defer cancel()
	out, err := launcher.ConsoleLog(ctx, wk.InstanceID, latest)
	if errors.Is(err, providers.ErrInstanceGone) {
		writeOperatorError(w, badField(http.StatusNotFound, "id",
			"instance %s of daemon %s is gone at provider %q (terminated?)", wk.InstanceID, wk.Label, wk.Provider))
		return
	}
	if err != nil {
		writeOperatorError(w, badField(http.StatusBadGateway, "provider", "provider %q: console output of %s: %v", wk.Provider, wk.InstanceID, err))
		return
	}
	writeJSON(w, http.StatusOK, operatorapi.LaunchLog{WorkerID: wk.ID, Provider: wk.Provider, InstanceID: wk.InstanceID, Output: out})
}

// launcherOf is the launcher of the provider that launched wk, or the
// error that says why there is none.
func (s *Server) launcherOf(ctx context.Context, wk store.Worker) (providers.Launcher, error) {
	if wk.Provider == "" {
		return nil, badField(http.StatusConflict, "id",
			"daemon %s was not launched by a provider, so there is no instance here; its log is on its own host", wk.Label)
	}
	if wk.InstanceID == "" {
		return nil, badField(http.StatusConflict, "id",
			"daemon %s has no instance: its launch through %q did not answer", wk.Label, wk.Provider)
	}
	p, err := s.st.Provider(ctx, wk.Provider)
	if isNotFound(err) {
		return nil, badField(http.StatusConflict, "provider",
			"daemon %s was launched by provider %q, which is no longer registered; register it again to reach instance %s",
			wk.Label, wk.Provider, wk.InstanceID)
	}
	if err != nil {
		return nil, err
	}
	l, _, err := s.launchers.get(ctx, p)
	if err != nil {
		return nil, providerError(err)
	}
	return l, nil
}

// terminateInstance ends wk's instance through its provider before its
// row goes (kill). It reports whether it terminated one, and a note when
// there was none to terminate.
func (s *Server) terminateInstance(ctx context.Context, wk store.Worker) (bool, string, error) {
	if wk.Provider == "" {
		return false, "not launched by a provider: no instance to terminate (stop the daemon on its host)", nil
	}
	if wk.InstanceID == "" {
		return false, "its launch never answered: no instance id to terminate", nil
	}
	l, err := s.launcherOf(ctx, wk)
	if err != nil {
		return false, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, terminateTimeout)
	defer cancel()
	if err := l.Terminate(ctx, wk.InstanceID); err != nil {
		return false, "", badField(http.StatusBadGateway, "provider",
			"provider %q could not terminate %s: %v (the row is kept; retry, or remove only the row with --no-terminate)",
			wk.Provider, wk.InstanceID, err)
	}
	s.log.Info().Str("worker_id", wk.ID).Str("provider", wk.Provider).Str("instance_id", wk.InstanceID).Msg("instance terminated")
	return true, "", nil
}
