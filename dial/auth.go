package dial

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// ErrAuthFailed: the server refused the user name or password given with
// WithPassword. Such an error also matches etcdwatch.ErrUnauthenticated.
var ErrAuthFailed = errors.New("etcdwatch: authentication failed")

// WithPassword makes New authenticate as user with etcd's Auth RPC and
// attach the token it gets to every RPC on the connection (the "token"
// metadata etcd reads). The first RPC, typically a Stream's Watch stream,
// authenticates; a token the server refuses as invalid or expired ("invalid
// auth token"), or as older than the last change to users and roles, is
// replaced by a new one on the next RPC. So a Stream's watches carry on
// across token expiry: the create that met the old token is tried once
// more on a new stream, which carries the new token, and every other watch
// resumes on it from its next revision, nothing lost. A token no RPC has
// been served with yet, refused by a member other than the one that issued
// it within 3 s of its issue, is kept: that member has yet to apply it
// (etcd numbers a simple token by the consistent index, which can be behind
// the entry that issued it), and a new token could meet the same race; the
// Watch stream then fails as Unavailable, to be opened again with it (at
// most 10 times a token). A unary RPC refused for its token is tried once
// more with a new one. An RPC that waits for a
// ready connection (grpc.WaitForReady, given to the call or as a default
// call option through WithGRPCOptions) waits for its token likewise: the
// Authenticate made for it is tried again, each time the connection is
// ready, until it succeeds, is refused, or the RPC's context ends. A
// service config's waitForReady is not seen: such an RPC fails fast while
// no token can be had. An RPC that fails for want of a token says so
// ("etcdwatch: cannot authenticate as user ...: etcdserver: no leader"),
// with the code Authenticate failed with, as the RPC would have failed
// without a password: Unavailable when the member gave no answer within
// 5 s, as one without a leader may.
//
// A wrong user name or password is final: the RPC (for a Stream, its
// first Watch stream, so every watch of the Stream) fails with an error
// matching ErrAuthFailed and etcdwatch.ErrUnauthenticated, whose gRPC code
// is Unauthenticated. A server with auth disabled is used without a token.
// Over plain text the password and token travel in clear, as with etcd's
// own client. An empty user is invalid. Default: no authentication.
func WithPassword(user, password string) Option {
	return func(s *settings) {
		s.auth = &tokenAuth{user: user, password: password, turn: make(chan struct{}, 1)}
	}
}

// authTimeout bounds one Authenticate call; authSpacing spaces out calls
// after one failed, so that a member answering at once that it cannot
// serve is not asked again in a tight loop.
const (
	authTimeout = 5 * time.Second
	authSpacing = 100 * time.Millisecond
)

// tokenAuth holds one connection's auth token. Its interceptors attach the
// token to each RPC and remember which token each Watch stream carries, so
// that when the server refuses that very token, it alone is dropped: a
// token another RPC got meanwhile is kept.
//
// One caller at a time authenticates (whoever holds turn), with an
// Authenticate that fails fast, so that the turn is held for one try and
// not for an outage; the others wait for it, each within its own context,
// and take its failure as theirs (shared) when it says the member's or the
// connection's state (passing), rather than each trying in turn: n calls
// waiting on a member without a leader would otherwise wait n
// Authenticates, one after another. token, failedAt, tries and shared are
// written by the holder of turn, under mu; known too, and cleared by
// invalidate, under mu.
type tokenAuth struct {
	user, password string
	turn           chan struct{}

	mu       sync.Mutex
	token    string     // "" with known: the server has auth disabled
	known    bool       // token may be used
	failedAt time.Time  // when the last Authenticate failed (not cut short by its caller)
	refused  *authError // the server refused the user or password: final, every RPC gets it
	tries    uint64     // Authenticate calls made so far
	fresh    freshToken // what tells a member's lag from token's death (refusedFresh)
	shared   error      // the last one's failure, for the callers that waited for it (nil: it succeeded, its own caller's context ended, or it failed for a reason of its own call, not passing)
}

// current returns the token if it may be used, or the final refusal of the
// user or password.
func (a *tokenAuth) current() (string, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refused != nil {
		return "", false, a.refused
	}
	return a.token, a.known, nil
}

