package etcdwatchtest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a port on 127.0.0.1 to a target, and
// injects faults into them on demand: it cuts every connection, refuses new
// ones, delays what it forwards, or silently stops forwarding. Put one
// between a client and a [Server] (connect the client to Addr) to see what
// the client does when its connection fails. A Proxy forwards bytes, not
// messages: a fault lands wherever the byte stream happens to be. Its
// methods are safe for concurrent use; after Close, Cut, Refuse, SetDelay
// and Blackhole do nothing and new connections are refused.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // accept loop, every link's dial and copiers
	ctx    context.Context
	stop   context.CancelFunc // at Close: ends dials, delays and the accept loop's backoff

	mu       sync.Mutex
	links    map[*link]struct{} // from accept, before the target is dialed, until either side closes
	closed   bool
	refusing bool
	delay    time.Duration
	changed  chan struct{} // closed, and replaced, when delay changes: chunks under way look again
	accepted int

	// Set by tests of this package, before any connection: onDelay, if
	// set, is called when a chunk starts its delay; onEnd, when a direction
	// of a link has ended and the proxy has done what it does about it;
	// dial dials the target.
	onDelay func()
	onEnd   func()
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
}

// link is one proxied connection.
type link struct {
	client net.Conn
	done   chan struct{} // closed with the link: a chunk it holds for a delay is let go

	mu         sync.Mutex
	server     net.Conn // nil while the target is being dialed
	closed     bool
	blackholed bool // bytes are read and dropped, and ends are not passed on
	ended      int  // directions whose source has ended (ended)
}

// dialTimeout bounds the dial of the target for one accepted connection.
const dialTimeout = 10 * time.Second

// NewProxy starts a Proxy to target (a host:port, usually a [Server]'s
// Endpoint) on a port the kernel picks. It fails the test if it cannot
// listen, and closes the Proxy when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := ListenProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// ListenProxy starts a Proxy to target (a host:port) on a port the kernel
// picks, 127.0.0.1:0. It dials target for each connection it accepts, not
// now: a target that is down makes the proxy close the connections it
// accepts. The caller closes the Proxy.
func ListenProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}, changed: make(chan struct{}), dial: (&net.Dialer{}).DialContext}
	p.ctx, p.stop = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	return p, nil
}

// Addr is the host:port clients connect to. It does not change.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and returns how many there were. Both
// ends see the connection closed. A connection accepted but whose target
// is still being dialed counts as open: it is closed too. New connections
// are forwarded as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if l.close() {
			n++
		}
		delete(p.links, l)
	}
	return n
}

// Refuse makes the proxy close new connections as soon as it accepts them
// (on), or forward them again (off). Open connections are not affected.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = on
}

// SetDelay delays every chunk of bytes forwarded, in either direction and
// on every connection, by d from when it arrived; 0 ends the delay. A chunk
// already held waits for the new d instead (released at once by 0). Chunks
// of one direction of a connection stay in order, so the delay adds up
// when the sender is faster than one chunk per d.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
	close(p.changed)
	p.changed = make(chan struct{})
}

// Blackhole makes every open connection silently stop carrying bytes in
// either direction, as when a firewall or NAT forgets a flow: the
// connections stay open and nothing reports an error, not even the target
// closing its side (a member stopped or restarted), nor the client closing
// its own: both ends stay open until Cut or Close, as a server's streams
// do behind a real blackhole until its keepalive gives up. New connections
// are not affected. It returns how many connections it blackholed.
func (p *Proxy) Blackhole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		l.mu.Lock()
		if !l.closed {
			l.blackholed = true
			n++
		}
		l.mu.Unlock()
	}
	return n
}

