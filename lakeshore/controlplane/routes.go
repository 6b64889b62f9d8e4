package controlplane

import (
	"net/http"

	"nymph/lakeshore/operatorapi"
)

// routePoll is the daemon's long-poll; signedAuth tells it apart.
const routePoll = "POST /v1/daemon/poll"

// routes is the whole HTTP surface in one table: each pattern ("METHOD
// /path", as http.ServeMux reads it) with its guard wrapped around its
// handler. A route without a guard authenticates itself, as its comment
// says. upload marks the routes whose body may take UploadTimeout.
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range []struct {
		pattern string
		handler http.HandlerFunc
	}{
		// Daemon routes, msgpack (the protocol spec).
		{"POST /v1/daemon/hello", s.helloAuth(s.handleHello)},
		{routePoll, s.signedAuth(limitPoll, s.handlePoll)},
		{"POST /v1/daemon/ack", s.signedAuth(limitAck, s.handleAck)},
		{"POST /v1/daemon/event", s.signedAuth(limitEvent, s.handleEvent)},
		// Signed by the key being replaced; handleKeys verifies it.
		{"POST /v1/daemon/keys", s.handleKeys},
		{"POST /v1/daemon/result-chunk", s.signedAuth(limitResultChunk, s.handleResultChunk)},
		// Only from the worker the exec was delivered to (authorizeExec).
		{"POST /v1/daemon/exec/{exec_id}/result", s.handleExecResult},
		{"POST /v1/daemon/exec/{exec_id}/chunk", s.handleExecChunk},

		// Operator routes, JSON (operatorapi), with the admin token.
		{operatorapi.RouteListWorkers, s.adminAuth(s.handleListWorkers)},
		{operatorapi.RouteGetWorker, s.adminAuth(s.handleGetWorker)},
		{operatorapi.RouteKillWorker, s.adminAuth(s.handleKillWorker)},
		{operatorapi.RouteCleanup, s.adminAuth(s.handleCleanup)},
		{operatorapi.RouteWorkerExec, s.adminAuth(s.handleWorkerExec)},
		{operatorapi.RouteQueueExec, s.adminAuth(s.handleQueueExec)},
		{operatorapi.RouteGetExec, s.adminAuth(s.handleGetExec)},
		{operatorapi.RouteListExecs, s.adminAuth(s.handleListExecs)},
		{operatorapi.RouteSetup, s.adminAuth(s.handleSetup)},
		{operatorapi.RouteHibernate, s.adminAuth(s.handleHibernate)},
		{operatorapi.RouteWake, s.adminAuth(s.handleWake)},
		{operatorapi.RouteReset, s.adminAuth(s.handleReset)},
		{operatorapi.RouteCancel, s.adminAuth(s.handleCancel)},
		{operatorapi.RouteCreateToken, s.adminAuth(s.handleCreateToken)},
		{operatorapi.RouteListTokens, s.adminAuth(s.handleListTokens)},
		{operatorapi.RouteRevokeToken, s.adminAuth(s.handleRevokeToken)},
		{operatorapi.RouteListCommands, s.adminAuth(s.handleListCommands)},
		{operatorapi.RouteRotateKey, s.adminAuth(s.handleRotateKey)},
		{operatorapi.RouteRevokeKey, s.adminAuth(s.handleRevokeKey)},

		// Releases: downloads are public (not secret; the daemon checks
		// them against the sha256 of its authenticated command).
		{operatorapi.RouteDownloadRelease, s.handleDownloadRelease},
		{operatorapi.RoutePublishRelease, s.upload(s.adminAuth(s.handlePublishRelease))},
		{operatorapi.RouteListReleases, s.adminAuth(s.handleListReleases)},
		{operatorapi.RouteDeleteRelease, s.adminAuth(s.handleDeleteRelease)},
		{operatorapi.RouteGetTargetVersion, s.adminAuth(s.handleGetTargetVersion)},
		{operatorapi.RouteSetTargetVersion, s.adminAuth(s.handleSetTargetVersion)},
		{operatorapi.RouteClearTargetVersion, s.adminAuth(s.handleClearTargetVersion)},
		{operatorapi.RouteUpdateWorker, s.adminAuth(s.handleUpdateWorker)},
		{operatorapi.RouteCreateQueue, s.adminAuth(s.handleCreateQueue)},
		{operatorapi.RouteListQueues, s.adminAuth(s.handleListQueues)},
		{operatorapi.RouteEditWorkerQueues, s.adminAuth(s.handleEditWorkerQueues)},
		{operatorapi.RouteCreateProvider, s.adminAuth(s.handleCreateProvider)},
		{operatorapi.RouteListProviders, s.adminAuth(s.handleListProviders)},
		{operatorapi.RouteGetProvider, s.adminAuth(s.handleGetProvider)},
		{operatorapi.RouteDeleteProvider, s.adminAuth(s.handleDeleteProvider)},
		{operatorapi.RouteLaunch, s.adminAuth(s.handleLaunch)},
		{operatorapi.RouteLaunchLog, s.adminAuth(s.handleLaunchLog)},

		// Invocations and payloads.
		{operatorapi.RouteSubmitInvocation, s.adminAuth(s.handleSubmitInvocation)},
		{operatorapi.RouteListInvocations, s.adminAuth(s.handleListInvocations)},
		{operatorapi.RouteGetInvocation, s.adminAuth(s.handleGetInvocation)},
		{operatorapi.RouteInvocationLogs, s.adminAuth(s.handleInvocationLogs)},
		{operatorapi.RouteCancelInvocation, s.adminAuth(s.handleCancelInvocation)},
		// Presign is both sides': JSON from an operator, anything else
		// msgpack from a daemon.
		{operatorapi.RoutePresign, byContentType(
			s.adminAuth(s.handlePresignJSON),
			s.signedAuth(limitPresign, s.handlePresignMsgpack))},
		// The signed capability token in the path authenticates these.
		{operatorapi.RoutePayloadGet, s.handlePayloadGet},
		{operatorapi.RoutePayloadPut, s.upload(s.handlePayloadPut)},

		// Probes, unauthenticated; they read no body and write nothing.
		{"GET /healthz", s.handleHealthz},
		{"GET /readyz", s.handleReadyz},
		// Prometheus metrics: behind the metrics token, or a 404 saying
		// how to serve them (metrics.go).
		{"GET /metrics", s.handleMetrics},
	} {
		mux.HandleFunc(r.pattern, r.handler)
	}
	return mux
}

// byContentType hands a JSON request to asJSON and any other to otherwise.
func byContentType(asJSON, otherwise http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if isJSONContentType(r.Header.Get("Content-Type")) {
			asJSON(w, r)
			return
		}
		otherwise(w, r)
	}
}
