package dial_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
)

// TestEndpoints: New takes host:port with or without a scheme, and
// refuses an endpoint it would have to guess the port of, or whose parts
// it would drop (user info, a path), naming the endpoint with no password
// and saying what is wrong.
func TestEndpoints(t *testing.T) {
	plain := dial.WithInsecure()
	for _, tc := range []struct {
		endpoint string
		ok       bool
		says     string // in the error, with the endpoint as named (default: the endpoint)
		named    string
	}{
		{endpoint: "127.0.0.1:2379", ok: true},
		{endpoint: "localhost:2379", ok: true},
		{endpoint: "[::1]:2379", ok: true},
		{endpoint: "http://127.0.0.1:2379", ok: true},
		{endpoint: "http://127.0.0.1:2379/", ok: true},
		{endpoint: "https://etcd.example:2379", says: "TLS"}, // TLS asked for, plain text given: see TestSecurity
		{endpoint: "unix://etcd:2379", says: "scheme must be http or https"},
		{endpoint: "unix:///run/etcd.sock", says: "scheme must be http or https"},
		{endpoint: "", says: "empty endpoint"},
		{endpoint: "localhost", says: "host:port"},
		{endpoint: "http://localhost", says: "host:port"},
		{endpoint: "localhost:", says: "port"},
		{endpoint: "localhost:http", says: "port"},
		{endpoint: "localhost:70000", says: "port"},
		{endpoint: "http://", says: "host"},
		{endpoint: "http://alice:secret@127.0.0.1:2379", says: "WithPassword", named: "http://alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "http://alice:50%secret@127.0.0.1:2379", says: "not a URL", named: "http://alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "http://alice:secret@127.0.0.1:2379/%zz", says: "not a URL", named: "http://alice:xxxxx@127.0.0.1:2379/%zz"},
		{endpoint: "http://alice:se@cret@127.0.0.1:2379", says: "WithPassword", named: "http://alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "alice:secret@127.0.0.1:2379", says: "WithPassword", named: "alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "alice@127.0.0.1:2379", says: "WithPassword"},
		{endpoint: "alice:se://cret@127.0.0.1:2379", says: "scheme", named: "alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "http://alice:se/cret@127.0.0.1:2379", says: "not a URL", named: "http://alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "http://alice:2024/secret@127.0.0.1:2379", says: "path", named: "http://alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "http://alice:#secret@127.0.0.1:2379", says: "path", named: "http://alice:xxxxx@127.0.0.1:2379"},
		{endpoint: "http://127.0.0.1:2379/?to=ops@example", says: "path", named: "http://127.0.0.1:xxxxx@example"}, // hidden as if a password
		{endpoint: "http://127.0.0.1:2379/v3", says: "path"},
		{endpoint: "http://127.0.0.1:2379?x=1", says: "path"},
	} {
		conn, err := dial.New([]string{"127.0.0.1:2379", tc.endpoint}, plain)
		if tc.ok {
			require.NoError(t, err, tc.endpoint)
			require.NoError(t, conn.Close())
			continue
		}
		require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument, "endpoint %q", tc.endpoint)
		named := tc.named
		if named == "" {
			named = tc.endpoint
		}
		if named != "" {
			require.Contains(t, err.Error(), fmt.Sprintf("%q", named))
		}
		require.Contains(t, err.Error(), tc.says)
		require.NotContains(t, err.Error(), "secret", "the password in an error")
	}
	_, err := dial.New(nil, plain)
	require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
}

// TestSecurity: the endpoints' schemes and the transport security must
// agree; the options are checked before anything is dialed. Plain text
// given as gRPC credentials is caught as WithInsecure is, and WithInsecure
// conflicts with TLS.
func TestSecurity(t *testing.T) {
	certs := newTestCerts(t, "localhost", "127.0.0.1")
	plain := dial.WithGRPCOptions(grpc.WithTransportCredentials(insecure.NewCredentials()))
	tlsCreds := dial.WithGRPCOptions(grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: certs.pool})))
	for _, tc := range []struct {
		name      string
		endpoints []string
		opts      []dial.Option
		refused   string // a fragment of the error; "" for none
	}{
		{"https with WithTLS", []string{"https://localhost:2379", "127.0.0.1:2380"}, []dial.Option{dial.WithTLS(nil)}, ""},
		{"https with gRPC TLS credentials", []string{"https://localhost:2379"}, []dial.Option{tlsCreds}, ""},
		{"https with WithTLSFiles", []string{"https://localhost:2379"}, []dial.Option{dial.WithTLSFiles(certs.caFile, "", "")}, ""},
		{"client certificate", []string{"https://localhost:2379"}, []dial.Option{dial.WithTLSFiles("", certs.certFile, certs.keyFile)}, ""},
		{"http plain", []string{"http://localhost:2379", "localhost:2380"}, []dial.Option{plain}, ""},
		{"no scheme with WithTLS", []string{"localhost:2379"}, []dial.Option{dial.WithTLS(nil)}, ""},
		{"password", []string{"localhost:2379"}, []dial.Option{plain, dial.WithPassword("u", "")}, ""},

		{"https with plain text", []string{"localhost:2379", "https://localhost:2380"}, []dial.Option{plain}, `"https://localhost:2380" asks for TLS`},
		{"https, WithTLS overridden by plain text", []string{"https://localhost:2379"}, []dial.Option{dial.WithTLS(nil), plain}, "asks for TLS"},
		{"http with WithTLS", []string{"http://localhost:2379"}, []dial.Option{dial.WithTLS(nil)}, `"http://localhost:2379" asks for plain text, but WithTLS`},
		{"http with WithTLSFiles", []string{"http://localhost:2379"}, []dial.Option{dial.WithTLSFiles(certs.caFile, "", "")}, "WithTLSFiles was given"},
		{"mixed schemes", []string{"http://localhost:2379", "https://localhost:2380"}, []dial.Option{dial.WithTLS(nil)}, "http:// and https:// cannot share"},
		{"no transport security", []string{"localhost:2379"}, nil, "no transport security"},
		{"missing CA file", []string{"localhost:2379"}, []dial.Option{dial.WithTLSFiles(filepath.Join(t.TempDir(), "none.pem"), "", "")}, "none.pem"},
		{"CA file without PEM", []string{"localhost:2379"}, []dial.Option{dial.WithTLSFiles(certs.keyFile+".txt", "", "")}, "no PEM certificate"},
		{"certificate without key", []string{"localhost:2379"}, []dial.Option{dial.WithTLSFiles("", certs.certFile, "")}, "both certFile and keyFile"},
		{"empty user", []string{"localhost:2379"}, []dial.Option{plain, dial.WithPassword("", "pw")}, "WithPassword needs a user name"},

		// WithInsecure is plain text said explicitly: refused beside TLS,
		// whichever comes first, and with an https:// endpoint.
		{"WithInsecure, no scheme", []string{"localhost:2379", "127.0.0.1:2380"}, []dial.Option{dial.WithInsecure()}, ""},
		{"WithInsecure, http", []string{"http://localhost:2379", "localhost:2380"}, []dial.Option{dial.WithInsecure()}, ""},
		{"WithInsecure twice", []string{"localhost:2379"}, []dial.Option{dial.WithInsecure(), dial.WithInsecure()}, ""},
		{"WithInsecure, https", []string{"https://localhost:2379"}, []dial.Option{dial.WithInsecure()}, `endpoint "https://localhost:2379" asks for TLS, but WithInsecure was given`},
		{"WithInsecure, https among others", []string{"localhost:2379", "https://localhost:2380"}, []dial.Option{dial.WithInsecure()}, `"https://localhost:2380" asks for TLS, but WithInsecure`},
		{"WithInsecure then WithTLS", []string{"localhost:2379"}, []dial.Option{dial.WithInsecure(), dial.WithTLS(nil)}, "WithInsecure and WithTLS were both given"},
		{"WithInsecure after WithTLS", []string{"localhost:2379"}, []dial.Option{dial.WithTLS(nil), dial.WithInsecure()}, "WithInsecure and WithTLS were both given"},
		{"WithInsecure with WithTLSFiles", []string{"localhost:2379"}, []dial.Option{dial.WithTLSFiles(certs.caFile, "", ""), dial.WithInsecure()}, "WithInsecure and WithTLSFiles were both given"},
		{"WithInsecure and WithTLS, https", []string{"https://localhost:2379"}, []dial.Option{dial.WithTLS(nil), dial.WithInsecure()}, "WithInsecure and WithTLS were both given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := dial.New(tc.endpoints, tc.opts...)
			if tc.refused == "" {
				require.NoError(t, err)
				require.NoError(t, conn.Close())
				return
			}
			require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.refused)
			require.Nil(t, conn)
		})
	}
}

