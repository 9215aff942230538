// Package watchserver is a scripted etcd Watch service for tests. It serves
// the real gRPC Watch API over an in-memory connection and hands each stream a
// client opens to the test, which then reads the client's requests and
// writes exactly the responses, in exactly the order, that a scenario needs.
package watchserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// Timeout bounds every wait of the server's helpers.
const Timeout = 10 * time.Second

// Server is a scripted Watch service. Start one per test.
type Server struct {
	pb.UnimplementedWatchServer
	release string // what the Maintenance Status RPC reports; "" for none
	lis     *bufconn.Listener
	srv     *grpc.Server
	streams chan *Stream
	kv      *KV
	leader  atomic.Uint64 // what Status reports; SetLeader's
}

// maintenance answers the Maintenance Status RPC with a release, when the
// test set one, and the leader SetLeader gave (none until then); without
// a release, the RPC is unimplemented, as on a server the client cannot
// ask.
type maintenance struct {
	pb.UnimplementedMaintenanceServer
	version string
	leader  *atomic.Uint64
}

func (m maintenance) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	if m.version == "" {
		return nil, status.Error(codes.Unimplemented, "watchserver: no release set")
	}
	return &pb.StatusResponse{Header: &pb.ResponseHeader{MemberId: 1}, Version: m.version, Leader: m.leader.Load()}, nil
}

// SetLeader sets the leader the Maintenance Status RPC reports; 0 is
// none. It needs a release (StartRelease).
func (s *Server) SetLeader(id uint64) { s.leader.Store(id) }

// Release returns the release the server reports, "" for none.
func (s *Server) Release() string { return s.release }

// StartRelease serves a new Server that reports version (such as "3.4.23")
// to the Maintenance Status RPC.
func StartRelease(t testing.TB, version string) *Server {
	return start(t, version)
}

// Start serves a new Server until the test ends.
func Start(t testing.TB) *Server { return start(t, "") }

func start(t testing.TB, version string) *Server {
	s := &Server{
		release: version,
		lis:     bufconn.Listen(1 << 20),
		srv:     grpc.NewServer(),
		streams: make(chan *Stream, 16),
		kv:      newKV(),
	}
	pb.RegisterWatchServer(s.srv, s)
	pb.RegisterKVServer(s.srv, kvService{kv: s.kv})
	pb.RegisterMaintenanceServer(s.srv, maintenance{version: version, leader: &s.leader})
	served := make(chan struct{})
	go func() { // exits when the server stops
		defer close(served)
		_ = s.srv.Serve(s.lis)
	}()
	t.Cleanup(func() {
		s.srv.Stop()
		<-served
	})
	return s
}

