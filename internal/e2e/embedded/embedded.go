// Package embedded runs a single-member etcd server in-process, listening on
// loopback ports the kernel picks, for tests, examples and benchmarks.
package embedded

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Server is a running embedded etcd.
type Server struct {
	etcd     *embed.Etcd
	Endpoint string // host:port of the client listener
}

// Config adjusts the server before it starts.
type Config func(*embed.Config)

// Start starts a member whose data lives in dir and waits until it serves.
func Start(dir string, configs ...Config) (*Server, error) {
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{loopback}
	cfg.AdvertiseClientUrls = []url.URL{loopback}
	cfg.ListenPeerUrls = []url.URL{loopback}
	cfg.AdvertisePeerUrls = []url.URL{loopback}
	cfg.InitialCluster = cfg.Name + "=" + loopback.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true // a test member need not survive a power cut
	for _, c := range configs {
		c(cfg)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd failed: %w", err)
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after a minute")
	}
	return &Server{etcd: e, Endpoint: e.Clients[0].Addr().String()}, nil
}

// Dial returns a gRPC connection to the server for etcdwatch.Open.
func (s *Server) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	return grpc.NewClient("passthrough:///"+s.Endpoint, opts...)
}

// Close stops the server and waits for it.
func (s *Server) Close() {
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
}
