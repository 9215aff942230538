package dial_test

import (
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait for something the test expects to happen.
const wait = 10 * time.Second

// serve runs srv on lis until the test ends, and waits for it to stop.
func serve(t *testing.T, srv *grpc.Server, lis net.Listener) {
	served := make(chan struct{})
	go func() { // exits when the server stops
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
}
