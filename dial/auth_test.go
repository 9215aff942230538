package dial_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
)

// authServer is a fake etcd with auth on a loopback port: Authenticate
// hands out tok1, tok2, ... for the right password; Watch confirms a create
// only under a valid token and otherwise refuses it as etcd does (id -1,
// "invalid auth token"); Range answers under a valid token. expire makes
// every token so far invalid.
type authServer struct {
	pb.UnimplementedAuthServer
	pb.UnimplementedWatchServer
	pb.UnimplementedKVServer
	addr     string
	password string
	disabled bool // auth not enabled
	learner  int  // Authenticate calls still to be answered as an etcd 3.6+ learner does; guarded by mu
	// lagging is how many Watch creates under a valid token are still to be
	// refused as invalid, as a member that has yet to apply the token's
	// Authenticate does, with refuser as the member in the refusal's
	// header; Authenticate is answered as member 1. Guarded by mu.
	lagging int
	refuser uint64

	mu      sync.Mutex
	issued  int
	valid   map[string]bool
	streams []string // the token each Watch stream carried, in order
	ranges  []string // the token each Range carried
}

func startAuthServer(t *testing.T, password string) *authServer {
	t.Helper()
	a := &authServer{password: password, valid: map[string]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a.addr = lis.Addr().String()
	srv := grpc.NewServer()
	pb.RegisterAuthServer(srv, a)
	pb.RegisterWatchServer(srv, a)
	pb.RegisterKVServer(srv, a)
	serve(t, srv, lis)
	return a
}

func (a *authServer) Authenticate(_ context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.disabled:
		return nil, rpctypes.ErrGRPCAuthNotEnabled
	case a.learner > 0:
		a.learner--
		return nil, rpctypes.ErrGRPCNotSupportedForLearner // FailedPrecondition
	case r.Name != "alice" || r.Password != a.password:
		return nil, rpctypes.ErrGRPCAuthFailed
	}
	a.issued++
	tok := fmt.Sprintf("tok%d", a.issued)
	a.valid[tok] = true
	return &pb.AuthenticateResponse{Header: &pb.ResponseHeader{MemberId: 1}, Token: tok}, nil
}

// lags reports whether a create under a valid token is to be refused as a
// lagging member refuses it, and by which member.
func (a *authServer) lags() (uint64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lagging == 0 {
		return 0, false
	}
	a.lagging--
	return a.refuser, true
}

func (a *authServer) expire() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.valid)
}

func (a *authServer) authenticated() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.issued
}

func token(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("token"); len(v) == 1 {
		return v[0]
	}
	return ""
}

// RangeStream answers as etcd 3.7 does: one message, or, under a token it
// does not take, the refusal on the first Recv.
func (a *authServer) RangeStream(_ *pb.RangeRequest, rs pb.KV_RangeStreamServer) error {
	if !a.allowed(token(rs.Context())) {
		return rpctypes.ErrGRPCInvalidAuthToken
	}
	return rs.Send(&pb.RangeStreamResponse{RangeResponse: &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 1}}})
}

// allowed reports whether tok may be used.
func (a *authServer) allowed(tok string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.disabled || a.valid[tok]
}

func (a *authServer) Watch(srv pb.Watch_WatchServer) error {
	tok := token(srv.Context())
	a.mu.Lock()
	a.streams = append(a.streams, tok)
	a.mu.Unlock()
	for {
		req, err := srv.Recv()
		if err != nil {
			return nil
		}
		var resp *pb.WatchResponse
		member, lags := uint64(0), false
		if req.GetCreateRequest() != nil && a.allowed(tok) {
			member, lags = a.lags()
		}
		switch {
		case lags:
			resp = &pb.WatchResponse{Header: &pb.ResponseHeader{MemberId: member, Revision: 1}, WatchId: -1, Created: true, Canceled: true,
				CancelReason: rpctypes.ErrGRPCInvalidAuthToken.Error()}
		case req.GetCreateRequest() != nil && a.allowed(tok):
			resp = &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 1}, WatchId: req.GetCreateRequest().WatchId, Created: true}
		case req.GetCreateRequest() != nil:
			resp = &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 1}, WatchId: -1, Created: true, Canceled: true,
				CancelReason: rpctypes.ErrGRPCInvalidAuthToken.Error()}
		case req.GetCancelRequest() != nil:
			resp = &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 1}, WatchId: req.GetCancelRequest().WatchId, Canceled: true}
		default:
			continue
		}
		if err := srv.Send(resp); err != nil {
			return nil
		}
	}
}

func (a *authServer) Range(ctx context.Context, _ *pb.RangeRequest) (*pb.RangeResponse, error) {
	tok := token(ctx)
	a.mu.Lock()
	a.ranges = append(a.ranges, tok)
	a.mu.Unlock()
	switch {
	case a.allowed(tok):
		return &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 1}}, nil
	case tok == "":
		return nil, rpctypes.ErrGRPCUserEmpty // as etcd answers a request without a token once auth is on
	}
	return nil, rpctypes.ErrGRPCInvalidAuthToken
}

