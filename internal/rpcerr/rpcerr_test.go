package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	for reason, want := range map[string]Kind{
		"etcdserver: permission denied":                                                      PermissionDenied,
		"rpc error: code = PermissionDenied desc = etcdserver: permission denied":            PermissionDenied,
		"etcdserver: invalid auth token":                                                     Unauthenticated,
		"rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old": Unauthenticated,
		"etcdserver: user name is empty":                                                     NoUser,
		"mvcc: watcher range is empty":                                                       InvalidRequest,
		"mvcc: duplicate watch ID provided on the WatchStream":                               InvalidRequest,
		"etcdserver: mvcc: required revision has been compacted":                             Compacted,
		"grpc: received message larger than max (4718608 vs. 4194304)":                       InvalidRequest,
		"": Other,
		"rpc error: code = Unavailable desc = etcdserver: no leader": Other,
	} {
		if got := Classify(reason); got != want {
			t.Errorf("Classify(%q) = %d, want %d", reason, got, want)
		}
	}
}

func TestFinalAndCanceled(t *testing.T) {
	for _, tc := range []struct {
		err             error
		final, canceled bool
	}{
		{status.Error(codes.PermissionDenied, "x"), true, false},
		{status.Error(codes.Unauthenticated, "x"), true, false},
		{status.Error(codes.InvalidArgument, "x"), true, false},
		{status.Error(codes.Unimplemented, "x"), true, false},
		{status.Error(codes.Unavailable, "x"), false, false},
		{status.Error(codes.OutOfRange, "x"), false, false},
		{status.Error(codes.Canceled, "x"), false, true},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), false, true},
		{context.Canceled, false, true},
		{errors.New("plain"), false, false},
		{nil, false, false},
	} {
		if got := Final(tc.err); got != tc.final {
			t.Errorf("Final(%v) = %v", tc.err, got)
		}
		if got := Canceled(tc.err); got != tc.canceled {
			t.Errorf("Canceled(%v) = %v", tc.err, got)
		}
	}
}

func TestTooLarge(t *testing.T) {
	if !TooLarge(status.Error(codes.ResourceExhausted, "grpc: received message larger than max (2097152 vs. 1572864)")) {
		t.Error("gRPC's receive limit not recognised")
	}
	if TooLarge(status.Error(codes.ResourceExhausted, "etcdserver: too many requests")) {
		t.Error("etcd's rate limit taken for the receive limit")
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		err         error
		size, limit int
		ok          bool
	}{
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (4718608 vs. 4194304)"), 4718608, 4194304, true},
		{status.Error(codes.ResourceExhausted, "trying to send message larger than max (2000 vs. 1000)"), 2000, 1000, true},
		{status.Error(codes.ResourceExhausted, "grpc: received message after decompression larger than max 4194304"), -1, 4194304, true},
		{fmt.Errorf("wrapped: %w", status.Error(codes.ResourceExhausted, "grpc: received message larger than max (2 vs. 1)")), 2, 1, true},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max"), 0, 0, false}, // no sizes
		{status.Error(codes.ResourceExhausted, "etcdserver: too many requests"), 0, 0, false},
		{status.Error(codes.Unavailable, "grpc: received message larger than max (2 vs. 1)"), 0, 0, false},
		{errors.New("larger than max (2 vs. 1)"), 0, 0, false},
	} {
		if size, limit, ok := Sizes(tc.err); size != tc.size || limit != tc.limit || ok != tc.ok {
			t.Errorf("Sizes(%v) = %d, %d, %v; want %d, %d, %v", tc.err, size, limit, ok, tc.size, tc.limit, tc.ok)
		}
	}
}