// TestVerifiesEachMemberByItsHost: three members behind one certificate
// for localhost and 127.0.0.1, named both ways, are all reached (each
// answers a unary RPC with its own member id), each verified against the
// host of its own endpoint: the localhost ones were asked for that name
// (SNI), the IP one for none. A member whose certificate does not name its
// host is refused.
func TestVerifiesEachMemberByItsHost(t *testing.T) {
	certs := newTestCerts(t, "localhost", "127.0.0.1")
	var members []*tlsMember
	for i := range 3 {
		members = append(members, startTLSMember(t, uint64(i+1), certs.server))
	}
	endpoints := []string{
		"https://localhost:" + members[0].port,
		"https://127.0.0.1:" + members[1].port,
		"localhost:" + members[2].port,
	}
	conn, err := dial.New(endpoints, dial.WithTLS(&tls.Config{RootCAs: certs.pool}))
	require.NoError(t, err)
	defer conn.Close()
	seen := map[uint64]bool{}
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
		require.NoError(t, err)
		seen[resp.Header.MemberId] = true
		return len(seen) == 3
	}, wait, time.Millisecond, "members reached: %v", seen)
	require.Equal(t, []string{"localhost"}, members[0].names())
	require.Equal(t, []string{""}, members[1].names())
	require.Equal(t, []string{"localhost"}, members[2].names())

	wrong := newTestCerts(t, "localhost") // no IP address in it
	m := startTLSMember(t, 9, wrong.server)
	conn, err = dial.New([]string{"https://127.0.0.1:" + m.port}, dial.WithTLS(&tls.Config{RootCAs: wrong.pool}))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{})
	require.ErrorContains(t, err, "127.0.0.1")
	require.ErrorContains(t, err, "doesn't contain any IP SANs")
}

