package etcdwatchtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Option adjusts a member's configuration before it first starts. The
// defaults suit tests: no logging, no fsync (a test member need not survive
// a power cut), and a 20 ms tick with a 200 ms election timeout, so that a
// cluster elects a leader soon after losing one. An Option is applied to
// every member of a cluster, after the defaults and the loopback URLs are
// set; the member's name and URLs are read back after it, so an Option may
// change them too. Options run before the constructor returns and are not
// kept; a start tried again on fresh ports (see StartClusterIn) runs them
// again, so an Option should set fields and do nothing else.
type Option func(*embed.Config)

// Server is one etcd member running in this process. Name and Endpoint are
// set before the constructor returns and never change, across restarts
// too. Its methods are safe for concurrent use; Stop and Restart run one
// at a time.
type Server struct {
	// Name is the member's name in its cluster: m0, m1 and so on.
	Name string
	// Endpoint is the host:port of the member's client listener, on
	// 127.0.0.1.
	Endpoint string

	cfg   *embed.Config
	peers []*Server  // every member of the cluster, this one included; set before the constructor returns
	life  sync.Mutex // held by Stop and Restart throughout

	mu       sync.Mutex
	etcd     *embed.Etcd // nil while stopped
	id       types.ID    // the member's ID, set at first start; stable across restarts
	isolated bool        // between Isolate and Rejoin
}

// StartEtcd starts a single member with its data in t.TempDir() and waits
// until it serves. It fails the test if the member cannot start, and stops
// the member when the test ends.
func StartEtcd(t testing.TB, opts ...Option) *Server {
	t.Helper()
	return StartCluster(t, 1, opts...)[0]
}

// StartCluster starts a cluster of n members with their data in
// t.TempDir() and waits until every member serves. It fails the test if
// the cluster cannot start, and stops every member when the test ends.
func StartCluster(t testing.TB, n int, opts ...Option) []*Server {
	t.Helper()
	members, err := StartClusterIn(t.TempDir(), n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { StopAll(members...) })
	return members
}

// StartEtcdIn starts a single member with its data under dir and waits
// until it serves. The caller stops it, before removing dir.
func StartEtcdIn(dir string, opts ...Option) (*Server, error) {
	members, err := StartClusterIn(dir, 1, opts...)
	if err != nil {
		return nil, err
	}
	return members[0], nil
}

// StartClusterIn starts a cluster of n members with their data under dir
// and waits until every member serves. The caller stops them, with
// StopAll for speed, before removing dir.
//
// Ports are handed out by the kernel (127.0.0.1:0) and released just
// before the members bind them, so another socket can take one in between:
// a start that fails for a port in use is tried again on fresh ports, up
// to three times in all, each try in a new directory under dir. Any other
// failure is returned at once.
func StartClusterIn(dir string, n int, opts ...Option) ([]*Server, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdwatchtest: a cluster of %d members", n)
	}
	var errs []error
	for attempt := range 3 {
		members, err := startCluster(filepath.Join(dir, fmt.Sprint("try", attempt)), n, opts)
		if err == nil {
			return members, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func startCluster(dir string, n int, opts []Option) ([]*Server, error) {
	members := make([]*Server, n)
	urls, err := freeURLs(2 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := range members {
		client, peer := urls[2*i], urls[2*i+1]
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.UnsafeNoFsync = true
		cfg.TickMs, cfg.ElectionMs = 20, 200
		for _, o := range opts {
			o(cfg)
		}
		if len(cfg.AdvertiseClientUrls) == 0 || len(cfg.AdvertisePeerUrls) == 0 {
			return nil, fmt.Errorf("etcdwatchtest: member %s has no client or peer URL", cfg.Name)
		}
		initial = append(initial, cfg.Name+"="+cfg.AdvertisePeerUrls[0].String())
		members[i] = &Server{Name: cfg.Name, Endpoint: cfg.AdvertiseClientUrls[0].Host, cfg: cfg}
	}
	for _, m := range members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
		m.peers = members
		e, err := embed.StartEtcd(m.cfg)
		if err != nil {
			StopAll(members...)
			return nil, fmt.Errorf("etcdwatchtest: start member %s: %w", m.Name, err)
		}
		m.etcd = e
		m.id = e.Server.MemberID()
	}
	for _, m := range members {
		if err := waitReady(m.Name, m.etcd); err != nil {
			StopAll(members...)
			return nil, err
		}
	}
	return members, nil
}

// StopAll stops the members and returns once every one has stopped: the
// followers together, then the leader. That order is the quickest: a
// leader stopped first hands its leadership over, which takes a second,
// and one stopped together with its followers waits seconds for a handover
// that cannot happen. Each stops as Stop does; StopAll may be called
// concurrently with any method of the members.
func StopAll(members ...*Server) {
	var wg sync.WaitGroup
	var leaders []*Server
	for _, m := range members {
		if m.IsLeader() {
			leaders = append(leaders, m)
		} else {
			wg.Go(m.Stop)
		}
	}
	wg.Wait()
	for _, m := range leaders {
		m.Stop()
	}
}

// freeURLs returns n loopback URLs on distinct ports the kernel just
// handed out: every listener stays open until all n are chosen, so that
// none is handed out twice.
func freeURLs(n int) ([]url.URL, error) {
	urls := make([]url.URL, n)
	for i := range urls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		urls[i] = url.URL{Scheme: "http", Host: l.Addr().String()}
	}
	return urls, nil
}

func waitReady(name string, e *embed.Etcd) error {
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcdwatchtest: member %s failed: %w", name, err)
	case <-t.C:
		return fmt.Errorf("etcdwatchtest: member %s not ready after a minute", name)
	}
}

