package opclient

import (
	"context"
	"errors"
	"strconv"
	"time"

	"nymph/backoff"
	"nymph/lakeshore/operatorapi"
)

// InvocationLogs reads one page of an invocation's output after the cursor
// after (RouteInvocationLogs): at most maxBytes of it (0: the server's
// default). A positive wait long-polls until there is output or the
// invocation is over.
func (c *Client) InvocationLogs(ctx context.Context, id string, after int64, maxBytes int, wait time.Duration) (operatorapi.InvocationLogs, error) {
	q := waitQuery(wait)
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if maxBytes > 0 {
		q.Set("max_bytes", strconv.Itoa(maxBytes))
	}
	out, err := call[operatorapi.InvocationLogs](ctx, c, operatorapi.RouteInvocationLogs, params{"inv_id": id}, q, nil)
	if err == nil && out.Events == nil {
		out.Events = []operatorapi.LogEvent{}
	}
	return out, err
}

// FollowInvocationLogs reads an invocation's output from the cursor after
// until the invocation is over and every page of its output is read, and
// returns the last page. each sees every page, in order (and, with a nil
// page's error, each read that failed and will be retried): transport
// failures and a restarting server are retried with backoff until ctx
// ends; other errors end the follow.
func (c *Client) FollowInvocationLogs(ctx context.Context, id string, after int64,
	each func(operatorapi.InvocationLogs, error)) (operatorapi.InvocationLogs, error) {
	retry := backoff.New(waitRetryMin, waitRetryMax)
	var page operatorapi.InvocationLogs
	for {
		wait := waitPoll
		if page.More {
			wait = 0
		}
		rctx, cancel := context.WithTimeout(ctx, waitPoll+waitSlack)
		next, err := c.InvocationLogs(rctx, id, after, 0, wait)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return page, ctx.Err()
			}
			if !Retryable(err) && !errors.Is(err, context.DeadlineExceeded) {
				return page, err
			}
			if each != nil {
				each(operatorapi.InvocationLogs{}, err)
			}
			if !retry.Wait(ctx) {
				return page, ctx.Err()
			}
			continue
		}
		retry.Reset()
		page, after = next, next.Next
		if each != nil {
			each(page, nil)
		}
		if operatorapi.InvocationTerminal(page.State) && !page.More {
			return page, nil
		}
	}
}
