package etcdwatchprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchprom"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// Register a Collector per Stream and serve them with promhttp. Here the
// etcd is embedded and the /metrics page is fetched once from a loopback
// test server; a program would pass the handler to its own http.Server.
func Example() {
	dir, err := os.MkdirTemp("", "etcdwatchprom-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	member, err := etcdwatchtest.StartEtcdIn(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer member.Stop()
	conn, err := member.Dial()
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	s, err := etcdwatch.Open(conn)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(etcdwatchprom.New("config", s))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := s.Watch(ctx, etcdwatch.Prefix("app/"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pb.NewKVClient(conn).Put(ctx, &pb.PutRequest{Key: []byte("app/color"), Value: []byte("blue")}); err != nil {
		log.Fatal(err)
	}
	if _, ok := <-w.Responses(); !ok {
		log.Fatal(w.Err()) // the watch ended: why
	}

	web := httptest.NewServer(mux)
	defer web.Close()
	resp, err := http.Get(web.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		for _, name := range []string{"etcdwatch_connected{", "etcdwatch_events_total{", "etcdwatch_watches{"} {
			if strings.HasPrefix(lines.Text(), name) {
				fmt.Println(lines.Text())
			}
		}
	}
	// Output:
	// etcdwatch_connected{stream="config"} 1
	// etcdwatch_events_total{stream="config"} 1
	// etcdwatch_watches{stream="config"} 1
}