func (a *authServer) seen() (streams, ranges []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.streams...), append([]string(nil), a.ranges...)
}

func dialAuth(t *testing.T, a *authServer, password string) *grpc.ClientConn {
	t.Helper()
	conn, err := dial.New([]string{a.addr}, dial.WithInsecure(), dial.WithPassword("alice", password))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	return conn
}

// TestAuthTokenRenewedWhenRefused: the Watch stream carries the token; once
// the server refuses it, the refused create is tried on a new stream that
// carries a new one, the watch already open resumes there, and only one
// more Authenticate is made. A unary RPC refused for its token is tried
// once more with a new one.
func TestAuthTokenRenewedWhenRefused(t *testing.T) {
	a := startAuthServer(t, "pw")
	conn := dialAuth(t, a, "pw")
	s, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	first, err := s.Watch(ctx, etcdwatch.Key("a"))
	require.NoError(t, err)
	streams, _ := a.seen()
	require.Equal(t, []string{"tok1"}, streams)

	a.expire()
	_, err = s.Watch(ctx, etcdwatch.Key("b"))
	require.NoError(t, err)
	streams, _ = a.seen()
	require.Equal(t, []string{"tok1", "tok2"}, streams)
	require.Equal(t, 2, a.authenticated())
	require.Eventually(t, func() bool { return s.Stats().Moved == 1 }, wait, time.Millisecond, "the first watch resumed on the new stream")
	require.NoError(t, first.Err())

	kv := pb.NewKVClient(conn)
	_, err = kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")})
	require.NoError(t, err)
	a.expire()
	_, err = kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")})
	require.NoError(t, err)
	_, ranges := a.seen()
	require.Equal(t, []string{"tok2", "tok2", "tok3"}, ranges)
	require.Equal(t, 3, a.authenticated())
}

// TestAuthWrongPassword: a refused password fails the first Watch with an
// error matching dial.ErrAuthFailed (and ErrUnauthenticated), which says why.
func TestAuthWrongPassword(t *testing.T) {
	a := startAuthServer(t, "pw")
	conn := dialAuth(t, a, "wrong")
	s, err := etcdwatch.Open(conn)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Watch(t.Context(), etcdwatch.Key("a"))
	require.ErrorIs(t, err, dial.ErrAuthFailed)
	require.ErrorIs(t, err, etcdwatch.ErrUnauthenticated)
	require.ErrorIs(t, err, etcdwatch.ErrStreamFailed)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.ErrorContains(t, err, "authentication failed for user alice: etcdserver: authentication failed, invalid user ID or password")
	require.Equal(t, 0, a.authenticated())
	streams, _ := a.seen()
	require.Empty(t, streams, "no Watch stream without a token")

	_, err = pb.NewKVClient(conn).Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.ErrorIs(t, err, dial.ErrAuthFailed)
	require.ErrorIs(t, err, etcdwatch.ErrUnauthenticated)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
}

// TestAuthNotEnabled: a server with auth disabled is used without a token.
func TestAuthNotEnabled(t *testing.T) {
	a := startAuthServer(t, "pw")
	a.disabled = true
	s, err := etcdwatch.Open(dialAuth(t, a, "pw"))
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Watch(t.Context(), etcdwatch.Key("a"))
	require.NoError(t, err)
	streams, _ := a.seen()
	require.Equal(t, []string{""}, streams)
}

// TestAuthEnabledAfterTheConnectionAsked: a connection that learned that
// auth was off sends no token; once auth is on, the server answers such an
// RPC that it names no user, and the connection authenticates and tries
// it again with a token. Catches: "user name is empty" not taken as a
// refusal of the missing token, every RPC failing until the process
// restarts.
func TestAuthEnabledAfterTheConnectionAsked(t *testing.T) {
	a := startAuthServer(t, "pw")
	a.mu.Lock()
	a.disabled = true
	a.mu.Unlock()
	kv := pb.NewKVClient(dialAuth(t, a, "pw"))
	_, err := kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.NoError(t, err)
	a.mu.Lock()
	a.disabled = false
	a.mu.Unlock()
	_, err = kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.NoError(t, err)
	_, ranges := a.seen()
	require.Equal(t, []string{"", "", "tok1"}, ranges, "without a token, refused for it, then with one")
}

// TestAuthTokenDroppedForGeneratedClient: a Watch stream of etcd's
// generated client, not a Stream's, also drops a token the server refuses
// for a create, so the next stream carries a new one.
func TestAuthTokenDroppedForGeneratedClient(t *testing.T) {
	a := startAuthServer(t, "pw")
	conn := dialAuth(t, a, "pw")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	watch := pb.NewWatchClient(conn)
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}}

	first, err := watch.Watch(ctx)
	require.NoError(t, err)
	a.expire()
	require.NoError(t, first.Send(create))
	resp, err := first.Recv()
	require.NoError(t, err)
	require.True(t, resp.Canceled, "the server refused the create")
	require.Equal(t, rpctypes.ErrGRPCInvalidAuthToken.Error(), resp.CancelReason)

	second, err := watch.Watch(ctx)
	require.NoError(t, err)
	require.NoError(t, second.Send(create))
	resp, err = second.Recv()
	require.NoError(t, err)
	require.False(t, resp.Canceled, "the create on a new token: %s", resp.CancelReason)
	streams, _ := a.seen()
	require.Equal(t, []string{"tok1", "tok2"}, streams)
	require.Equal(t, 2, a.authenticated())
}

