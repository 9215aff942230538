// Package faults injects network faults between a client and etcd: a TCP
// proxy on loopback that can cut every connection, refuse new ones, add
// delay, or silently blackhole the connections it carries.
package faults

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from its loopback address to a target.
// Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // accept loop and every link's copiers

	mu       sync.Mutex
	links    map[*link]struct{}
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

// NewProxy listens on 127.0.0.1:0 and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and returns how many there were.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.links)
	for l := range p.links {
		l.close()
	}
	return n
}

// Refuse makes the proxy close new connections at once (on) or forward them (off).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = on
}

// SetDelay delays every chunk forwarded from now on by d.
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

// Accepted returns how many connections the proxy has forwarded.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops the proxy, closes every connection and waits for its goroutines.
func (p *Proxy) Close() {
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
