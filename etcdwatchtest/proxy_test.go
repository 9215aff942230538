package etcdwatchtest_test

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// echoServer echoes every connection's bytes back, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
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

// connect opens a connection to addr, closed when the test ends.
func connect(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg on c and requires it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(wait)))
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

// requireClosed requires that the other end of c has closed it.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "still open")
}

func TestProxyForwards(t *testing.T) {
	p := etcdwatchtest.NewProxy(t, echoServer(t))
	_, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:"+port, p.Addr())
	require.Equal(t, 0, p.Accepted())
	a, b := connect(t, p.Addr()), connect(t, p.Addr())
	roundTrip(t, a, "hello")
	roundTrip(t, b, "world")
	require.Equal(t, 2, p.Accepted())
}

// TestProxyCut: Cut closes the open connections and counts them; new ones
// are forwarded as before.
func TestProxyCut(t *testing.T) {
	p := etcdwatchtest.NewProxy(t, echoServer(t))
	a, b := connect(t, p.Addr()), connect(t, p.Addr())
	roundTrip(t, a, "a")
	roundTrip(t, b, "b")
	require.Equal(t, 2, p.Cut())
	requireClosed(t, a)
	requireClosed(t, b)
	roundTrip(t, connect(t, p.Addr()), "c")
	require.Equal(t, 3, p.Accepted())
}

// TestProxyRefuse: a refusing proxy closes new connections at once and
// leaves open ones alone.
func TestProxyRefuse(t *testing.T) {
	p := etcdwatchtest.NewProxy(t, echoServer(t))
	open := connect(t, p.Addr())
	roundTrip(t, open, "before")
	p.Refuse(true)
	requireClosed(t, connect(t, p.Addr()))
	roundTrip(t, open, "during")
	require.Equal(t, 1, p.Accepted())
	p.Refuse(false)
	roundTrip(t, connect(t, p.Addr()), "after")
	require.Equal(t, 2, p.Accepted())
}

// TestProxySetDelay: a round trip crosses the proxy twice, so nothing
// comes back within the delay; the bytes come back whole after it. (As in
// TestProxyBlackhole, no duration is measured: a loaded machine can make a
// broken proxy pass, not a working one fail.)
func TestProxySetDelay(t *testing.T) {
	p := etcdwatchtest.NewProxy(t, echoServer(t))
	c := connect(t, p.Addr())
	const d = 200 * time.Millisecond
	p.SetDelay(d)
	_, err := c.Write([]byte("slow"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a delayed echo came back within the delay")
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	got := make([]byte, len("slow"))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "slow", string(got))
	p.SetDelay(0)
	roundTrip(t, c, "fast")
}

// TestProxyBlackhole: a blackholed connection stays open and carries
// nothing; new connections are forwarded. (That nothing arrives is checked
// for 200 ms: a loaded machine can make a broken proxy pass, not a working
// one fail.)
func TestProxyBlackhole(t *testing.T) {
	p := etcdwatchtest.NewProxy(t, echoServer(t))
	c := connect(t, p.Addr())
	roundTrip(t, c, "before")
	require.Equal(t, 1, p.Blackhole())
	_, err := c.Write([]byte("lost"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	roundTrip(t, connect(t, p.Addr()), "new")
}

// oneConnServer accepts one connection and hands it to the test, which
// closes it when it ends.
func oneConnServer(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 1)
	go func() { // exits after one Accept, or when the listener closes
		c, err := ln.Accept()
		if err != nil {
			close(ch)
			return
		}
		t.Cleanup(func() { c.Close() })
		ch <- c
	}()
	return ln.Addr().String(), ch
}

// TestProxyHalfClose: a client that sends its request and closes its
// write side (TCP's half-close) still gets the reply. Catches: the
// client's end taken for the whole link's, which closed the target's side
// before it answered.
func TestProxyHalfClose(t *testing.T) {
	addr, conns := oneConnServer(t)
	p := etcdwatchtest.NewProxy(t, addr)
	c := connect(t, p.Addr())
	_, err := c.Write([]byte("request"))
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	srv := <-conns
	require.NotNil(t, srv)
	served := make(chan error, 1)
	go func() { // exits once it has answered
		req, err := io.ReadAll(srv)
		if err == nil {
			_, err = srv.Write(append([]byte("reply to "), req...))
		}
		served <- errors.Join(err, srv.Close())
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "reply to request", string(got))
	require.NoError(t, <-served)
}

// TestProxyClose: Close closes every connection and stops listening;
// TestMain's leak check proves that its goroutines have exited. A second
// Close does nothing.
func TestProxyClose(t *testing.T) {
	p, err := etcdwatchtest.ListenProxy(echoServer(t))
	require.NoError(t, err)
	c := connect(t, p.Addr())
	roundTrip(t, c, "open")
	p.Close()
	requireClosed(t, c)
	_, err = net.Dial("tcp", p.Addr())
	require.Error(t, err, "still listening")
	p.Close()
	require.Equal(t, 0, p.Cut())
}

// TestProxyTargetDown: a connection the proxy cannot forward is closed.
func TestProxyTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := etcdwatchtest.NewProxy(t, down)
	requireClosed(t, connect(t, p.Addr()))
	require.Equal(t, 0, p.Accepted())
}