// TestAuthTokenDroppedFromAStream: a server-streaming RPC (RangeStream, as
// views list on etcd 3.7) refused for its token drops it, as a unary RPC
// or a Watch create does: the next RPC authenticates afresh. Catches: a
// token that expired refusing every later RangeStream.
func TestAuthTokenDroppedFromAStream(t *testing.T) {
	a := startAuthServer(t, "pw")
	kv := pb.NewKVClient(dialAuth(t, a, "pw"))
	list := func() error {
		rs, err := kv.RangeStream(t.Context(), &pb.RangeRequest{Key: []byte("v/")})
		if err != nil {
			return err
		}
		_, err = rs.Recv()
		return err
	}
	require.NoError(t, list())
	a.expire() // its TTL passed
	require.Equal(t, codes.Unauthenticated, status.Code(list()), "the stream's own refusal")
	require.NoError(t, list(), "the next stream carries a new token")
	require.Equal(t, 2, a.authenticated())
}

// TestAuthLearnerIsNoRefusal: an Authenticate answered by a learner (or a
// member that does not know the cluster's version yet), FailedPrecondition
// on etcd 3.6+, is not a wrong password: the next RPC authenticates again.
// Catches: the connection failing with ErrAuthFailed for good.
func TestAuthLearnerIsNoRefusal(t *testing.T) {
	a := startAuthServer(t, "pw")
	a.mu.Lock()
	a.learner = 1
	a.mu.Unlock()
	kv := pb.NewKVClient(dialAuth(t, a, "pw"))
	_, err := kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.Error(t, err)
	require.NotErrorIs(t, err, dial.ErrAuthFailed)
	_, err = kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.NoError(t, err, "authenticated again (after authSpacing)")
}

// TestAuthWaitsForReadyWithTheCall: an RPC made with grpc.WaitForReady
// while no member can be reached waits for one, with WithPassword as
// without: the Authenticate made for it waits too, and the RPC succeeds
// once the member is up. Catches: an Authenticate that fails fast and
// fails the waiting RPC with Unavailable.
func TestAuthWaitsForReadyWithTheCall(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())          // the member is down for now
	asked := make(chan []grpc.CallOption, 1) // the options of the first Authenticate
	spy := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == pb.Auth_Authenticate_FullMethodName {
			select {
			case asked <- opts:
			default:
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn, err := dial.New([]string{addr}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	conn.Connect()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	for s := conn.GetState(); s != connectivity.TransientFailure; s = conn.GetState() {
		require.True(t, conn.WaitForStateChange(ctx, s), "the channel never failed to connect")
	}

	res := make(chan error, 1)
	go func() { // exits when the Range returns, within ctx
		_, err := pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("a")}, grpc.WaitForReady(true))
		res <- err
	}()
	var opts []grpc.CallOption
	select {
	case opts = <-asked:
	case err := <-res:
		t.Fatalf("the Range returned before Authenticate was asked: %v", err)
	case <-ctx.Done():
		t.Fatal("Authenticate was never asked")
	}
	select {
	case err := <-res:
		t.Fatalf("the Range did not wait for the member: %v", err)
	default:
	}
	a := &authServer{password: "pw", valid: map[string]bool{}, addr: addr}
	lis, err = net.Listen("tcp", addr) // the member comes back
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterAuthServer(srv, a)
	pb.RegisterKVServer(srv, a)
	serve(t, srv, lis)
	require.NoError(t, <-res)
	require.Contains(t, opts, grpc.CallOption(grpc.WaitForReady(false)), "Authenticate fails fast: the call waits between tries, outside the auth turn")
	require.Equal(t, 1, a.authenticated())
}

// TestAuthWaitingCallHoldsNoOneUp: while an RPC that waits for a ready
// connection waits for its token through an outage, a fail-fast RPC on the
// same connection still fails fast (Unavailable), as it would without
// WithPassword. It used to wait for the other's Authenticate, which waited
// for the connection for up to 5 s (authTimeout) holding the auth turn; the
// Stream's release probe is such an RPC, so every Stream on a connection
// with a password held its first report of the outage for that long.
func TestAuthWaitingCallHoldsNoOneUp(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // the member is down
	asked := make(chan struct{}, 1)
	var timedOut atomic.Int32 // Authenticate calls that ended waiting
	spy := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == pb.Auth_Authenticate_FullMethodName {
			if status.Code(err) == codes.DeadlineExceeded {
				timedOut.Add(1)
			}
			select {
			case asked <- struct{}{}:
			default:
			}
		}
		return err
	}
	conn, err := dial.New([]string{addr}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	kv := pb.NewKVClient(conn)
	waiting, stop := context.WithCancel(t.Context())
	res := make(chan error, 1)
	go func() { // until stop
		_, err := kv.Range(waiting, &pb.RangeRequest{Key: []byte("a")}, grpc.WaitForReady(true))
		res <- err
	}()
	defer func() {
		stop()
		require.Equal(t, codes.Canceled, status.Code(<-res))
	}()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	select {
	case <-asked: // the waiting RPC has had its first try
	case <-ctx.Done():
		t.Fatal("Authenticate was never asked")
	}
	_, err = kv.Range(ctx, &pb.RangeRequest{Key: []byte("b")})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Zero(t, timedOut.Load(), "an Authenticate waited for the connection until it timed out")
}

