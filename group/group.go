package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/health"
	"github.com/etcdwatch/etcdwatch/view"
)

// Group is a set of Streams that runs watches and views with the API of
// one Stream, spread over its Streams and, through them, over etcd's
// members. Its methods are safe for concurrent use.
type Group struct {
	own   []*slot            // the group's Streams (WithStreams), in order; fixed from New to Close
	owned []*grpc.ClientConn // Dial's connections, closed by Close; nil with New
	// members follows Dial's connections and routes its Streams over
	// them; nil with New. Set before Dial returns, then fixed.
	members *members
	turns   *turns // Conn's: the own Streams' connections in turn; fixed from New to Close
	opts    options
	base    context.Context         // ends at Close with etcdwatch.ErrClosed: Context's
	stop    context.CancelCauseFunc // ends base

	mu      sync.Mutex
	placing []int              // per own Stream: watches placed there, not yet handed to it; guarded by mu
	pinning []int              // per own Stream: pinned watches placed on its connection whose Stream is not yet a candidate; guarded by mu
	pinned  map[*slot]struct{} // pinned Streams open now; guarded by mu
	retired etcdwatch.Stats    // the counters of pinned Streams closed, added together; guarded by mu
	// rest is the pinned Streams' State together when none counts (none
	// open, or all opening), and the last error of those closed; guarded
	// by mu.
	rest   etcdwatch.State
	closed bool // Close has begun: nothing more opens; guarded by mu

	// What State and the pinned entry of Streams last reported, so that
	// their Since moves only when Connected does.
	steadyAll, steadyPinned health.Steady

	// wg counts the goroutines the group starts: one per pinned Stream,
	// closing it once its watch ends, and one per part of a multi-part
	// call, each returning once its Stream has answered. Close waits for
	// them. Add is called under mu, only while closed is false.
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// slot is one Stream of the group and the connection it is opened on.
type slot struct {
	name   string
	stream *etcdwatch.Stream
	conn   grpc.ClientConnInterface // the connection given (New) or dialed (Dial), under the tracker: pinned Streams open on it too
	track  *tracked
	// For a pinned Stream: on is the own Stream on whose connection it
	// opened, fixed; retiring, that its watch has ended and it is
	// closing, guarded by the group's mu.
	on       int
	retiring bool
}

var _ view.Source = (*Group)(nil)

// New opens a Group of Streams on conn, WithStreams of them (3 by
// default). It returns at once, as etcdwatch.Open does. Close the Group to
// release it; conn stays open and belongs to the caller.
//
// Each Stream's gRPC stream goes where conn's balancer sends it. Over
// package dial's connection, or a clientv3 Client's, that is round_robin
// over the members that are ready: on a connection just made, the first
// member connected takes every Stream (as it did in most runs of the
// end-to-end test), and later the Streams' other RPCs take turns too, so
// nothing spreads them over members, and Streams on one member fail
// together. They still each have a gRPC stream, and a send loop on the
// server, of their own: a watch catching up on one holds up no progress
// on another. Dial spreads them over members for certain.
func New(conn grpc.ClientConnInterface, opts ...Option) (*Group, error) {
	if isNil(conn) {
		return nil, fmt.Errorf("%w: conn is nil", etcdwatch.ErrInvalidArgument)
	}
	o := apply(3, opts)
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.dialSet {
		return nil, fmt.Errorf("%w: WithDialOptions is for Dial: New is given its connection", etcdwatch.ErrInvalidArgument)
	}
	if o.settleSet {
		return nil, fmt.Errorf("%w: WithHoming is for Dial: New's Streams have no member of their own", etcdwatch.ErrInvalidArgument)
	}
	conns := make([]grpc.ClientConnInterface, o.streams)
	for i := range conns {
		conns[i] = conn
	}
	return start(conns, nil, o)
}

// Dial opens a Group with one Stream per endpoint (WithStreams to change
// that), so that Stream i is on member i, its home. Dial makes one
// connection per endpoint (dial.New, with WithDialOptions), each to that
// member alone; Stream i's RPCs go to its home when it is up, and
// otherwise to the next member up that is, in the order of endpoints from
// i. With more Streams than endpoints, Stream i's home is member i modulo
// their number.
//
// When member i fails, Stream i, and only it, reconnects to the next
// member that is up, and its watches resume there from their own
// revisions. A member that refuses streams for want of a leader (with
// etcdwatch.WithRequireLeader in WithStreamOptions) counts as down until
// it has one again. Once member i has been back, connected and with a
// leader (etcd's Status, asked on its connection), for WithHoming's
// settle time, Stream i goes home: its gRPC stream elsewhere is ended, and
// its watches resume on member i, again from their own revisions (a
// Stream whose gRPC stream ends for another reason goes home at once if
// its home is up). So a rolling restart, or a Dial while a member is
// down, leaves each Stream on its own member in the end. Streams' Member
// tells where each is.
//
// Streams opened with the group wait for their home's first attempt to
// connect rather than take the first member that answers: a refused
// connection fails at once, but a member that drops packets holds a
// Stream's first stream for dial's connect timeout (5s).
//
// Endpoints are as dial.New takes them. Close closes the connections.
func Dial(endpoints []string, opts ...Option) (*Group, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: Dial needs at least one endpoint", etcdwatch.ErrInvalidArgument)
	}
	o := apply(len(endpoints), opts)
	if err := o.validate(); err != nil {
		return nil, err
	}
	owned := make([]*grpc.ClientConn, 0, len(endpoints))
	for _, ep := range endpoints {
		cc, err := dial.New([]string{ep}, o.dial...)
		if err != nil {
			closeAll(owned)
			return nil, err
		}
		owned = append(owned, cc)
	}
	ms := newMembers(owned, o.settle)
	conns := make([]grpc.ClientConnInterface, o.streams)
	for i := range conns {
		conns[i] = ms.route(i % len(endpoints))
	}
	g, err := start(conns, owned, o)
	if err != nil {
		closeAll(owned)
		return nil, err
	}
	g.members = ms
	ms.run(g.base)
	return g, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		_ = c.Close() // only fails if already closed
	}
}

