package dial

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
)

// Option configures New. Options apply in order over the defaults, then
// New checks them together. An Option is not a grpc.DialOption: gRPC's own
// options go through WithGRPCOptions.
type Option func(*settings)

// settings is what the options set. Its zero value is the defaults: no
// transport security, no authentication, no gRPC options beyond New's own.
type settings struct {
	grpc     []grpc.DialOption // in order: WithTLS, WithTLSFiles and WithInsecure as transport credentials, and WithGRPCOptions'
	tls      string            // the last of WithTLS and WithTLSFiles given, for messages; "" if none
	insecure bool              // WithInsecure was given
	auth     *tokenAuth        // from WithPassword; nil for none
	err      error             // the first option that could not be applied
}

// validate checks the options together, and with the endpoints' schemes.
func (s *settings) validate(schemes endpointSchemes) error {
	switch {
	case s.err != nil:
		return s.err
	case s.insecure && s.tls != "":
		return fmt.Errorf("%w: WithInsecure and %s were both given: a connection has one kind of transport security", etcdwatch.ErrInvalidArgument, s.tls)
	case s.tls != "" && schemes.http != "":
		return fmt.Errorf("%w: endpoint %q asks for plain text, but %s was given", etcdwatch.ErrInvalidArgument, schemes.http, s.tls)
	case s.insecure && schemes.https != "":
		return fmt.Errorf("%w: endpoint %q asks for TLS, but WithInsecure was given", etcdwatch.ErrInvalidArgument, schemes.https)
	case s.auth != nil && s.auth.user == "":
		return fmt.Errorf("%w: WithPassword needs a user name", etcdwatch.ErrInvalidArgument)
	}
	return nil
}

// clientError is gRPC's refusal of the options. Without transport security
// chosen here, the likeliest cause is none at all, and gRPC's own text then
// suggests its insecure package: point at this package's options instead.
func (s *settings) clientError(err error) error {
	if s.tls == "" && !s.insecure {
		return fmt.Errorf("%w: no transport security chosen: give New WithTLS, WithTLSFiles or WithInsecure (gRPC said: %w)", etcdwatch.ErrInvalidArgument, err)
	}
	return fmt.Errorf("%w: %w", etcdwatch.ErrInvalidArgument, err)
}

// WithTLS makes New connect over TLS configured by cfg, which is cloned
// here: changes to cfg after the call do not reach the Option, and one
// Option may serve several New calls at once. Leave cfg.ServerName empty
// so that each member's certificate is verified against that member's
// host; a nil cfg verifies against the system's roots. Default: none
// (transport security then comes from another option).
func WithTLS(cfg *tls.Config) Option {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	creds := credentials.NewTLS(cfg.Clone()) // clones cfg again; its ServerName is set per member at each handshake
	return func(s *settings) {
		s.tls = "WithTLS"
		s.grpc = append(s.grpc, grpc.WithTransportCredentials(creds))
	}
}

// WithTLSFiles makes New connect over TLS with files in PEM format, as
// etcdctl's --cacert, --cert and --key do: caFile holds the certificates
// that members' certificates must chain to ("" for the system's roots),
// and certFile and keyFile a client certificate and its key, for members
// that require one (both "" for none). New reads them and fails, with an
// error wrapping etcdwatch.ErrInvalidArgument, if it cannot. Default:
// none.
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(s *settings) {
		cfg, err := tlsFromFiles(caFile, certFile, keyFile)
		if err != nil {
			if s.err == nil {
				s.err = fmt.Errorf("%w: WithTLSFiles: %w", etcdwatch.ErrInvalidArgument, err)
			}
			return
		}
		s.tls = "WithTLSFiles"
		s.grpc = append(s.grpc, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
}

// WithInsecure makes New connect in plain text, without TLS. It conflicts
// with WithTLS, WithTLSFiles and https:// endpoints: New refuses those
// together. Default: off (transport security must then come from another
// option).
func WithInsecure() Option {
	return func(s *settings) {
		s.insecure = true
		s.grpc = append(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
}

// WithGRPCOptions passes gRPC's own options to the connection: an
// interceptor, a dialer, call options, or a replacement for one of New's
// defaults (keepalive, connect backoff, the round_robin service config),
// which they override. They apply after New's defaults, in order, where
// they stand among this package's options: transport credentials given
// here override a WithTLS, WithTLSFiles or WithInsecure before them, and
// one after them overrides them. A service config given here replaces all
// of New's, round_robin included. Default: none.
func WithGRPCOptions(opts ...grpc.DialOption) Option {
	opts = append([]grpc.DialOption(nil), opts...)
	return func(s *settings) {
		s.grpc = append(s.grpc, opts...)
	}
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
