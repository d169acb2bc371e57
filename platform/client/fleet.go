package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/managoat/managoat/platform/api"
)

type placementKey struct{}

type placement struct {
	selector   string
	preferLast bool
}

// WithPlacement makes the creates made with ctx ask the platform to place
// a runner sandbox by selector (a label selector: "gpu=h100", "zone in
// (eu,us)"; "" selects every runner) and, with preferLast, on the runner
// of the account's latest sandbox when it fits.
func WithPlacement(ctx context.Context, selector string, preferLast bool) context.Context {
	return context.WithValue(ctx, placementKey{}, placement{selector, preferLast})
}

func placeInto(ctx context.Context, req *api.CreateRequest) {
	if p, ok := ctx.Value(placementKey{}).(placement); ok {
		req.RunnerSelector, req.PreferLastRunner = p.selector, p.preferLast
	}
}

// Runners lists the account's runners: online ones with their labels and
// capacity, and the offline ones the platform knows, each with its
// schedule (cordoned, draining) and what its sandboxes' records hold.
func (c *Client) Runners(ctx context.Context) ([]api.RunnerView, error) {
	var out struct {
		Data []api.RunnerView `json:"data"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/runners", nil, &out)
	return out.Data, err
}

func runnerPath(name, op string) string { return "/v1/runners/" + url.PathEscape(name) + "/" + op }

// Cordon stops new placements on the runner (by name or id).
func (c *Client) Cordon(ctx context.Context, runner string) (api.RunnerView, error) {
	var v api.RunnerView
	err := c.do(ctx, http.MethodPost, runnerPath(runner, "cordon"), nil, &v)
	return v, err
}

// Uncordon lets the runner take new sandboxes again (ending a drain too).
func (c *Client) Uncordon(ctx context.Context, runner string) (api.RunnerView, error) {
	var v api.RunnerView
	err := c.do(ctx, http.MethodPost, runnerPath(runner, "uncordon"), nil, &v)
	return v, err
}

// Drain cordons the runner and makes one pass over its sandboxes:
// parking each (wait false) or only counting them (wait true). Call it
// again until Remaining is 0.
func (c *Client) Drain(ctx context.Context, runner string, wait bool) (api.DrainStatus, error) {
	var st api.DrainStatus
	err := c.do(ctx, http.MethodPost, runnerPath(runner, "drain"), api.DrainRequest{Wait: wait}, &st)
	return st, err
}

// LabelRunner sets operator labels on the runner ("" as a value removes one).
func (c *Client) LabelRunner(ctx context.Context, runner string, labels map[string]string) (api.RunnerView, error) {
	var v api.RunnerView
	err := c.do(ctx, http.MethodPost, runnerPath(runner, "labels"), api.LabelsRequest{Labels: labels}, &v)
	return v, err
}