// start opens a Stream on each of conns.
func start(conns []grpc.ClientConnInterface, owned []*grpc.ClientConn, o options) (*Group, error) {
	g := &Group{
		owned:   owned,
		opts:    o,
		placing: make([]int, len(conns)),
		pinning: make([]int, len(conns)),
		pinned:  map[*slot]struct{}{},
	}
	g.turns = &turns{}
	for i, conn := range conns {
		sl, err := open(strconv.Itoa(i), conn, o.stream)
		if err != nil {
			for _, sl := range g.own {
				_ = sl.stream.Close()
			}
			return nil, err
		}
		g.own = append(g.own, sl)
		g.turns.conns = append(g.turns.conns, sl.stream.Conn())
	}
	g.base, g.stop = context.WithCancelCause(context.Background())
	g.rest = etcdwatch.State{Connected: true, Since: time.Now()} // no pinned Stream yet: none is down
	return g, nil
}

// open opens a Stream on conn, through a tracker.
func open(name string, conn grpc.ClientConnInterface, opts []etcdwatch.Option) (*slot, error) {
	tc, t := track(conn)
	s, err := etcdwatch.Open(tc, opts...)
	if err != nil {
		return nil, err
	}
	return &slot{name: name, stream: s, conn: conn, track: t}, nil
}

