package main

import (
	"context"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// rawClient is the practical limit: a minimal client written straight on
// the generated Watch API. It sends every create back to back with ids it
// chooses, routes responses by id in one plain loop, and on a broken stream
// opens another and re-creates every watch from its next revision. It
// handles nothing else (no refusals, fragments, slow consumers or cancels).
type rawClient struct{}

func (rawClient) name() string { return "raw" }

func (rawClient) watch(ctx context.Context, conn *grpc.ClientConn, specs []spec, out sink) (func(), error) {
	r := &rawRun{client: pb.NewWatchClient(conn), specs: specs, out: out, next: make([]int64, len(specs)), created: make(chan error, 1)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Go(r.loop)
	select {
	case err := <-r.created:
		if err != nil {
			r.stop()
			return nil, err
		}
	case <-ctx.Done():
		r.stop()
		return nil, ctx.Err()
	}
	return r.stop, nil
}

type rawRun struct {
	client    pb.WatchClient
	specs     []spec
	out       sink
	next      []int64    // per watch: the revision to resume from; 0 for "now"
	created   chan error // the first stream's outcome
	confirmed bool       // every watch was confirmed once; later failures are retried
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

func (r *rawRun) stop() { r.cancel(); r.wg.Wait() }

// loop runs streams until stopped, re-creating every watch on each.
func (r *rawRun) loop() {
	for r.ctx.Err() == nil {
		if err := r.stream(); !r.confirmed && err != nil {
			r.created <- err
			return
		}
	}
}

func (r *rawRun) stream() error {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	ws, err := r.client.Watch(ctx)
	if err != nil {
		return err
	}
	// Send from a goroutine of its own: sending every create before reading
	// any answer would deadlock once flow control fills up.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i, s := range r.specs {
			c := &pb.WatchCreateRequest{Key: []byte(s.key), WatchId: int64(i + 1), StartRevision: r.next[i]}
			if s.prefix {
				c.RangeEnd = prefixEnd(s.key)
			}
			if ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}) != nil {
				return
			}
		}
	}()
	defer func() { cancel(); <-sent }()
	confirmed := 0
	for {
		resp, err := ws.Recv()
		if err != nil {
			return err
		}
		if resp.Created {
			if resp.Canceled {
				return fmt.Errorf("create refused: %s", resp.CancelReason)
			}
			if i := resp.WatchId - 1; r.next[i] == 0 {
				r.next[i] = resp.Header.GetRevision() + 1
			}
			if confirmed++; confirmed == len(r.specs) && !r.confirmed {
				r.confirmed = true
				r.created <- nil
			}
			continue
		}
		if n := len(resp.Events); n > 0 {
			i := resp.WatchId - 1
			last := resp.Events[n-1].Kv
			r.next[i] = last.ModRevision + 1
			if r.out != nil {
				r.out(int(i), n, last.ModRevision, last.Value)
			}
		}
	}
}

func prefixEnd(p string) []byte {
	end := []byte(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
