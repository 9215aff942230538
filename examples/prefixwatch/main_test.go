package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestMain checks that nothing outlives the tests but the idle peer HTTP
// connections of stopped etcd members, which close on their own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdwatchtest.LeakOptions()...)
}

// TestDemo runs the example as `make run` does and checks that every demo
// write is shown, in order.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, nil, etcdwatch.Prefix("demo/"), true); err != nil {
		t.Fatal(err)
	}
	requireDemoOutput(t, out.String())
}

// TestSeveralEndpoints: the example takes several members and watches
// through whichever is up, here with the first one stopped.
func TestSeveralEndpoints(t *testing.T) {
	members := etcdwatchtest.StartCluster(t, 3)
	members[0].Stop()
	var eps []string
	for _, m := range members {
		eps = append(eps, m.Endpoint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := watch(ctx, &out, eps, etcdwatch.Prefix("demo/"), true, true); err != nil {
		t.Fatal(err)
	}
	requireDemoOutput(t, out.String())
}

// requireDemoOutput checks that got shows every demo write, in order.
func requireDemoOutput(t *testing.T, got string) {
	t.Helper()
	want := []string{
		"PUT demo/config/color rev=2", "value: blue",
		"PUT demo/config/size rev=3", "value: large",
		"PUT demo/config/color rev=4", "value: green", "previous: blue",
		"DELETE demo/config/size rev=5", "previous: large",
		"demo done: every write arrived",
	}
	all := got
	for _, line := range want {
		i := strings.Index(got, line)
		if i < 0 {
			t.Fatalf("output lacks %q in order:\n%s", line, all)
		}
		got = got[i+len(line):]
	}
}