// isNil reports whether conn is nil or holds a nil pointer.
func isNil(conn grpc.ClientConnInterface) bool {
	if conn == nil {
		return true
	}
	v := reflect.ValueOf(conn)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Watch opens a watch on one of the group's Streams, chosen as the
// package documentation says, and returns once the server confirmed it,
// as etcdwatch.Stream.Watch does; ctx bounds the watch's life. A request
// that sets Isolated is pinned, as by WatchPinned.
//
// The watch stays on its Stream for its whole life: when that Stream's
// member fails, the watch resumes with the Stream on another member.
func (g *Group) Watch(ctx context.Context, r etcdwatch.Request) (*etcdwatch.Watch, error) {
	ws, err := g.open(ctx, []etcdwatch.Request{r}, callWatch)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// WatchPinned opens a watch on a Stream of its own, for a watch that is
// heavy (a large range, a replay of much history) or whose progress
// matters (Watch.RequestProgress on it waits for no other watch): it
// holds up no other watch, and none holds it up. The Stream is opened on
// the connection of the group's Stream that placement chooses (with Dial,
// on its member), and closed once the watch ends. Isolated is cleared in
// the request the Stream is given (Watch.Request shows it): alone on a
// Stream of its own, the watch needs no gRPC stream apart. Otherwise it
// is Watch.
func (g *Group) WatchPinned(ctx context.Context, r etcdwatch.Request) (*etcdwatch.Watch, error) {
	ws, err := g.open(ctx, []etcdwatch.Request{r}, callPinned)
	if err != nil {
		return nil, err
	}
	return ws[0], nil
}

// WatchAll opens a watch for each request, spread over the group's
// Streams by placement (each isolated request pinned), with each Stream's
// share opened by one Stream.WatchAll, all Streams at once. It returns the
// watches in the order of rs once every one is confirmed; an empty rs
// returns nil.
//
// It is all or nothing, as Stream.WatchAll is: an invalid request opens
// nothing, and its error names it by its index in rs; when one Stream's
// share fails (a refusal, ctx, Close), the call returns that error at
// once, wrapped with the Stream's name, and every watch opened on the
// other Streams is canceled, now or as soon as its Stream answers. A
// refusal is a *etcdwatch.RequestError naming the request by its index in
// rs, wrapped with the Stream's name.
func (g *Group) WatchAll(ctx context.Context, rs ...etcdwatch.Request) ([]*etcdwatch.Watch, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	return g.open(ctx, rs, callAll)
}

// call is which method a call to open serves: its errors are Watch's
// (the Stream's own) for Watch and WatchPinned, and name the request by
// its index for WatchAll, however many requests it has.
type call int

const (
	callWatch  call = iota // Watch: one request, pinned if Isolated
	callPinned             // WatchPinned: one request, pinned
	callAll                // WatchAll
)

// part is the requests of one call placed on one Stream: the indices of
// rs given to one of the group's Streams, or the index of one request
// pinned, with the Stream on whose connection it opens.
type part struct {
	on     int   // index of the group's Stream
	pinned bool  // one request, on a Stream of its own
	idx    []int // indices in rs, in order
}

func (g *Group) open(ctx context.Context, rs []etcdwatch.Request, kind call) ([]*etcdwatch.Watch, error) {
	for i, r := range rs {
		if err := r.Validate(); err != nil {
			if kind != callAll {
				return nil, err
			}
			return nil, &etcdwatch.RequestError{Index: i, Of: len(rs), Request: r, Err: err}
		}
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	parts, err := g.place(rs, kind == callPinned)
	if err != nil {
		return nil, err
	}
	if len(parts) == 1 { // the common case, on this goroutine
		p := parts[0]
		ws, err := g.openPart(ctx, rs, p)
		if err != nil && kind == callAll {
			err = g.partError(ctx, p, rs, err)
		}
		return ws, err
	}
	c := &multiCall{ws: make([]*etcdwatch.Watch, len(rs)), left: len(parts), done: make(chan struct{})}
	for _, p := range parts {
		go func() { // returns once its Stream has answered (bounded by ctx and Close); Close waits (wg.Add in place)
			defer g.wg.Done()
			ws, err := g.openPart(ctx, rs, p)
			if err != nil {
				err = g.partError(ctx, p, rs, err)
			}
			c.finish(p, ws, err)
		}()
	}
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	return c.ws, nil
}

// partError says which Stream a part's error came from. An error that
// concerns one request names it by its index among the call's requests rs
// (a *etcdwatch.RequestError), not among the part's: a part of several
// gets one from WatchAll, with the part's index; a part of one request
// gets the server's refusal as it is. ctx's cause is no request's error,
// whatever it holds (errgroup's is a sibling call's).
func (g *Group) partError(ctx context.Context, p part, rs []etcdwatch.Request, err error) error {
	if cause := context.Cause(ctx); cause == nil || !errors.Is(err, cause) {
		err = requestError(p, rs, err)
	}
	if p.pinned {
		return fmt.Errorf("pinned stream: %w", err)
	}
	return fmt.Errorf("stream %s: %w", g.own[p.on].name, err)
}

// requestError names the request of rs that err, a part's error, concerns,
// if it concerns one: a *etcdwatch.RequestError from the part's
// WatchAll, or a refusal (*etcdwatch.ServerError) of its one request.
func requestError(p part, rs []etcdwatch.Request, err error) error {
	var (
		re *etcdwatch.RequestError
		se *etcdwatch.ServerError
	)
	switch {
	case errors.As(err, &re) && re.Of == len(p.idx) && re.Index >= 0 && re.Index < len(p.idx):
		i := p.idx[re.Index]
		return &etcdwatch.RequestError{Index: i, Of: len(rs), Request: rs[i], Err: re.Err}
	case len(p.idx) == 1 && errors.As(err, &se):
		i := p.idx[0]
		return &etcdwatch.RequestError{Index: i, Of: len(rs), Request: rs[i], Err: err}
	}
	return err
}

// multiCall gathers the parts of a call spread over several Streams.
type multiCall struct {
	mu   sync.Mutex
	ws   []*etcdwatch.Watch // by index in rs, filled as parts succeed
	err  error              // the first part's failure
	left int                // parts not yet finished, while none failed
	done chan struct{}      // closed once every part succeeded, or one failed
}

// finish records a part's outcome. After a failure, the watches of the
// parts that succeeded, before or after it, are canceled.
func (c *multiCall) finish(p part, ws []*etcdwatch.Watch, err error) {
	c.mu.Lock()
	var cancel []*etcdwatch.Watch
	switch {
	case err != nil && c.err == nil:
		c.err = err
		for _, w := range c.ws {
			if w != nil {
				cancel = append(cancel, w)
			}
		}
		close(c.done)
	case err != nil: // a later failure: the first is reported
	case c.err != nil:
		cancel = ws
	default:
		for k, i := range p.idx {
			c.ws[i] = ws[k]
		}
		if c.left--; c.left == 0 {
			close(c.done)
		}
	}
	c.mu.Unlock()
	for _, w := range cancel {
		w.Cancel()
	}
}

// openPart opens the watches of one part.
func (g *Group) openPart(ctx context.Context, rs []etcdwatch.Request, p part) ([]*etcdwatch.Watch, error) {
	if p.pinned {
		w, err := g.openPinned(ctx, rs[p.idx[0]], p.on)
		if err != nil {
			return nil, err
		}
		return []*etcdwatch.Watch{w}, nil
	}
	s := g.own[p.on].stream
	if len(p.idx) == 1 {
		g.placed(p) // the Stream counts them from its call (Stats.Watches), not the group
		w, err := s.Watch(ctx, rs[p.idx[0]])
		if err != nil {
			return nil, err
		}
		return []*etcdwatch.Watch{w}, nil
	}
	sub := make([]etcdwatch.Request, len(p.idx))
	for k, i := range p.idx {
		sub[k] = rs[i]
	}
	g.placed(p) // after the copy, which takes as long as the part is large
	return s.WatchAll(ctx, sub...)
}

// openPinned opens a Stream on the connection of the group's Stream on,
// and r on it alone. A goroutine closes the Stream once the watch ends.
// The group's wg counts the Stream from before it opens, so that a Close
// meanwhile waits until it is closed again.
func (g *Group) openPinned(ctx context.Context, r etcdwatch.Request, on int) (*etcdwatch.Watch, error) {
	pin := part{on: on, pinned: true}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		g.placed(pin)
		return nil, etcdwatch.ErrClosed
	}
	g.wg.Add(1)
	g.mu.Unlock()
	sl, err := open("pinned", g.own[on].conn, g.opts.stream)
	if err != nil {
		g.placed(pin)
		g.wg.Done()
		return nil, err // the options opened the group's own Streams: not expected
	}
	sl.on = on
	g.mu.Lock()
	// Its slot stands for it in placement from here, or it fails.
	g.pinning[on]--
	if g.closed { // Close began while it opened, and waits for this
		g.mu.Unlock()
		_ = sl.stream.Close()
		g.wg.Done()
		return nil, etcdwatch.ErrClosed
	}
	g.pinned[sl] = struct{}{}
	g.mu.Unlock()
	r.Isolated = false
	w, err := sl.stream.Watch(ctx, r)
	if err != nil {
		g.retire(sl)
		g.wg.Done()
		return nil, err
	}
	go func() { // returns once the watch has ended: Cancel, its ctx, the server, or Close closing its Stream; Close waits
		defer g.wg.Done()
		<-w.Done()
		g.retire(sl)
	}()
	return w, nil
}

// retire closes a pinned Stream and keeps its counters. Marked retiring
// first, the Stream leaves State and placement before its Close reads as
// a failure; it stays in Stats until its counters are among the retired.
func (g *Group) retire(sl *slot) {
	g.mu.Lock()
	before := g.pinnedState()
	sl.retiring = true
	g.mu.Unlock()
	_ = sl.stream.Close()
	st := sl.stream.Stats()
	st.Watches, st.Paused = 0, 0 // gauges: none now
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pinned, sl)
	g.retired = add(g.retired, st)
	g.rest = restAfter(g.rest, before, time.Now())
}

// place chooses the Stream of each request, counts them as being placed
// until placed is called, and returns the call's parts: one per Stream of
// the group's own with requests, in order, then one per pinned request.
// For each part it adds to wg, if there is more than one.
func (g *Group) place(rs []etcdwatch.Request, pinAll bool) ([]part, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, etcdwatch.ErrClosed
	}
	p := placement{cands: g.candidates()}
	byStream := make([][]int, len(g.own))
	var pinned []part
	for i, r := range rs {
		pin := pinAll || r.Isolated
		on := p.next(pin)
		if pin {
			pinned = append(pinned, part{on: on, pinned: true, idx: []int{i}})
			g.pinning[on]++
			continue
		}
		byStream[on] = append(byStream[on], i)
		g.placing[on]++
	}
	var parts []part
	for on, idx := range byStream {
		if len(idx) > 0 {
			parts = append(parts, part{on: on, idx: idx})
		}
	}
	parts = append(parts, pinned...)
	if len(parts) > 1 {
		g.wg.Add(len(parts))
	}
	return parts, nil
}

