package etcdwatchtest

import (
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
	wg     sync.WaitGroup // accept loop and every link's copiers

	mu       sync.Mutex
	links    map[*link]struct{}
	closed   bool
	refusing bool
	delay    time.Duration
	accepted int
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	mu             sync.Mutex
	blackholed     bool // bytes are read and dropped
}

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
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	return p, nil
}

// Addr is the host:port clients connect to. It does not change.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and returns how many there were. Both
// ends see the connection closed. New connections are forwarded as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.links)
	for l := range p.links {
		l.close()
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

// SetDelay delays every chunk of bytes forwarded from now on, in either
// direction and on every connection, by d; 0 ends the delay. Chunks of one
// direction of a connection stay in order, so the delay adds up when the
// sender is faster than one chunk per d.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Blackhole makes every open connection silently stop carrying bytes in
// either direction, as when a firewall or NAT forgets a flow: the
// connections stay open and nothing reports an error. New connections
// are not affected. It returns how many connections it blackholed.
func (p *Proxy) Blackhole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.mu.Lock()
		l.blackholed = true
		l.mu.Unlock()
	}
	return len(p.links)
}

// Accepted returns how many connections the proxy has forwarded since it
// started, open or not; refused ones do not count.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops listening, closes every connection and returns once every
// goroutine of the proxy has exited. Closing it again does nothing more.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refusing := p.refusing
		p.mu.Unlock()
		if refusing {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.closed { // accepted while Close ran: Cut has already been
			p.mu.Unlock()
			l.close()
			return
		}
		p.links[l] = struct{}{}
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(2)
		go p.copy(l, s, c) // each copier exits when either side closes
		go p.copy(l, c, s)
	}
}

// copy forwards src to dst until either fails, then closes the link.
func (p *Proxy) copy(l *link, dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay := p.delay
			p.mu.Unlock()
			if delay > 0 {
				time.Sleep(delay) // the injected fault itself, not synchronisation
			}
			l.mu.Lock()
			drop := l.blackholed
			l.mu.Unlock()
			if !drop {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return // EOF, a cut, or a reset: the link is done either way
		}
	}
}

func (l *link) close() {
	l.client.Close()
	l.server.Close()
}
