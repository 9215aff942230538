package dial_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
)

// A cluster served over TLS, with auth enabled: each member's certificate
// is verified against its own host name, and the user's token is renewed
// whenever the server refuses it, without the watches noticing.
func ExampleNew() {
	conn, err := dial.New(
		[]string{"https://etcd-0.example:2379", "https://etcd-1.example:2379", "https://etcd-2.example:2379"},
		dial.WithTLSFiles("ca.pem", "", ""), // or dial.WithTLS(cfg)
		dial.WithPassword("watcher", "secret"))
	if err != nil {
		log.Fatal(err) // etcdwatch.ErrInvalidArgument: a bad endpoint, file or option
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	w, err := s.Watch(context.Background(), etcdwatch.Prefix("app/"))
	switch {
	case errors.Is(err, dial.ErrAuthFailed):
		log.Fatal("wrong user name or password: ", err)
	case errors.Is(err, etcdwatch.ErrPermissionDenied):
		log.Fatal("the user may not read app/: ", err)
	case err != nil:
		log.Fatal(err)
	}
	for r := range w.Responses() {
		for _, e := range r.Events {
			fmt.Println(e.Type, string(e.Key), string(e.Value))
		}
	}
}

// An https:// endpoint asks for TLS: New refuses to drop it silently,
// whether plain text is asked for with WithInsecure or given as gRPC's
// credentials.
func ExampleNew_schemes() {
	_, err := dial.New([]string{"https://localhost:2379"}, dial.WithInsecure())
	fmt.Println(errors.Is(err, etcdwatch.ErrInvalidArgument))
	fmt.Println(err)

	_, err = dial.New([]string{"https://localhost:2379"},
		dial.WithGRPCOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	fmt.Println(err)

	_, err = dial.New([]string{"http://10.0.0.1:2379", "https://10.0.0.2:2379"}, dial.WithTLS(nil))
	fmt.Println(err)
	// Output:
	// true
	// etcdwatch: invalid argument: endpoint "https://localhost:2379" asks for TLS, but WithInsecure was given
	// etcdwatch: invalid argument: endpoint "https://localhost:2379" asks for TLS, but the connection has no transport security (use WithTLS or WithTLSFiles)
	// etcdwatch: invalid argument: endpoints "http://10.0.0.1:2379" and "https://10.0.0.2:2379": http:// and https:// cannot share a connection
}

// gRPC's own options go through WithGRPCOptions, after New's defaults:
// here a message size limit for large revisions, and an interceptor.
func ExampleWithGRPCOptions() {
	logCalls := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		log.Println(method, err)
		return err
	}
	conn, err := dial.New([]string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"},
		dial.WithInsecure(),
		dial.WithGRPCOptions(
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
			grpc.WithChainUnaryInterceptor(logCalls)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
}
