package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

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

func TestNoLeader(t *testing.T) {
	if !NoLeader(status.Error(codes.Unavailable, "etcdserver: no leader")) {
		t.Error("etcd's no-leader refusal not recognised")
	}
	if NoLeader(status.Error(codes.Unavailable, "connection refused")) || NoLeader(errors.New("no leader")) {
		t.Error("a refusal that is not etcd's no-leader status was taken for one")
	}
}
