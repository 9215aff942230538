package dial

import (
	"context"
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

	"github.com/etcdwatch/etcdwatch"
)

// New returns a connection over the etcd members at endpoints (see the
// package documentation for what it turns on). Endpoints are "host:port",
// optionally with an http:// or https:// scheme; the host (with no blank or
// slash) and the port are required, and
// an endpoint with user info (use WithPassword), a path other than "/", a
// query or a fragment is refused rather than used in part. Errors name an
// endpoint without its password. Each member's TLS certificate is verified
// against that member's own host (unless the tls.Config names a
// ServerName).
//
// Transport security must be chosen in opts: WithTLS, WithTLSFiles or
// WithInsecure, or gRPC transport credentials given with WithGRPCOptions.
// Options apply in order, later ones overriding earlier ones, then New
// checks them together with the endpoints' schemes; it refuses, with an
// error wrapping etcdwatch.ErrInvalidArgument:
//   - an https:// endpoint on a connection without transport security
//     (the scheme is not silently dropped), or with WithInsecure;
//   - an http:// endpoint with WithTLS or WithTLSFiles;
//   - WithInsecure together with WithTLS or WithTLSFiles;
//   - http:// and https:// endpoints together: one connection has one
//     kind of transport security.
//
// Endpoints without a scheme take whatever opts say. An http:// endpoint
// with TLS given through WithGRPCOptions cannot be told apart here; its
// handshake fails, which etcdwatch's Stream.State reports.
//
// To share the connection of an existing go.etcd.io/etcd/client/v3 Client,
// with its credentials and auth token, pass client.ActiveConnection() to
// etcdwatch.Open instead.
func New(endpoints []string, opts ...Option) (*grpc.ClientConn, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: New needs at least one endpoint", etcdwatch.ErrInvalidArgument)
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
	var s settings
	for _, o := range opts {
		o(&s)
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
			return nil, s.clientError(err)
		}
		return conn, nil
	}
	// gRPC refuses per-RPC credentials that require transport security on
	// a connection without it: that is how an https:// endpoint given plain
	// text through WithGRPCOptions is caught, since the transport
	// credentials in them cannot be read.
	conn, err := grpc.NewClient(target, append(all, grpc.WithPerRPCCredentials(transportSecurity{}))...)
	if err == nil {
		return conn, nil
	}
	other, oerr := grpc.NewClient(target, all...)
	if oerr != nil {
		return nil, s.clientError(oerr)
	}
	_ = other.Close()
	return nil, fmt.Errorf("%w: endpoint %q asks for TLS, but the connection has no transport security (use WithTLS or WithTLSFiles)",
		etcdwatch.ErrInvalidArgument, schemes.https)
}

// transportSecurity adds no metadata; it only requires transport security.
type transportSecurity struct{}

func (transportSecurity) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return nil, nil
}
func (transportSecurity) RequireTransportSecurity() bool { return true }

// endpoint is one parsed endpoint.
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
		return fmt.Errorf("%w: endpoints %q and %q: http:// and https:// cannot share a connection", etcdwatch.ErrInvalidArgument, s.http, s.https)
	}
	return nil
}

// parseEndpoint reads "host:port" or "scheme://host:port". The port is
// required: etcd has no single default one (2379 for clients, but often
// another), and gRPC would dial port 443.
func parseEndpoint(ep string) (endpoint, error) {
	e := endpoint{raw: redact(ep), host: ep} // raw: what errors say
	if ep == "" {
		return e, fmt.Errorf("%w: empty endpoint", etcdwatch.ErrInvalidArgument)
	}
	hasScheme := strings.Contains(ep, "://")
	if !hasScheme && strings.Contains(ep, "@") {
		return e, fmt.Errorf("%w: endpoint %q: user info in an endpoint is not used; authenticate with WithPassword", etcdwatch.ErrInvalidArgument, e.raw)
	}
	if hasScheme {
		u, err := url.Parse(ep)
		if err != nil {
			return e, fmt.Errorf("%w: endpoint %q is not a URL", etcdwatch.ErrInvalidArgument, e.raw)
		}
		e.scheme, e.host = strings.ToLower(u.Scheme), u.Host
		switch {
		case e.scheme != "http" && e.scheme != "https":
			return e, fmt.Errorf("%w: endpoint %q: scheme must be http or https", etcdwatch.ErrInvalidArgument, e.raw)
		case u.User != nil:
			return e, fmt.Errorf("%w: endpoint %q: user info in an endpoint is not used; authenticate with WithPassword", etcdwatch.ErrInvalidArgument, e.raw)
		case u.Host == "":
			return e, fmt.Errorf("%w: endpoint %q has no host", etcdwatch.ErrInvalidArgument, e.raw)
		case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
			return e, fmt.Errorf("%w: endpoint %q: etcd's gRPC endpoints have no path, query or fragment", etcdwatch.ErrInvalidArgument, e.raw)
		}
	}
	host, port, err := net.SplitHostPort(e.host) // e.host holds no user info: refused above
	if err != nil {
		return e, fmt.Errorf("%w: endpoint %q needs host:port: %w", etcdwatch.ErrInvalidArgument, e.raw, err)
	}
	if host == "" || strings.ContainsAny(host, " \t\r\n/") {
		return e, fmt.Errorf("%w: endpoint %q has no valid host", etcdwatch.ErrInvalidArgument, e.raw)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return e, fmt.Errorf("%w: endpoint %q has no valid port", etcdwatch.ErrInvalidArgument, e.raw)
	}
	return e, nil
}

// redact returns ep with the password of any user info in it replaced by
// "xxxxx", as url.URL.Redacted does. An endpoint in which url.Parse finds
// no user info, or that is not a valid URL (a '%' in the password, say),
// or has no scheme, is named in errors too: then whatever runs to its
// last '@' may be user info, since a password may hold any character
// ("alice:2024/secret@host" parses as a host and a path), and is taken as
// such. Better to hide an '@' in a query (refused anyway) than a password.
func redact(ep string) string {
	if !strings.Contains(ep, "@") {
		return ep
	}
	start := 0
	if i := strings.Index(ep, "://"); i > 0 && isScheme(ep[:i]) {
		if u, err := url.Parse(ep); err == nil && u.User != nil {
			return u.Redacted()
		}
		start = i + len("://")
	}
	at := strings.LastIndex(ep, "@")
	if at < start {
		return ep
	}
	user, _, hasPassword := strings.Cut(ep[start:at], ":")
	if !hasPassword {
		return ep
	}
	return ep[:start] + user + ":xxxxx" + ep[at:]
}

// isScheme reports whether s has the form of a URL scheme (RFC 3986: a
// letter, then letters, digits, '+', '-' or '.').
func isScheme(s string) bool {
	for i, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}