// get returns a token to use, authenticating if there is none. A refused
// user or password is asked for once: every RPC after gets that refusal
// (the Stream's release probe and its first Watch stream race for it).
// For an RPC that waits for a ready connection (grpc.WaitForReady, given
// to the call or as a default call option), Authenticate is tried again
// while it fails for a reason that may pass (see passing), until ctx ends:
// each time once the connection is ready (awaitReady, outside the turn),
// and spaced (getOnce).
func (a *tokenAuth) get(ctx context.Context, cc *grpc.ClientConn, opts []grpc.CallOption) (string, error) {
	ready := rpcerr.WaitsForReady(opts)
	for {
		tok, err := a.getOnce(ctx, cc)
		switch {
		case err == nil || !ready || !passing(err):
			return tok, err
		case ctx.Err() != nil: // it ended while the RPC waited: the RPC's own error, as gRPC gives a waiting one
			return "", status.FromContextError(ctx.Err()).Err()
		}
		awaitReady(ctx, cc)
	}
}

// awaitReady returns once cc is ready, shut down, or ctx ends, connecting
// an idle cc: as an RPC that waits for a ready connection would wait.
func awaitReady(ctx context.Context, cc *grpc.ClientConn) {
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready, connectivity.Shutdown:
			return
		case connectivity.Idle:
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, st) {
			return
		}
	}
}

// passing reports whether Authenticate failed for a reason a later try may
// not meet: no connection or no leader (Unavailable), a member not ready
// (FailedPrecondition, as a learner answers), or authTimeout spent waiting.
// Not a refusal, nor a closed connection (Canceled, as gRPC answers on one).
func passing(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.FailedPrecondition, codes.DeadlineExceeded:
		return true
	}
	return false
}

// testHookAwaitTurn, set by tests only, is called by each caller of
// getOnce about to wait for the turn, once it has noted tries: an
// Authenticate that ends after this call is one it waited for.
var testHookAwaitTurn func()

// getOnce is one try of get.
func (a *tokenAuth) getOnce(ctx context.Context, cc *grpc.ClientConn) (string, error) {
	if tok, ok, err := a.current(); ok || err != nil {
		return tok, err
	}
	a.mu.Lock()
	tries := a.tries
	a.mu.Unlock()
	if testHookAwaitTurn != nil {
		testHookAwaitTurn()
	}
	select {
	case a.turn <- struct{}{}:
	case <-ctx.Done():
		return "", status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-a.turn }()
	if tok, ok, err := a.current(); ok || err != nil { // another caller authenticated, or was refused, meanwhile
		return tok, err
	}
	a.mu.Lock()
	if a.tries != tries && a.shared != nil { // an Authenticate made while this caller waited failed: its failure is this one's too
		err := a.shared
		a.mu.Unlock()
		return "", err
	}
	wait := time.Until(a.failedAt.Add(authSpacing))
	a.mu.Unlock()
	if wait > 0 {
		if err := clock.Sleep(ctx, clock.Real, wait); err != nil {
			return "", status.FromContextError(ctx.Err()).Err()
		}
	}
	tok, issuer, err := a.authenticate(ctx, cc)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tries++
	a.shared = nil
	if err != nil {
		if ctx.Err() == nil { // not cut short by its own caller
			a.failedAt = time.Now()
			if passing(err) { // the member's or the connection's state, not this call's own failure (its per-RPC credentials, say): for everyone
				a.shared = err
			}
		}
		var refused *authError
		if errors.As(err, &refused) {
			a.refused = refused
		}
		return "", err
	}
	a.token, a.known = tok, true
	a.fresh = freshToken{issuer: issuer, issuedAt: time.Now()}
	return tok, nil
}

// freshToken tells a member's lag from a token's death, for a token no
// RPC has been served with yet: a refusal by a member other than its
// issuer, soon after it was issued, is that member's lag, a few times at
// most. etcd numbers a simple token by the consistent index, which can be
// behind the entry that issued it: a member that has applied the one but
// not the other refuses the token as invalid, though it will accept it
// once it has applied its entry (the issuer has, before it answered
// Authenticate). A token that died unused (its TTL passed, or it was
// revoked) is refused by every member, and given up after lagFor or
// maxLagRefusals, or at once by its issuer. The zero value takes no
// refusal for lag.
type freshToken struct {
	issuer   uint64    // the member that issued it (its Authenticate's header); 0 if not known
	issuedAt time.Time // when its Authenticate answered
	served   bool      // an RPC carrying it has been served: every refusal is its own
	refusals int       // refusals taken for a member's lag so far
}

