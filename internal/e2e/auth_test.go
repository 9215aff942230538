package e2e

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
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

// tokenTTL is the members' simple-token TTL, in seconds. A token unused for
// that long (etcd checks every second) is gone; a watch stream uses its
// token only at creates.
const tokenTTL = 2

// expired is how long to leave a token unused so that it has surely expired.
const expired = (tokenTTL + 2) * time.Second

// secure is a cluster serving clients over TLS, with auth enabled: root,
// and a user "watcher" (password "pw") whose role "watcher" may read under
// "secure/".
type secure struct {
	members []*etcdwatchtest.Server
	roots   *x509.CertPool
	admin   *clientv3.Client // as root
}

// startSecure starts n members with client TLS (a certificate for
// localhost and 127.0.0.1, made here), auth and a short token TTL.
func startSecure(t *testing.T, n int) *secure {
	t.Helper()
	certs := makeCerts(t, "localhost", "127.0.0.1")
	members := etcdwatchtest.StartCluster(t, n, func(c *embed.Config) {
		c.ListenClientUrls[0].Scheme = "https"
		c.AdvertiseClientUrls[0].Scheme = "https"
		c.ClientTLSInfo = transport.TLSInfo{CertFile: certs.certFile, KeyFile: certs.keyFile}
		c.AuthTokenTTL = tokenTTL
		c.BcryptCost = 4 // bcrypt.MinCost: Authenticate checks the password, which takes seconds under -race at the default cost
	})
	sc := &secure{members: members, roots: certs.pool}
	var eps []string
	for _, m := range members {
		eps = append(eps, "https://"+m.Endpoint)
	}
	tlsCfg := &tls.Config{RootCAs: certs.pool}
	setup, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tlsCfg, DialTimeout: wait})
	require.NoError(t, err)
	defer setup.Close()
	c := ctx(t)
	for _, step := range []func() error{
		func() error { _, err := setup.UserAdd(c, "root", "rootpw"); return err },
		func() error { _, err := setup.UserGrantRole(c, "root", "root"); return err },
		func() error { _, err := setup.RoleAdd(c, "watcher"); return err },
		func() error { return grant(c, setup, "secure/") },
		func() error { _, err := setup.UserAdd(c, "watcher", "pw"); return err },
		func() error { _, err := setup.UserGrantRole(c, "watcher", "watcher"); return err },
		func() error { _, err := setup.AuthEnable(c); return err },
	} {
		require.NoError(t, step())
	}
	sc.admin, err = clientv3.New(clientv3.Config{Endpoints: eps, TLS: tlsCfg, Username: "root", Password: "rootpw", DialTimeout: wait})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sc.admin.Close()) })
	return sc
}

// grant lets role "watcher" read under prefix.
func grant(c context.Context, kv *clientv3.Client, prefix string) error {
	_, err := kv.RoleGrantPermission(c, "watcher", prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermRead))
	return err
}

// endpoints names the members https://localhost:port and
// https://127.0.0.1:port in turn, so that both names are verified.
func (sc *secure) endpoints() []string {
	var eps []string
	for i, m := range sc.members {
		_, port, _ := net.SplitHostPort(m.Endpoint)
		host := "localhost"
		if i%2 == 1 {
			host = "127.0.0.1"
		}
		eps = append(eps, "https://"+net.JoinHostPort(host, port))
	}
	return eps
}

// authentications counts a connection's Authenticate calls.
type authentications struct{ ok, failed atomic.Int64 }

// open returns a Stream for user on a dial.New connection over TLS
// to endpoints, and a count of the connection's Authenticate calls.
func (sc *secure) open(t *testing.T, endpoints []string, user, password string, opts ...etcdwatch.Option) (*etcdwatch.Stream, *authentications) {
	t.Helper()
	var authenticated authentications
	trace := &syncBuffer{}
	opts = append(opts, etcdwatch.WithLogger(slog.New(slog.NewTextHandler(trace, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the Stream's log:\n%s", trace)
		}
	})
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		switch {
		case method != pb.Auth_Authenticate_FullMethodName:
		case err == nil:
			authenticated.ok.Add(1)
			fmt.Fprintf(trace, "%s Authenticate: %s\n", time.Now().Format("15:04:05.000"), reply.(*pb.AuthenticateResponse).Token)
		default:
			authenticated.failed.Add(1)
			t.Logf("Authenticate failed: %v", err)
		}
		return err
	}
	conn, err := dial.New(endpoints, dial.WithTLS(&tls.Config{RootCAs: sc.roots}),
		dial.WithPassword(user, password), dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(count)))
	require.NoError(t, err)
	s, err := etcdwatch.Open(conn, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		require.NoError(t, conn.Close())
	})
	return s, &authenticated
}