// TestClientCertificateIsSent: WithTLSFiles with a certificate and key
// presents them: a member that requires a client certificate signed by
// its CA serves the connection, and refuses one made with the CA alone.
// Catches the certificate read but left out of the TLS config.
func TestClientCertificateIsSent(t *testing.T) {
	certs := newTestCerts(t, "localhost", "127.0.0.1")
	m := &tlsMember{id: 1}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	_, m.port, _ = net.SplitHostPort(lis.Addr().String())
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{certs.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    certs.pool,
	})))
	pb.RegisterMaintenanceServer(srv, m)
	serve(t, srv, lis)
	statusWith := func(opt dial.Option) error {
		conn, err := dial.New([]string{"https://127.0.0.1:" + m.port}, opt)
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, err = pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{})
		return err
	}
	require.NoError(t, statusWith(dial.WithTLSFiles(certs.caFile, certs.certFile, certs.keyFile)))
	require.Error(t, statusWith(dial.WithTLSFiles(certs.caFile, "", "")), "a connection without a client certificate")
}

// TestWithTLSTakesTheConfigAtTheCall: WithTLS clones its config when it is
// called, as its doc says: a change to the config after it does not reach
// the connection, and one Option serves two New calls at once (which raced
// on the config while the Option cloned it inside New).
func TestWithTLSTakesTheConfigAtTheCall(t *testing.T) {
	certs := newTestCerts(t, "localhost", "127.0.0.1")
	m := startTLSMember(t, 1, certs.server)
	cfg := &tls.Config{RootCAs: certs.pool}
	opt := dial.WithTLS(cfg)
	cfg.RootCAs = newTestCerts(t, "localhost").pool // roots that do not verify m
	conns := make(chan *grpc.ClientConn, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			conn, err := dial.New([]string{"https://127.0.0.1:" + m.port}, opt)
			assert.NoError(t, err)
			conns <- conn
		})
	}
	wg.Wait()
	close(conns)
	for conn := range conns {
		require.NotNil(t, conn)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
		cancel()
		require.NoError(t, err, "the connection used the config as changed after WithTLS")
		require.NoError(t, conn.Close())
	}
}

