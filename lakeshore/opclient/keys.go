package opclient

import (
	"context"

	"nymph/lakeshore/operatorapi"
)

// RotateKey queues a rotate_key command on a worker (RouteRotateKey).
func (c *Client) RotateKey(ctx context.Context, workerID string) (operatorapi.Queued, error) {
	return call[operatorapi.Queued](ctx, c, operatorapi.RouteRotateKey, params{"id": workerID}, nil, struct{}{})
}

// RevokeKey revokes a worker's key keyID, or its current key when keyID is
// empty (RouteRevokeKey).
func (c *Client) RevokeKey(ctx context.Context, workerID, keyID string) (operatorapi.RevokeKeyResponse, error) {
	return call[operatorapi.RevokeKeyResponse](ctx, c, operatorapi.RouteRevokeKey, params{"id": workerID}, nil, operatorapi.RevokeKeyRequest{KeyID: keyID})
}
