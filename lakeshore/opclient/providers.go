package opclient

import (
	"context"
	"net/url"
	"strconv"

	"nymph/lakeshore/operatorapi"
)

// CreateProvider registers a provider (RouteCreateProvider).
func (c *Client) CreateProvider(ctx context.Context, req operatorapi.ProviderRequest) (operatorapi.Provider, error) {
	return call[operatorapi.Provider](ctx, c, operatorapi.RouteCreateProvider, nil, nil, req)
}

// ListProviders lists the registered providers by name (RouteListProviders).
func (c *Client) ListProviders(ctx context.Context) ([]operatorapi.Provider, error) {
	out, err := call[operatorapi.ProviderList](ctx, c, operatorapi.RouteListProviders, nil, nil, nil)
	return nonNil(out.Providers, err)
}

// GetProvider returns one provider (RouteGetProvider).
func (c *Client) GetProvider(ctx context.Context, name string) (operatorapi.Provider, error) {
	return call[operatorapi.Provider](ctx, c, operatorapi.RouteGetProvider, params{"name": name}, nil, nil)
}

// DeleteProvider removes a provider (RouteDeleteProvider); force removes
// one whose launched daemons still have rows.
func (c *Client) DeleteProvider(ctx context.Context, name string, force bool) (operatorapi.Provider, error) {
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	return call[operatorapi.Provider](ctx, c, operatorapi.RouteDeleteProvider, params{"name": name}, q, nil)
}

// Launch launches daemons through a provider (RouteLaunch); it returns
// once every launcher call has answered.
func (c *Client) Launch(ctx context.Context, req operatorapi.LaunchRequest) (operatorapi.LaunchResponse, error) {
	return call[operatorapi.LaunchResponse](ctx, c, operatorapi.RouteLaunch, nil, nil, req)
}

// LaunchLog returns a launched daemon's console output (RouteLaunchLog);
// latest=false asks for the whole buffer where the provider keeps one.
func (c *Client) LaunchLog(ctx context.Context, workerID string, latest bool) (operatorapi.LaunchLog, error) {
	q := url.Values{"latest": {strconv.FormatBool(latest)}}
	return call[operatorapi.LaunchLog](ctx, c, operatorapi.RouteLaunchLog, params{"id": workerID}, q, nil)
}
