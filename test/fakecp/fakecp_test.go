package fakecp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"nymph/daemon/uplink"
	"nymph/messages"
	"nymph/test/fakecp"
)

func client(t *testing.T, cp *fakecp.CP, opts ...uplink.Option) *uplink.Client {
	c, err := uplink.New(cp.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCursorRedeliversUntilAcknowledged(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithMaxBatch(2))
	c := client(t, cp)
	ctx := context.Background()
	h, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"})
	if err != nil || h.Cursor == nil || *h.Cursor != "0" || *h.WorkerID != "w-fake" {
		t.Fatalf("%+v %v", h, err)
	}
	a := cp.QueueKind(messages.KindResetBackoff, nil)
	b := cp.QueueKind(messages.KindResetBackoff, nil)
	d := cp.QueueKind(messages.KindResetBackoff, nil)

	p1, err := c.Poll(ctx, &messages.PollRequest{Cursor: h.Cursor, TimeoutS: 1})
	if err != nil || len(p1.Commands) != 2 || p1.Commands[0].ID != a || p1.Commands[1].ID != b || *p1.Cursor != "2" {
		t.Fatalf("%+v %v", p1, err)
	}
	// the same cursor again: nothing was acknowledged, the batch comes back
	p2, _ := c.Poll(ctx, &messages.PollRequest{Cursor: h.Cursor, TimeoutS: 1})
	if len(p2.Commands) != 2 || p2.Commands[0].ID != a {
		t.Fatalf("not redelivered: %+v", p2)
	}
	p3, _ := c.Poll(ctx, &messages.PollRequest{Cursor: p2.Cursor, TimeoutS: 1})
	if len(p3.Commands) != 1 || p3.Commands[0].ID != d || *p3.Cursor != "3" {
		t.Fatalf("%+v", p3)
	}
	p4, _ := c.Poll(ctx, &messages.PollRequest{Cursor: p3.Cursor, TimeoutS: 0.05})
	if len(p4.Commands) != 0 || *p4.Cursor != "3" || cp.Queued() != 0 {
		t.Fatalf("%+v queued=%d", p4, cp.Queued())
	}
}

func TestLegacyDeletesOnDelivery(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithLegacyCursor())
	c := client(t, cp)
	cp.QueueKind(messages.KindResetBackoff, nil)
	p, _ := c.Poll(context.Background(), &messages.PollRequest{TimeoutS: 1})
	if len(p.Commands) != 1 || p.Cursor != nil || cp.Queued() != 0 {
		t.Fatalf("%+v", p)
	}
}

func TestLongPollWakesOnQueue(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithMaxHold(10*time.Second))
	c := client(t, cp)
	go func() {
		cp.Wait(5*time.Second, "a poll", func() bool { return cp.Count(fakecp.RoutePoll) == 0 && len(cp.Polls()) == 1 })
		cp.QueueKind(messages.KindResetBackoff, nil)
	}()
	start := time.Now()
	p, err := c.Poll(context.Background(), &messages.PollRequest{TimeoutS: 20})
	if err != nil || len(p.Commands) != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("%+v %v %v", p, err, time.Since(start))
	}
}

func TestFaults(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithToken("tok"))
	c := client(t, cp, uplink.WithToken("tok"), uplink.WithTimeout(200*time.Millisecond))
	ctx := context.Background()
	cp.Fail(fakecp.RouteAck, 1, 503)
	var se *uplink.StatusError
	if err := c.Ack(ctx, &messages.Ack{InvocationID: "i"}); !errors.As(err, &se) || se.Status != 503 {
		t.Fatalf("err = %v", err)
	}
	if err := c.Ack(ctx, &messages.Ack{InvocationID: "i"}); err != nil || len(cp.Acks()) != 1 {
		t.Fatalf("err = %v acks=%d", err, len(cp.Acks()))
	}
	cp.Malform(fakecp.RouteHello, 1)
	var de *uplink.DecodeError
	if _, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"}); !errors.As(err, &de) {
		t.Fatalf("err = %v", err)
	}
	cp.Hang(fakecp.RoutePoll, 1)
	if _, err := c.Poll(ctx, &messages.PollRequest{TimeoutS: 1}); err == nil {
		t.Fatal("hang did not time out")
	}
	bad := client(t, cp)
	if err := bad.Ack(ctx, &messages.Ack{}); !errors.As(err, &se) || se.Status != 401 {
		t.Fatalf("err = %v", err)
	}
}

func TestHoldForeverAndDeliveredBy(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithLegacyCursor(), fakecp.WithHoldForever())
	c := client(t, cp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Poll(ctx, &messages.PollRequest{TimeoutS: 0.01})
		done <- err
	}()
	cp.Wait(5*time.Second, "the poll held", func() bool { return len(cp.Polls()) == 1 })
	// Its timeout_s passed long ago; only the client giving up ends it.
	cancel()
	if err := <-done; err == nil {
		t.Fatal("an empty poll was answered although the fake holds it forever")
	}
	// Once the fake has seen the client go (the held poll ends, recorded
	// with no status), nothing queued next can go to it.
	cp.Wait(5*time.Second, "the held poll to end", func() bool { return cp.Count(fakecp.RoutePoll) == 1 })
	id := cp.QueueKind(messages.KindResetBackoff, nil)
	if _, ok := cp.DeliveredBy(id); ok {
		t.Fatal("delivered before any poll carried it")
	}
	p, err := c.Poll(context.Background(), &messages.PollRequest{TimeoutS: 0.01})
	if err != nil || len(p.Commands) != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	if n, ok := cp.DeliveredBy(id); !ok || n != 1 {
		t.Fatalf("delivered by poll %d (%v), want the second (1)", n, ok)
	}
}
