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
	}, time.Now, &hooks{on: func(p hook) {
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

// refusingSend is a wire stream whose Send fails with sendErr, as gRPC's
// SendMsg over its send limit does: once it has begun, Recv returns
// recvErr and ends the session first, and Send returns only then.
type refusingSend struct {
	sending          chan struct{}
	sess             *session
	recvErr, sendErr error
}

func (s *refusingSend) Recv(*wireResponse) error {
	<-s.sending
	return s.recvErr
}

func (s *refusingSend) Send(*wireRequest) error {
	close(s.sending)
	<-s.sess.dead // the receive loop reported first
	return s.sendErr
}

// sendRefused runs a session on st, sends it a create with id 7, and
// returns the session once it has ended and closed.
func sendRefused(st *refusingSend) *session {
	st.sending = make(chan struct{})
	ready := make(chan struct{})
	s := startSession(func(context.Context) (wireStream, error) { <-ready; return st, nil }, time.Now, nil)
	st.sess = s
	close(ready)
	<-s.opened
	s.send <- []wireRequest{{kind: requestCreate, id: 7}}
	<-s.dead
	s.close()
	return s
}

var sendLimit = status.Error(codes.ResourceExhausted, "trying to send message larger than max (5000 vs. 4000)")

// TestUnsentOnlyWithItsError: the request Send refused is recorded only
// when its failure is the one that ended the session. Catches a refusal
// recorded beside another error (a response over the receive limit),
// which ended that create's watch for the other error and replaced a
// stream that had failed for good.
func TestUnsentOnlyWithItsError(t *testing.T) {
	s := sendRefused(&refusingSend{
		recvErr: status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9000 vs. 4096)"),
		sendErr: sendLimit,
	})
	if u := s.unsent(); u.kind != 0 {
		t.Fatalf("session ended with %v, and records request %d as unsent", s.err, u.id)
	}
}

// TestUnsentWhenRecvReportsTheSendError: gRPC reports a send it refused
// through Recv too; the request is recorded whichever loop reports first.
// Catches it recorded only when the send loop did: with compression, the
// size in the error then matched no create, and an earlier create, sent
// fine, was refused in its place (28 of 300 runs through gRPC).
func TestUnsentWhenRecvReportsTheSendError(t *testing.T) {
	s := sendRefused(&refusingSend{
		recvErr: status.Error(codes.ResourceExhausted, "trying to send message larger than max (5000 vs. 4000)"),
		sendErr: sendLimit,
	})
	if u := s.unsent(); u.kind != requestCreate || u.id != 7 {
		t.Fatalf("session ended with the send limit's error %v, and names no unsent request", s.err)
	}
}
