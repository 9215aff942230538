package scenarios

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target and cuts
// them all on demand. It is the one fault the scenarios need; it lives
// here, rather than coming from etcdwatchtest, so that this module does not
// depend on etcd's server.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every connection's copiers

	mu     sync.Mutex
	conns  map[net.Conn]net.Conn // client side -> server side
	closed bool
}

// NewProxy listens on 127.0.0.1:0 and forwards to target; it is closed
// when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	t.Cleanup(p.Close)
	return p
}

// Addr is the host:port to connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection, both sides, and returns how many.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c, s := range p.conns {
		c.Close()
		s.Close()
		delete(p.conns, c)
	}
	return n
}

// Close stops listening, cuts every connection and waits for the proxy's
// goroutines.
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
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed { // accepted while Close ran, after its Cut
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[c] = s
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, c, s) // each exits when either side is closed
		go p.pipe(c, s, c)
	}
}

// pipe copies src to dst until either closes, then closes both and forgets
// the pair of client c: a Cut counts only the connections still open.
func (p *Proxy) pipe(c, dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}