// userAdmin is a fake etcd whose Authenticate always succeeds, and whose
// UserAdd refuses an empty name as etcd does (ErrGRPCUserEmpty).
type userAdmin struct {
	pb.UnimplementedAuthServer
	mu     sync.Mutex
	issued int
}

func (s *userAdmin) Authenticate(context.Context, *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.issued++
	return &pb.AuthenticateResponse{Token: fmt.Sprint("tok", s.issued)}, nil
}

func (s *userAdmin) UserAdd(_ context.Context, r *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	if r.Name == "" {
		return nil, rpctypes.ErrGRPCUserEmpty
	}
	return &pb.AuthUserAddResponse{}, nil
}

// TestAuthKeepsTheTokenOnAnEmptyUserName: an RPC that carried a token and
// is told "user name is empty" (an admin RPC given an empty name) keeps
// its token: no Authenticate again. Catches: the reason taken for a
// refused token, the token dropped and asked for again at every such call.
func TestAuthKeepsTheTokenOnAnEmptyUserName(t *testing.T) {
	s := &userAdmin{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterAuthServer(srv, s)
	serve(t, srv, lis)
	conn, err := dial.New([]string{lis.Addr().String()}, dial.WithInsecure(), dial.WithPassword("alice", "pw"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	auth := pb.NewAuthClient(conn)
	_, err = auth.UserAdd(t.Context(), &pb.AuthUserAddRequest{Name: "bob"})
	require.NoError(t, err)
	for range 3 {
		_, err = auth.UserAdd(t.Context(), &pb.AuthUserAddRequest{Name: ""})
		require.ErrorContains(t, err, "user name is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, 1, s.issued, "Authenticate calls")
}

// TestAuthWaitForReadyEndsWithTheConnection: an RPC that waits for a ready
// connection, on a connection closed before it had a token, fails with
// the closed connection's Canceled after one Authenticate, as it would
// without WithPassword. Catches: Authenticate tried again and again,
// every 100 ms, until the RPC's context ends.
func TestAuthWaitForReadyEndsWithTheConnection(t *testing.T) {
	a := startAuthServer(t, "pw")
	asked, spy := counting(pb.Auth_Authenticate_FullMethodName)
	conn, err := dial.New([]string{a.addr}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy)))
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	_, err = pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("a")}, grpc.WaitForReady(true))
	require.Equal(t, codes.Canceled, status.Code(err), "the closed connection's error: %v", err)
	require.EqualValues(t, 1, asked.Load(), "Authenticate calls")
}

// failingOnce is per-RPC credentials whose first call fails, as a token
// source of the application's own might once.
type failingOnce struct{ calls atomic.Int64 }

func (c *failingOnce) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if c.calls.Add(1) == 1 {
		return nil, errors.New("token source unavailable (scripted)")
	}
	return nil, nil
}

func (c *failingOnce) RequireTransportSecurity() bool { return false }

// TestAuthClientSideUnauthenticatedIsNotARefusal: an Authenticate that
// fails with an Unauthenticated gRPC made itself (the application's own
// per-RPC credentials failed) fails that RPC only; the next authenticates.
// etcd refuses a wrong password with InvalidArgument. Catches: the
// connection refused for good as if the password were wrong.
func TestAuthClientSideUnauthenticatedIsNotARefusal(t *testing.T) {
	a := startAuthServer(t, "pw")
	conn, err := dial.New([]string{a.addr}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithPerRPCCredentials(&failingOnce{})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	kv := pb.NewKVClient(conn)
	_, err = kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.NotErrorIs(t, err, dial.ErrAuthFailed, "not a refused password")
	_, err = kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
	require.NoError(t, err)
}

// leaderlessAuth is a member without a leader: every Authenticate fails
// with "no leader" (Unavailable), the first only once the test releases it,
// as a member holds a call while it waits for a leader.
type leaderlessAuth struct {
	pb.UnimplementedAuthServer
	entered, release chan struct{}
	mu               sync.Mutex
	asked            int
}

func (s *leaderlessAuth) Authenticate(ctx context.Context, _ *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	s.mu.Lock()
	s.asked++
	first := s.asked == 1
	s.mu.Unlock()
	if first {
		close(s.entered)
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	}
	return nil, rpctypes.ErrGRPCNoLeader
}

func (s *leaderlessAuth) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked
}

