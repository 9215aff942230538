package etcdwatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// sendAfterEnd is a wire stream whose Recv fails first, over the receive
// limit, and whose Send then fails over the send limit, once the session
// has ended with Recv's error.
type sendAfterEnd struct {
	sending chan struct{}
	sess    *session
}

func (s *sendAfterEnd) Recv(*wireResponse) error {
	<-s.sending
	return status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9000 vs. 4096)")
}

func (s *sendAfterEnd) Send(*wireRequest) error {
	close(s.sending)
	<-s.sess.dead
	return status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max (5000 vs. 4000)")
}

// TestUnsentOnlyWithItsError: the request Send refused is recorded only
// when its failure is the one that ended the session. Catches a refusal
// recorded beside another error (a response over the receive limit),
// which ended that create's watch for the other error and replaced a
// stream that had failed for good.
func TestUnsentOnlyWithItsError(t *testing.T) {
	st := &sendAfterEnd{sending: make(chan struct{})}
	ready := make(chan struct{})
	s := startSession(func(context.Context) (wireStream, error) { <-ready; return st, nil }, nil)
	st.sess = s
	close(ready)
	<-s.opened
	s.send <- []wireRequest{{kind: requestCreate, id: 7}}
	<-s.dead
	s.close()
	if s.unsent.kind != 0 {
		t.Fatalf("session ended with %v, and records request %d as unsent", s.err, s.unsent.id)
	}
}

// finishingSend is a wire stream whose Send fails over the send limit as
// gRPC's SendMsg does: it ends the stream with that error before it
// returns, so that Recv, waiting, returns the same error, and here reports
// it first.
type finishingSend struct {
	finished chan struct{}
	sess     *session
	err      error
}

func (s *finishingSend) Recv(*wireResponse) error {
	<-s.finished
	return status.Error(codes.ResourceExhausted, "trying to send message larger than max (5000 vs. 4000)")
}

func (s *finishingSend) Send(*wireRequest) error {
	close(s.finished)
	<-s.sess.dead // the receive loop reported it first
	return s.err
}

// TestUnsentWhenRecvReportsTheSendError: gRPC reports a send it refused
// through Recv too; the request is recorded whichever loop reports first.
// Catches it recorded only when the send loop did: with compression, the
// size in the error then matched no create, and an earlier create, sent
// fine, was refused in its place (28 of 300 runs through gRPC).
func TestUnsentWhenRecvReportsTheSendError(t *testing.T) {
	st := &finishingSend{finished: make(chan struct{}),
		err: status.Error(codes.ResourceExhausted, "trying to send message larger than max (5000 vs. 4000)")}
	ready := make(chan struct{})
	s := startSession(func(context.Context) (wireStream, error) { <-ready; return st, nil }, nil)
	st.sess = s
	close(ready)
	<-s.opened
	s.send <- []wireRequest{{kind: requestCreate, id: 7}}
	<-s.dead
	s.close()
	if s.unsent.kind != requestCreate || s.unsent.id != 7 {
		t.Fatalf("session ended with the send limit's error %v, and names no unsent request", s.err)
	}
}
