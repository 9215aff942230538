package main

import (
	"context"
	"fmt"
	"net"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// scripted is an in-process Watch service over an in-memory connection, so
// that only client cost is measured. It confirms every create at once and,
// when events > 0, plays a store whose history holds that many events,
// perResponse to a revision (keys and values of 32 bytes): each watch gets
// the history from its start revision as fast as the stream takes it, one
// revision to a response. Like etcd it honours cancels and start revisions,
// so a client that pauses a watch and resumes it gets what it missed.
type scripted struct {
	pb.UnimplementedWatchServer
	events, perResponse int
	lis                 *bufconn.Listener
	srv                 *grpc.Server
}

func startScripted(events, perResponse int) *scripted {
	s := &scripted{events: events, perResponse: perResponse, lis: bufconn.Listen(4 << 20), srv: grpc.NewServer()}
	pb.RegisterWatchServer(s.srv, s)
	go s.srv.Serve(s.lis) // ends with stop
	return s
}

func (s *scripted) stop() { s.srv.Stop() }

func (s *scripted) dial() (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///scripted",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// lastRev is the store's last revision; history starts at revision 2.
func (s *scripted) lastRev() int64 {
	if s.events == 0 {
		return 1
	}
	return 1 + int64((s.events+s.perResponse-1)/s.perResponse)
}

// Watch reads requests in a goroutine and sends from this one, the stream's
// only sender.
func (s *scripted) Watch(srv pb.Watch_WatchServer) error {
	reqs := make(chan *pb.WatchRequest, 1024)
	go func() { // ends with the stream
		defer close(reqs)
		for {
			req, err := srv.Recv()
			if err != nil {
				return
			}
			reqs <- req
		}
	}()
	next := map[int64]int64{} // streaming watches: id -> next revision to send
	evs := make([]*mvccpb.Event, s.perResponse)
	for i := range evs {
		evs[i] = &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: fmt.Appendf(nil, "key-%027d", i), Value: fmt.Appendf(nil, "value-%025d", i)}}
	}
	resp := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: s.lastRev()}, Events: evs}
	for {
		var req *pb.WatchRequest
		var ok bool
		if len(next) == 0 {
			req, ok = <-reqs
		} else {
			select {
			case req, ok = <-reqs:
			default:
				ok = true
			}
		}
		if !ok {
			return nil
		}
		if req != nil && !s.handle(srv, req, next) {
			return nil
		}
		for id, rev := range next { // one response per streaming watch per round
			for _, e := range evs {
				e.Kv.ModRevision, e.Kv.CreateRevision = rev, rev
			}
			resp.WatchId = id
			if srv.Send(resp) != nil {
				return nil
			}
			if next[id] = rev + 1; rev+1 > s.lastRev() {
				delete(next, id)
			}
		}
	}
}

// handle answers a create or cancel; it reports false when the stream broke.
func (s *scripted) handle(srv pb.Watch_WatchServer, req *pb.WatchRequest, next map[int64]int64) bool {
	header := &pb.ResponseHeader{Revision: s.lastRev()}
	if c := req.GetCreateRequest(); c != nil {
		if s.events > 0 {
			next[c.WatchId] = max(c.StartRevision, 2)
		}
		return srv.Send(&pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 1}, WatchId: c.WatchId, Created: true}) == nil
	}
	if c := req.GetCancelRequest(); c != nil {
		delete(next, c.WatchId)
		return srv.Send(&pb.WatchResponse{Header: header, WatchId: c.WatchId, Canceled: true}) == nil
	}
	return true
}