// tlsMember is a gRPC server over TLS on a loopback port that answers
// Maintenance.Status with its member id, and records the server names
// clients asked for.
type tlsMember struct {
	pb.UnimplementedMaintenanceServer
	id   uint64
	port string

	mu  sync.Mutex
	sni []string
}

func startTLSMember(t *testing.T, id uint64, cert tls.Certificate) *tlsMember {
	t.Helper()
	m := &tlsMember{id: id}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	_, m.port, _ = net.SplitHostPort(lis.Addr().String())
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.sni = append(m.sni, hello.ServerName)
			return nil, nil
		},
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	pb.RegisterMaintenanceServer(srv, m)
	serve(t, srv, lis)
	return m
}

func (m *tlsMember) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Header: &pb.ResponseHeader{MemberId: m.id}}, nil
}

// names returns the distinct server names clients asked for.
func (m *tlsMember) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	seen := map[string]bool{}
	for _, n := range m.sni {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return names
}

// testCerts is a CA and a server certificate it signed, in memory and in
// PEM files.
type testCerts struct {
	pool                      *x509.CertPool
	server                    tls.Certificate
	caFile, certFile, keyFile string
}

// newTestCerts makes a CA and a certificate for hosts (names or IPs).
func newTestCerts(t *testing.T, hosts ...string) testCerts {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdwatch test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	server, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	dir := t.TempDir()
	c := testCerts{
		pool:     x509.NewCertPool(),
		server:   server,
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server-key.pem"),
	}
	c.pool.AddCert(ca)
	require.NoError(t, os.WriteFile(c.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	require.NoError(t, os.WriteFile(c.certFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(c.keyFile, keyPEM, 0o600))
	require.NoError(t, os.WriteFile(c.keyFile+".txt", []byte("not PEM"), 0o600))
	return c
}

// TestEndpointsNeedAHost: an endpoint whose host is empty, or has
// surrounding blanks (as a comma-separated flag "a:2379, b:2379" split on
// commas gives), is refused at New as "http://" is, rather than dialed as
// the local machine or looked up as a name with a blank in it.
func TestEndpointsNeedAHost(t *testing.T) {
	for _, ep := range []string{":2379", "http://:2379", "https://:2379", "[]:2379", " 127.0.0.1:2379", "127.0.0.1:2379 ", "//127.0.0.1:2379"} {
		conn, err := dial.New([]string{ep}, dial.WithTLS(nil))
		if err == nil {
			require.NoError(t, conn.Close())
		}
		require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument, "endpoint %q", ep)
	}
}

// TestEndpointPortBounds: a port is 1 to 65535. Catches port 0 (which
// would dial a port the system picks, or none) or 65536 taken.
func TestEndpointPortBounds(t *testing.T) {
	for ep, ok := range map[string]bool{
		"127.0.0.1:1": true, "127.0.0.1:65535": true, "http://127.0.0.1:65535": true,
		"127.0.0.1:0": false, "127.0.0.1:65536": false, "http://127.0.0.1:0": false, "127.0.0.1:-1": false,
	} {
		conn, err := dial.New([]string{ep}, dial.WithInsecure())
		if ok {
			require.NoError(t, err, ep)
			require.NoError(t, conn.Close())
			continue
		}
		require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument, ep)
		require.ErrorContains(t, err, "no valid port", ep)
	}
}

// TestWithTLSFilesFirstFailureReported: of two options that cannot be
// applied, New reports the first. Catches a later failure overwriting it.
func TestWithTLSFilesFirstFailureReported(t *testing.T) {
	dir := t.TempDir()
	_, err := dial.New([]string{"localhost:2379"},
		dial.WithTLSFiles(filepath.Join(dir, "first.pem"), "", ""),
		dial.WithTLSFiles(filepath.Join(dir, "second.pem"), "", ""))
	require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
	require.ErrorContains(t, err, "first.pem")
	require.NotContains(t, err.Error(), "second.pem")
}
