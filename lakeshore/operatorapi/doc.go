// Package operatorapi owns the JSON contract between the operator CLI and the
// control plane: route paths and request/response bodies. Both sides import
// it, so a change here is a change to both.
//
// Every operator route needs the admin token as "Authorization: Bearer ...".
// Errors come back as an Error body with a 4xx/5xx status.
//
// Keys are camelCase (workerId, hibernatingUntil, capabilities.maxInvocations):
// an object the daemon reports in its own wire form is copied into an
// operatorapi type with camelCase keys (Capabilities) rather than embedded.
// Not yet so, and kept as they are so existing clients keep working: the
// invocation routes (run_config, worker_id, ...) and the daemon reports
// embedded as received (an exec's result, setup and update outcomes), whose
// keys are the spec's snake_case names.
package operatorapi
