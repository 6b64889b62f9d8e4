// Package operatorapi owns the JSON contract between the operator CLI and the
// control plane: route paths and request/response bodies. Both sides import
// it, so a change here is a change to both.
//
// Every operator route needs the admin token as "Authorization: Bearer ...".
// Errors come back as an Error body with a 4xx/5xx status.
package operatorapi