// TestAuthConcurrentCallsShareAFailedAuthenticate: RPCs made while an
// Authenticate is under way wait for it and share its outcome, failure
// included: n fail-fast RPCs that all need a token while the member cannot
// issue one cost one Authenticate, and all fail as soon as it does, as they
// would without WithPassword. Catches: each waiting RPC making its own
// Authenticate in turn, one after another, authSpacing (and a whole
// Authenticate) apart, so that the last of n fails n Authenticates late.
func TestAuthConcurrentCallsShareAFailedAuthenticate(t *testing.T) {
	s := &leaderlessAuth{entered: make(chan struct{}), release: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterAuthServer(srv, s)
	serve(t, srv, lis)
	var waiting atomic.Int64 // RPCs that have noted the Authenticates made so far and wait for their turn
	dial.OnAwaitAuthTurn(t, func() { waiting.Add(1) })
	conn, err := dial.New([]string{lis.Addr().String()}, dial.WithInsecure(), dial.WithPassword("alice", "pw"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	kv := pb.NewKVClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()

	const n = 10
	res := make(chan error, n)
	call := func() { // returns within ctx
		_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")})
		res <- err
	}
	go call()
	select {
	case <-s.entered: // the first RPC's Authenticate is under way
	case <-ctx.Done():
		t.Fatal("Authenticate was never asked")
	}
	for range n - 1 {
		go call()
	}
	// Every RPC waits for the Authenticate under way. Counted as it
	// reached an interceptor of the application's, an RPC could note the
	// Authenticates made only after that one had failed, and make its own
	// (1 run in 25 to 300).
	require.Eventually(t, func() bool { return waiting.Load() == n }, wait, time.Millisecond, "every RPC waiting for the Authenticate")
	close(s.release)
	start := time.Now()
	for range n {
		err := <-res
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		require.Equal(t, "etcdwatch: cannot authenticate as user alice: etcdserver: no leader", status.Convert(err).Message(), "the RPC's error says it had no token, and why")
	}
	t.Logf("%d concurrent RPCs: %d Authenticate calls; the last failed %v after the first Authenticate did", n, s.calls(), time.Since(start))
	require.Equal(t, 1, s.calls(), "Authenticate calls for %d RPCs waiting together", n)
}

// heldFailingOnce is per-RPC credentials whose first call, the first
// Authenticate's, fails once the test releases it, as a token source of
// the application's own might once; every later call succeeds.
type heldFailingOnce struct {
	calls            atomic.Int64
	entered, release chan struct{}
}

func (c *heldFailingOnce) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if c.calls.Add(1) == 1 {
		close(c.entered)
		<-c.release
		return nil, errors.New("token source unavailable (scripted)")
	}
	return nil, nil
}

func (c *heldFailingOnce) RequireTransportSecurity() bool { return false }

// TestAuthClientSideFailureIsNotShared: an Authenticate that fails with
// an Unauthenticated gRPC made itself (the application's own per-RPC
// credentials failed for that call) fails that RPC only, as
// TestAuthClientSideUnauthenticatedIsNotARefusal has it; an RPC that
// waited for it meanwhile authenticates on its own, and succeeds. Taken
// as the server's answer (shared), it fails too: on a Stream, a Watch
// stream that waited for its release probe's Authenticate would end every
// watch for good (Unauthenticated is final there).
func TestAuthClientSideFailureIsNotShared(t *testing.T) {
	a := startAuthServer(t, "pw")
	creds := &heldFailingOnce{entered: make(chan struct{}), release: make(chan struct{})}
	var waiting atomic.Int64 // as in TestAuthConcurrentCallsShareAFailedAuthenticate
	dial.OnAwaitAuthTurn(t, func() { waiting.Add(1) })
	conn, err := dial.New([]string{a.addr}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithPerRPCCredentials(creds)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	kv := pb.NewKVClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()

	first, second := make(chan error, 1), make(chan error, 1)
	go func() { _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")}); first <- err }()
	select {
	case <-creds.entered: // the first RPC's Authenticate is under way
	case <-ctx.Done():
		t.Fatal("Authenticate was never asked")
	}
	go func() { _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("b")}); second <- err }()
	require.Eventually(t, func() bool { return waiting.Load() == 2 }, wait, time.Millisecond, "the second RPC waiting for the first's Authenticate")
	close(creds.release)
	require.Equal(t, codes.Unauthenticated, status.Code(<-first), "the RPC whose credentials failed")
	require.NoError(t, <-second, "the RPC that waited for it: a client-side failure of another call is not the server's answer")
}

// counting returns an interceptor that counts the calls of method, and
// the count.
func counting(method string) (*atomic.Int64, grpc.UnaryClientInterceptor) {
	var n atomic.Int64
	return &n, func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if m == method {
			n.Add(1)
		}
		return invoker(ctx, m, req, reply, cc, opts...)
	}
}

// TestAuthFreshTokenRefusedByALaggingMemberIsKept: etcd numbers a simple
// token by its consistent index, which can be behind the entry that
// issued it, so a member that has yet to apply a token's Authenticate
// refuses the token as invalid. A token no RPC has been served with yet,
// refused so by a member other than the one that issued it, is kept: the
// Watch stream fails as Unavailable, to be opened again with it. Catches a
// new token taken instead, which the next lagging member can refuse too:
// a Stream retries a create refused for its credentials once, and its
// watch then ended (e2e TestTokenExpiryOverTLS, about 1 run in 10 under
// load). Found by a flake audit.
func TestAuthFreshTokenRefusedByALaggingMemberIsKept(t *testing.T) {
	a := startAuthServer(t, "pw")
	a.lagging, a.refuser = 1, 2
	watch := pb.NewWatchClient(dialAuth(t, a, "pw"))
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}}
	open := func() (*pb.WatchResponse, error) {
		ws, err := watch.Watch(t.Context())
		require.NoError(t, err)
		require.NoError(t, ws.Send(create))
		return ws.Recv()
	}
	_, err := open()
	require.Equal(t, codes.Unavailable, status.Code(err), "a lagging member's refusal of a fresh token: %v", err)
	resp, err := open()
	require.NoError(t, err)
	require.False(t, resp.Canceled, "the create on the same token: %s", resp.CancelReason)
	streams, _ := a.seen()
	require.Equal(t, []string{"tok1", "tok1"}, streams)
	require.Equal(t, 1, a.authenticated())
}

