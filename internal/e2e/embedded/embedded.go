// Package embedded runs etcd members in-process on loopback, for tests,
// examples and benchmarks: one member, or a cluster whose members can be
// stopped and restarted on the same data directories and ports.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Config adjusts a member's configuration before it starts.
type Config func(*embed.Config)

// Server is one member. Its Endpoint and ports stay the same across restarts.
type Server struct {
	Name     string
	Endpoint string // host:port of the client listener
	cfg      *embed.Config
	etcd     *embed.Etcd // nil while stopped
}

// Start starts a single member whose data lives in dir and waits until it serves.
func Start(dir string, configs ...Config) (*Server, error) {
	members, err := StartCluster(dir, 1, configs...)
	if err != nil {
		return nil, err
	}
	return members[0], nil
}

// StartCluster starts n members with data under dir and waits until all
// serve. Ports are picked by the kernel (127.0.0.1:0) and kept for restarts.
// A port can be taken by another socket between the kernel handing it out
// and the member binding it, so a start that fails is tried again, up to
// three times, on fresh ports.
func StartCluster(dir string, n int, configs ...Config) ([]*Server, error) {
	var errs []error
	for attempt := range 3 {
		members, err := startCluster(filepath.Join(dir, fmt.Sprint("try", attempt)), n, configs...)
		if err == nil {
			return members, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startCluster(dir string, n int, configs ...Config) ([]*Server, error) {
	members := make([]*Server, n)
	var initial []string
	for i := range members {
		client, err := freeURL()
		if err != nil {
			return nil, err
		}
		peer, err := freeURL()
		if err != nil {
			return nil, err
		}
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.UnsafeNoFsync = true // a test member need not survive a power cut
		cfg.TickMs, cfg.ElectionMs = 20, 200
		for _, c := range configs {
			c(cfg)
		}
		initial = append(initial, cfg.Name+"="+peer.String())
		members[i] = &Server{Name: cfg.Name, Endpoint: client.Host, cfg: cfg}
	}
	for _, m := range members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
		e, err := embed.StartEtcd(m.cfg)
		if err != nil {
			stopAll(members)
			return nil, fmt.Errorf("start member %s: %w", m.Name, err)
		}
		m.etcd = e
	}
	for _, m := range members {
		if err := m.waitReady(); err != nil {
			stopAll(members)
			return nil, err
		}
	}
	return members, nil
}

func stopAll(members []*Server) {
	for _, m := range members {
		if m != nil {
			m.Stop()
		}
	}
}

// freeURL returns a loopback URL on a port the kernel just handed out.
func freeURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

func (s *Server) waitReady() error {
	select {
	case <-s.etcd.Server.ReadyNotify():
		return nil
	case err := <-s.etcd.Err():
		return fmt.Errorf("member %s failed: %w", s.Name, err)
	case <-time.After(time.Minute):
		return fmt.Errorf("member %s not ready after a minute", s.Name)
	}
}

// Stop stops the member and waits for it, up to a minute (a member that
// never joined its cluster may not report that it stopped). Stopping a
// stopped member does nothing.
func (s *Server) Stop() {
	if s.etcd == nil {
		return
	}
	s.etcd.Close()
	select {
	case <-s.etcd.Server.StopNotify():
	case <-time.After(time.Minute):
	}
	s.etcd = nil
}

// Restart starts a stopped member again on its data and ports, and waits
// until it serves (in a cluster, until it has rejoined a quorum).
func (s *Server) Restart() error {
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		return fmt.Errorf("restart member %s: %w", s.Name, err)
	}
	s.etcd = e
	return s.waitReady()
}

// IsLeader reports whether the running member is its cluster's leader.
func (s *Server) IsLeader() bool {
	return s.etcd != nil && s.etcd.Server.Leader() == s.etcd.Server.MemberID()
}

// HasLeader reports whether the running member knows of a leader in its
// cluster. A member cut off from its quorum loses it within an election
// timeout or two.
func (s *Server) HasLeader() bool {
	return s.etcd != nil && s.etcd.Server.Leader() != 0
}

// Dial returns a gRPC connection to the member for etcdwatch.Open.
func (s *Server) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	return grpc.NewClient("passthrough:///"+s.Endpoint, opts...)
}
