package opclient

import (
	"context"

	"nymph/lakeshore/operatorapi"
)

// RotateKey queues a rotate_key command on a worker (RouteRotateKey).
func (c *Client) RotateKey(ctx context.Context, workerID string) (operatorapi.Queued, error) {
	var out operatorapi.Queued
	err := c.do(ctx, operatorapi.RouteRotateKey, params{"id": workerID}, nil, struct{}{}, &out)
	return out, err
}

// RevokeKey revokes a worker's key keyID, or its current key when keyID is
// empty (RouteRevokeKey).
func (c *Client) RevokeKey(ctx context.Context, workerID, keyID string) (operatorapi.RevokeKeyResponse, error) {
	var out operatorapi.RevokeKeyResponse
	err := c.do(ctx, operatorapi.RouteRevokeKey, params{"id": workerID}, nil, operatorapi.RevokeKeyRequest{KeyID: keyID}, &out)
	return out, err
}