// Dial returns a client connection to the server, closed when the test ends.
func (s *Server) Dial(t testing.TB) *grpc.ClientConn {
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("watchserver: dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Connect opens a connection to the server, for a client's own dialer.
func (s *Server) Connect(ctx context.Context) (net.Conn, error) { return s.lis.DialContext(ctx) }

// Accept returns the next Watch stream a client opened.
func (s *Server) Accept(t testing.TB) *Stream {
	t.Helper()
	select {
	case st := <-s.streams:
		return st
	case <-time.After(Timeout):
		t.Fatalf("watchserver: no Watch stream opened within %v", Timeout)
		return nil
	}
}

// Streams delivers the Watch streams clients open, as Accept does, for a
// test that serves them in a loop of its own.
func (s *Server) Streams() <-chan *Stream { return s.streams }

// Watch implements pb.WatchServer: it hands the stream to Accept and serves
// it until the test ends it with Close or the client goes away.
func (s *Server) Watch(srv pb.Watch_WatchServer) error {
	st := &Stream{srv: srv, end: make(chan error, 1), reqs: make(chan *pb.WatchRequest, 1<<16)}
	recvDone := make(chan struct{})
	go func() { // exits when the RPC ends; waited for below
		defer close(recvDone)
		defer close(st.reqs)
		for {
			req, err := srv.Recv()
			if err != nil {
				return
			}
			st.reqs <- req
		}
	}()
	s.streams <- st
	var err error
	select {
	case err = <-st.end:
	case <-srv.Context().Done():
		<-recvDone
	}
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
	return err
}

// Stream is one client's Watch stream, seen from the server.
type Stream struct {
	srv    pb.Watch_WatchServer
	reqs   chan *pb.WatchRequest // closed when the client's side ends
	end    chan error
	mu     sync.Mutex // serializes Send
	closed bool
	sent   atomic.Int64
}

// Recv returns the client's next request, failing the test after Timeout or
// when the client ended the stream. From the test's goroutine only, as
// t.Fatal is; other goroutines use Next.
func (st *Stream) Recv(t testing.TB) *pb.WatchRequest {
	t.Helper()
	req, err := st.Next()
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// Next returns the client's next request, or an error after Timeout or when
// the client ended the stream. Safe from any goroutine.
func (st *Stream) Next() (*pb.WatchRequest, error) {
	select {
	case req, ok := <-st.reqs:
		if !ok {
			return nil, errors.New("watchserver: client ended the stream")
		}
		return req, nil
	case <-time.After(Timeout):
		return nil, fmt.Errorf("watchserver: no request within %v", Timeout)
	}
}

// Metadata returns the gRPC metadata the client sent with the stream.
func (st *Stream) Metadata() metadata.MD {
	md, _ := metadata.FromIncomingContext(st.srv.Context())
	return md
}

// Requests returns the channel of the client's requests, for tests that
// serve a stream in a loop; it is closed when the client's side ends.
func (st *Stream) Requests() <-chan *pb.WatchRequest { return st.reqs }

// RecvCreate returns the next request, which must be a create.
func (st *Stream) RecvCreate(t testing.TB) *pb.WatchCreateRequest {
	t.Helper()
	req := st.Recv(t)
	c := req.GetCreateRequest()
	if c == nil {
		t.Fatalf("watchserver: want a create request, got %v", req)
	}
	return c
}

// RecvCancel returns the id of the next request, which must be a cancel.
func (st *Stream) RecvCancel(t testing.TB) int64 {
	t.Helper()
	req := st.Recv(t)
	c := req.GetCancelRequest()
	if c == nil {
		t.Fatalf("watchserver: want a cancel request, got %v", req)
	}
	return c.WatchId
}

// Ended reports whether the client has ended its side of the stream, waiting
// up to Timeout for it; requests still unread are discarded.
func (st *Stream) Ended(t testing.TB) bool {
	t.Helper()
	deadline := time.After(Timeout)
	for {
		select {
		case _, ok := <-st.reqs:
			if !ok {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// Send writes resp to the client. Sends after the stream ended are ignored.
func (st *Stream) Send(t testing.TB, resp *pb.WatchResponse) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	if err := st.srv.Send(resp); err != nil {
		t.Logf("watchserver: send: %v", err)
		return
	}
	st.sent.Add(1)
}

// Sent returns how many responses Send has written on the stream.
func (st *Stream) Sent() int64 { return st.sent.Load() }

// Close ends the RPC with err (a status error, or nil for OK).
func (st *Stream) Close(err error) {
	select {
	case st.end <- err:
	default:
	}
}

// Header is a response header at revision rev.
func Header(rev int64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: 1, MemberId: 2, RaftTerm: 3, Revision: rev}
}

// Created confirms watch id at header revision rev.
func Created(id, rev int64) *pb.WatchResponse {
	return &pb.WatchResponse{Header: Header(rev), WatchId: id, Created: true}
}

// CreateFailed refuses a create the way etcd 3.5.6+ does: id -1.
func CreateFailed(reason string) *pb.WatchResponse {
	return &pb.WatchResponse{Header: Header(1), WatchId: -1, Created: true, Canceled: true, CancelReason: reason}
}

// Canceled ends watch id, as the answer to a cancel request.
func Canceled(id int64) *pb.WatchResponse {
	return &pb.WatchResponse{Header: Header(1), WatchId: id, Canceled: true}
}

// Compacted ends watch id because compact was compacted away.
func Compacted(id, compact int64) *pb.WatchResponse {
	return &pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: id, Canceled: true, CompactRevision: compact}
}

// Progress is a progress notification at rev; id -1 is stream-wide.
func Progress(id, rev int64) *pb.WatchResponse {
	return &pb.WatchResponse{Header: Header(rev), WatchId: id}
}

// Events is an event response for watch id with header revision header.
func Events(id, header int64, events ...*mvccpb.Event) *pb.WatchResponse {
	return &pb.WatchResponse{Header: Header(header), WatchId: id, Events: events}
}

// Put is a put of key=value at revision rev.
func Put(key, value string, rev int64) *mvccpb.Event {
	return &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{
		Key: []byte(key), Value: []byte(value), CreateRevision: rev, ModRevision: rev, Version: 1}}
}

// Del is a delete of key at revision rev.
func Del(key string, rev int64) *mvccpb.Event {
	return &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}
}
