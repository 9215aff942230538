package dial_test

import (
	"context"
	"crypto/tls"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
)

// TestOptionIsNotAGRPCDialOption: an Option handed to grpc.NewClient must
// not compile, as etcdwatch's Dial options once did and did nothing.
func TestOptionIsNotAGRPCDialOption(t *testing.T) {
	require.False(t, reflect.TypeFor[dial.Option]().Implements(reflect.TypeFor[grpc.DialOption]()),
		"dial.Option satisfies grpc.DialOption: gRPC would take it and ignore it")
}

// TestNoTransportSecurityNamesTheOptions: with none chosen, the refusal
// points at this package's options, not only at gRPC's insecure package.
func TestNoTransportSecurityNamesTheOptions(t *testing.T) {
	_, err := dial.New([]string{"localhost:2379"}, dial.WithPassword("u", "p"))
	require.ErrorIs(t, err, etcdwatch.ErrInvalidArgument)
	require.ErrorContains(t, err, "no transport security")
	require.ErrorContains(t, err, "WithTLS, WithTLSFiles or WithInsecure")
	msg := err.Error()
	if i := strings.Index(msg, "grpc.WithTransportCredentials"); i >= 0 { // gRPC's advice, for a grpc.DialOption New does not take
		require.Less(t, strings.Index(msg, "WithTLS, WithTLSFiles or WithInsecure"), i, "this package's options named first: %s", msg)
	}

	// Credentials given as gRPC's own options are enough.
	conn, err := dial.New([]string{"localhost:2379"},
		dial.WithGRPCOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}

// TestGRPCOptionsOverrideDefaults: gRPC options apply after New's own, so
// a service config given here replaces New's round_robin one, and in
// order, so the last of two wins. The config's response size limit of one
// byte shows which one is in effect: under it a member's Status answer is
// refused as too large.
func TestGRPCOptionsOverrideDefaults(t *testing.T) {
	certs := newTestCerts(t, "localhost", "127.0.0.1")
	m := startTLSMember(t, 7, certs.server)
	const (
		roundRobin = `{"loadBalancingConfig": [{"round_robin": {}}]}`
		tiny       = `{"loadBalancingConfig": [{"round_robin": {}}],
			"methodConfig": [{"name": [{"service": "etcdserverpb.Maintenance"}], "maxResponseMessageBytes": 1}]}`
	)
	askStatus := func(t *testing.T, opts ...dial.Option) error {
		t.Helper()
		opts = append([]dial.Option{dial.WithTLS(&tls.Config{RootCAs: certs.pool})}, opts...)
		conn, err := dial.New([]string{"127.0.0.1:" + m.port}, opts...)
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		resp, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
		if err == nil {
			require.Equal(t, uint64(7), resp.Header.MemberId)
		}
		return err
	}
	tooLarge := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	}

	require.NoError(t, askStatus(t), "New's defaults alone")
	tooLarge(t, askStatus(t, dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(tiny))))
	tooLarge(t, askStatus(t, dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(roundRobin)), dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(tiny))))
	tooLarge(t, askStatus(t, dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(roundRobin), grpc.WithDefaultServiceConfig(tiny))))
	require.NoError(t, askStatus(t, dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(tiny)), dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(roundRobin))))
	require.NoError(t, askStatus(t, dial.WithGRPCOptions(grpc.WithDefaultServiceConfig(tiny), grpc.WithDefaultServiceConfig(roundRobin))))
}
