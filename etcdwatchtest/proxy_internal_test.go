package etcdwatchtest

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// sink accepts connections and holds them, unread, until the test ends.
func sink(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() { // exits when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("no %s within %v", what, wait)
	}
}

// TestCutReachesAConnectionBeingDialed: Refuse and Cut while the proxy
// dials the target for a connection it accepted close that connection too:
// a partition partitions a client caught mid-reconnect. Catches a link
// registered only once its dial returned, which Cut missed and which then
// forwarded.
func TestCutReachesAConnectionBeingDialed(t *testing.T) {
	p, err := ListenProxy(sink(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	dialing, released := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release) // before p.Close, which waits for the dial
	p.mu.Lock()
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		<-released
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	p.mu.Unlock()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	await(t, dialing, "dial of the target")
	p.Refuse(true)
	require.Equal(t, 1, p.Cut(), "the connection being dialed is open")
	release()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the connection was not closed")
	p.Close() // waits for the dial's goroutine
	require.Zero(t, p.Accepted(), "a cut connection was forwarded")
}

// TestCloseDoesNotWaitOutADelay: Close returns while a chunk waits out a
// long SetDelay. Catches a delay slept through, which made Close (and a
// test's cleanup) last as long as the delay.
func TestCloseDoesNotWaitOutADelay(t *testing.T) {
	p, err := ListenProxy(sink(t))
	require.NoError(t, err)
	delaying := make(chan struct{})
	var once sync.Once
	p.mu.Lock()
	p.onDelay = func() { once.Do(func() { close(delaying) }) }
	p.mu.Unlock()
	p.SetDelay(time.Hour)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	await(t, delaying, "delay")
	closed := make(chan struct{})
	go func() { // exits when Close returns
		p.Close()
		close(closed)
	}()
	await(t, closed, "return from Close during an hour's delay")
}

// echo echoes each connection's bytes back until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() { // exits when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) }) // until the connection closes
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestSetDelayZeroEndsADelayUnderWay: a chunk held by a long delay is
// released as soon as SetDelay(0) ends the delay, not when the old delay
// would have passed.
func TestSetDelayZeroEndsADelayUnderWay(t *testing.T) {
	p, err := ListenProxy(echo(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	delaying := make(chan struct{})
	once := sync.OnceFunc(func() { close(delaying) })
	p.mu.Lock()
	p.onDelay = once
	p.mu.Unlock()
	p.SetDelay(time.Hour)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	await(t, delaying, "delay")
	p.SetDelay(0)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	_, err = io.ReadFull(c, make([]byte, 1))
	require.NoError(t, err, "the byte is still held by the hour's delay")
}

// TestCutCountsOnlyOpenConnections: Cut and Blackhole count the
// connections they reach that are open, not those already closed whose
// goroutines have yet to let them go (here, one whose target is still
// being dialed when the first Cut closed it).
func TestCutCountsOnlyOpenConnections(t *testing.T) {
	p, err := ListenProxy(sink(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	dialing, released := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release) // before p.Close, which waits for the dial
	p.mu.Lock()
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		<-released
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	p.mu.Unlock()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	await(t, dialing, "dial of the target")
	require.Equal(t, 1, p.Cut())
	require.Equal(t, 0, p.Cut(), "the connection was closed by the first Cut")
	require.Equal(t, 0, p.Blackhole(), "no connection is open")
}

// TestCutEndsADelayUnderWay: a Cut lets go of a chunk held for a delay on
// the connection it closes: the goroutines forwarding it exit then, not
// when the delay would have passed.
func TestCutEndsADelayUnderWay(t *testing.T) {
	p, err := ListenProxy(sink(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	delaying := make(chan struct{})
	p.mu.Lock()
	p.onDelay = sync.OnceFunc(func() { close(delaying) })
	p.mu.Unlock()
	p.SetDelay(time.Hour)
	before := goleak.IgnoreCurrent() // the proxy's accept loop and the sink's
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	await(t, delaying, "delay")
	require.Equal(t, 1, p.Cut())
	c.Close()
	goleak.VerifyNone(t, before) // the link's copiers have exited
}

// proxiedLink returns a proxy to a listener of the test's, after set (if
// not nil) has set its hooks, and the two ends of a connection through
// it: the client's and the target's. All close when the test ends.
func proxiedLink(t *testing.T, set func(*Proxy)) (p *Proxy, client, target net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	p, err = ListenProxy(ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(p.Close)
	if set != nil {
		set(p)
	}
	client, err = net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	target, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { target.Close() })
	return p, client, target
}

// TestBlackholeHidesTheTargetsEnd: a blackholed connection stays open for
// the client when the target closes its side (a member stopped), as behind
// a firewall that forgot the flow. Catches: the target's end passed on,
// which told the client at once, so that its keepalive and liveness checks
// never ran; the soak's blackhole-then-restart was a plain cut.
func TestBlackholeHidesTheTargetsEnd(t *testing.T) {
	ended := make(chan struct{}, 2)
	p, c, srv := proxiedLink(t, func(p *Proxy) { p.onEnd = func() { ended <- struct{}{} } })
	_, err := srv.Write([]byte("x")) // the link is up
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	_, err = io.ReadFull(c, make([]byte, 1))
	require.NoError(t, err)

	require.Equal(t, 1, p.Blackhole())
	require.NoError(t, srv.Close())
	await(t, ended, "end of the target's side") // the proxy has read it, and done what it does
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the client learned that the target closed")
	require.Equal(t, 1, p.Cut(), "the link is open until cut")
}

// TestCloseCancelsADial: Close cancels a dial of the target under way
// rather than letting it run to its own timeout. Catches a Close that does
// not cancel the proxy's context (or a dial not derived from it).
func TestCloseCancelsADial(t *testing.T) {
	p, err := ListenProxy(sink(t))
	require.NoError(t, err)
	dialing := make(chan struct{})
	dialErr := make(chan error, 1)
	p.mu.Lock()
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		<-ctx.Done() // a target that never answers
		dialErr <- ctx.Err()
		return nil, ctx.Err()
	}
	p.mu.Unlock()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	await(t, dialing, "dial of the target")
	p.Close()
	require.ErrorIs(t, <-dialErr, context.Canceled, "Close waited out the dial's timeout")
}

// TestChangedDelayStillHolds: a chunk held by a delay that SetDelay
// changes to another long delay stays held. Catches a change of delay
// taken for its end, which released the chunk at once. (As in
// TestProxySetDelay, no duration is measured in the passing direction.)
func TestChangedDelayStillHolds(t *testing.T) {
	delaying := make(chan struct{})
	p, c, srv := proxiedLink(t, func(p *Proxy) {
		p.mu.Lock()
		p.onDelay = sync.OnceFunc(func() { close(delaying) })
		p.mu.Unlock()
		p.SetDelay(time.Hour)
	})
	_, err := c.Write([]byte("x"))
	require.NoError(t, err)
	await(t, delaying, "delay")
	p.SetDelay(2 * time.Hour)
	// One crossing only, client to target: what the target reads.
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = srv.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a chunk came through under a changed, long delay")
	p.SetDelay(0)
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(wait)))
	_, err = io.ReadFull(srv, make([]byte, 1))
	require.NoError(t, err)
}

// TestFinishedLinkIsForgotten: a connection whose two directions both
// ended cleanly (half-close, reply, close) is closed and forgotten: a Cut
// after it finds nothing open. Catches a link never dropped once both
// directions ended, which kept its sockets and counted in Cut.
func TestFinishedLinkIsForgotten(t *testing.T) {
	p, c, srv := proxiedLink(t, nil)
	_, err := c.Write([]byte("req"))
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	require.NoError(t, srv.SetDeadline(time.Now().Add(wait)))
	req, err := io.ReadAll(srv)
	require.NoError(t, err)
	_, err = srv.Write(append([]byte("re:"), req...))
	require.NoError(t, err)
	require.NoError(t, srv.Close())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	got, err := io.ReadAll(c) // its end comes once the proxy dropped the link
	require.NoError(t, err)
	require.Equal(t, "re:req", string(got))
	require.Equal(t, 0, p.Cut(), "a finished connection is still open in the proxy")
}

// TestCutDuringDialIsNotForwarded: a connection cut while its target
// is dialed is not forwarded once the dial succeeds, even with the proxy
// still running. Catches the link's closed state ignored after the dial
// (TestCutReachesAConnectionBeingDialed lets Close fail the dial first).
func TestCutDuringDialIsNotForwarded(t *testing.T) {
	p, err := ListenProxy(sink(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	dialing, released, dialed := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	p.mu.Lock()
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		<-released
		s, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		dialed <- err
		return s, err
	}
	p.mu.Unlock()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	await(t, dialing, "dial of the target")
	require.Equal(t, 1, p.Cut())
	release()
	select {
	case err := <-dialed:
		require.NoError(t, err, "the dial itself must succeed for this test")
	case <-time.After(wait):
		t.Fatal("no dial")
	}
	p.Close() // waits for serve, which has the dialed connection
	require.Zero(t, p.Accepted(), "a cut connection was forwarded")
}
