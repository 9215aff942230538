package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch"
)

// TestSoakFromNowUnderWrites opens watches from now, one after another on
// four goroutines, while 32 writers put under their prefix. etcd reads a
// created response's header after registering the watch, so writes racing
// the create put the header ahead of the watch's start (by up to 96
// revisions here), and their events come after it. None is a duplicate:
// on one member, with no reconnect, the Stream must drop no event at all.
// The race is rare (a few watches in ten thousand), so this runs with the
// soak (ETCDWATCH_SOAK, at most a minute of it), not in make test; from
// half a minute on, the run must have seen it.
func TestSoakFromNowUnderWrites(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("ETCDWATCH_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set ETCDWATCH_SOAK to a duration to soak")
	}
	d = min(d, time.Minute)
	leakCheck(t)
	kv := client(t)
	s := open(t)
	prefix := unique("fromnow")
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()

	var stop atomic.Bool
	var writers sync.WaitGroup
	for i := range 32 {
		writers.Go(func() { // until stop
			for !stop.Load() {
				_, err := kv.Put(ctx, fmt.Sprintf("%s%d", prefix, i), "v")
				if !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	var watches, early atomic.Int64 // early: first events below the created header
	var watchers sync.WaitGroup
	deadline := time.Now().Add(d)
	for range 4 {
		watchers.Go(func() { // until the deadline
			for time.Now().Before(deadline) {
				w, err := s.Watch(ctx, etcdwatch.Prefix(prefix))
				if !assert.NoError(t, err) {
					return
				}
				select {
				case r, ok := <-w.Responses():
					if !assert.True(t, ok, "watch ended: %v", w.Err()) {
						return
					}
					if len(r.Events) > 0 && r.Events[0].ModRevision < w.CreatedRevision() {
						early.Add(1)
					}
				case <-ctx.Done():
					assert.Fail(t, "a watch from now under writes got nothing")
				}
				w.Cancel()
				watches.Add(1)
			}
		})
	}
	watchers.Wait()
	stop.Store(true)
	writers.Wait()
	st := s.Stats()
	t.Logf("%d watches from now under 32 writers; %d began below their created header; reconnects %d, duplicates dropped %d",
		watches.Load(), early.Load(), st.Reconnects, st.DuplicatesDropped)
	require.Zero(t, st.Reconnects, "one member, no fault: a reconnect replays, and a drop then proves nothing")
	require.Zero(t, st.DuplicatesDropped, "an event dropped on a live stream without reconnects is lost")
	// A run in which no watch began below its header tested nothing. It
	// happened 22 to 32 times a minute here, so from half a minute on its
	// absence means the setup no longer races, not bad luck.
	if d >= 30*time.Second {
		require.Positive(t, early.Load(), "no watch began below its created header: the race this test guards never happened")
	}
}
