package etcdwatch

import (
	"errors"
	"fmt"

	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrClosed is returned by Stream methods after Close, and ends every
	// watch that was still running when the Stream was closed.
	ErrClosed = errors.New("etcdwatch: stream closed")

	// ErrCanceled ends a watch whose Cancel method was called.
	ErrCanceled = errors.New("etcdwatch: watch canceled")

	// ErrInvalidRequest wraps every error returned by Request.Validate, and
	// matches a *ServerError for a request the server refused as malformed
	// or too large.
	ErrInvalidRequest = errors.New("etcdwatch: invalid request")

	// ErrInvalidArgument wraps errors for bad arguments and options: to Open,
	// to dial.New, to view.New.
	ErrInvalidArgument = errors.New("etcdwatch: invalid argument")

	// ErrCompacted matches a *CompactedError.
	ErrCompacted = errors.New("etcdwatch: required revision has been compacted")

	// ErrPermissionDenied: the server refused the watch for lack of permission.
	ErrPermissionDenied = errors.New("etcdwatch: permission denied")

	// ErrUnauthenticated: the server refused the watch's credentials (invalid
	// auth token, old auth revision, empty user name).
	ErrUnauthenticated = errors.New("etcdwatch: unauthenticated")

	// ErrServerCanceled matches a *ServerError whose reason is not one of the
	// classified ones above.
	ErrServerCanceled = errors.New("etcdwatch: watch canceled by server")

	// ErrStreamFailed ends the watches of a Stream whose gRPC stream broke;
	// the error also wraps the gRPC error (use status.FromError on it).
	ErrStreamFailed = errors.New("etcdwatch: watch stream failed")

	// ErrCreateTimeout fails a Watch, WatchAll or Handle call that the
	// server did not answer within WithCreateTimeout.
	ErrCreateTimeout = errors.New("etcdwatch: watch not confirmed in time")

	// ErrProgressUnsupported is returned by RequestProgress on an etcd whose
	// progress answers can run ahead of its events (etcd #15220:
	// 3.4.0-3.4.24 and 3.5.0-3.5.7).
	ErrProgressUnsupported = errors.New("etcdwatch: progress requests unsupported by this etcd")

	// ErrNoWatches is returned by RequestProgress on a Stream without live
	// watches, at once: etcd never answers such a request, on any release.
	ErrNoWatches = errors.New("etcdwatch: no watches on the stream")
)

// CompactedError ends a watch whose next revision was compacted away: the
// changes from Revision to CompactRevision-1 can no longer be watched. To carry
// on, read the keys with a Range (which reports its revision R), then watch
// again FromRevision(R+1). It matches ErrCompacted.
type CompactedError struct {
	CompactRevision int64  // the oldest revision the server still has: a watch may start there
	Revision        int64  // the revision the watch needed next
	Header          Header // of the server's response that ended the watch (etcd sends Revision 0 there)
}

// Error says which revision the watch needed and where history now starts.
func (e *CompactedError) Error() string {
	return fmt.Sprintf("etcdwatch: watch needs revision %d; history starts at %d", e.Revision, e.CompactRevision)
}

// Is reports whether target is ErrCompacted.
func (e *CompactedError) Is(target error) bool { return target == ErrCompacted }

// ServerError is a create refused or a watch canceled by the server, or
// another request of the Stream's or of a wing's (a view's Range) that it
// refused, with the server's reason. It unwraps to the sentinel its reason
// means: ErrPermissionDenied, ErrUnauthenticated, ErrInvalidRequest,
// ErrCompacted (a create refused as compacted, without a compact
// revision) or, for any other reason, ErrServerCanceled.
type ServerError struct {
	Reason string // as the server sent it (cancel_reason, or a status message); may be empty
}

// Error is the sentinel's text and the server's reason.
func (e *ServerError) Error() string {
	if e.Reason == "" {
		return e.Unwrap().Error()
	}
	return e.Unwrap().Error() + ": " + e.Reason
}

// Unwrap returns the sentinel the reason means.
func (e *ServerError) Unwrap() error { return reasonKinds[rpcerr.Classify(e.Reason)] }

// RequestError is the error of WatchAll or Handle, or of a group's
// WatchAll, that concerns one of its requests: invalid (Err wraps
// ErrInvalidRequest) or refused by the server (a *ServerError). Err is what
// Watch would have returned for that request alone; errors.Is and
// errors.As see through to it.
type RequestError struct {
	Index   int     // the request's index in the call's requests
	Of      int     // how many requests the call had
	Request Request // the request itself
	Err     error
}

// Error names the request by its index and its keys, then Err.
func (e *RequestError) Error() string {
	return fmt.Sprintf("request %d of %d (%s): %v", e.Index, e.Of, e.Request, e.Err)
}

// Unwrap returns Err.
func (e *RequestError) Unwrap() error { return e.Err }

// classifyReason turns a server cancel reason into a *ServerError. The
// text is read in internal/rpcerr, the one place that reads the server's.
func classifyReason(reason string) *ServerError {
	return &ServerError{Reason: reason}
}

// reasonKinds maps what rpcerr made of a reason to the sentinel it matches.
var reasonKinds = [...]error{
	rpcerr.Other:            ErrServerCanceled,
	rpcerr.PermissionDenied: ErrPermissionDenied,
	rpcerr.Unauthenticated:  ErrUnauthenticated,
	rpcerr.NoUser:           ErrUnauthenticated,
	rpcerr.InvalidRequest:   ErrInvalidRequest,
	rpcerr.Compacted:        ErrCompacted,
}

// streamError wraps the error that ended a gRPC stream.
func streamError(err error) error {
	return fmt.Errorf("%w: %w", ErrStreamFailed, err)
}
