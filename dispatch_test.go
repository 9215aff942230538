package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdwatch/etcdwatch/internal/clock"
)

func TestKindOf(t *testing.T) {
	ev := []*mvccpb.Event{{Kv: &mvccpb.KeyValue{Key: []byte("k"), ModRevision: 2}}}
	for _, tc := range []struct {
		name string
		resp *pb.WatchResponse
		want responseKind
	}{
		{"created", &pb.WatchResponse{WatchId: 3, Created: true}, kindCreated},
		{"refused create has id -1", &pb.WatchResponse{WatchId: -1, Created: true, Canceled: true}, kindCreated},
		{"canceled", &pb.WatchResponse{WatchId: 3, Canceled: true}, kindCanceled},
		{"compacted", &pb.WatchResponse{WatchId: 3, Canceled: true, CompactRevision: 9}, kindCanceled},
		{"stream progress", &pb.WatchResponse{WatchId: -1}, kindStreamProgress},
		{"watch progress", &pb.WatchResponse{WatchId: 3}, kindWatch},
		{"events", &pb.WatchResponse{WatchId: 3, Events: ev}, kindWatch},
		{"fragment", &pb.WatchResponse{WatchId: 3, Events: ev, Fragment: true}, kindWatch},
		{"events for id -1 are not progress", &pb.WatchResponse{WatchId: -1, Events: ev}, kindWatch},
		{"watch 0 is a watch", &pb.WatchResponse{WatchId: 0}, kindWatch},
	} {
		if got := kindOf(decoded(t, tc.resp)); got != tc.want {
			t.Errorf("%s: kindOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestClassifyReason: each kind of reason internal/rpcerr tells apart
// matches its sentinel, and the reason is kept as the server sent it.
func TestClassifyReason(t *testing.T) {
	for reason, want := range map[string]error{
		"etcdserver: permission denied":                          ErrPermissionDenied,
		"etcdserver: invalid auth token":                         ErrUnauthenticated,
		"mvcc: watcher range is empty":                           ErrInvalidRequest,
		"etcdserver: mvcc: required revision has been compacted": ErrCompacted,
		"etcdserver: no leader":                                  ErrServerCanceled,
	} {
		err := classifyReason(reason)
		if !errors.Is(err, want) || err.Reason != reason {
			t.Errorf("classifyReason(%q) = %v, want %v", reason, err, want)
		}
	}
}

// fuzzServer plays the etcd side for FuzzDispatcher, synchronously: it reads
// the dispatcher's outbox and calls its handlers directly, with no goroutine
// but the watches' pumps and consumers.
type fuzzServer struct {
	t       *testing.T
	d       *dispatcher
	rev     int64
	creates []*pb.WatchCreateRequest // unanswered, in order
	cancels []int64                  // unanswered
	live    map[int64]string         // server's watches: id -> key
	echoed  bool                     // this stream has answered a create with the id it asked for
	ids     []int64                  // live ids in creation order, for picking
	watches []*Watch
	asked   int               // progress requests received and not yet answered
	opening bool              // the stream waits for its connection: nothing is sent either way
	calls   []*progressWaiter // RequestProgress calls made
	wg      sync.WaitGroup    // consumers
	ctx     context.Context   // bounds some watches; ended by a step
	cancel  context.CancelCauseFunc
}

var errFuzzContext = errors.New("fuzz: context ended")

// reconnect replaces the session if the dispatcher ended it; the next
// stream starts with no watches.
func (f *fuzzServer) reconnect() {
	select {
	case <-f.d.sess.dead:
	default:
		return
	}
	f.d.handleSessionEnd()
	f.d.connect()
	f.creates, f.cancels, f.ids = nil, nil, nil
	f.echoed, f.asked = false, 0
	clear(f.live)
}

func (f *fuzzServer) readOutbox() {
	f.reconnect()
	if f.opening {
		f.takeCommands()
		return // nothing goes out before the stream opens
	}
	queued := false
	for _, r := range f.d.outbox {
		req := encoded(f.t, &r)
		switch {
		case req.GetCreateRequest() != nil:
			f.creates = append(f.creates, req.GetCreateRequest())
		case req.GetCancelRequest() != nil:
			f.cancels = append(f.cancels, req.GetCancelRequest().WatchId)
		case req.GetProgressRequest() != nil:
			f.asked++
			queued = true
		}
	}
	if f.d.progress.queued != queued {
		f.t.Errorf("progress.queued is %v with %v progress request in the outbox", f.d.progress.queued, queued)
	}
	f.d.clearOutbox() // as the session takes it
	f.takeCommands()
}

// takeCommands handles the commands waiting, such as resumes from pumps.
func (f *fuzzServer) takeCommands() {
	for {
		select {
		case c := <-f.d.l.cmds:
			c.handle(f.d)
		default:
			return
		}
	}
}

func (f *fuzzServer) send(resp *pb.WatchResponse) {
	if f.opening {
		return // no stream to send on
	}
	if resp.Header == nil {
		resp.Header = &pb.ResponseHeader{Revision: f.rev}
	}
	if f.d.discard {
		return // the loop reads nothing more from a stream it gave up
	}
	if f.d.stall.w != nil {
		// The loop reads nothing during a stall; a consumer that has not
		// caught up by now has outlasted it.
		f.d.handleStallTimeout()
	}
	f.d.handleResponse(decoded(f.t, resp))
}

func (f *fuzzServer) pick(b byte) int64 {
	if len(f.ids) == 0 {
		return 1 + int64(b)
	}
	return f.ids[int(b)%len(f.ids)]
}

func (f *fuzzServer) forget(id int64) {
	delete(f.live, id)
	for i, x := range f.ids {
		if x == id {
			f.ids = append(f.ids[:i], f.ids[i+1:]...)
			return
		}
	}
}

// consume reads w and checks that every event was sent for w: the server
// writes into each event the key of the watch it was sent to.
func (f *fuzzServer) consume(w *Watch) {
	f.wg.Go(func() {
		var last int64
		for r := range w.Responses() {
			if r.Revision < last {
				f.t.Errorf("watch %q: revision went back from %d to %d", w.req.key(), last, r.Revision)
			}
			last = r.Revision
			for _, e := range r.Events {
				if string(e.Value) != w.req.key() {
					f.t.Errorf("watch %q got an event sent for %q", w.req.key(), e.Value)
				}
				if e.ModRevision < w.req.revision {
					f.t.Errorf("watch %q from %d got revision %d", w.req.key(), w.req.revision, e.ModRevision)
				}
			}
		}
	})
}

func (f *fuzzServer) step(op, arg byte) {
	f.readOutbox()
	switch op % 11 {
	case 0: // a consumer opens a watch, or three in one call
		var ws []*Watch
		for range 1 + 2*int(arg/128) {
			r := Key(fmt.Sprint("k", len(f.watches)))
			if arg%3 == 0 {
				r = r.FromRevision(f.rev + int64(arg%5))
			}
			r.Fragment = arg%2 == 0
			w := newWatch(f.d.l, r, 0, nil)
			f.watches = append(f.watches, w)
			f.consume(w)
			ws = append(ws, w)
		}
		ctx := context.Background()
		if arg%4 == 1 {
			ctx = f.ctx
		}
		create(f.d, ws, ctx)
	case 1, 2, 3: // the server answers the oldest create: as asked, refused, or with its own id
		if len(f.creates) == 0 {
			return
		}
		i := 0
		if op%11 == 3 && arg%4 == 3 && !f.echoed && len(f.creates) > 1 {
			i = 1 // a proxy answering out of order, which only a stream that never echoed can be
		}
		c := f.creates[i]
		f.creates = append(f.creates[:i:i], f.creates[i+1:]...)
		id := c.WatchId
		switch op % 11 {
		case 2:
			reason := "permission denied"
			if arg%2 == 1 {
				reason = "etcdserver: invalid auth token"
			}
			f.send(&pb.WatchResponse{WatchId: -1, Created: true, Canceled: true, CancelReason: reason})
			return
		case 3:
			id = 1000 + int64(arg)
		}
		if _, dup := f.live[id]; dup {
			f.send(&pb.WatchResponse{WatchId: -1, Created: true, Canceled: true, CancelReason: "mvcc: duplicate watch ID provided on the WatchStream"})
			return
		}
		f.live[id] = string(c.Key)
		f.ids = append(f.ids, id)
		f.echoed = f.echoed || id == c.WatchId
		f.send(&pb.WatchResponse{WatchId: id, Created: true})
	case 4, 5: // events for a live watch, maybe fragmented
		id := f.pick(arg)
		key, ok := f.live[id]
		if !ok {
			return
		}
		f.rev++
		n := 1 + int(arg%3)
		resp := &pb.WatchResponse{WatchId: id, Fragment: op%11 == 5 && arg%2 == 0}
		for range n {
			resp.Events = append(resp.Events, &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(key), ModRevision: f.rev}})
		}
		f.send(resp)
	case 6: // events for an id nobody created
		f.rev++
		f.send(&pb.WatchResponse{WatchId: 1<<40 + int64(arg), Events: []*mvccpb.Event{
			{Kv: &mvccpb.KeyValue{Key: []byte("stray"), Value: []byte("stray"), ModRevision: f.rev}}}})
	case 7: // the server ends a watch: compaction, or a reason
		id := f.pick(arg)
		if _, ok := f.live[id]; !ok {
			return
		}
		f.forget(id)
		resp := &pb.WatchResponse{WatchId: id, Canceled: true}
		if arg%2 == 0 {
			resp.CompactRevision = f.rev
		}
		f.send(resp)
	case 8: // progress: a call asks for it, its retry is due, the server answers a request, or notifies one watch
		switch arg % 4 {
		case 3:
			ctx := context.Background()
			if arg%8 == 7 {
				ctx = f.ctx
			}
			p := newProgressWaiter(ctx, 0)
			f.calls = append(f.calls, p)
			f.d.handleProgressRequest(p)
		case 2:
			if f.d.progress.inFlight {
				f.d.handleProgressTimeout()
			}
		case 1:
			if f.asked > 0 {
				f.asked--
				f.send(&pb.WatchResponse{WatchId: -1})
			}
		default:
			f.send(&pb.WatchResponse{WatchId: f.pick(arg)})
		}
	case 9: // a context ends, a consumer cancels, or the server answers a cancel
		if arg%8 == 6 {
			f.cancel(errFuzzContext)
			if g := f.d.ctxs[f.ctx.Done()]; g != nil {
				f.d.handleCtxDone(g) // the AfterFunc's command may come later, or never
			}
			return
		}
		if arg%2 == 0 && len(f.watches) > 0 {
			w := f.watches[int(arg/2)%len(f.watches)]
			if w.abort(ErrCanceled) {
				f.d.handleCancel(w)
			}
			return
		}
		if len(f.cancels) > 0 {
			id := f.cancels[0]
			f.cancels = f.cancels[1:]
			if _, ok := f.live[id]; ok {
				f.forget(id)
				f.send(&pb.WatchResponse{WatchId: id, Canceled: true})
			}
		}
	case 10: // the stream breaks, and the next may wait for its connection; or the connection is back
		if arg%4 == 1 {
			f.opening = false
			return
		}
		f.d.sess.exit(io.EOF)
		f.reconnect()
		f.opening = arg%4 == 2
	}
}

// FuzzDispatcher feeds the dispatcher arbitrary sequences of client actions
// and server responses (two bytes a step: what, and with which argument; see
// fuzzServer.step). It must never panic, no event may reach a watch it was not
// sent to, and a watch's revisions never go back. Every RequestProgress call
// is answered once, by shutdown at the latest (unless its context ended),
// never below the revision it began at; the dispatcher counts a progress
// request as waiting to go out exactly when one is in its outbox. Seeds:
// testdata/fuzz.
func FuzzDispatcher(f *testing.F) {
	f.Fuzz(fuzzDispatcher)
}

// fuzzDispatcher runs one script of FuzzDispatcher.
func fuzzDispatcher(t *testing.T, script []byte) {
	s := &Stream{opts: defaultOptions(), closing: make(chan struct{})}
	s.opts.bufferLimit = 4
	d := newDispatcher(testLane(s), func(ctx context.Context) (wireStream, error) { <-ctx.Done(); return nil, ctx.Err() })
	d.releaseKnown = true // a release whose progress answers may be trusted
	d.sess = startSession(d.open, d.clock.Now, nil)
	f := &fuzzServer{t: t, d: d, live: map[int64]string{}}
	f.ctx, f.cancel = context.WithCancelCause(context.Background())
	defer f.cancel(nil)
	for i := 0; i+1 < len(script); i += 2 {
		f.step(script[i], script[i+1])
	}
	close(s.closing)
	d.shutdown()
	s.pumps.Wait()
	f.wg.Wait()
	if n := s.stats.watches.Load(); n != 0 {
		t.Errorf("%d watches still counted after shutdown", n)
	}
	if len(d.ctxs) != 0 {
		t.Errorf("%d context registrations outlive their watches", len(d.ctxs))
	}
	for i, p := range f.calls { // each answered once, by shutdown at the latest, unless its ctx ended first
		select {
		case r := <-p.reply:
			if r.err == nil && r.rev < p.minRev {
				t.Errorf("RequestProgress call %d: revision %d below the %d it began at", i, r.rev, p.minRev)
			}
		default:
			if p.ctx.Err() == nil {
				t.Errorf("RequestProgress call %d never answered", i)
			}
		}
	}
}

// testLane is a lane of s whose dispatcher a test drives by hand.
func testLane(s *Stream) *lane {
	l := &lane{s: s, cmds: make(chan command, 64), done: make(chan struct{}), retire: make(chan struct{}), gone: ErrClosed}
	s.main = l
	return l
}

// TestBackoff: a stream that worked is followed by the next at once (at
// most one such retry per min), however short it lived; only streams that
// fail before doing anything back off, exponentially; a member without a
// leader is polled every noLeaderRetry, without growing the delay.
func TestBackoff(t *testing.T) {
	const ms = time.Millisecond
	var (
		worked   = streamEnd{worked: true}
		failed   = streamEnd{}
		noLeader = streamEnd{noLeader: true}
	)
	b := backoff{min: 100 * ms, max: time.Second}
	t0 := time.Unix(1000, 0)
	for i, step := range []struct {
		at       time.Duration // when the stream ended
		end      streamEnd
		min, max time.Duration // the delay's range
	}{
		{0, worked, 0, 0},                    // a cut: at once
		{400 * ms, worked, 0, 0},             // a series of cuts: every one at once
		{800 * ms, worked, 0, 0},             //
		{850 * ms, worked, 50 * ms, 50 * ms}, // 50ms after the last immediate retry: spaced to min
		{900 * ms, failed, 50 * ms, 100 * ms},
		{1000 * ms, failed, 100 * ms, 200 * ms},
		{1200 * ms, failed, 200 * ms, 400 * ms},
		{1600 * ms, noLeader, noLeaderRetry / 2, noLeaderRetry}, // polled, not backed off
		{1650 * ms, noLeader, noLeaderRetry / 2, noLeaderRetry},
		{1700 * ms, failed, 400 * ms, 800 * ms}, // the failures in a row go on counting
		{2500 * ms, failed, 500 * ms, time.Second},
		{3500 * ms, failed, 500 * ms, time.Second}, // capped at max
		{4500 * ms, worked, 0, 0},                  // worked: starts over
		{4600 * ms, failed, 50 * ms, 100 * ms},
	} {
		d := b.next(t0.Add(step.at), step.end)
		if d < step.min || d > step.max {
			t.Fatalf("step %d (%+v at %v): delay %v, want within [%v, %v]", i, step.end, step.at, d, step.min, step.max)
		}
	}
}

// TestGrowing: the delay after n failures doubles from min up to max and
// stays there, for any min, max and n: a min of 20s overflowed int64 at
// the 30th failure (a member down for a few hours) and panicked in jitter.
func TestGrowing(t *testing.T) {
	for _, c := range []struct {
		min, max time.Duration
		n        int
		want     time.Duration // before jitter: the delay is within [want/2, want]
	}{
		{100 * time.Millisecond, 5 * time.Second, 1, 100 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 3, 400 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 7, 5 * time.Second}, // 6.4s, capped
		{100 * time.Millisecond, 5 * time.Second, 1 << 20, 5 * time.Second},
		{20 * time.Second, 5 * time.Minute, 5, 5 * time.Minute},
		{20 * time.Second, 5 * time.Minute, 30, 5 * time.Minute}, // min<<29 overflowed
		{20 * time.Second, 5 * time.Minute, 64, 5 * time.Minute},
		{time.Nanosecond, time.Duration(math.MaxInt64), 40, 1 << 39},
		{time.Nanosecond, time.Duration(math.MaxInt64), 70, time.Duration(math.MaxInt64)},
		{time.Second, time.Minute, 0, time.Second}, // below 1 counts as 1
		{time.Second, time.Minute, -5, time.Second},
	} {
		for range 20 {
			if d := growing(c.min, c.max, c.n); d < c.want/2 || d > c.want {
				t.Fatalf("growing(%v, %v, %d) = %v, want within [%v, %v]", c.min, c.max, c.n, d, c.want/2, c.want)
			}
		}
	}
}

// TestStallRation: the first stallFree of each stall is free; beyond it,
// stalls draw on a budget of at most max that refills at 1/stallShare of the
// time, and a watch reaching its limit with the budget spent is not waited
// for. A stall that holds up other watches may last sharedStall at most, and
// one that comes to hold them up is cut short to that.
func TestStallRation(t *testing.T) {
	const stallMax = 100 * time.Millisecond
	s := stall{max: stallMax}
	defer s.Stop()
	w := &Watch{}
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	for _, step := range []struct {
		begin      time.Duration
		shared     bool
		sharedAt   time.Duration // > 0: another watch starts waiting then
		end        time.Duration
		wantBegun  bool
		wantUntil  time.Duration // the stall's deadline, from t0
		wantBudget time.Duration // after it ended
	}{
		{0, false, 0, 1 * ms, true, 101 * ms, stallMax},                                                                              // within the free part: costs nothing
		{10 * ms, false, 0, 71 * ms, true, 111 * ms, 40 * ms},                                                                        // 60ms charged beyond the free part
		{81 * ms, false, 0, 132 * ms, true, 123 * ms, 0},                                                                             // refilled by 1ms to 41ms; 50ms charged, never below 0
		{132 * ms, false, 0, 0, false, 0, 0},                                                                                         // spent: the watch is paused instead
		{232 * ms, false, 0, 237 * ms, true, 243 * ms, 6 * ms},                                                                       // 100ms refill 10ms; 4ms charged
		{10 * time.Second, false, 0, 10*time.Second + ms, true, 10*time.Second + 101*ms, stallMax},                                   // refilled up to the cap, no further
		{11 * time.Second, true, 0, 11*time.Second + 2*ms, true, 11*time.Second + sharedStall, stallMax - ms},                        // neighbours: sharedStall at most
		{12 * time.Second, false, 12*time.Second + ms, 12*time.Second + 2*ms, true, 12*time.Second + sharedStall, stallMax - ms},     // cut short
		{13 * time.Second, false, 13*time.Second + 5*ms, 13*time.Second + 5*ms, true, 13*time.Second + sharedStall, stallMax - 4*ms}, // past sharedStall: due at once
	} {
		if got := s.begin(clock.Real, w, at(step.begin), step.shared); got != step.wantBegun {
			t.Fatalf("stall at %v begun %v, want %v", step.begin, got, step.wantBegun)
		}
		if got := s.w; (got == w) != step.wantBegun {
			t.Fatalf("stall at %v waits for %p", step.begin, got)
		}
		if !step.wantBegun {
			continue
		}
		if step.sharedAt > 0 {
			s.share(clock.Real, at(step.sharedAt))
		}
		if want := at(step.wantUntil); !s.until.Equal(want) {
			t.Fatalf("stall at %v lasts until %v, want %v", step.begin, s.until.Sub(t0), step.wantUntil)
		}
		s.release(at(step.end))
		if s.budget != step.wantBudget {
			t.Fatalf("after the stall at %v the budget is %v, want %v", step.begin, s.budget, step.wantBudget)
		}
		if s.w != nil || s.C != nil {
			t.Fatal("an ended stall still waits")
		}
	}

	never := stall{}
	if never.begin(clock.Real, w, t0, false) || never.C != nil {
		t.Fatal("a zero budget stalls")
	}
}

// TestStallRationUnbounded: WithStallBudget(math.MaxInt64), "always
// wait", waits: budget plus stallFree, and the refill, wrapped negative
// and the watch was paused at once.
func TestStallRationUnbounded(t *testing.T) {
	s := stall{max: math.MaxInt64}
	defer s.Stop()
	w := &Watch{}
	t0 := time.Unix(1000, 0)
	for i, at := range []time.Duration{0, 2 * time.Second, time.Hour} {
		now := t0.Add(at)
		if !s.begin(clock.Real, w, now, false) {
			t.Fatalf("stall %d not begun", i)
		}
		if s.allowed() <= 0 || s.until.Before(now.Add(100*365*24*time.Hour)) {
			t.Fatalf("stall %d may last %v, until %v", i, s.allowed(), s.until)
		}
		s.release(now.Add(time.Second))
		if want := time.Duration(math.MaxInt64) - time.Second + stallFree; s.budget != want && i == 0 {
			t.Fatalf("after stall %d the budget is %v, want %v", i, s.budget, want)
		}
	}
}

// TestUnmatchedAnswerLeftInAnEndedStream: a stream can end with answers
// still waiting to be read, and the first of them may be one that cannot be
// matched. Handling it while draining the ended stream must not end that
// stream a second time; both creates wait for the next stream, which sends
// them one at a time.
func TestUnmatchedAnswerLeftInAnEndedStream(t *testing.T) {
	s := &Stream{opts: defaultOptions(), closing: make(chan struct{})}
	d := newDispatcher(testLane(s), func(ctx context.Context) (wireStream, error) { <-ctx.Done(); return nil, ctx.Err() })
	d.sess = startSession(d.open, d.clock.Now, nil)
	ws := []*Watch{newWatch(d.l, Key("a"), 0, nil), newWatch(d.l, Key("b"), 1, nil)}
	for _, w := range ws {
		w.entry.created = make(chan created, 2)
	}
	create(d, ws, context.Background())
	if d.pending.Len() != 2 {
		t.Fatalf("%d creates in flight, want 2 pipelined", d.pending.Len())
	}
	d.sess.recv <- wireResponse{WatchID: 0, Created: true} // a proxy's own id, for either create
	d.sess.exit(io.EOF)
	d.handleSessionEnd()
	if d.toCreate.Len() != 2 || d.pending.Len() != 0 || d.pipeline.start != startProxied || d.discard {
		t.Fatalf("after the stream: %d to create, %d in flight, next start %d, discarding %v; want 2, 0, %d, false",
			d.toCreate.Len(), d.pending.Len(), d.pipeline.start, d.discard, startProxied)
	}
	close(s.closing)
	d.shutdown()
}

// TestProgressRunsAhead: the releases with etcd #15220.
func TestProgressRunsAhead(t *testing.T) {
	for version, want := range map[string]bool{
		"3.4.0": true, "3.4.23": true, "3.4.24": true, "3.4.25": false, "3.4.31": false,
		"3.5.0": true, "3.5.7": true, "3.5.8": false, "3.5.35": false,
		"3.6.0": false, "3.7.3": false, "3.5.7-rc.0": true, "4.0.0": false,
	} {
		r, ok := parseRelease(version)
		if !ok || r.progressRunsAhead() != want {
			t.Errorf("%s: parsed %v, runs ahead %v, want %v", version, ok, r.progressRunsAhead(), want)
		}
	}
	if _, ok := parseRelease("main"); ok {
		t.Error(`"main" parsed as a release`)
	}
}

// TestDropUnsentLetsTheNextCreateGo: where creates go one at a time (a
// proxy), a create taken out of the outbox unsent, its Watch call having
// given up while the stream opened, lets the next queued create go.
// Catches: that create waiting with nothing in flight until something else
// flushes creates (a probe, an answer, another Watch).
func TestDropUnsentLetsTheNextCreateGo(t *testing.T) {
	s := &Stream{opts: defaultOptions(), closing: make(chan struct{})}
	d := newDispatcher(testLane(s), func(ctx context.Context) (wireStream, error) { <-ctx.Done(); return nil, ctx.Err() })
	d.sess = startSession(d.open, d.clock.Now, nil) // opening until shutdown
	d.pipeline.mode, d.pipeline.start = ownIDs, startProxied
	a, b := newWatch(d.l, Key("a"), 0, nil), newWatch(d.l, Key("b"), 0, nil)
	for _, w := range []*Watch{a, b} {
		w.entry.created = make(chan created, 1)
		create(d, []*Watch{w}, context.Background())
	}
	if d.pending.Len() != 1 || d.toCreate.Len() != 1 || len(d.outbox) != 1 {
		t.Fatalf("one at a time: %d in flight, %d queued, %d in the outbox", d.pending.Len(), d.toCreate.Len(), len(d.outbox))
	}
	a.abort(ErrCanceled)
	d.handleCancel(a)
	d.dropUnsent()
	if next, _ := d.pending.Peek(); d.pending.Len() != 1 || d.toCreate.Len() != 0 || len(d.outbox) != 1 || next != b {
		t.Errorf("after a's create was dropped: %d in flight, %d queued, %d in the outbox; want b's in flight", d.pending.Len(), d.toCreate.Len(), len(d.outbox))
	}
	close(s.closing)
	d.shutdown()
}

// create hands the dispatcher the creates of ws as Stream.open does,
// counting them first.
func create(d *dispatcher, ws []*Watch, ctx context.Context) {
	d.s.stats.watches.Add(int64(len(ws)))
	d.handleCreate(ws, ctx)
}