// lagFor and maxLagRefusals bound what freshToken takes for a member's
// lag: an apply is late by milliseconds, a second or two under load.
const (
	lagFor         = 3 * time.Second
	maxLagRefusals = 10
)

// lagging reports whether member's refusal of the token at now is that
// member's lag, and counts it if so.
func (f *freshToken) lagging(member uint64, now time.Time) bool {
	if f.served || member == 0 || f.issuer == 0 || member == f.issuer ||
		f.refusals >= maxLagRefusals || now.Sub(f.issuedAt) >= lagFor {
		return false
	}
	f.refusals++
	return true
}

// accept records that an RPC carrying tok was served.
func (a *tokenAuth) accept(tok string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known && a.token == tok {
		a.fresh.served = true
	}
}

// refusedFresh reports whether member's refusal of tok, the current token,
// as invalid (reason) is that member's lag (freshToken). Such a token is
// kept, and the stream that met the refusal fails as Unavailable, to be
// opened again, rather than the create being refused: a new token would
// meet the same race on the next member.
func (a *tokenAuth) refusedFresh(tok, reason string, member uint64) bool {
	if !rpcerr.TokenUnknown(reason) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.known && a.token == tok && tok != "" && a.fresh.lagging(member, time.Now())
}

// authenticate asks the server for a new token, failing fast without a
// ready connection. A refusal of the user or password is an *authError;
// other errors (no connection, no leader) are returned as they are, for
// the caller to try again.
func (a *tokenAuth) authenticate(ctx context.Context, cc *grpc.ClientConn) (string, uint64, error) {
	actx, cancel := context.WithTimeout(ctx, authTimeout)
	defer cancel()
	resp, err := pb.NewAuthClient(cc).Authenticate(actx, &pb.AuthenticateRequest{Name: a.user, Password: a.password}, grpc.WaitForReady(false))
	switch {
	case err == nil:
		return resp.Token, resp.GetHeader().GetMemberId(), nil
	case errors.Is(rpctypes.Error(err), rpctypes.ErrAuthNotEnabled):
		return "", 0, nil
	case ctx.Err() != nil: // the caller's own context ended: its RPC's own error
		return "", 0, status.FromContextError(ctx.Err()).Err()
	}
	// Only a wrong user or password is a refusal (etcd's ErrAuthFailed,
	// InvalidArgument). FailedPrecondition is what a learner, or a member
	// that does not know the cluster's version yet, answers on etcd 3.6+
	// (Unavailable before): another member, or a moment later, may take it.
	// etcd answers Authenticate with no Unauthenticated: that one is gRPC's
	// own, the application's per-RPC credentials having failed, and says
	// nothing of the password.
	if rpcerr.Final(err) && status.Code(err) != codes.Unauthenticated {
		return "", 0, &authError{user: a.user, reason: status.Convert(err).Message()}
	}
	return "", 0, unauthenticated(a.user, err)
}

// invalidate drops tok, if it is still the current token, after the
// server refused it.
func (a *tokenAuth) invalidate(tok string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known && a.token == tok {
		a.known = false
	}
}

// unary attaches the token to a unary RPC, and tries once more with a new
// token if the server refuses it. Authenticate itself goes without.
func (a *tokenAuth) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == pb.Auth_Authenticate_FullMethodName {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	for retried := false; ; retried = true {
		tok, err := a.get(ctx, cc, opts)
		if err != nil {
			return err
		}
		err = invoker(withToken(ctx, tok), method, req, reply, cc, opts...)
		if err == nil {
			a.accept(tok)
		}
		if err == nil || retried || !refusedToken(status.Convert(err).Message(), tok) {
			return err
		}
		a.invalidate(tok)
	}
}

// stream attaches the token to a stream, and watches it for refusals of
// that token: the stream's error (RangeStream's, say), or on a Watch
// stream a create refused for it.
func (a *tokenAuth) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	tok, err := a.get(ctx, cc, opts)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx) // ends the stream whose refusal RecvMsg turns into an error
	cs, err := streamer(withToken(sctx, tok), desc, cc, method, opts...)
	if err != nil {
		cancel()
		if refusedToken(status.Convert(err).Message(), tok) {
			a.invalidate(tok)
		}
		return cs, err
	}
	return &tokenStream{ClientStream: cs, auth: a, token: tok, cancel: cancel}, nil
}