func TestSame(t *testing.T) {
	refused := status.Error(codes.ResourceExhausted, "trying to send message larger than max (5000 vs. 4000)")
	for _, tc := range []struct {
		a, b error
		want bool
	}{
		{refused, refused, true},
		{refused, status.Error(codes.ResourceExhausted, "trying to send message larger than max (5000 vs. 4000)"), true}, // reported again through Recv
		{refused, status.Error(codes.ResourceExhausted, "grpc: received message larger than max (9000 vs. 4096)"), false},
		{refused, status.Error(codes.Unavailable, "trying to send message larger than max (5000 vs. 4000)"), false},
		{refused, errors.New("trying to send message larger than max (5000 vs. 4000)"), false},
		{context.Canceled, context.Canceled, true},
		{context.Canceled, fmt.Errorf("wrapped: %w", context.Canceled), false}, // a is not b's
	} {
		if got := Same(tc.a, tc.b); got != tc.want {
			t.Errorf("Same(%v, %v) = %v", tc.a, tc.b, got)
		}
	}
}

func TestNoLeader(t *testing.T) {
	if !NoLeader(status.Error(codes.Unavailable, "etcdserver: no leader")) {
		t.Error("etcd's no-leader refusal not recognised")
	}
	if NoLeader(status.Error(codes.Unavailable, "connection refused")) || NoLeader(errors.New("no leader")) {
		t.Error("a refusal that is not etcd's no-leader status was taken for one")
	}
}

// TestTokenUnknown: only a reason saying the member does not know the
// token, in whatever case and wrapped or bare, as Classify reads reasons;
// not a token older than the auth store, which is Unauthenticated too but
// no member's lag. Catches TokenUnknown taken as Classify's Unauthenticated
// (a token refused for an old auth store kept as if a member lagged), or
// matching case-sensitively where Classify does not.
func TestTokenUnknown(t *testing.T) {
	for reason, want := range map[string]bool{
		"etcdserver: invalid auth token":                                                     true,
		"rpc error: code = Unauthenticated desc = etcdserver: invalid auth token":            true,
		"etcdserver: Invalid Auth Token":                                                     true,
		"etcdserver: revision of auth store is old":                                          false,
		"rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old": false,
		"etcdserver: user name is empty":                                                     false,
		"etcdserver: permission denied":                                                      false,
		"":                                                                                   false,
	} {
		if got := TokenUnknown(reason); got != want {
			t.Errorf("TokenUnknown(%q) = %v, want %v", reason, got, want)
		}
		if want && Classify(reason) != Unauthenticated {
			t.Errorf("Classify(%q) = %d: a token the member does not know is Unauthenticated", reason, Classify(reason))
		}
	}
}

// TestNoLeaderNeedsUnavailable: "no leader" under another code is not
// etcd's no-leader refusal. Catches the code not checked.
func TestNoLeaderNeedsUnavailable(t *testing.T) {
	for _, c := range []codes.Code{codes.Unknown, codes.FailedPrecondition, codes.Internal, codes.Canceled} {
		if NoLeader(status.Error(c, "etcdserver: no leader")) {
			t.Errorf("NoLeader of %v with the text of no leader: true, want false", c)
		}
	}
}

// TestWaitsForReadyLastWins: of several grpc.WaitForReady options, the
// last one counts, as gRPC applies them. Catches any WaitForReady(true)
// winning over a later WaitForReady(false) (a call default overridden per
// call).
func TestWaitsForReadyLastWins(t *testing.T) {
	for _, tc := range []struct {
		opts []grpc.CallOption
		want bool
	}{
		{nil, false},
		{[]grpc.CallOption{grpc.WaitForReady(true)}, true},
		{[]grpc.CallOption{grpc.WaitForReady(false)}, false},
		{[]grpc.CallOption{grpc.WaitForReady(false), grpc.WaitForReady(true)}, true},
		{[]grpc.CallOption{grpc.WaitForReady(true), grpc.WaitForReady(false)}, false},
		{[]grpc.CallOption{grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(1), grpc.WaitForReady(false)}, false},
		{[]grpc.CallOption{grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(1)}, true},
	} {
		if got := WaitsForReady(tc.opts); got != tc.want {
			t.Errorf("WaitsForReady(%v) = %v, want %v", tc.opts, got, tc.want)
		}
	}
}