// TestTokenExpiryOverTLS: a Stream over TLS to three members, authenticated
// as a user whose token lives 2 s, keeps a set of watches through several
// expiries while a writer runs: half met by a new create (refused for its
// token, then tried on a new stream that authenticates anew), half by a
// connection cut (every resumed create meeting the expired token). Each
// expiry costs one new token (a fresh one that a member has yet to apply
// is kept, not replaced), and every watch delivers its exact history.
func TestTokenExpiryOverTLS(t *testing.T) {
	leakCheck(t)
	sc := startSecure(t, 3)
	var proxied []string
	var proxies []*etcdwatchtest.Proxy
	for i, ep := range sc.endpoints() {
		host, _, _ := net.SplitHostPort(ep[len("https://"):])
		p := etcdwatchtest.NewProxy(t, sc.members[i].Endpoint)
		_, port, _ := net.SplitHostPort(p.Addr())
		proxies = append(proxies, p)
		proxied = append(proxied, "https://"+net.JoinHostPort(host, port))
	}
	s, authenticated := sc.open(t, proxied, "watcher", "pw", fastRetry)
	start := currentRevision(t, sc.admin) + 1
	prefix := "secure/" + unique("expiry")
	recs := watchSet(t, s, prefix, start)
	w := startWriter(t, sc.admin, prefix, 10)
	const expiries = 4
	for i := range expiries {
		progressed(t, recs[0], w.Last())
		time.Sleep(expired) // nothing uses the token meanwhile: etcd renews a simple token on each use, so its expiry cannot be polled for
		created, before := s.Stats().Created, authenticated.ok.Load()
		if i%2 == 0 {
			wt, err := s.Watch(t.Context(), etcdwatch.Prefix(prefix).FromRevision(start))
			require.NoError(t, err, "expiry %d", i+1)
			recs = append(recs, record(wt, start))
		} else {
			cut := 0
			for _, p := range proxies {
				cut += p.Cut()
			}
			require.Positive(t, cut)
		}
		flowingAgain(t, s, created, len(recs), w, recs[0])
		// One new token per expiry: a member may refuse a token that
		// another member has just issued (etcd numbers it by the
		// consistent index, which can be behind the entry that issued it),
		// but the connection keeps a token no RPC has been served with yet
		// and opens the stream again with it, rather than asking for
		// another that could meet the same race.
		tokens := authenticated.ok.Load() - before
		require.Equal(t, int64(1), tokens, "expiry %d: new tokens", i+1)
	}
	events := finish(t, w, recs)
	st := s.Stats()
	require.GreaterOrEqual(t, st.Reconnects, uint64(expiries))
	t.Logf("TLS, 3 members, token TTL %ds: %d watches through %d expiries (%d tokens), %d transactions, %d events checked; reconnects %d, resumed %d; lost 0, duplicated 0",
		tokenTTL, len(recs), expiries, authenticated.ok.Load(), w.txns, events, st.Reconnects, st.Moved)
}

// TestPermissionDeniedEndsOnlyItsWatch: a watch on a prefix the user may
// not read is refused with ErrPermissionDenied. A watch whose permission is
// revoked goes on (etcd checks permissions at create only) until it is
// created again, after a connection cut: then it alone ends with
// ErrPermissionDenied, and the others resume and deliver their exact
// history.
func TestPermissionDeniedEndsOnlyItsWatch(t *testing.T) {
	leakCheck(t)
	sc := startSecure(t, 1)
	c := ctx(t)
	team := "team/" + unique("revoked")
	require.NoError(t, grant(c, sc.admin, team))
	proxy := etcdwatchtest.NewProxy(t, sc.members[0].Endpoint)
	_, port, _ := net.SplitHostPort(proxy.Addr())
	s, authenticated := sc.open(t, []string{"https://localhost:" + port}, "watcher", "pw", fastRetry)
	start := currentRevision(t, sc.admin) + 1
	prefix := "secure/" + unique("denied")
	recs := watchSet(t, s, prefix, start)

	_, err := s.Watch(c, etcdwatch.Prefix("forbidden/"))
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied)
	var se *etcdwatch.ServerError
	require.ErrorAs(t, err, &se)
	// A view of the same prefix says so as the watch does.
	_, err = view.New(c, s, etcdwatch.Prefix("forbidden/"), view.DecodeBytes)
	require.ErrorIs(t, err, etcdwatch.ErrPermissionDenied, "%v", err)
	require.ErrorAs(t, err, &se)
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	teamWatch, err := s.Watch(t.Context(), etcdwatch.Prefix(team))
	require.NoError(t, err)
	w := startWriter(t, sc.admin, prefix, 10)
	progressed(t, recs[0], w.Last())

	_, err = sc.admin.RoleRevokePermission(c, "watcher", team, clientv3.GetPrefixRangeEnd(team))
	require.NoError(t, err)
	_, err = sc.admin.Put(c, team+"k", "v")
	require.NoError(t, err)
	require.Equal(t, team+"k", string(nextEvents(t, teamWatch)[0].Key), "a live watch is not checked again")
	created := s.Stats().Created
	require.Positive(t, proxy.Cut())
	select {
	case <-teamWatch.Done():
	case <-time.After(wait):
		t.Fatal("the revoked watch did not end")
	}
	require.ErrorIs(t, teamWatch.Err(), etcdwatch.ErrPermissionDenied)
	flowingAgain(t, s, created, len(recs), w, recs[0])
	events := finish(t, w, recs)
	t.Logf("1 create refused, 1 watch ended when re-created after its permission was revoked (%v); %d others resumed, %d events checked; %d tokens",
		teamWatch.Err(), len(recs), events, authenticated.ok.Load())
}

