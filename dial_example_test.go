package etcdwatch_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch"
)

// A cluster served over TLS, with auth enabled: each member's certificate
// is verified against its own host name, and the user's token is renewed
// whenever the server refuses it, without the watches noticing.
func ExampleWithPassword() {
	conn, err := etcdwatch.Dial(
		[]string{"https://etcd-0.example:2379", "https://etcd-1.example:2379", "https://etcd-2.example:2379"},
		etcdwatch.WithTLSFiles("ca.pem", "", ""), // or etcdwatch.WithTLS(cfg)
		etcdwatch.WithPassword("watcher", "secret"))
	if err != nil {
		log.Fatal(err) // ErrInvalidArgument: a bad endpoint, file or option
	}
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	w, err := s.Watch(context.Background(), etcdwatch.Prefix("app/"))
	switch {
	case errors.Is(err, etcdwatch.ErrAuthFailed):
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

// An https:// endpoint asks for TLS: Dial refuses to drop it silently.
func ExampleDial_schemes() {
	_, err := etcdwatch.Dial([]string{"https://localhost:2379"},
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	fmt.Println(errors.Is(err, etcdwatch.ErrInvalidArgument))
	fmt.Println(err)

	_, err = etcdwatch.Dial([]string{"http://10.0.0.1:2379", "https://10.0.0.2:2379"}, etcdwatch.WithTLS(nil))
	fmt.Println(err)
	// Output:
	// true
	// etcdwatch: invalid argument: endpoint "https://localhost:2379" asks for TLS, but the connection has no transport security (use WithTLS or WithTLSFiles)
	// etcdwatch: invalid argument: endpoints "http://10.0.0.1:2379" and "https://10.0.0.2:2379": http:// and https:// cannot share a connection
}