// placed ends place's count of a part whose watches are about to count
// elsewhere, or never will: a plain part's just before its Stream is asked
// (whose Stats count them as soon as its Watch or WatchAll is called,
// before it checks the requests: rather than counting them twice until the
// Stream answers; a placement made in between, a few hundred nanoseconds,
// does not see them), a pinned one's when its pinned Stream joins the
// candidates, or fails to.
func (g *Group) placed(p part) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.pinned {
		g.pinning[p.on]--
	} else {
		g.placing[p.on] -= len(p.idx)
	}
}

// candidates is placement's view of the Streams, the group's own first.
// Called with mu held.
func (g *Group) candidates() []candidate {
	cs := make([]candidate, 0, len(g.own)+len(g.pinned))
	for i, sl := range g.own {
		st := sl.stream.State()
		cs = append(cs, candidate{
			watches: int(sl.stream.Stats().Watches) + g.placing[i],
			healthy: healthy(st),
			failed:  st.Failed != nil,
			member:  sl.track.where(),
			on:      i,
		})
	}
	for sl := range g.pinned {
		if !sl.retiring {
			cs = append(cs, candidate{watches: 1, healthy: healthy(sl.stream.State()), member: sl.track.where(), on: sl.on, pinned: true})
		}
	}
	for i, n := range g.pinning { // placed, their Streams not yet candidates: where placement put them
		for range n {
			cs = append(cs, candidate{watches: 1, healthy: true, member: cs[i].member, on: i, pinned: true})
		}
	}
	return cs
}

