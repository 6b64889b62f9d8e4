// Package operatorapi owns the JSON contract between the operator CLI and the
// control plane: route paths and request/response bodies. Both sides import
// it, so a change here is a change to both.
//
// Every operator route needs the admin token as "Authorization: Bearer ...".
// Errors come back as an Error body with a 4xx/5xx status.
//
// One convention, camelCase, for every operator JSON body (workerId,
// hibernatingUntil, capabilities.maxInvocations, runConfig.timeoutS,
// result.exitCode): an object the daemon reports in its own wire form, with
// the spec's snake_case names, is copied into an operatorapi type with
// camelCase keys (Capabilities, RunConfig, ExecResult, SetupOutcome,
// OtaOutcome) rather than embedded. The one exception is PayloadStored, the
// answer to a payload PUT, which daemons read as well. A submit body may
// still use the snake_case keys an older CLI sent (InvocationRequest).
// Query parameters (max_bytes, ...) are not bodies and keep their names.
package operatorapi
