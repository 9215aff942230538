// Package rpcerr reads what etcd says when it refuses something: which gRPC
// codes no retry can cure, and what the texts of its cancel reasons mean.
// It is the one place in etcdwatch that reads the server's text. It also
// tells whether a call waits for a ready connection, for those that
// retry a call that failed for want of one.
package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Final reports whether err refuses the caller or the request itself: a
// permission, credentials, an argument, or an RPC the server does not have.
// Asking again, on this connection or another, gets the same answer.
func Final(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.Unimplemented:
		return true
	}
	return false
}

// Canceled reports whether err is a cancellation, the caller's own
// (context.Canceled, context.DeadlineExceeded) or gRPC's (codes.Canceled).
func Canceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.Canceled
}

// TooLarge reports whether err is gRPC refusing a message larger than the
// receiver's limit (grpc.MaxCallRecvMsgSize): the same message would be
// refused again. etcd's own ResourceExhausted ("too many requests") is
// not this, and passes.
func TooLarge(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.ResourceExhausted && strings.Contains(s.Message(), "larger than max")
}

// Sizes returns what a message broke when err is gRPC refusing one as too
// large: its size, or -1 when the text does not say (after decompression),
// and the limit. The texts: "received message larger than max (X vs. Y)"
// (a receiver's limit, the server's or the client's own), "received
// message after decompression larger than max Y", and "trying to send
// message larger than max (X vs. Y)" (the client's send limit).
func Sizes(err error) (size, limit int, ok bool) {
	if !TooLarge(err) {
		return 0, 0, false
	}
	msg := status.Convert(err).Message()
	rest := msg[strings.Index(msg, "larger than max")+len("larger than max"):]
	if _, err := fmt.Sscanf(rest, " (%d vs. %d)", &size, &limit); err == nil {
		return size, limit, true
	}
	if _, err := fmt.Sscanf(rest, " %d", &limit); err == nil {
		return -1, limit, true
	}
	return 0, 0, false
}

// Same reports whether a and b are one failure: the same error, or gRPC
// statuses of the same code and message (gRPC reports a send it refused
// through the stream's receive too, as an error of its own).
func Same(a, b error) bool {
	if errors.Is(a, b) {
		return true
	}
	sa, okA := status.FromError(a)
	sb, okB := status.FromError(b)
	return okA && okB && sa.Code() == sb.Code() && sa.Message() == sb.Message()
}

// Kind is what a server's cancel reason means.
type Kind uint8

const (
	Other            Kind = iota // none of the below
	PermissionDenied             // the user may not read the range
	Unauthenticated              // the token is invalid, expired or older than the auth store
	NoUser                       // the request named no user: it carried no token while auth is on (or an admin RPC named an empty user)
	InvalidRequest               // the server refused the request as malformed
	Compacted                    // the start revision has been compacted
)

// reasons maps fragments of etcd's cancel_reason texts to kinds. Reasons
// may arrive bare ("etcdserver: permission denied") or as a whole gRPC
// status text ("rpc error: code = PermissionDenied desc = ..."), so they
// are matched by substring.
var reasons = []struct {
	fragment string
	kind     Kind
}{
	{"permission denied", PermissionDenied},
	{invalidToken, Unauthenticated},
	{"revision of auth store is old", Unauthenticated},
	{"user name is empty", NoUser},
	{"range is empty", InvalidRequest},
	{"duplicate watch id", InvalidRequest},
	{"compacted", Compacted},            // etcd 3.7 refuses a negative start revision so
	{"larger than max", InvalidRequest}, // gRPC's size limit, for a create the server refused as too large (Sizes)
}

// invalidToken is etcd's ErrInvalidAuthToken: the member does not know the
// token it was given.
const invalidToken = "invalid auth token"

// TokenUnknown reports whether reason says that the member does not know
// the token it was given (an Unauthenticated reason): one that expired,
// that it never issued, or whose Authenticate it has yet to apply. It is
// not said of a token older than the auth store.
func TokenUnknown(reason string) bool {
	return strings.Contains(strings.ToLower(reason), invalidToken)
}

// Classify returns what a cancel reason (or any error text of the server)
// means.
func Classify(reason string) Kind {
	lower := strings.ToLower(reason)
	for _, r := range reasons {
		if strings.Contains(lower, r.fragment) {
			return r.kind
		}
	}
	return Other
}

// NoLeader reports whether a stream was refused or ended because its member
// had no leader (etcd's ErrGRPCNoLeader, sent to streams that require one
// as a plain Unavailable status).
func NoLeader(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && strings.Contains(s.Message(), "no leader")
}

// WaitsForReady reports whether opts make an RPC wait for a ready
// connection (grpc.WaitForReady(true)) rather than fail fast; the last
// such option wins.
func WaitsForReady(opts []grpc.CallOption) bool {
	ready := false
	for _, o := range opts {
		if ff, ok := o.(grpc.FailFastCallOption); ok {
			ready = !ff.FailFast
		}
	}
	return ready
}
