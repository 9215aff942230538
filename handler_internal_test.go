package etcdwatch

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ws "github.com/etcdwatch/etcdwatch/internal/watchserver"
)

// TestCancelRacingTheFirstPushOfAHandlersWatch: the dispatcher's push of a
// response to an idle Handler's watch takes the right to serve it; a
// Cancel right after must find the watch queued on its Handler, so that
// Ended is due before Done and Err say the watch ended, and a
// Handler.Wait then waits for Ended. The test holds the Handler's lock, as
// a preempted dispatcher would hold that moment open. Catches (found by
// review) push letting go of the delivery before the watch was queued: a
// Cancel then closed Done with Ended neither running nor queued, and a
// Wait made then returned before Ended was called.
func TestCancelRacingTheFirstPushOfAHandlersWatch(t *testing.T) {
	srv := ws.Start(t)
	s, err := Open(srv.Dial(t), WithProgressRetry(time.Hour, time.Hour))
	require.NoError(t, err)
	var endedMu sync.Mutex
	ended := false
	hd := NewHandler(func(*Watch, int, Response) {}, WithEnded(func(*Watch, error) {
		endedMu.Lock()
		ended = true
		endedMu.Unlock()
	}))
	t.Cleanup(func() { s.Close(); hd.Wait() })
	st := srv.Accept(t)
	res := make(chan []*Watch, 1)
	go func() {
		wl, err := s.Handle(context.Background(), hd, Key("k"))
		if err == nil {
			res <- wl
		}
		close(res)
	}()
	c := st.RecvCreate(t)
	st.Send(t, ws.Created(c.WatchId, 1))
	wl, ok := <-res
	require.True(t, ok)
	w := wl[0]

	hd.mu.Lock() // the dispatcher will stop in schedule, after push
	locked := true
	defer func() {
		if locked {
			hd.mu.Unlock()
		}
	}()
	st.Send(t, ws.Events(w.ID(), 2, ws.Put("k", "v", 2)))
	// Wait for the dispatcher's push: either it has let go of the delivery
	// with the watch taken for its Handler and not yet queued there (the
	// window), or it still holds the delivery, waiting for the Handler.
	deadline := time.Now().Add(10 * time.Second)
	window := false
	for {
		if !w.out.mu.TryLock() {
			break // the dispatcher holds the delivery (nobody else locks it here)
		}
		window = w.out.pumping
		w.out.mu.Unlock()
		if window {
			break
		}
		require.True(t, time.Now().Before(deadline), "the dispatcher did not push")
		runtime.Gosched()
	}
	if !window {
		hd.mu.Unlock()
		locked = false
	}
	w.Cancel()
	select {
	case <-w.Done():
	default:
		t.Fatal("Done open after Cancel of a watch with no call running")
	}
	require.ErrorIs(t, w.Err(), ErrCanceled)
	if window {
		// Done is closed and Err set: Ended must be due by now.
		due := hd.running > 0 || hd.queue.Len() > 0
		require.True(t, due, "Done closed and Err set while Ended is neither running nor queued on the Handler: a Wait now returns before Ended")
		hd.mu.Unlock()
		locked = false
	}
	hd.Wait()
	endedMu.Lock()
	defer endedMu.Unlock()
	require.True(t, ended, "Wait, after Done closed, returned before Ended")
}