// TestWrongPassword: a wrong password fails the first Watch with
// dial.ErrAuthFailed, saying why.
func TestWrongPassword(t *testing.T) {
	leakCheck(t)
	sc := startSecure(t, 1)
	s, authenticated := sc.open(t, sc.endpoints(), "watcher", "not the password")
	c, cancel := context.WithTimeout(ctx(t), wait)
	defer cancel()
	_, err := s.Watch(c, etcdwatch.Prefix("secure/"))
	require.ErrorIs(t, err, dial.ErrAuthFailed)
	require.ErrorIs(t, err, etcdwatch.ErrUnauthenticated)
	require.ErrorContains(t, err, "authentication failed for user watcher: etcdserver: authentication failed, invalid user ID or password")
	require.Equal(t, int64(1), authenticated.failed.Load(), "a wrong password is not tried again")
	require.Zero(t, authenticated.ok.Load())
	t.Logf("Watch: %v", err)
}

type certFiles struct {
	pool              *x509.CertPool
	certFile, keyFile string
}

// makeCerts makes a CA and a server certificate it signed for hosts, and
// writes the certificate and its key to files.
func makeCerts(t *testing.T, hosts ...string) certFiles {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdwatch e2e CA"},
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
	dir := t.TempDir()
	c := certFiles{pool: x509.NewCertPool(), certFile: filepath.Join(dir, "server.pem"), keyFile: filepath.Join(dir, "server-key.pem")}
	c.pool.AddCert(ca)
	require.NoError(t, os.WriteFile(c.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(c.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return c
}

// TestAuthOnALeaderlessMemberSharedByConcurrentCalls: on a member cut off
// from its peers (no leader), Authenticate waits until it gives up. n
// fail-fast RPCs made together on a new connection with WithPassword wait
// for one Authenticate and fail with it, as they would without a password
// (each waiting for the member in parallel). Catches: each RPC making its
// own Authenticate in turn, the last failing n Authenticates (n times 5 s)
// late, with n Authenticates sent to the member.
func TestAuthOnALeaderlessMemberSharedByConcurrentCalls(t *testing.T) {
	leakCheck(t)
	sc := startSecure(t, 3)
	var victim *etcdwatchtest.Server
	for _, m := range sc.members {
		if !m.IsLeader() {
			victim = m
			break
		}
	}
	victim.Isolate()
	t.Cleanup(victim.Rejoin)
	require.Eventually(t, func() bool { return !victim.HasLeader() }, wait, time.Millisecond, "the isolated member kept its leader")

	var asked atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == pb.Auth_Authenticate_FullMethodName {
			asked.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	_, port, _ := net.SplitHostPort(victim.Endpoint)
	conn, err := dial.New([]string{"https://localhost:" + port}, dial.WithTLS(&tls.Config{RootCAs: sc.roots}),
		dial.WithPassword("watcher", "pw"), dial.WithGRPCOptions(grpc.WithChainUnaryInterceptor(count)))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })
	kv := pb.NewKVClient(conn)

	const n = 3
	c, cancel := context.WithTimeout(ctx(t), wait)
	defer cancel()
	start := time.Now()
	took, errs := make(chan time.Duration, n), make(chan error, n)
	for range n {
		go func() { // returns within c
			_, err := kv.Range(c, &pb.RangeRequest{Key: []byte("secure/a")})
			t.Logf("Range after %v: %v", time.Since(start).Round(time.Millisecond), err)
			took <- time.Since(start)
			errs <- err
		}()
	}
	var last time.Duration
	for range n {
		last = max(last, <-took)
		err := <-errs
		require.Equal(t, codes.Unavailable, status.Code(err), "the RPC exceeded no deadline of its own: %v", err)
		require.Equal(t, "etcdwatch: cannot authenticate as user watcher: no answer within 5s", status.Convert(err).Message())
	}
	t.Logf("%d concurrent RPCs on a leaderless member: %d Authenticate calls, the last RPC returned after %v", n, asked.Load(), last.Round(time.Millisecond))
	require.EqualValues(t, 1, asked.Load(), "Authenticate calls for %d RPCs made together", n)
}