// TestAuthTokenRefusedByItsIssuerOrOnceServedIsDropped: a refusal of a
// fresh token by the member that issued it, or of a token an RPC has been
// served with, is the token's own: it is dropped as before, and the
// refusal reaches the caller.
func TestAuthTokenRefusedByItsIssuerOrOnceServedIsDropped(t *testing.T) {
	a := startAuthServer(t, "pw")
	a.lagging, a.refuser = 1, 1 // the issuer
	watch := pb.NewWatchClient(dialAuth(t, a, "pw"))
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}}
	open := func() *pb.WatchResponse {
		ws, err := watch.Watch(t.Context())
		require.NoError(t, err)
		require.NoError(t, ws.Send(create))
		resp, err := ws.Recv()
		require.NoError(t, err)
		return resp
	}
	require.True(t, open().Canceled, "refused by its issuer")
	require.False(t, open().Canceled, "a new token")
	require.Equal(t, 2, a.authenticated())
	a.mu.Lock()
	a.lagging, a.refuser = 1, 2 // another member, but tok2 was served
	a.mu.Unlock()
	require.True(t, open().Canceled, "refused once served")
	require.False(t, open().Canceled, "a new token")
	streams, _ := a.seen()
	require.Equal(t, []string{"tok1", "tok2", "tok2", "tok3"}, streams)
}

// downMember returns the address of a member that is down: nothing
// listens there.
func downMember(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// answered returns an interceptor that signals on the channel it returns
// each time an Authenticate has been answered (its error), without
// blocking.
func answered() (chan error, grpc.UnaryClientInterceptor) {
	ch := make(chan error, 1)
	return ch, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == pb.Auth_Authenticate_FullMethodName {
			select {
			case ch <- err:
			default:
			}
		}
		return err
	}
}

// TestAuthWaitForReadyEndsAtItsDeadline: an RPC that waits for a ready
// connection, and whose deadline passes while it waits for its token
// through an outage, fails with DeadlineExceeded, as it would without
// WithPassword. Catches the wait for a token going on after the RPC's
// context ended (DeadlineExceeded taken for a failure that may pass, and
// Authenticate asked again and again, for ever).
func TestAuthWaitForReadyEndsAtItsDeadline(t *testing.T) {
	asked, spy := answered()
	conn, err := dial.New([]string{downMember(t)}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	bound, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	ctx, stop := context.WithDeadline(bound, time.Now().Add(100*time.Millisecond))
	defer stop()
	res := make(chan error, 1)
	go func() { // exits when the Range returns
		_, err := pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("a")}, grpc.WaitForReady(true))
		res <- err
	}()
	select {
	case <-asked:
	case <-bound.Done():
		t.Fatal("Authenticate was never asked")
	}
	select {
	case err := <-res:
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	case <-bound.Done():
		t.Fatal("the Range outlived its deadline")
	}
}

// TestAuthWaitForReadyEndsWhenTheConnectionCloses: an RPC that waits for
// a ready connection, waiting for its token through an outage, ends with
// the closed connection's Canceled once the connection is closed, as it
// would without WithPassword. Catches the wait for a ready connection not
// ending at Shutdown: the RPC held until its own context ends.
func TestAuthWaitForReadyEndsWhenTheConnectionCloses(t *testing.T) {
	asked, spy := answered()
	conn, err := dial.New([]string{downMember(t)}, dial.WithInsecure(), dial.WithPassword("alice", "pw"),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	res := make(chan error, 1)
	go func() { // exits when the Range returns, within ctx
		_, err := pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("a")}, grpc.WaitForReady(true))
		res <- err
	}()
	select {
	case err := <-asked:
		require.Equal(t, codes.Unavailable, status.Code(err), "the member is down: %v", err)
	case <-ctx.Done():
		t.Fatal("Authenticate was never asked")
	}
	require.NoError(t, conn.Close())
	err = <-res
	require.Equal(t, codes.Canceled, status.Code(err), "the closed connection's error, not the RPC's deadline: %v", err)
}