// healthy: the server answers on the Stream, or nothing has failed on it
// yet (a Stream just opened, before its server said anything).
func healthy(st etcdwatch.State) bool { return st.Connected || st.LastError == nil }

// RequestProgress asks every Stream of the group for progress at once, as
// Stream.RequestProgress does each (pinned Streams too), and returns the
// lowest answer: a revision R such that every active watch of the group
// has queued all its events <= R, and gets a bookmark at its Stream's
// answer (>= R) after them. R is at least the highest revision the group
// had seen when called: a Stream whose member answers below it (a member
// behind the others) is asked again, after 10ms, then twice as long up to
// 250ms, until it answers at or above it or ctx ends. A Stream without
// watches is not waited for, nor one that failed for good (its watches
// ended with it); ErrNoWatches if no Stream has any, or that failure if
// the only Streams with watches failed.
//
// It waits for the slowest Stream, as a Stream waits for its slowest
// watch: bound ctx. A view's watch, on a Stream of its own, asks its own
// (Watch.RequestProgress).
func (g *Group) RequestProgress(ctx context.Context) (int64, error) {
	if err := context.Cause(ctx); err != nil {
		return 0, err // ended already: ask the server nothing
	}
	slots, err := g.slots()
	if err != nil {
		return 0, err
	}
	floor := g.Stats().Revision
	revs := make([]int64, len(slots))
	errs := make([]error, len(slots))
	// The first failure that counts decides the call: it ends the others'
	// waits at once (with itself as the cause), rather than the slowest
	// Stream's answer.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var wg sync.WaitGroup
	for i, sl := range slots {
		wg.Go(func() { // returns with the Stream's answer, bounded by ctx; waited for below
			revs[i], errs[i] = askAtLeast(ctx, sl.stream, floor)
			if errs[i] != nil && !g.excused(sl, errs[i]) {
				fail(errs[i])
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	rev, answered := int64(0), false
	var failed error
	for i, r := range revs {
		switch {
		case errors.Is(errs[i], etcdwatch.ErrStreamFailed):
			failed = errs[i]
		case errs[i] == nil && (!answered || r < rev):
			rev, answered = r, true
		}
	}
	switch {
	case answered:
		return rev, nil
	case failed != nil: // every Stream with watches failed for good
		return 0, failed
	}
	return 0, etcdwatch.ErrNoWatches
}

// excused reports whether RequestProgress may leave out sl's failure err:
// a Stream the server has nothing to answer for, one that failed for good
// (its watches ended with it), or a pinned one whose watch ended meanwhile.
func (g *Group) excused(sl *slot, err error) bool {
	return errors.Is(err, etcdwatch.ErrNoWatches) || errors.Is(err, etcdwatch.ErrStreamFailed) ||
		(errors.Is(err, etcdwatch.ErrClosed) && g.unpinned(sl))
}

// unpinned reports whether ErrClosed from sl's Stream means that its
// pinned watch ended (retire closes it then), not that the group closed:
// sl is a pinned Stream and the group is open.
func (g *Group) unpinned(sl *slot) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.closed && !slices.Contains(g.own, sl)
}

// askAtLeast asks s for progress until it answers at least floor.
func askAtLeast(ctx context.Context, s *etcdwatch.Stream, floor int64) (int64, error) {
	delay := 10 * time.Millisecond
	for {
		rev, err := s.RequestProgress(ctx)
		if err != nil || rev >= floor {
			return rev, err
		}
		if err := clock.Sleep(ctx, clock.Real, delay); err != nil {
			return 0, err
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// slots returns the group's Streams and the pinned ones open now, or
// ErrClosed.
func (g *Group) slots() ([]*slot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, etcdwatch.ErrClosed
	}
	out := append([]*slot(nil), g.own...)
	for sl := range g.pinned {
		out = append(out, sl)
	}
	return out, nil
}

// Close closes every Stream of the group, pinned ones included, which
// ends every watch with etcdwatch.ErrClosed, ends Context (views on the
// group end with it), waits for the group's goroutines, and closes
// Dial's connections. It is idempotent and always returns nil.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		var pinned []*slot
		for sl := range g.pinned {
			pinned = append(pinned, sl)
		}
		g.mu.Unlock()
		g.stop(etcdwatch.ErrClosed)
		for _, sl := range g.own {
			_ = sl.stream.Close()
		}
		for _, sl := range pinned {
			_ = sl.stream.Close()
		}
		g.wg.Wait()
		if g.members != nil {
			g.members.wait() // its goroutines ended with base
		}
		closeAll(g.owned)
		if g.members != nil {
			g.members.closed()
		}
	})
	return nil
}

// Conn returns a connection for RPCs of a wing's own (a view's Range
// calls), with the Streams' call options (Stream.Conn): each RPC goes on
// the connection of the group's next Stream in turn, so that with Dial the
// reads of many views spread over the members as their watches do. Under
// Dial, an RPC made with grpc.WaitForReady waits for a ready member, not
// for the one first chosen; a WaitForReady given as a default call option
// (grpc.WithDefaultCallOptions in WithDialOptions) is not seen, and such
// an RPC waits on the member chosen: pass it per call, or through the
// Streams' WithCallOptions.
func (g *Group) Conn() grpc.ClientConnInterface { return g.turns }

// Context returns a context that ends at Close, with cause
// etcdwatch.ErrClosed, for a wing's goroutines.
func (g *Group) Context() context.Context { return g.base }

// Logger returns the Streams' logger (etcdwatch.WithLogger in
// WithStreamOptions).
func (g *Group) Logger() *slog.Logger { return g.own[0].stream.Logger() }

// RetryDelay returns how long to wait after failures (>= 1) attempts in a
// row failed, by the Streams' WithReconnectBackoff.
func (g *Group) RetryDelay(failures int) time.Duration { return g.own[0].stream.RetryDelay(failures) }
