package etcdwatch

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	backoffpkg "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// Dial returns a gRPC connection that spreads over several etcd members,
// for Open. It uses grpc-go's own machinery: a fixed list of addresses and
// the round_robin policy, so each new Watch stream goes to a member that is
// up, and a Stream whose member fails (or, with WithRequireLeader, loses its
// leader) resumes on another. It also turns on gRPC keepalive (10s, 5s
// timeout; etcd refuses pings more often than every 5s), which is what
// replaces a TCP connection that silently stopped carrying packets, and
// reconnects to a member that comes back within 100ms to 3s (gRPC's own
// default waits from 1s up to 2 minutes).
//
// Endpoints are "host:port", optionally with an http:// or https:// scheme;
// the port is required.
// Transport credentials are required in opts (for example
// grpc.WithTransportCredentials(insecure.NewCredentials()) for plain text);
// later options override the defaults above.
//
// To share the connection of an existing go.etcd.io/etcd/client/v3 Client,
// with its credentials and auth token, pass client.ActiveConnection() to
// Open instead.
func Dial(endpoints []string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: Dial needs at least one endpoint", ErrInvalidArgument)
	}
	addrs := make([]resolver.Address, 0, len(endpoints))
	for _, ep := range endpoints {
		host, err := endpointHost(ep)
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, resolver.Address{Addr: host})
	}
	r := manual.NewBuilderWithScheme("etcdwatch")
	r.InitialState(resolver.State{Addresses: addrs})
	opts = append([]grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoffpkg.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	return grpc.NewClient(r.Scheme()+":///etcd", opts...)
}

// endpointHost returns host:port from "host:port" or "scheme://host:port".
// The port is required: etcd has no single default one (2379 for clients,
// but often another), and gRPC would dial port 443.
func endpointHost(ep string) (string, error) {
	host := ep
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("%w: endpoint %q is not a URL with a host", ErrInvalidArgument, ep)
		}
		host = u.Host
	}
	if ep == "" {
		return "", fmt.Errorf("%w: empty endpoint", ErrInvalidArgument)
	}
	_, port, err := net.SplitHostPort(host)
	if err != nil {
		return "", fmt.Errorf("%w: endpoint %q needs host:port: %w", ErrInvalidArgument, ep, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%w: endpoint %q has no valid port", ErrInvalidArgument, ep)
	}
	return host, nil
}
