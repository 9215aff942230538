package etcdwatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// bigStream is a wire stream whose every response is a message of size
// bytes. On each Recv it checks that the session had room: less than
// readAheadBytes of big messages waiting for the dispatcher.
type bigStream struct {
	t     *testing.T
	s     *session
	size  int
	recvs atomic.Int64
}

func (b *bigStream) Send(*wireRequest) error { return nil }

func (b *bigStream) Recv(r *wireResponse) error {
	if ahead := b.s.ahead.Load(); ahead >= readAheadBytes {
		b.t.Errorf("Recv with %d bytes waiting, want under %d", ahead, readAheadBytes)
	}
	b.recvs.Add(1)
	*r = wireResponse{WatchID: 1, size: b.size}
	return nil
}

// TestReadAheadIsBoundedInBytes: the receive loop decodes no further while
// readAheadBytes of big messages wait for the dispatcher, and reads on once
// the dispatcher takes one.
func TestReadAheadIsBoundedInBytes(t *testing.T) {
	const size = 1 << 20
	b := &bigStream{t: t, size: size}
	opened := make(chan struct{})
	handed := make(chan struct{}, readAhead+1)
	s := startSession(func(context.Context) (wireStream, error) {
		<-opened // b.s is set first
		return b, nil
	}, &hooks{on: func(p hook) {
		if p == hookReceived {
			handed <- struct{}{}
		}
	}})
	b.s = s
	close(opened)
	defer s.close()
	deadline := time.After(10 * time.Second)
	waitHanded := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-handed:
			case <-deadline:
				t.Fatalf("the session handed over fewer than %d more messages", n)
			}
		}
	}
	waitHanded(readAheadBytes / size)
	if got := b.recvs.Load(); got != readAheadBytes/size {
		t.Fatalf("%d Recvs with %d big messages waiting, want %[2]d", got, readAheadBytes/size)
	}
	resp := <-s.recv
	s.took(resp.size)
	waitHanded(1)
	if n := len(s.recv); n > readAheadBytes/size {
		t.Fatalf("%d big messages waiting, want at most %d", n, readAheadBytes/size)
	}
}