// Accepted returns how many connections the proxy has forwarded since it
// started, open or not; refused ones do not count.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops listening, closes every connection and returns once every
// goroutine of the proxy has exited, without waiting out a delay
// (SetDelay) or a dial. Closing it again does nothing more.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.stop()
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// accept takes each connection and registers its link before dialing the
// target, so that Cut, Refuse and Blackhole reach a connection whose dial
// is under way. It exits when Close closes the listener; other Accept
// errors (out of file descriptors) are waited out.
func (p *Proxy) accept() {
	defer p.wg.Done()
	backoff := time.Duration(0)
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if !p.wait(backoff) {
				return
			}
			continue
		}
		backoff = 0
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.refusing { // closed: accepted while Close ran, after its Cut
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l) // exits once the target is dialed, or the dial failed
	}
}

// serve dials the target for l, then starts forwarding both ways.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	p.mu.Lock()
	dial := p.dial
	p.mu.Unlock()
	s, err := dial(ctx, "tcp", p.target)
	cancel()
	if err != nil || !l.connect(s) {
		p.drop(l)
		return
	}
	p.mu.Lock()
	p.accepted++
	p.mu.Unlock()
	p.wg.Add(2)
	go p.copy(l, s, l.client) // each copier exits when either side closes
	go p.copy(l, l.client, s)
}

// drop forgets l and closes both its sides.
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close()
}

// wait waits d, and reports false if Close came first.
func (p *Proxy) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.ctx.Done():
		return false
	}
}

// hold waits out the delay of a chunk of l that arrived at start: until
// start plus the delay set now, looking again each time SetDelay changes
// it. It reports false if l closed (a Cut) or Close came first.
func (p *Proxy) hold(l *link, start time.Time) bool {
	for {
		p.mu.Lock()
		d, changed := p.delay, p.changed
		p.mu.Unlock()
		left := time.Until(start.Add(d))
		if left <= 0 {
			return true
		}
		t := time.NewTimer(left)
		select {
		case <-t.C:
			return true
		case <-changed:
			t.Stop()
		case <-l.done:
			t.Stop()
			return false
		case <-p.ctx.Done():
			t.Stop()
			return false
		}
	}
}

// copy forwards src to dst until src ends (ended) or dst fails (the link
// is dropped).
func (p *Proxy) copy(l *link, dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, onDelay := p.delay, p.onDelay
			p.mu.Unlock()
			if delay > 0 {
				if onDelay != nil {
					onDelay()
				}
				if !p.hold(l, time.Now()) { // the injected fault itself, not synchronisation
					p.drop(l) // closed already, by a Cut or Close
					return
				}
			}
			l.mu.Lock()
			drop := l.blackholed
			l.mu.Unlock()
			if !drop {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					p.drop(l)
					return
				}
			}
		}
		if err != nil {
			p.ended(l, dst, err)
			return
		}
	}
}

// ended passes on the end of one direction of l, read from its source
// with err, to dst: a clean end (EOF) as dst's write side closing, TCP's
// half-close, so that a reply can still come the other way; any other, by
// dropping the link. Once both directions have ended the link is dropped.
// A blackholed link passes on nothing: the other side hears no more.
func (p *Proxy) ended(l *link, dst net.Conn, err error) {
	l.mu.Lock()
	l.ended++
	both, hole := l.ended == 2, l.blackholed
	l.mu.Unlock()
	switch {
	case both:
		p.drop(l)
	case hole:
	case errors.Is(err, io.EOF) && closeWrite(dst):
	default:
		p.drop(l)
	}
	p.mu.Lock()
	onEnd := p.onEnd
	p.mu.Unlock()
	if onEnd != nil {
		onEnd()
	}
}

// closeWrite closes c's write side, and reports whether it could.
func closeWrite(c net.Conn) bool {
	cw, ok := c.(interface{ CloseWrite() error })
	return ok && cw.CloseWrite() == nil
}

// connect gives l the connection to the target, and reports false, closing
// it, if l was closed while it was dialed.
func (l *link) connect(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		s.Close()
		return false
	}
	l.server = s
	return true
}

// close closes both sides of l, and reports whether it was open.
func (l *link) close() bool {
	l.mu.Lock()
	was := !l.closed
	if was {
		close(l.done)
	}
	l.closed = true
	s := l.server
	l.mu.Unlock()
	l.client.Close()
	if s != nil {
		s.Close()
	}
	return was
}
