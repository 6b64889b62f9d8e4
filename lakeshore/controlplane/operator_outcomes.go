package controlplane

import (
	"context"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// withOutcomes fills in what the workers' daemons reported about their
// setups and updates: the newest setup of each, and for detailed views the
// recent outcomes. A failure to read them leaves them out, logged: the
// rest of the view is worth more than they are.
func (s *Server) withOutcomes(ctx context.Context, ns string, ws []operatorapi.Worker, detailed bool) {
	latest, err := s.st.LatestWorkerEvents(ctx, ns, messages.EventSetupFinished)
	if err != nil {
		s.log.Error().Err(err).Msg("read the latest setup outcomes")
		return
	}
	for i := range ws {
		if e, ok := latest[ws[i].ID]; ok {
			o := outcomeView(e)
			ws[i].LastSetup = &o
		}
		if !detailed {
			continue
		}
		evs, err := s.st.WorkerEvents(ctx, ws[i].ID, []string{messages.EventSetupFinished, messages.EventOtaFinished},
			operatorapi.WorkerOutcomesShown)
		if err != nil {
			s.log.Error().Err(err).Str("worker_id", ws[i].ID).Msg("read the outcomes of a worker")
			continue
		}
		ws[i].Outcomes = make([]operatorapi.WorkerOutcome, 0, len(evs))
		for _, e := range evs {
			ws[i].Outcomes = append(ws[i].Outcomes, outcomeView(e))
		}
	}
}

func outcomeView(e store.Event) operatorapi.WorkerOutcome {
	o := operatorapi.WorkerOutcome{Kind: e.Kind, CommandID: e.InvocationID, At: e.TS, ReceivedAt: e.ReceivedAt}
	switch e.Kind {
	case messages.EventSetupFinished:
		var d messages.SetupOutcome
		if messages.Unmarshal(e.Data, &d) == nil {
			v := operatorapi.SetupOutcomeOf(d)
			o.Setup = &v
		}
	case messages.EventOtaFinished:
		var d messages.OtaOutcome
		if messages.Unmarshal(e.Data, &d) == nil {
			v := operatorapi.OtaOutcomeOf(d)
			o.Ota = &v
		}
	}
	return o
}