func (s *Server) running() *embed.Etcd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.etcd
}

// Stop stops the member and returns once it has stopped. Its data and
// ports are kept for Restart. Stopping a stopped member does nothing.
func (s *Server) Stop() {
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	e := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	if e == nil {
		return
	}
	select {
	case <-e.Server.ReadyNotify():
	default:
		// It never served (isolated since it restarted): embed's Close
		// would wait for its serving to begin, which waits for its
		// server to stop. Stop that first.
		e.Server.Stop()
	}
	e.Close() // returns once the server has stopped
}

// Restart starts a stopped member again on its data and ports, and waits
// until it serves: in a cluster, until it has rejoined a quorum, which
// needs a majority of the members running, so restart the members of a
// cluster stopped whole concurrently, not one after another. An isolated
// member cannot serve until Rejoin: Restart returns once it has started,
// cut off again. It fails if the member is running, or if one of its
// ports has been taken meanwhile.
func (s *Server) Restart() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.running() != nil {
		return fmt.Errorf("etcdwatchtest: restart member %s: it is running", s.Name)
	}
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		return fmt.Errorf("etcdwatchtest: restart member %s: %w", s.Name, err)
	}
	s.mu.Lock()
	s.etcd = e
	self := s.isolated
	s.mu.Unlock()
	for _, p := range s.peers { // isolation outlasts a restart, of either side
		if p != s && (self || p.isIsolated()) {
			e.Server.CutPeer(p.id)
		}
	}
	if self {
		return nil // it would wait its minute for a quorum it cannot reach
	}
	return waitReady(s.Name, e)
}

// IsLeader reports whether the member is running and its cluster's leader.
func (s *Server) IsLeader() bool {
	e := s.running()
	return e != nil && e.Server.Leader() == e.Server.MemberID()
}

// HasLeader reports whether the member is running and knows of a leader in
// its cluster. A member cut off from its quorum loses its leader within an
// election timeout or two.
func (s *Server) HasLeader() bool {
	e := s.running()
	return e != nil && e.Server.Leader() != 0
}

// Isolate cuts the member off from the other members of its cluster, as a
// network partition would, while clients still reach it: it and each
// running peer drop the raft messages they would send the other (etcd's
// own partition hook, EtcdServer.CutPeer). An isolated follower loses its
// leader within an election timeout or two, and etcd then refuses, on it,
// requests and watch streams that require a leader; an isolated leader
// steps down, and the rest elect another. The others keep serving if they
// are a quorum. Isolating an isolated member does nothing more.
//
// Isolation lasts until Rejoin, whatever happens meanwhile: a member or a
// peer stopped then is cut off as it restarts (as it starts, before the cut
// is made again, a message or two may pass), and Rejoin of another member
// leaves this one isolated.
func (s *Server) Isolate() { s.partition(true) }

// Rejoin undoes Isolate: the member and its peers send each other their
// raft messages again, but for peers still isolated themselves, and it
// rejoins the cluster (a follower that lost its leader finds it at the
// leader's next heartbeat).
func (s *Server) Rejoin() { s.partition(false) }

func (s *Server) isIsolated() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.isolated
}

func (s *Server) partition(cut bool) {
	s.mu.Lock()
	s.isolated = cut
	s.mu.Unlock()
	e := s.running()
	for _, p := range s.peers {
		if p == s {
			continue
		}
		pe := p.running()
		if cut {
			if e != nil {
				e.Server.CutPeer(p.id) // a stopped peer too: it is cut when it comes back
			}
			if pe != nil {
				pe.Server.CutPeer(s.id)
			}
		} else if !p.isIsolated() {
			if e != nil {
				e.Server.MendPeer(p.id)
			}
			if pe != nil {
				pe.Server.MendPeer(s.id)
			}
		}
	}
}

// Dial returns a gRPC connection to the member's Endpoint, without TLS
// (opts come after that and may override it), for etcdwatch.Open or
// etcd's generated clients. It does not connect until first used, works
// whether the member is running or not, and reconnects across restarts.
// The caller closes it.
func (s *Server) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	return grpc.NewClient("passthrough:///"+s.Endpoint, opts...)
}

// LeakOptions returns the goleak options that ignore what stopped members
// leave behind for a moment: idle HTTP connections between peers, which
// close on their own. Pass them to goleak.VerifyTestMain or goleak.Find in
// a package whose tests run members. Each call returns a new slice.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	}
}