// tokenStream is a stream that drops its token from the connection when
// the server refuses it. It does so in RecvMsg, before the caller sees the
// refusal: the caller's next RPC (a Stream's new Watch stream, a view's
// next listing) authenticates afresh. A refusal taken for a member's lag
// (refusedFresh) keeps the token instead, and ends the stream with an
// Unavailable error of its own making.
type tokenStream struct {
	grpc.ClientStream
	auth   *tokenAuth
	token  string
	served bool   // a response other than a refusal of token came: token accepted
	cancel func() // ends the stream: once RecvMsg has returned an error, the stream's own or one of its making
}

// canceledResponse is a Watch response read through the getters of etcd's
// generated *pb.WatchResponse, which a Stream's own response type has too.
type canceledResponse interface {
	GetCanceled() bool
	GetCancelReason() string
	GetHeader() *pb.ResponseHeader
}

func (s *tokenStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	var reason string
	var member uint64 // the member that refused, from the response's header
	if r, ok := m.(canceledResponse); ok && r.GetCanceled() {
		reason, member = r.GetCancelReason(), r.GetHeader().GetMemberId()
	}
	if err != nil {
		reason = status.Convert(err).Message()
	}
	switch {
	case reason != "" && refusedToken(reason, s.token):
		if err == nil && s.auth.refusedFresh(s.token, reason, member) {
			s.cancel() // the stream is not over for gRPC: its caller's error must end it
			return status.Error(codes.Unavailable, "etcdwatch: the member has yet to apply the token it refused ("+reason+")")
		}
		s.auth.invalidate(s.token)
	case err == nil && !s.served: // once per stream: not a lock per response
		s.served = true
		s.auth.accept(s.token)
	}
	if err != nil {
		s.cancel() // over: its context is let go of
	}
	return err
}

// refusedToken reports whether a server's reason refuses tok, the token
// the RPC carried: invalid or expired, or older than the auth store; or,
// for an RPC that carried none (auth was off when the connection asked),
// that it names no user. An RPC that carried a token and is told it names
// no user (an admin RPC given an empty user name) keeps its token.
func refusedToken(reason, tok string) bool {
	switch rpcerr.Classify(reason) {
	case rpcerr.Unauthenticated:
		return true
	case rpcerr.NoUser:
		return tok == ""
	}
	return false
}

func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, tok)
}

// authError is a user name or password the server refused. It matches
// ErrAuthFailed and etcdwatch.ErrUnauthenticated, and its gRPC code is
// Unauthenticated, which ends a Stream's watches rather than retrying.
type authError struct {
	user, reason string
}

func (e *authError) Error() string {
	return "etcdwatch: authentication failed for user " + e.user + ": " + e.reason
}

func (e *authError) Unwrap() []error { return []error{ErrAuthFailed, etcdwatch.ErrUnauthenticated} }

// GRPCStatus gives the error's gRPC code, for status.Code and the Stream.
func (e *authError) GRPCStatus() *status.Status { return status.New(codes.Unauthenticated, e.Error()) }

// authUnavailable is an Authenticate that failed but for a refusal: the RPC
// that needed the token fails with it, and says so. It has the failure's
// gRPC code (Unavailable for no leader or no connection, say), so that
// the RPC fails as it would have without a password; but Unavailable when
// authTimeout ran out, the RPC's own context not ended (a member without a
// leader keeps Authenticate waiting): that RPC exceeded no deadline of its
// own. It unwraps to the failure.
type authUnavailable struct {
	user   string
	code   codes.Code
	reason string
	err    error
}

// unauthenticated returns err, the failure of user's Authenticate, as an
// *authUnavailable.
func unauthenticated(user string, err error) *authUnavailable {
	e := &authUnavailable{user: user, code: status.Code(err), reason: status.Convert(err).Message(), err: err}
	if e.code == codes.DeadlineExceeded {
		e.code, e.reason = codes.Unavailable, "no answer within "+authTimeout.String()
	}
	return e
}

func (e *authUnavailable) Error() string {
	return "etcdwatch: cannot authenticate as user " + e.user + ": " + e.reason
}

func (e *authUnavailable) Unwrap() error { return e.err }

// GRPCStatus gives the error's gRPC code, for status.Code and the Stream.
func (e *authUnavailable) GRPCStatus() *status.Status { return status.New(e.code, e.Error()) }