// TestAuthWaitForReadyWaitsOutALearner: an RPC that waits for a ready
// connection, whose Authenticate a learner answers (FailedPrecondition,
// a state that passes), authenticates again and succeeds, as it waits
// through Unavailable. Catches FailedPrecondition taken as final there:
// the RPC failing though it asked to wait.
func TestAuthWaitForReadyWaitsOutALearner(t *testing.T) {
	a := startAuthServer(t, "pw")
	a.mu.Lock()
	a.learner = 1
	a.mu.Unlock()
	kv := pb.NewKVClient(dialAuth(t, a, "pw"))
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a")}, grpc.WaitForReady(true))
	require.NoError(t, err)
	require.Equal(t, 1, a.authenticated())
}

// TestAuthWrongPasswordAskedOnce: a refused password is final: the RPCs
// after the first get its refusal without another Authenticate.
// Catches the refusal not kept, every RPC asking the server again.
func TestAuthWrongPasswordAskedOnce(t *testing.T) {
	a := startAuthServer(t, "pw")
	asked, spy := counting(pb.Auth_Authenticate_FullMethodName)
	conn, err := dial.New([]string{a.addr}, dial.WithInsecure(), dial.WithPassword("alice", "wrong"),
		dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(spy)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	kv := pb.NewKVClient(conn)
	for range 3 {
		_, err = kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
		require.ErrorIs(t, err, dial.ErrAuthFailed)
	}
	require.EqualValues(t, 1, asked.Load(), "Authenticate calls")
}

// refusingRanges is a fake etcd whose Authenticate always succeeds and
// whose Range refuses every token as invalid, as a member whose auth
// store never takes them would.
type refusingRanges struct {
	pb.UnimplementedAuthServer
	pb.UnimplementedKVServer
	issued, ranges atomic.Int64
}

func (s *refusingRanges) Authenticate(context.Context, *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	return &pb.AuthenticateResponse{Token: fmt.Sprint("tok", s.issued.Add(1))}, nil
}

func (s *refusingRanges) Range(context.Context, *pb.RangeRequest) (*pb.RangeResponse, error) {
	s.ranges.Add(1)
	return nil, rpctypes.ErrGRPCInvalidAuthToken
}

// TestAuthUnaryRetriedOnce: a unary RPC refused for its token is tried
// once more with a new one, and no more: refused again, it fails with the
// server's refusal. Catches a retry without end (an Authenticate and a
// call per round) against a member that refuses every token.
func TestAuthUnaryRetriedOnce(t *testing.T) {
	s := &refusingRanges{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterAuthServer(srv, s)
	pb.RegisterKVServer(srv, s)
	serve(t, srv, lis)
	conn, err := dial.New([]string{lis.Addr().String()}, dial.WithInsecure(), dial.WithPassword("alice", "pw"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	_, err = pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte("a")})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "invalid auth token")
	require.EqualValues(t, 2, s.ranges.Load(), "Range calls")
	require.EqualValues(t, 2, s.issued.Load(), "Authenticate calls")
}

// holdingAuth is authServer whose first Authenticate is held until its
// caller gives up; the later ones are answered as authServer answers.
type holdingAuth struct {
	*authServer
	entered chan struct{}
	calls   atomic.Int64
}

func (h *holdingAuth) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	if h.calls.Add(1) == 1 {
		close(h.entered)
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return h.authServer.Authenticate(ctx, r)
}

// expiring is a context whose deadline passes when the test says so.
type expiring struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func (e *expiring) Done() <-chan struct{} { return e.done }

func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (e *expiring) expire() { e.once.Do(func() { close(e.done) }) }

// TestAuthCallersDeadlineIsNotShared: an Authenticate cut short by its own
// caller's deadline fails that RPC only: an RPC that waited for it meanwhile
// authenticates on its own, at once, and succeeds, with its token on its
// first try. Catches the caller's own DeadlineExceeded taken for the
// member's state (shared, as a timeout of authTimeout is), failing every
// RPC that waited; and a waiter let go without a token.
func TestAuthCallersDeadlineIsNotShared(t *testing.T) {
	a := &authServer{password: "pw", valid: map[string]bool{}}
	h := &holdingAuth{authServer: a, entered: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	pb.RegisterAuthServer(srv, h)
	pb.RegisterKVServer(srv, a)
	serve(t, srv, lis)
	var waiting atomic.Int64 // as in TestAuthConcurrentCallsShareAFailedAuthenticate
	dial.OnAwaitAuthTurn(t, func() { waiting.Add(1) })
	conn, err := dial.New([]string{lis.Addr().String()}, dial.WithInsecure(), dial.WithPassword("alice", "pw"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	kv := pb.NewKVClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()

	short := &expiring{Context: ctx, done: make(chan struct{})}
	defer short.expire()
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { _, err := kv.Range(short, &pb.RangeRequest{Key: []byte("a")}); first <- err }()
	select {
	case <-h.entered: // the first RPC's Authenticate is under way
	case <-ctx.Done():
		t.Fatal("Authenticate was never asked")
	}
	go func() { _, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("b")}); second <- err }()
	require.Eventually(t, func() bool { return waiting.Load() == 2 }, wait, time.Millisecond, "the second RPC waiting for the first's Authenticate")
	short.expire()
	require.Equal(t, codes.DeadlineExceeded, status.Code(<-first), "the RPC whose deadline passed")
	require.NoError(t, <-second, "the RPC that waited for it: another call's deadline is not the member's state")
	_, ranges := a.seen()
	require.Equal(t, []string{"tok1"}, ranges, "the RPC that waited carried a token on its first try")
	require.EqualValues(t, 2, h.calls.Load(), "Authenticate calls")
}

// TestAuthServedOldTokenLeavesTheNewOneFresh: a stream that carried a
// token since replaced, served only now, says nothing of the new token:
// refused by a lagging member, the new one is still taken for fresh and
// kept. Catches accept marking whatever token is current as served, so
// that the new token is dropped at a lagging member's refusal.
func TestAuthServedOldTokenLeavesTheNewOneFresh(t *testing.T) {
	a := startAuthServer(t, "pw")
	watch := pb.NewWatchClient(dialAuth(t, a, "pw"))
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	old, err := watch.Watch(ctx) // tok1
	require.NoError(t, err)
	require.NoError(t, old.Send(create))
	require.Eventually(t, func() bool { // the server has confirmed the create under tok1, not read yet
		streams, _ := a.seen()
		return len(streams) == 1
	}, wait, time.Millisecond)

	a.expire()
	refused, err := watch.Watch(ctx) // tok1, refused: dropped
	require.NoError(t, err)
	require.NoError(t, refused.Send(create))
	resp, err := refused.Recv()
	require.NoError(t, err)
	require.True(t, resp.Canceled, "refused by its issuer's peer with no member named: dropped")

	fresh, err := watch.Watch(ctx) // tok2, fresh
	require.NoError(t, err)
	resp, err = old.Recv() // tok1's stream served now
	require.NoError(t, err)
	require.False(t, resp.Canceled, "the create made under tok1 before it expired: %s", resp.CancelReason)

	a.mu.Lock()
	a.lagging, a.refuser = 1, 2
	a.mu.Unlock()
	require.NoError(t, fresh.Send(create))
	_, err = fresh.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "a lagging member's refusal of the fresh tok2: %v", err)
	streams, _ := a.seen()
	require.Equal(t, []string{"tok1", "tok1", "tok2"}, streams)
	require.Equal(t, 2, a.authenticated())
}

// TestAuthLaggingRefusalEndsTheStream: a Watch stream whose fresh token a
// lagging member refused fails as Unavailable and is over for gRPC too:
// the member sees it end, though its caller, having had an error, does
// not cancel it. Catches the stream left open on the member until its
// caller's context ends.
func TestAuthLaggingRefusalEndsTheStream(t *testing.T) {
	a := &authServer{password: "pw", valid: map[string]bool{}, lagging: 1, refuser: 2}
	var ended atomic.Int64 // Watch streams the server has seen end
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		ended.Add(1)
		return err
	}))
	pb.RegisterAuthServer(srv, a)
	pb.RegisterWatchServer(srv, a)
	serve(t, srv, lis)
	conn, err := dial.New([]string{lis.Addr().String()}, dial.WithInsecure(), dial.WithPassword("alice", "pw"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ws, err := pb.NewWatchClient(conn).Watch(t.Context())
	require.NoError(t, err)
	require.NoError(t, ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("a")}}}))
	_, err = ws.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Eventually(t, func() bool { return ended.Load() == 1 }, wait, time.Millisecond, "the member saw the stream end")
}

// TestNoTokenWithoutAuth: on a server with auth disabled, RPCs carry no
// token metadata at all, not an empty one. Catches an empty "token" sent,
// which a member that has since turned auth on reads as a token.
func TestNoTokenWithoutAuth(t *testing.T) {
	a := &authServer{password: "pw", valid: map[string]bool{}, disabled: true}
	var keys atomic.Int64 // "token" entries the server has seen
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		keys.Add(int64(len(md.Get(rpctypes.TokenFieldNameGRPC))))
		return handler(ctx, req)
	}))
	pb.RegisterAuthServer(srv, a)
	pb.RegisterKVServer(srv, a)
	serve(t, srv, lis)
	kv := pb.NewKVClient(dialAuth(t, &authServer{addr: lis.Addr().String()}, "pw"))
	for range 2 {
		_, err = kv.Range(t.Context(), &pb.RangeRequest{Key: []byte("a")})
		require.NoError(t, err)
	}
	require.Zero(t, keys.Load(), "token metadata sent")
}
