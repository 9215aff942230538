package group

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// confirmAll answers every create and cancel on every Watch stream of s,
// and no progress request, until the test ends.
func confirmAll(t *testing.T, s *ws.Server) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { // returns when the test ends; the cleanup waits
		for {
			select {
			case st := <-s.Streams():
				wg.Go(func() { // returns when the stream ends
					for req := range st.Requests() {
						switch {
						case req.GetCreateRequest() != nil:
							st.Send(t, ws.Created(req.GetCreateRequest().WatchId, 5))
						case req.GetCancelRequest() != nil:
							st.Send(t, ws.Canceled(req.GetCancelRequest().WatchId))
						}
					}
				})
			case <-ctx.Done():
				return
			}
		}
	})
}

// TestRequestProgressEndsOnTheFirstFailure: when one Stream refuses
// progress (its member runs etcd 3.5.7, which has #15220) and another is
// not answered (a watch there waits for a future revision, say), the
// group's RequestProgress returns the refusal at once, not when ctx ends.
// Catches: waiting for every Stream's answer before looking at any.
func TestRequestProgressEndsOnTheFirstFailure(t *testing.T) {
	old, cur := ws.StartRelease(t, "3.5.7"), ws.StartRelease(t, "3.6.0")
	confirmAll(t, old)
	confirmAll(t, cur)
	g, err := start([]grpc.ClientConnInterface{old.Dial(t), cur.Dial(t)}, nil, apply(2, nil))
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() })
	_, err = g.WatchAll(t.Context(), etcdwatch.Key("a"), etcdwatch.Key("b")) // one on each Stream
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := g.RequestProgress(context.Background()) // unbounded: only the refusal ends it
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(ws.Timeout):
		t.Fatal("RequestProgress waited for the Stream that does not answer")
	}
	require.ErrorIs(t, err, etcdwatch.ErrProgressUnsupported)
}
