package etcdwatch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	backoffpkg "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
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
// the port is required. Each member's TLS certificate is verified against
// that member's own host (unless the tls.Config names a ServerName).
//
// Transport security is required in opts: WithTLS or WithTLSFiles, or
// grpc.WithTransportCredentials (insecure.NewCredentials() for plain
// text). Options apply in order, over the defaults above, later ones
// overriding earlier ones, then Dial checks them together with the
// endpoints' schemes; it refuses, with an error wrapping
// ErrInvalidArgument:
//   - an https:// endpoint on a connection without transport security
//     (the scheme is not silently dropped);
//   - an http:// endpoint with WithTLS or WithTLSFiles;
//   - http:// and https:// endpoints together: one connection has one
//     kind of transport security.
//
// Endpoints without a scheme take whatever opts say. An http:// endpoint
// with TLS given through grpc.WithTransportCredentials cannot be told
// apart here; its handshake fails, which Stream.State reports.
//
// WithPassword authenticates with etcd's Auth RPC and attaches the token
// to every RPC on the connection, renewing it when the server refuses it.
//
// To share the connection of an existing go.etcd.io/etcd/client/v3 Client,
// with its credentials and auth token, pass client.ActiveConnection() to
// Open instead.
func Dial(endpoints []string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: Dial needs at least one endpoint", ErrInvalidArgument)
	}
	addrs := make([]resolver.Address, 0, len(endpoints))
	var schemes endpointSchemes
	for _, ep := range endpoints {
		e, err := parseEndpoint(ep)
		if err != nil {
			return nil, err
		}
		if err := schemes.add(e); err != nil {
			return nil, err
		}
		// ServerName is the authority of this address's RPCs, and the name
		// its TLS certificate is verified against (gRPC drops the port).
		addrs = append(addrs, resolver.Address{Addr: e.host, ServerName: e.host})
	}
	s := dialSettings{}
	for _, o := range opts {
		if own, ok := o.(dialOption); ok {
			own.apply(&s)
		} else {
			s.grpc = append(s.grpc, o)
		}
	}
	if err := s.validate(schemes); err != nil {
		return nil, err
	}
	r := manual.NewBuilderWithScheme("etcdwatch")
	r.InitialState(resolver.State{Addresses: addrs})
	base := []grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoffpkg.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	all := append(base, s.grpc...)
	if s.auth != nil {
		all = append(all, grpc.WithChainUnaryInterceptor(s.auth.unary), grpc.WithChainStreamInterceptor(s.auth.stream))
	}
	target := r.Scheme() + ":///etcd"
	if schemes.https == "" {
		conn, err := grpc.NewClient(target, all...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		return conn, nil
	}
	// gRPC refuses per-RPC credentials that require transport security on
	// a connection without it: that is how an https:// endpoint given plain
	// text is caught, since the transport credentials in opts cannot be read.
	conn, err := grpc.NewClient(target, append(all, grpc.WithPerRPCCredentials(transportSecurity{}))...)
	if err == nil {
		return conn, nil
	}
	other, oerr := grpc.NewClient(target, all...)
	if oerr != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, oerr)
	}
	_ = other.Close()
	return nil, fmt.Errorf("%w: endpoint %q asks for TLS, but the connection has no transport security (use WithTLS or WithTLSFiles)",
		ErrInvalidArgument, schemes.https)
}

// transportSecurity adds no metadata; it only requires transport security.
type transportSecurity struct{}

func (transportSecurity) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return nil, nil
}
func (transportSecurity) RequireTransportSecurity() bool { return true }

// endpoint is one parsed Dial endpoint.
type endpoint struct {
	raw    string
	scheme string // "", "http" or "https"
	host   string // host:port
}

// endpointSchemes remembers one endpoint of each scheme seen.
type endpointSchemes struct{ http, https string }

func (s *endpointSchemes) add(e endpoint) error {
	switch e.scheme {
	case "http":
		s.http = e.raw
	case "https":
		s.https = e.raw
	}
	if s.http != "" && s.https != "" {
		return fmt.Errorf("%w: endpoints %q and %q: http:// and https:// cannot share a connection", ErrInvalidArgument, s.http, s.https)
	}
	return nil
}

