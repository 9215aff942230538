package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// rawClient is the practical limit: a minimal client written straight on
// the generated Watch API. It sends every create back to back with ids it
// chooses, routes responses by id in one plain loop, and on a broken stream
// opens another and re-creates every watch from its next revision. It
// handles nothing else (no refusals, fragments, slow consumers or cancels).
// Its zero value calls the sink from that loop and opens the next stream at
// once; the fields are for workloads that need an application around it.
type rawClient struct {
	// queued hands each watch's responses to a goroutine of its own through
	// an unbounded queue, as clientv3 does, so that one sink that blocks
	// holds up only its own watch (and the queue grows meanwhile).
	queued bool
	// requireLeader sends etcd's "hasleader" metadata: the member refuses,
	// and ends, the stream while it has no leader.
	requireLeader bool
	// retry is the wait before the next stream after one that failed.
	retry time.Duration
	// perCall opens the first stream's watches as -callers goroutines
	// calling a function each, which sends its create and waits for its
	// own created response: the least a client with a Watch call per
	// goroutine can do. The contender "raw-percall"; it is raw without
	// -callers.
	perCall bool
}

func (c rawClient) name() string {
	if c.perCall {
		return "raw-percall"
	}
	return "raw"
}

func (c rawClient) watch(ctx context.Context, conn *grpc.ClientConn, specs []spec, out sink) (func(), error) {
	r := &rawRun{client: pb.NewWatchClient(conn), specs: specs, out: out, next: make([]int64, len(specs)), created: make(chan error, 1), retry: c.retry}
	if c.perCall && *callers > 0 {
		r.answered = make([]chan struct{}, len(specs))
		for i := range r.answered {
			r.answered[i] = make(chan struct{})
		}
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if c.requireLeader {
		r.ctx = metadata.AppendToOutgoingContext(r.ctx, "hasleader", "true")
	}
	if c.queued && out != nil {
		r.startQueues()
	}
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
	next      []int64       // per watch: the revision to resume from; 0 for "now"
	created   chan error    // the first stream's outcome
	confirmed bool          // every watch was confirmed once; later failures are retried
	retry     time.Duration // wait before the next stream after a failed one
	queue     []*rawQueue   // per watch, when queued
	streams   int           // opened, for -v
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	// answered is closed per watch by its first created response, for the
	// per-call callers waiting on it; nil unless perCall with -callers.
	answered []chan struct{}
}

func (r *rawRun) stop() {
	r.cancel()
	r.wg.Wait()
	if *verbose {
		fmt.Printf("# raw: %d streams\n", r.streams)
	}
}

// loop runs streams until stopped, re-creating every watch on each.
func (r *rawRun) loop() {
	for r.ctx.Err() == nil {
		err := r.stream()
		if !r.confirmed && err != nil {
			r.created <- err
			return
		}
		if err != nil && r.retry > 0 {
			sleepCtx(r.ctx, r.retry)
		}
	}
}

func (r *rawRun) stream() error {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	r.streams++
	ws, err := r.client.Watch(ctx)
	if err != nil {
		return err
	}
	// Send from a goroutine of its own: sending every create before reading
	// any answer would deadlock once flow control fills up.
	sent := make(chan struct{})
	perCall := r.answered != nil && !r.confirmed // the loop below sets confirmed
	go func() {
		defer close(sent)
		if perCall {
			r.sendPerCall(ctx, ws)
			return
		}
		for i := range r.specs {
			if ws.Send(r.create(i)) != nil {
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
			i := resp.WatchId - 1
			if r.next[i] == 0 {
				r.next[i] = resp.Header.GetRevision() + 1
			}
			if perCall {
				close(r.answered[i])
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
			switch {
			case r.queue != nil:
				r.queue[i].push(resp)
			case r.out != nil:
				r.out(int(i), n, last.ModRevision, last.Value)
			}
		}
	}
}

// create is the request creating watch i from its next revision.
func (r *rawRun) create(i int) *pb.WatchRequest {
	s := r.specs[i]
	c := &pb.WatchCreateRequest{Key: []byte(s.key), WatchId: int64(i + 1), StartRevision: r.next[i]}
	if s.prefix {
		c.RangeEnd = prefixEnd(s.key)
	}
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
}

// sendPerCall opens every watch from -callers goroutines, each sending one
// create under a lock (a gRPC stream takes one Send at a time) and waiting
// for its created response before it takes the next watch.
func (r *rawRun) sendPerCall(ctx context.Context, ws pb.Watch_WatchClient) {
	var mu sync.Mutex
	_ = parallel(len(r.specs), func(i int) error {
		mu.Lock()
		err := ws.Send(r.create(i))
		mu.Unlock()
		if err != nil {
			return err
		}
		select {
		case <-r.answered[i]:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// startQueues gives every watch an unbounded queue of whole responses and
// a goroutine that hands them to out in turn. The goroutines exit when the
// run stops.
func (r *rawRun) startQueues() {
	r.queue = make([]*rawQueue, len(r.specs))
	for i := range r.queue {
		q := &rawQueue{}
		q.cond = sync.NewCond(&q.mu)
		r.queue[i] = q
		r.wg.Go(func() {
			for resp := q.pop(r.ctx); resp != nil; resp = q.pop(r.ctx) {
				last := resp.Events[len(resp.Events)-1].Kv
				r.out(i, len(resp.Events), last.ModRevision, last.Value)
			}
		})
	}
	context.AfterFunc(r.ctx, func() {
		for _, q := range r.queue {
			q.mu.Lock()
			q.cond.Broadcast()
			q.mu.Unlock()
		}
	})
}

// rawQueue is one watch's unbounded queue of responses.
type rawQueue struct {
	mu    sync.Mutex
	cond  *sync.Cond
	items []*pb.WatchResponse
}

func (q *rawQueue) push(resp *pb.WatchResponse) {
	q.mu.Lock()
	q.items = append(q.items, resp)
	q.cond.Signal()
	q.mu.Unlock()
}

// pop waits for the next response; nil once ctx has ended.
func (q *rawQueue) pop(ctx context.Context) *pb.WatchResponse {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && ctx.Err() == nil {
		q.cond.Wait()
	}
	if ctx.Err() != nil {
		return nil
	}
	resp := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	return resp
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