// parseEndpoint reads "host:port" or "scheme://host:port". The port is
// required: etcd has no single default one (2379 for clients, but often
// another), and gRPC would dial port 443.
func parseEndpoint(ep string) (endpoint, error) {
	e := endpoint{raw: ep, host: ep}
	if ep == "" {
		return e, fmt.Errorf("%w: empty endpoint", ErrInvalidArgument)
	}
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return e, fmt.Errorf("%w: endpoint %q is not a URL with a host", ErrInvalidArgument, ep)
		}
		e.scheme, e.host = strings.ToLower(u.Scheme), u.Host
		if e.scheme != "http" && e.scheme != "https" {
			return e, fmt.Errorf("%w: endpoint %q: scheme must be http or https", ErrInvalidArgument, ep)
		}
	}
	_, port, err := net.SplitHostPort(e.host)
	if err != nil {
		return e, fmt.Errorf("%w: endpoint %q needs host:port: %w", ErrInvalidArgument, ep, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return e, fmt.Errorf("%w: endpoint %q has no valid port", ErrInvalidArgument, ep)
	}
	return e, nil
}

// dialSettings is what Dial's own options set. Each takes effect where it
// stands among the gRPC options.
type dialSettings struct {
	grpc []grpc.DialOption // in order, with WithTLS and WithTLSFiles turned into transport credentials
	tls  string            // the last of WithTLS and WithTLSFiles given, for messages; "" if none
	auth *tokenAuth        // from WithPassword; nil for none
	err  error             // the first option that could not be applied
}

func (s *dialSettings) validate(schemes endpointSchemes) error {
	switch {
	case s.err != nil:
		return s.err
	case s.tls != "" && schemes.http != "":
		return fmt.Errorf("%w: endpoint %q asks for plain text, but %s was given", ErrInvalidArgument, schemes.http, s.tls)
	case s.auth != nil && s.auth.user == "":
		return fmt.Errorf("%w: WithPassword needs a user name", ErrInvalidArgument)
	}
	return nil
}

// dialOption is one of Dial's own options. It is a grpc.DialOption that
// gRPC itself ignores, so that one list can hold both kinds.
type dialOption struct {
	grpc.EmptyDialOption
	apply func(*dialSettings)
}

// WithTLS makes Dial connect over TLS configured by cfg, which is cloned.
// Leave cfg.ServerName empty so that each member's certificate is
// verified against that member's host; a nil cfg verifies against the
// system's roots. It is a Dial option. Default: none (transport security
// then comes from another option).
func WithTLS(cfg *tls.Config) grpc.DialOption {
	return dialOption{apply: func(s *dialSettings) {
		if cfg == nil {
			cfg = &tls.Config{}
		}
		s.tls = "WithTLS"
		s.grpc = append(s.grpc, grpc.WithTransportCredentials(credentials.NewTLS(cfg.Clone())))
	}}
}

// WithTLSFiles makes Dial connect over TLS with files in PEM format, as
// etcdctl's --cacert, --cert and --key do: caFile holds the certificates
// that members' certificates must chain to ("" for the system's roots),
// and certFile and keyFile a client certificate and its key, for members
// that require one (both "" for none). Dial reads them and fails, with an
// error wrapping ErrInvalidArgument, if it cannot. It is a Dial option.
// Default: none.
func WithTLSFiles(caFile, certFile, keyFile string) grpc.DialOption {
	return dialOption{apply: func(s *dialSettings) {
		cfg, err := tlsFromFiles(caFile, certFile, keyFile)
		if err != nil {
			if s.err == nil {
				s.err = fmt.Errorf("%w: WithTLSFiles: %w", ErrInvalidArgument, err)
			}
			return
		}
		s.tls = "WithTLSFiles"
		s.grpc = append(s.grpc, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}}
}

func tlsFromFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no PEM certificate in %s", caFile)
		}
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, errors.New("a client certificate needs both certFile and keyFile")
	default:
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
